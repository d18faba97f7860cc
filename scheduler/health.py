"""GET /api/health: PostgreSQL, Redis and Kafka up or down, live workers and the cron leader, probed in the background.

A request never probes anything itself: it reads the latest result of each component's probe
(``HealthMonitor``) and, when that result is older than ``PROBE_INTERVAL_SECONDS``, starts one
new probe of it on a background thread, unless one is already running. So each web process
probes each component at most once per interval, however many requests arrive, and a hung or
unreachable component (a blackholed Kafka used to hold each request 2 s, and 16 concurrent
calls stalled the web tier) costs a request nothing: it answers with the last result. Only a
process's very first request waits, at most ``FIRST_WAIT_SECONDS``, for the first results;
a component still unprobed then is reported ``unknown``. A probe still in flight after
``HUNG_AFTER_SECONDS`` means its component does not answer: it is reported ``down`` (without
facts) until a probe returns, rather than by a result from before it hung. A frozen PostgreSQL
(SIGSTOP, a stalled storage) accepts connections and never answers, and its
``statement_timeout`` is the server's own, so the database probe hangs as long as the freeze:
the last result, "up", was shown for all of it.

The database probe also reads the workers alive (``WorkerNode`` rows heartbeating within
``WORKER_DEAD_AFTER_SECONDS``) and the cron leader: the newest fencing token the database
accepted (``LeaderFence``) and whether its lock is still held, in Redis (the lock's value is
``holder:token``) or, in the fallback, as the PostgreSQL advisory lock.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

logger = logging.getLogger(__name__)

PROBE_INTERVAL_SECONDS = 5.0  # each component is probed at most once per this, per web process
FIRST_WAIT_SECONDS = 1.0  # the most a process's first request waits for the first probes
KAFKA_TIMEOUT = 1.5  # seconds for the metadata request
DB_STATEMENT_TIMEOUT_MS = 1000
# A probe in flight this long (seconds) reports its component down: longer than any probe's own
# bound (KAFKA_TIMEOUT, the database's statement timeout, Redis's socket timeout) takes to fail.
HUNG_AFTER_SECONDS = 5.0
UP, DOWN, UNKNOWN = "up", "down", "unknown"
COMPONENTS = ("database", "redis", "kafka")

_admin_lock = threading.Lock()
_admin_client: Any = None


@dataclass(slots=True)
class Reading:
    """A component's latest probe: ``state`` up/down/unknown, ``facts`` extra JSON, ``at`` monotonic seconds."""

    state: str = UNKNOWN
    facts: dict[str, Any] = field(default_factory=dict)
    at: float | None = None


def probe_database() -> tuple[bool, dict[str, Any]]:
    """Return (up, {"workers": {...}, "cron_leader": {...} or None}) from one short transaction.

    Workers alive: not stopped and heartbeating within ``WORKER_DEAD_AFTER_SECONDS``, with their
    slots. The leader: the ``cron`` fence row, with ``lock`` "postgres" when its advisory lock is
    held right now (the Redis probe fills in "redis"), else None. Raises on any database error.
    """
    from scheduler.leadership import DEFAULT_ROLE, advisory_key
    from scheduler.selectors import worker_alive_sql, worker_dead_after_seconds

    key = advisory_key(DEFAULT_ROLE)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('statement_timeout', %s, true)", [str(DB_STATEMENT_TIMEOUT_MS)])
        workers_sql = (
            "SELECT count(*), coalesce(sum(concurrency), 0), coalesce(sum(busy_slots), 0) FROM stint_worker_node"  # noqa: S608
            f" WHERE {worker_alive_sql()}"
        )
        cursor.execute(workers_sql, {"dead_after": worker_dead_after_seconds()})
        alive, slots, busy = cursor.fetchone()
        cursor.execute(
            """
            SELECT f.holder, f.token, f.updated_at, EXISTS (
                SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                  AND l.classid = %s::oid AND l.objid = %s::oid)
            FROM stint_leader_fence f WHERE f.role = %s
            """,
            [(key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF, DEFAULT_ROLE],
        )
        fence = cursor.fetchone()
    leader = None
    if fence is not None:
        holder, token, since, advisory = fence
        leader = {
            "holder": holder,
            "token": int(token),
            "since": since.astimezone(dt.UTC).isoformat(),
            "lock": "postgres" if advisory else None,
        }
    return True, {"workers": {"alive": int(alive), "slots": int(slots), "busy": int(busy)}, "cron_leader": leader}


def probe_redis() -> tuple[bool, dict[str, Any]]:
    """Return (up, {"cron_lock": "holder:token" or None}) from one PING and one GET of the cron lock."""
    from django_redis import get_redis_connection

    from scheduler.leadership import DEFAULT_ROLE, lock_key

    redis = get_redis_connection("default")
    up = bool(redis.ping())
    value = redis.get(lock_key(DEFAULT_ROLE))
    return up, {"cron_lock": value.decode() if isinstance(value, bytes) else value}


def probe_kafka() -> tuple[bool, dict[str, Any]]:
    """Return (True, {}) when the brokers answer a metadata request within ``KAFKA_TIMEOUT``; raise otherwise."""
    global _admin_client
    from confluent_kafka.admin import AdminClient

    with _admin_lock:
        if _admin_client is None:
            _admin_client = AdminClient({"bootstrap.servers": settings.KAFKA_BOOTSTRAP_SERVERS, "log_level": 0})
        client = _admin_client
    client.list_topics(timeout=KAFKA_TIMEOUT)
    return True, {}


def kafka_client_reset() -> None:
    """Forget the cached Kafka admin client (after ``KAFKA_BOOTSTRAP_SERVERS`` changes)."""
    global _admin_client
    with _admin_lock:
        _admin_client = None


class HealthMonitor:
    """Latest readings of each component, refreshed by at most one background probe per component per interval.

    ``probes`` maps a component name to a function returning ``(up, facts)`` or raising (down).
    Thread-safe; the web process holds one (``monitor``).
    """

    def __init__(
        self,
        probes: dict[str, Callable[[], tuple[bool, dict[str, Any]]]],
        *,
        interval_seconds: float = PROBE_INTERVAL_SECONDS,
        first_wait_seconds: float = FIRST_WAIT_SECONDS,
        hung_after_seconds: float = HUNG_AFTER_SECONDS,
    ) -> None:
        self.probes = probes
        self.interval_seconds = interval_seconds
        self.first_wait_seconds = first_wait_seconds
        self.hung_after_seconds = hung_after_seconds
        self._lock = threading.Lock()
        self._readings = {name: Reading() for name in probes}
        self._running: dict[str, threading.Thread] = {}
        self._started: dict[str, float] = {}  # monotonic start of each probe in flight
        self.probes_started = dict.fromkeys(probes, 0)

    def readings(self) -> dict[str, Reading]:
        """Return each component's latest reading, starting a background probe of any that is stale.

        Waits (at most ``first_wait_seconds`` in all) only for components never probed yet. A
        component whose probe has been in flight ``hung_after_seconds`` or more reads ``down``
        with no facts, whatever its last result was.
        """
        now = time.monotonic()
        waiting: list[threading.Thread] = []
        with self._lock:
            for name, reading in self._readings.items():
                stale = reading.at is None or now - reading.at >= self.interval_seconds
                thread = self._running.get(name)
                if stale and thread is None:
                    thread = threading.Thread(target=self._probe, args=(name,), name=f"health-{name}", daemon=True)
                    self._running[name] = thread
                    self._started[name] = now
                    self.probes_started[name] += 1
                    thread.start()
                if reading.at is None and thread is not None:
                    waiting.append(thread)
        deadline = now + self.first_wait_seconds
        for thread in waiting:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        now = time.monotonic()
        with self._lock:
            hung = {name for name, started in self._started.items() if now - started >= self.hung_after_seconds}
            return {
                name: Reading(DOWN, {}, now) if name in hung else Reading(r.state, dict(r.facts), r.at)
                for name, r in self._readings.items()
            }

    def probing(self, name: str) -> bool:
        """True while a probe of ``name`` runs."""
        with self._lock:
            return name in self._running

    def reset(self) -> None:
        """Forget every reading and count (the next request probes afresh); running probes finish unrecorded."""
        with self._lock:
            self._readings = {name: Reading() for name in self.probes}
            self._running.clear()
            self._started.clear()
            self.probes_started = dict.fromkeys(self.probes, 0)

    def _probe(self, name: str) -> None:
        readings = self._readings
        try:
            up, facts = self.probes[name]()
            state = UP if up else DOWN
        except Exception as exc:  # any failure of the component (or its client) means down
            logger.info("health: %s down (%s)", name, exc)
            state, facts = DOWN, {}
        finally:
            if name == "database":
                connection.close()  # this thread's own connection: never left open
        with self._lock:
            if self._readings is readings:  # not reset meanwhile
                self._readings[name] = Reading(state, facts, time.monotonic())
                self._running.pop(name, None)
                self._started.pop(name, None)


monitor = HealthMonitor({"database": probe_database, "redis": probe_redis, "kafka": probe_kafka})


def health_report(readings: dict[str, Reading]) -> dict[str, Any]:
    """Build the health body from ``readings``: components, workers and the cron leader.

    The leader is the database's newest accepted fence, shown with ``lock`` "redis" when Redis's
    cron lock holds exactly that holder and token, "postgres" when its advisory lock is held,
    and null when neither holds it (no scheduler leads right now, or the facts are unknown).
    """
    db, redis = readings["database"], readings["redis"]
    leader = db.facts.get("cron_leader")
    if leader is not None:
        lock_value = redis.facts.get("cron_lock")
        if lock_value == f"{leader['holder']}:{leader['token']}":
            leader = {**leader, "lock": "redis"}
        if leader.get("lock") is None:
            leader = None
    return {
        "components": {name: readings[name].state for name in COMPONENTS},
        "workers": db.facts.get("workers"),
        "cron_leader": leader,
    }


class HealthView(APIView):
    """Report each component (up, down, unknown), live workers and the cron leader; 503 unless the database is up."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []
    throttle_classes: list = []

    @extend_schema(
        responses={
            200: inline_serializer(
                "Health",
                {
                    "status": serializers.CharField(help_text="ok, degraded (a component is not up) or down."),
                    "components": serializers.DictField(child=serializers.CharField()),
                    "workers": inline_serializer(
                        "HealthWorkers",
                        {
                            "alive": serializers.IntegerField(),
                            "slots": serializers.IntegerField(),
                            "busy": serializers.IntegerField(),
                        },
                        allow_null=True,
                    ),
                    "cron_leader": inline_serializer(
                        "HealthLeader",
                        {
                            "holder": serializers.CharField(),
                            "token": serializers.IntegerField(),
                            "since": serializers.DateTimeField(),
                            "lock": serializers.CharField(),
                        },
                        allow_null=True,
                    ),
                },
            )
        }
    )
    def get(self, request: Request) -> Response:
        """Answer from the latest background probes (module docstring)."""
        body = health_report(monitor.readings())
        components = body["components"]
        ok = components["database"] == UP
        overall = "ok" if all(v == UP for v in components.values()) else ("degraded" if ok else "down")
        return Response({"status": overall, **body}, status=200 if ok else 503)
