"""Why a QUEUED job is not running: its queue is paused, or a flow limit it falls under is full.

Read by the API (``waiting`` on a job), the user job page and the console. Figures come from
the same sources the claim uses (RUNNING jobs, the rate window's admission log), read without
the limit's lock: a snapshot, good for a person, not for a decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from scheduler.flow.limits import Limit, effective_limits
from scheduler.models import Job, Queue
from scheduler.states import JobStatus


@dataclass(slots=True)
class Explainer:
    """Explains many jobs with one read per queue set, limit and partition value (a page of jobs)."""

    _paused: set[str] | None = None
    _counts: dict[tuple[str, Any], int] = field(default_factory=dict)
    _paces: dict[str, float | None] = field(default_factory=dict)

    def paused(self) -> set[str]:
        """Return the names of the paused queues (read once per explainer)."""
        if self._paused is None:
            self._paused = set(Queue.objects.filter(paused=True).values_list("name", flat=True))
        return self._paused

    def _count(self, what: tuple[str, Any], sql: str, params: list[Any]) -> int:
        if what not in self._counts:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                self._counts[what] = cursor.fetchone()[0]
        return self._counts[what]

    def running(self, limit: Limit, partition: Any = None, *, by_partition: bool = False) -> int:
        """Return how many RUNNING jobs ``limit`` counts now (one query, cached per explainer).

        All RUNNING jobs of its queue or type; with ``by_partition``, only those whose payload's
        ``partition_key`` field reads as ``partition`` through ``->>`` (None: missing or JSON null).
        """
        column = "type" if limit.scope == "type" else "queue"
        if not by_partition:
            return self._count(
                (limit.key, None),
                f"SELECT count(*) FROM stint_job WHERE status = 'RUNNING' AND {column} = %s",  # noqa: S608
                [limit.name],
            )
        return self._count(
            (limit.key, ("p", partition)),
            f"SELECT count(*) FROM stint_job WHERE status = 'RUNNING' AND {column} = %s"  # noqa: S608
            " AND (payload ->> %s) IS NOT DISTINCT FROM %s",
            [limit.name, limit.partition_key, partition],
        )

    def admitted(self, limit: Limit) -> int:
        """Return how many starts ``limit``'s admission log holds for its last ``rate_period_seconds``."""
        return self._count(
            (limit.key, "rate"),
            "SELECT count(*) FROM stint_flow_admission WHERE key = %s"
            " AND admitted_at > statement_timestamp() - make_interval(secs => %s)",
            [limit.key, limit.rate_period_seconds],
        )

    def _window_frees_in(self, limit: Limit, admitted: int) -> float | None:
        """Seconds until the rate window of ``limit``, holding ``admitted`` starts, has room again; None if unknown.

        The window has room once all but ``rate_limit - 1`` of them have aged out: when the
        ``admitted - rate_limit + 1``-th oldest is ``rate_period_seconds`` old (database clock).
        """
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM admitted_at + make_interval(secs => %s) - statement_timestamp())::float8"
                " FROM stint_flow_admission"
                " WHERE key = %s AND admitted_at > statement_timestamp() - make_interval(secs => %s)"
                " ORDER BY admitted_at OFFSET %s LIMIT 1",
                [limit.rate_period_seconds, limit.key, limit.rate_period_seconds, admitted - limit.rate_limit],
            )
            row = cursor.fetchone()
        return None if row is None else max(0.0, row[0])

    def _pace_ahead(self, limit: Limit) -> float | None:
        """Seconds until the rate limit's pacing admits a claim (<= 0: now), or None without pacing state."""
        from scheduler.flow.claim import burst, pace_start

        if limit.key in self._paces:
            return self._paces[limit.key]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM tat - statement_timestamp())::float8 FROM stint_flow_pace WHERE key = %s",
                [limit.key],
            )
            row = cursor.fetchone()
        tolerance = (burst(limit) - 1) * limit.rate_period_seconds / limit.rate_limit
        self._paces[limit.key] = None if row is None else pace_start(limit, row[0]) - tolerance
        return self._paces[limit.key]

    def reason(self, job: Job) -> dict[str, str] | None:
        """Return ``{"code", "message"}`` for why QUEUED ``job`` waits, or None (not QUEUED, or only its turn)."""
        if job.status != JobStatus.QUEUED:
            return None
        if job.queue in self.paused():
            return {"code": "queue_paused", "message": f"Queue {job.queue} is paused."}
        limits = effective_limits()
        for key in (f"type:{job.type}", f"queue:{job.queue}"):
            limit = limits.get(key)
            if limit is None:
                continue
            what = f"{limit.scope} {limit.name}"
            if limit.concurrency is not None:
                running = self.running(limit)
                if running >= limit.concurrency:
                    return {
                        "code": "concurrency_limit",
                        "message": f"Concurrency limit of {what}: {running} of {limit.concurrency} running.",
                    }
            if limit.partition_key:
                payload = job.payload if isinstance(job.payload, dict) else {}
                value = payload.get(limit.partition_key)
                value = None if value is None else (value if isinstance(value, str) else _json_text(value))
                running = self.running(limit, value, by_partition=True)
                if running >= (limit.partition_concurrency or 1):
                    return {
                        "code": "partition_limit",
                        "message": f"Concurrency limit of {what} per {limit.partition_key} ({value}): "
                        f"{running} of {limit.partition_concurrency} running.",
                    }
            if limit.rate_limit is not None:
                admitted = self.admitted(limit)
                if admitted >= limit.rate_limit:
                    message = (
                        f"Rate limit of {what}: {admitted} of {limit.rate_limit} started in the last "
                        f"{limit.rate_period_seconds:g} s"
                    )
                    frees_in = self._window_frees_in(limit, admitted)
                    if frees_in is not None:  # pacing may space the starts after that further apart
                        wait = max(frees_in, self._pace_ahead(limit) or 0.0)
                        message += f"; the next start it admits is in about {wait:.1f} s"
                    return {"code": "rate_limit", "message": message + "."}
                ahead = self._pace_ahead(limit)
                if ahead is not None and ahead > 0:
                    return {
                        "code": "rate_limit",
                        "message": f"Rate limit of {what}: starts are spaced "
                        f"{limit.rate_period_seconds / limit.rate_limit:g} s apart; the next in about {ahead:.1f} s.",
                    }
        return None


def _json_text(value: Any) -> str:
    """The text PostgreSQL's ``->>`` gives for a non-string JSON value, from PostgreSQL itself.

    jsonb orders an object's keys and keeps non-ASCII characters as they are, so Python's
    ``json.dumps`` of the same value can differ (``{"b": 1, "a": "é"}``).
    """
    import json

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb #>> '{}'", [json.dumps(value)])
        return cursor.fetchone()[0]


def waiting_reason(job: Job, explainer: Explainer | None = None) -> dict[str, str] | None:
    """Return why QUEUED ``job`` waits as ``{"code", "message"}``, or None. Codes: queue_paused,
    concurrency_limit, partition_limit, rate_limit. Pass one ``explainer`` for a page of jobs."""
    return (explainer or Explainer()).reason(job)


def limit_usage(limit: Limit) -> dict[str, int | None]:
    """Return ``{"running": int, "admitted_in_window": int | None}``: what ``limit`` counts now.

    ``admitted_in_window`` is None for a limit without a rate. A snapshot read without the lock.
    """
    explainer = Explainer()
    return {
        "running": explainer.running(limit),
        "admitted_in_window": explainer.admitted(limit) if limit.rate_limit is not None else None,
    }
