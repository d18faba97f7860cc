"""Leases: claim, heartbeat, record outcomes and hand back, each fenced by the lease token and batched.

A worker claims with ``claim_jobs`` in one short transaction, runs handlers outside any
transaction, and reports outcomes through ``record_outcomes``, which writes every outcome of
a batch (status, attempt, result, events) in one transaction and a handful of statements. An
outcome whose lease token no longer matches (the lease was rescued, or the job timed out and
moved on) changes nothing: that is the fencing rule of DESIGN.md.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from scheduler import lifecycle
from scheduler.conf import conf
from scheduler.exceptions import UnknownJobType
from scheduler.lifecycle import NOW, NULL, Claimed, Sql
from scheduler.registry import get_handler
from scheduler.retry import backoff
from scheduler.states import AttemptStatus, EventType, JobStatus

MAX_ERROR_CHARS = 2000  # characters of an error message kept on the job
MAX_TRACEBACK_CHARS = 20000  # characters of a traceback kept on the attempt


class Outcome(enum.StrEnum):
    """How a handler run ended."""

    SUCCEEDED = "SUCCEEDED"
    RETRYABLE = "RETRYABLE"  # raised a retryable error
    TIMED_OUT = "TIMED_OUT"
    PERMANENT = "PERMANENT"  # raised PermanentError
    CANCELLED = "CANCELLED"
    HANDED_BACK = "HANDED_BACK"  # the worker shut down before it finished


@dataclass(slots=True, kw_only=True)
class Report:
    """One finished (or abandoned) run to record. ``result`` is JSON; errors are strings."""

    job: Claimed
    outcome: Outcome
    result: Any = None
    error: str = ""
    traceback: str = ""
    finished_at: dt.datetime | None = field(default=None)


def claim_jobs(
    *, worker_id: str, limit: int, queues: Sequence[str] | None, paused: Sequence[str] = ()
) -> list[Claimed]:
    """Claim up to ``limit`` due jobs for ``worker_id`` in one short transaction (see ``lifecycle.claim``)."""
    with transaction.atomic():
        return lifecycle.claim(
            worker_id=worker_id, limit=limit, lease_seconds=conf().lease_seconds, queues=queues, paused=paused
        )


def heartbeat(*, worker_id: str, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
    """Extend the leases of ``jobs`` ((job id, lease token) pairs) in one statement.

    Returns (still held, cancel requested): the job ids whose lease this worker still holds,
    and those among them whose cancellation was requested. A job missing from the first set
    was rescued or finished elsewhere; its run must not be reported as the current attempt.
    The rows are locked in id order, as ``lifecycle.transition`` locks them: two statements
    that lock the same rows in different orders can deadlock.
    """
    if not jobs:
        return set(), set()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH locked AS (
                SELECT j.id FROM stint_job j
                JOIN unnest(%s::uuid[], %s::uuid[]) AS v(id, token) ON v.id = j.id
                WHERE j.lease_token = v.token AND j.status = 'RUNNING'
                ORDER BY j.id
                FOR UPDATE OF j
            )
            UPDATE stint_job j SET lease_expires_at = now() + make_interval(secs => %s)
            FROM locked WHERE j.id = locked.id
            RETURNING j.id, j.cancel_requested
            """,
            [[j for j, _ in jobs], [t for _, t in jobs], float(conf().lease_seconds)],
        )
        rows = cursor.fetchall()
    return {r[0] for r in rows}, {r[0] for r in rows if r[1]}


def cancel_requested(job_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Return which of ``job_ids`` have ``cancel_requested`` set (one indexed read)."""
    if not job_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM stint_job WHERE id = ANY(%s::uuid[]) AND cancel_requested AND status = 'RUNNING'",
            [list(job_ids)],
        )
        return {r[0] for r in cursor.fetchall()}


def retry_delay(job_type: str, retry_number: int) -> float:
    """Return the backoff in seconds before retry ``retry_number`` (1-based) of a ``job_type`` job.

    The handler's per-type base, cap and jitter win over ``SCHEDULER``'s; an unregistered type
    (its handler removed since it was enqueued) gets the global ones. Formula: ``retry.backoff``.
    """
    c = conf()
    try:
        spec = get_handler(job_type)
    except UnknownJobType:
        spec = None
    base = spec.backoff_base_seconds if spec and spec.backoff_base_seconds is not None else c.backoff_base_seconds
    cap = spec.backoff_max_seconds if spec and spec.backoff_max_seconds is not None else c.backoff_max_seconds
    jitter = spec.backoff_jitter if spec and spec.backoff_jitter is not None else c.backoff_jitter
    return backoff(max(1, retry_number), base=base, cap=cap, jitter=jitter)


_ATTEMPT_STATUS = {
    Outcome.SUCCEEDED: AttemptStatus.SUCCEEDED,
    Outcome.RETRYABLE: AttemptStatus.FAILED,
    Outcome.PERMANENT: AttemptStatus.FAILED,
    Outcome.TIMED_OUT: AttemptStatus.TIMED_OUT,
    Outcome.CANCELLED: AttemptStatus.CANCELLED,
    Outcome.HANDED_BACK: AttemptStatus.LOST,
}


def _plan(report: Report) -> tuple[JobStatus, EventType | None]:
    """Decide the job's next status for ``report``."""
    if report.outcome == Outcome.SUCCEEDED:
        return JobStatus.SUCCESS, None
    if report.outcome == Outcome.PERMANENT:
        return JobStatus.FAILED, None
    if report.outcome == Outcome.CANCELLED:
        return JobStatus.CANCELLED, None
    if report.outcome == Outcome.HANDED_BACK:
        return JobStatus.RETRYING, EventType.JOB_RETRIED
    if report.job.attempts_left > 0:
        return JobStatus.RETRYING, None
    return JobStatus.DEAD, None


def record_outcomes(reports: Sequence[Report], *, final: dict[uuid.UUID, JobStatus] | None = None) -> set[uuid.UUID]:
    """Write a batch of outcomes in one transaction; return the ids whose outcome was accepted.

    ``final``, when given, is filled with the status each accepted job moved to.

    For each target status, one fenced ``lifecycle.transition`` moves every job of that group
    (RUNNING -> SUCCESS / RETRYING with ``scheduled_at = now() + backoff`` / DEAD / FAILED /
    CANCELLED), then one statement updates their attempts and one upserts their results. A
    report whose lease token lost (rescued, or already reported) is dropped. A HANDED_BACK run
    becomes due at once and does not consume the attempt budget. A run that would be retried
    or dead-lettered ends CANCELLED instead when its cancellation was requested.
    """
    if not reports:
        return set()
    accepted: set[uuid.UUID] = set()
    with transaction.atomic():
        stopping = _locked_cancel_requests([r for r in reports if r.outcome in _RETRY_OUTCOMES])
        groups: dict[tuple[JobStatus, EventType | None], list[Report]] = {}
        for report in reports:
            plan = (JobStatus.CANCELLED, None) if report.job.id in stopping else _plan(report)
            groups.setdefault(plan, []).append(report)
        for (to, event), group in groups.items():
            ids = [r.job.id for r in group]
            tokens = [r.job.lease_token for r in group]
            errors = [r.error[:MAX_ERROR_CHARS] for r in group]
            assign: dict[str, Any] = {
                "lease_owner": NULL,
                "lease_token": NULL,
                "lease_expires_at": NULL,
                "last_error": Sql("v.err"),
            }
            per_row: dict[str, tuple[str, Sequence[Any]]] = {"err": ("text", errors)}
            payloads = [{"error": e} if e else {} for e in errors]
            if to == JobStatus.RETRYING:
                delays = [
                    0.0
                    if r.outcome == Outcome.HANDED_BACK
                    else retry_delay(r.job.type, r.job.attempt - r.job.attempts_base)
                    for r in group
                ]
                bases = [r.job.attempts_base + (1 if r.outcome == Outcome.HANDED_BACK else 0) for r in group]
                per_row["delay"] = ("float8", delays)
                per_row["base"] = ("int", bases)
                assign["scheduled_at"] = Sql("now() + make_interval(secs => v.delay)")
                assign["attempts_base"] = Sql("v.base")
                payloads = [
                    {**p, "backoff_seconds": d, "reason": r.outcome.lower()}
                    for p, d, r in zip(payloads, delays, group, strict=True)
                ]
            else:
                assign["finished_at"] = NOW
            moved = lifecycle.transition(
                job_ids=ids,
                to=to,
                expected=JobStatus.RUNNING,
                event=event,
                assign=assign,
                per_row=per_row,
                lease_tokens=tokens,
                event_payloads=payloads,
            )
            won = {m.job_id for m in moved}
            if not won:
                continue
            accepted |= won
            if final is not None:
                final.update(dict.fromkeys(won, to))
            mine = [r for r in group if r.job.id in won]
            _finish_attempts(mine)
            if to != JobStatus.RETRYING:
                _store_results(mine)
    return accepted


# Outcomes that would run the job again (or dead-letter it) unless its cancellation was requested.
_RETRY_OUTCOMES = frozenset({Outcome.RETRYABLE, Outcome.TIMED_OUT, Outcome.HANDED_BACK})


def _locked_cancel_requests(reports: Sequence[Report]) -> set[uuid.UUID]:
    """Lock the jobs of ``reports`` that this run still holds; return those whose cancel was requested.

    A run that failed, timed out or was handed back after its owner asked to cancel it ends
    CANCELLED, never RETRYING or DEAD (the lease rescuer follows the same rule). ``FOR UPDATE``
    (in id order, as ``lifecycle.transition`` locks) makes a concurrent ``job_cancel`` either
    commit its request before we read it, or wait and then find the job no longer RUNNING.
    """
    if not reports:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT j.id, j.cancel_requested FROM stint_job j
            JOIN unnest(%s::uuid[], %s::uuid[]) AS v(id, token) ON v.id = j.id
            WHERE j.lease_token = v.token AND j.status = 'RUNNING'
            ORDER BY j.id
            FOR UPDATE OF j
            """,
            [[r.job.id for r in reports], [r.job.lease_token for r in reports]],
        )
        return {r[0] for r in cursor.fetchall() if r[1]}


def _finish_attempts(reports: Sequence[Report]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE stint_job_attempt a
            SET status = v.status, finished_at = coalesce(v.finished_at, now()), error = v.error,
                traceback = v.tb
            FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::timestamptz[], %s::text[], %s::text[])
                 AS v(job_id, attempt, status, finished_at, error, tb)
            WHERE a.job_id = v.job_id AND a.attempt_number = v.attempt
            """,
            [
                [r.job.id for r in reports],
                [r.job.attempt for r in reports],
                [str(_ATTEMPT_STATUS[r.outcome]) for r in reports],
                [r.finished_at for r in reports],
                [r.error[:MAX_ERROR_CHARS] for r in reports],
                [r.traceback[-MAX_TRACEBACK_CHARS:] for r in reports],
            ],
        )


def _store_results(reports: Sequence[Report]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO stint_job_result (job_id, attempt, status, result, created_at)
            SELECT job_id, attempt, status, result, now()
            FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::jsonb[]) AS v(job_id, attempt, status, result)
            ON CONFLICT (job_id) DO UPDATE
            SET attempt = EXCLUDED.attempt, status = EXCLUDED.status, result = EXCLUDED.result,
                created_at = EXCLUDED.created_at
            """,
            [
                [r.job.id for r in reports],
                [r.job.attempt for r in reports],
                [str(_ATTEMPT_STATUS[r.outcome]) for r in reports],
                [Jsonb(r.result) if r.outcome == Outcome.SUCCEEDED else None for r in reports],
            ],
        )
