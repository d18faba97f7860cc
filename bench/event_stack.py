"""The database, processes and measurements shared by the lifecycle-event benchmarks.

Each benchmark runs against a fresh database next to ``DATABASE_URL`` and a fresh Kafka topic and
consumer group, with the real ``run_scheduler`` (the outbox relay runs inside it) and
``run_audit_consumer`` processes, and reads every figure from the database's clock.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


def fresh_database(base_url: str, name: str) -> str:
    """(Re)create database ``name`` on ``base_url``'s server; return its URL."""
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return urlunsplit(urlsplit(base_url)._replace(path=f"/{name}"))


def bench_environment(database: str, *, run_with: str, **extra: str) -> dict[str, str] | None:
    """Return the environment of a benchmark run: ``os.environ`` plus a fresh database and ``extra``.

    ``database`` is (re)created next to ``DATABASE_URL``'s (``fresh_database``) and becomes the
    run's ``DATABASE_URL``; the ``bench`` app's handlers are installed (``STINT_EXTRA_APPS``), logs
    are quiet (``LOG_LEVEL=WARNING``) and ``DJANGO_SETTINGS_MODULE`` is set; ``extra`` entries
    win. Returns None, after saying on stderr how to run it (``run_with``), when ``DATABASE_URL``
    is not set. Raises ``psycopg.Error`` when the server refuses the database.
    """
    base_url = os.environ.get("DATABASE_URL")
    if not base_url:
        print(f"DATABASE_URL is not set: {run_with}", file=sys.stderr)
        return None
    return {
        **os.environ,
        "DATABASE_URL": fresh_database(base_url, database),
        "STINT_EXTRA_APPS": "bench",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        **extra,
    }


def provision_topic(env: dict[str, str]) -> None:
    """Create the run's lifecycle topic (``KAFKA_TOPIC`` of ``env``) as a deployment's ``manage.py create_topics`` does.

    Neither the relay nor the audit consumer creates it (docs/chaos-findings.md F7, F8), so a
    benchmark that starts them on a fresh topic provisions it first. Raises ``KafkaException``
    when the broker does not answer within 10 s.
    """
    from scheduler.kafka import ensure_topic

    ensure_topic(
        bootstrap_servers=env["KAFKA_BOOTSTRAP_SERVERS"],
        topic=env["KAFKA_TOPIC"],
        partitions=int(env.get("KAFKA_TOPIC_PARTITIONS", "6")),
        timeout=10,
    )


def setup_django(env: dict[str, str]) -> None:
    """Point this process at the benchmark's database and topic, set Django up and migrate."""
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def bench_env(*, database_url: str, bootstrap_servers: str, tag: str) -> dict[str, str]:
    """Return the environment of the benchmark's processes: own database, topic and consumer group."""
    suffix = uuid.uuid4().hex[:8]
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "KAFKA_TOPIC": f"bench-{tag}-{suffix}",
        "KAFKA_AUDIT_GROUP": f"bench-{tag}-{suffix}",
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONUNBUFFERED": "1",
    }


class Processes:
    """``run_scheduler``, ``run_audit_consumer`` and optionally ``run_workers``, stopped with SIGTERM."""

    def __init__(self, env: dict[str, str], *, workers: int = 0, log: Path | None = None) -> None:
        self.env = env
        self.log = (log or Path(os.devnull)).open("ab")
        provision_topic(env)
        self.procs: list[subprocess.Popen] = [
            self._spawn(["run_scheduler", "--tick-seconds", "0.05"]),
            self._spawn(["run_audit_consumer"]),
        ]
        self.procs += [self._spawn(["run_workers", "--processes", "1", "--concurrency", "20"]) for _ in range(workers)]

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *argv, "-v", "1"],
            env=self.env,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        self.log.close()
        return codes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS's pick), for a server a benchmark starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Any, *, timeout: float, step: float = 0.1) -> bool:
    """Poll ``predicate()`` every ``step`` seconds; return whether it held within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def scalar(sql: str, params: list[Any] | None = None) -> Any:
    """Return the first column of the first row of ``sql``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def unpublished() -> int:
    """Outbox events not yet confirmed by Kafka (the relay's backlog)."""
    return scalar("SELECT coalesce(sum(event_count), 0) FROM stint_outbox WHERE published_at IS NULL")


# Outbox events not (yet) in the audit table; `make bench` runs it over psycopg, the others over Django.
AUDIT_MISSING_SQL = (
    "SELECT count(*) FROM stint_outbox_event o WHERE NOT EXISTS "
    "(SELECT 1 FROM stint_audit_event a WHERE a.event_id = o.event_id)"
)


def audit_complete() -> bool:
    """True when every outbox event is in the audit table."""
    return scalar(AUDIT_MISSING_SQL) == 0


def warm_up(timeout: float = 120.0) -> bool:
    """Enqueue one job and wait until its events are in the audit table (relay and consumer group ready)."""
    from scheduler.enqueuing import enqueue

    enqueue("DEMO_TASK", {}, name="warm-up")
    return wait_until(audit_complete, timeout=timeout)


def event_figures(*, since: Any) -> dict[str, Any]:
    """Latency percentiles (ms) and integrity counts for events that occurred at or after ``since``.

    ``commit_to_audit`` is ``received_at - occurred_at`` (both the database clock; ``occurred_at`` is
    the start of the writing transaction, a few ms before its commit); ``commit_to_kafka`` is
    ``published_at - occurred_at`` (the relay's share).
    """
    from django.db import connection

    quantiles = "percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY ms)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH e AS (
                SELECT extract(epoch FROM a.received_at - o.occurred_at) * 1000 AS ms,
                       extract(epoch FROM o.published_at - o.occurred_at) * 1000 AS relay_ms
                FROM stint_outbox_event o JOIN stint_audit_event a ON a.event_id = o.event_id
                WHERE o.occurred_at >= %s
            )
            SELECT count(*), {quantiles}, max(ms),
                   percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY relay_ms)
            FROM e
            """,  # noqa: S608 - a constant is interpolated
            [since],
        )
        n, q, worst, relay_q = cursor.fetchone()
        cursor.execute("SELECT coalesce(sum(event_count), 0) FROM stint_outbox WHERE occurred_at >= %s", [since])
        events = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) - count(DISTINCT event_id) FROM stint_audit_event")
        duplicates = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FROM (
                SELECT job_id FROM stint_audit_event GROUP BY job_id
                HAVING min(sequence) <> 1 OR max(sequence) <> count(*) OR count(DISTINCT sequence) <> count(*)
            ) gaps
            """
        )
        gapped = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FROM stint_job j
            WHERE j.event_sequence <> (SELECT count(*) FROM stint_audit_event a WHERE a.job_id = j.id)
            """
        )
        incomplete = cursor.fetchone()[0]

    def ms(values: list[float] | None) -> dict[str, float | None]:
        values = values or [None, None, None]
        return {
            k: (round(float(v), 1) if v is not None else None)
            for k, v in zip(("p50", "p90", "p99"), values, strict=True)
        }

    return {
        "events": events,
        "events_in_audit": n,
        "lost_events": events - n,
        "duplicate_events": duplicates,
        "jobs_with_gaps": gapped,
        "jobs_with_incomplete_trail": incomplete,
        "commit_to_audit_ms": {**ms(q), "max": round(float(worst), 1) if worst is not None else None},
        "commit_to_kafka_ms": ms(relay_q),
    }
