"""Leases: claim, heartbeat, record outcomes and hand back, each fenced by the lease token and batched.

A worker claims with ``claim_jobs`` in one short transaction, runs handlers outside any
transaction, and reports outcomes through ``record_outcomes``, which writes every outcome of
a batch (status, attempt, result, events) in one transaction and a handful of statements. An
outcome whose lease token no longer matches (the lease was rescued, or the job timed out and
moved on) changes nothing: that is the fencing rule of DESIGN.md. ``record_batch`` is the
worker's entry point: it makes sure one outcome PostgreSQL refuses never blocks the others.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import InterfaceError, OperationalError, connection, transaction

from core.dberrors import LOCK_NOT_AVAILABLE, db_error_is_transient, db_error_sqlstate
from scheduler import lifecycle, prepared
from scheduler.conf import conf
from scheduler.exceptions import UnknownJobType
from scheduler.lifecycle import Claimed
from scheduler.registry import resolve
from scheduler.retry import after_failed_attempt, backoff, is_backoff_seconds
from scheduler.states import AttemptStatus, JobStatus

MAX_ERROR_CHARS = 2000  # characters of an error message kept on the job
MAX_TRACEBACK_CHARS = 20000  # characters of a traceback kept on the attempt
MAX_DB_ERROR_CHARS = 500  # characters of a database error quoted in a job's error

logger = logging.getLogger(__name__)

# Errors that say the database (or the connection to it) is unavailable, not that one row is bad:
# only these are worth retrying with the same statement. Django wraps psycopg's OperationalError
# (connection lost, admin shutdown, deadlock, lock or statement timeout) and InterfaceError
# (connection closed) in its own classes; psycopg's own are listed for code that uses psycopg
# directly. Anything else (DataError, IntegrityError, ProgrammingError...) is about the data.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


class Outcome(enum.StrEnum):
    """How a handler run ended."""

    SUCCEEDED = "SUCCEEDED"
    RETRYABLE = "RETRYABLE"  # raised a retryable error
    TIMED_OUT = "TIMED_OUT"
    PERMANENT = "PERMANENT"  # raised PermanentError
    CANCELLED = "CANCELLED"
    HANDED_BACK = "HANDED_BACK"  # the worker shut down before it finished
    CRASHED = "CRASHED"  # the process running it died (process pool child): retried in isolation


@dataclass(slots=True, kw_only=True)
class Report:
    """One finished (or abandoned) run to record. ``result`` is JSON; errors are strings.

    ``run_seconds``: for a run whose handler returned, seconds from its slot beginning it to that
    return (the worker's flusher observes them in ``jobs_execution_duration_seconds``, one batch
    at a time). ``started_at``: when its slot began it (database clock: the claim's time plus the
    wait for a slot), for a run that waited after its claim (claimed ahead); None: at its claim.
    ``retry_after``: for a RETRYABLE run whose handler raised ``RetryAfter``, the seconds it asked
    to wait, as ``retry.asked_delay`` read them (0 to ``retry.MAX_BACKOFF_SECONDS``); None: the job
    type's backoff (``retry_delay``).
    """

    job: Claimed
    outcome: Outcome
    result: Any = None
    error: str = ""
    traceback: str = ""
    finished_at: dt.datetime | None = field(default=None)
    run_seconds: float | None = None
    started_at: dt.datetime | None = None
    retry_after: float | None = None


_held_for_units = False  # see claim_held_for_units; written by claim_jobs (a worker's claim loop)


def claim_jobs(
    *,
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    paused: Sequence[str] = (),
    isolated: bool = False,
) -> list[Claimed]:
    """Claim up to ``limit`` due jobs for ``worker_id`` in one short transaction (see ``lifecycle.claim``).

    The claim is one statement: in autocommit (a worker's connection) it is its own transaction,
    one round trip with no BEGIN or COMMIT; inside the caller's ``transaction.atomic`` it joins it.
    While flow limits exist (``scheduler.flow``), ``flow.claim.claim_jobs`` claims instead: the
    unlimited jobs as here, the limited ones under their limits, each in a short transaction.
    Every ``flow.claim.RELEASE_EVERY`` seconds, and when the limits in effect change, a non-isolated claim first clears
    the held flag of jobs no limit governs any more (``flow.claim.release_due``).
    """
    # --- flow control (issue 17): the one hook into the claim path ---
    from scheduler.flow import claim as flow_claim

    global _held_for_units
    _held_for_units = False
    if not isolated:
        flow_claim.release_due()
    if flow_claim.limits_apply():
        jobs = flow_claim.claim_jobs(worker_id=worker_id, limit=limit, queues=queues, paused=paused, isolated=isolated)
        _held_for_units = flow_claim.held_for_units()
        return jobs
    # --- end flow control ---
    return lifecycle.claim(
        worker_id=worker_id,
        limit=limit,
        lease_seconds=conf().lease_seconds,
        queues=queues,
        paused=paused,
        isolated=isolated,
    )


def claim_held_for_units() -> bool:
    """Whether this process's last ``claim_jobs`` left a due job waiting only for a concurrency flow limit's unit.

    Such a job may be claimed as soon as a job of that limit leaves RUNNING (its outcome is
    recorded), not only at the next poll or NOTIFY (``flow.claim.held_for_units``). False without
    flow limits, and when only slots or a rate limit left jobs behind.
    """
    return _held_for_units


def short_claim_took_all() -> bool:
    """Whether a claim that got fewer jobs than its ``limit`` took every due job its snapshot showed.

    True, except while flow limits apply (``scheduler.flow``): a limit leaves due jobs behind.
    The claim board (``scheduler.workers.claim_board``) relies on it to skip duplicate claims.
    """
    from scheduler.flow import claim as flow_claim

    return not flow_claim.limits_apply()


def isolated_jobs_waiting(*, queues: Sequence[str] | None) -> bool:
    """Return whether an isolated job is QUEUED in ``queues`` (None: any) and not in a paused queue.

    One read of the small ``job_isolated_claim_scan`` partial index; a supervisor asks it each
    poll interval to decide whether to start its isolation slot.
    """
    queue_filter = "AND j.queue = ANY(%s::text[])" if queues else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT EXISTS (
                SELECT 1 FROM stint_job j
                WHERE j.status = 'QUEUED' AND j.isolated {queue_filter}
                  AND NOT EXISTS (SELECT 1 FROM stint_queue q WHERE q.name = j.queue AND q.paused)
            )
            """,  # noqa: S608 - a constant filter
            [list(queues)] if queues else [],
        )
        return bool(cursor.fetchone()[0])


def heartbeat(*, worker_id: str, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
    """Extend the leases of ``jobs`` ((job id, lease token) pairs) in one statement.

    Returns (still held, cancel requested): the job ids whose lease this worker still holds,
    and those among them whose cancellation was requested. A job missing from the first set
    was rescued or finished elsewhere; its run must not be reported as the current attempt.
    The rows are locked in id order, as ``lifecycle`` locks them: two statements
    that lock the same rows in different orders can deadlock. A row another session holds
    locked is skipped (``SKIP LOCKED``), not waited for: its lease is not extended this time, and
    it counts as still held when the statement's snapshot shows it RUNNING with our token. Waiting
    would let one row that a handler keeps locked from a connection of its own stop every other
    lease of the worker from being extended, until all expired under their running handlers.
    """
    if not jobs:
        return set(), set()
    with prepared.cursor() as cursor:
        cursor.execute(
            """
            WITH v AS (
                SELECT * FROM unnest(%s::uuid[], %s::uuid[]) AS v(id, token)
            ), locked AS (
                SELECT j.id FROM stint_job j JOIN v ON v.id = j.id
                WHERE j.lease_token = v.token AND j.status = 'RUNNING'
                ORDER BY j.id
                FOR UPDATE OF j SKIP LOCKED
            ), extended AS (
                UPDATE stint_job j SET lease_expires_at = now() + make_interval(secs => %s)
                FROM locked WHERE j.id = locked.id
                RETURNING j.id, j.cancel_requested
            )
            SELECT id, cancel_requested FROM extended
            UNION ALL
            SELECT j.id, j.cancel_requested FROM stint_job j JOIN v ON v.id = j.id
            WHERE j.lease_token = v.token AND j.status = 'RUNNING' AND j.id NOT IN (SELECT id FROM locked)
            """,
            [[j for j, _ in jobs], [t for _, t in jobs], float(conf().lease_seconds)],
        )
        rows = cursor.fetchall()
    return {r[0] for r in rows}, {r[0] for r in rows if r[1]}


def extend_leases_held_by(*, worker_id: str, overdue_after: float) -> tuple[int, bool]:
    """Extend by a lease every RUNNING job's lease that ``worker_id`` holds; return (extended, any overdue).

    For a supervisor whose live worker process cannot heartbeat by itself (a handler holds its
    GIL: no other thread of it runs). The supervisor knows that process is alive, which is all a
    lease stands for. Overdue: a held job running longer than its ``timeout_seconds`` plus
    ``overdue_after`` seconds (database clock), a deadline its starved process cannot enforce.
    Rows another session holds locked are skipped, as by ``heartbeat``. One statement.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH locked AS (
                SELECT id FROM stint_job WHERE status = 'RUNNING' AND lease_owner = %s
                ORDER BY id
                FOR UPDATE SKIP LOCKED
            )
            UPDATE stint_job j SET lease_expires_at = now() + make_interval(secs => %s)
            FROM locked WHERE j.id = locked.id
            RETURNING j.started_at + make_interval(secs => j.timeout_seconds + %s) < now()
            """,
            [worker_id, float(conf().lease_seconds), float(overdue_after)],
        )
        rows = cursor.fetchall()
    return len(rows), any(overdue for (overdue,) in rows)


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


def _asked(report: Report) -> float | None:
    """The delay ``report``'s handler asked for, or None: none, or one the database cannot add to now().

    ``run_handler`` and a pool child's decoded message only carry delays ``retry.asked_delay``
    took; a ``Report`` made elsewhere with another value gets the backoff rather than failing the
    statement of its whole batch ("interval out of range").
    """
    asked = report.retry_after
    return float(asked) if asked is not None and is_backoff_seconds(asked) else None


def retry_delay(job_type: str, retry_number: int) -> float:
    """Return the backoff in seconds before retry ``retry_number`` (1-based) of a ``job_type`` job.

    The handler's per-type base, cap and jitter win over ``SCHEDULER``'s; an unregistered type
    (its handler removed since it was enqueued) gets the global ones. Formula: ``retry.backoff``.
    """
    c = conf()
    try:
        spec = resolve(job_type)
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
    Outcome.CRASHED: AttemptStatus.LOST,
}


# The job's next status for outcomes that need no decision.
_SETTLED = {
    Outcome.SUCCEEDED: JobStatus.SUCCESS,
    Outcome.PERMANENT: JobStatus.FAILED,
    Outcome.CANCELLED: JobStatus.CANCELLED,
}


def _plan(report: Report, *, cancel_requested: bool = False) -> JobStatus:
    """Decide the job's next status for ``report`` (the decision after a failure: ``retry.after_failed_attempt``)."""
    settled = _SETTLED.get(report.outcome)
    if settled is not None:
        return settled
    # RETRYABLE, TIMED_OUT, CRASHED, HANDED_BACK: a requested cancellation is read under the row lock.
    return after_failed_attempt(
        attempts_left=report.job.attempts_left,
        cancel_requested=cancel_requested,
        handed_back=report.outcome == Outcome.HANDED_BACK,
    )


def _verb(status: JobStatus, outcome: Outcome) -> Callable[..., list[lifecycle.Moved]]:
    """The writer's verb that moves a job to ``status`` after ``outcome``."""
    if status == JobStatus.RETRYING:
        return lifecycle.hand_back if outcome == Outcome.HANDED_BACK else lifecycle.retry_later
    return _FINISHING[status]


_FINISHING: dict[JobStatus, Callable[..., list[lifecycle.Moved]]] = {
    JobStatus.SUCCESS: lifecycle.complete,
    JobStatus.FAILED: lifecycle.fail,
    JobStatus.DEAD: lifecycle.dead_letter,
    JobStatus.CANCELLED: lifecycle.cancel_running,
}


def _attempt_end(report: Report, to: JobStatus) -> lifecycle.AttemptEnd:
    """What the writer records of ``report``'s attempt, moving its job to ``to``."""
    job = report.job
    return lifecycle.AttemptEnd(
        job_id=job.id,
        lease_token=job.lease_token,
        status=_ATTEMPT_STATUS[report.outcome],
        worker=job.worker,
        started_at=report.started_at,
        finished_at=report.finished_at,
        error=report.error,
        traceback=report.traceback,
        isolated=_ISOLATED_AFTER.get(report.outcome, False),
        reason=_retry_reason(report) if to == JobStatus.RETRYING else "",
        result=report.result if report.outcome == Outcome.SUCCEEDED else None,
    )


def _retry_reason(report: Report) -> str:
    """The JOB_RETRIED event's ``reason`` for ``report``: its outcome, or ``retry_after`` for its handler's delay."""
    return "retry_after" if _asked(report) is not None else report.outcome.lower()


def _retry_delay_of(report: Report) -> float:
    """Seconds until ``report``'s job is due again: the delay its handler asked for, else its type's backoff."""
    asked = _asked(report)
    if asked is not None:
        return asked
    return retry_delay(report.job.type, report.job.attempt - report.job.attempts_base)


def record_outcomes(reports: Sequence[Report], *, final: dict[uuid.UUID, JobStatus] | None = None) -> set[uuid.UUID]:
    """Write a batch of outcomes in one transaction; return the ids whose outcome was accepted.

    A batch of one kind of outcome without retries (the common case) is a single statement;
    any other batch is a transaction of one statement per target status, after a row lock.

    ``final``, when given, is filled with the status each accepted job moved to.

    Each report's next status is ``_plan``'s; for each target, one ``lifecycle`` verb moves
    every job of that group, fenced by its lease token: ``complete`` (SUCCESS), ``fail``
    (FAILED), ``retry_later`` (RETRYING after the type's backoff, ``retry_delay``, or the delay
    the handler asked for, ``Report.retry_after``, each row its own in the same statement),
    ``dead_letter`` (DEAD), ``cancel_running`` (CANCELLED) or ``hand_back`` (RETRYING now),
    each writing the attempt's row and, for a finished job, its result in the same statement.
    A report whose lease token lost (rescued, or already reported) is dropped. A HANDED_BACK
    run does not consume the attempt budget. A run that would be retried or dead-lettered ends
    CANCELLED instead when its cancellation was requested. A CRASHED run (its process died)
    counts as an attempt, LOST, and leaves the job ``isolated``; any other recorded run but a
    hand-back clears ``isolated`` (the job ran without killing its process).

    Error texts and tracebacks are cut to their limits and made storable (``storable_text``),
    in place. The batch must hold at most one report per job (``record_batch`` makes sure).
    Raises the database's error if a statement fails (a result ``jsonb`` refuses, a lost
    connection): the whole batch is then rolled back.
    """
    if not reports:
        return set()
    for report in reports:
        if report.error:
            report.error = storable_text(report.error[:MAX_ERROR_CHARS])
        if report.traceback:
            report.traceback = storable_text(report.traceback[-MAX_TRACEBACK_CHARS:])
    accepted: set[uuid.UUID] = set()
    retries = [r for r in reports if r.outcome in _RETRY_OUTCOMES]
    # The common batch (every run succeeded, say) is one statement: in autocommit its own
    # transaction, one round trip. Any other batch first locks ALL its rows in id order (reading
    # the cancel requests its retries need): its statements, one per target status, each lock only
    # their own group, so without it the batch would lock a group of higher ids before a lower id
    # of a later group, and deadlock with a heartbeat, which locks in id order (seen in `make
    # loadtest --chaos`). Inside a caller's transaction a savepoint stays, so that a refused batch
    # leaves it usable.
    one_statement = not retries and len({_plan(r) for r in reports}) == 1 and not connection.in_atomic_block
    with contextlib.nullcontext() if one_statement else transaction.atomic():
        stopping = _locked_cancel_requests(reports) if not one_statement else set()
        groups: dict[tuple[JobStatus, Callable[..., list[lifecycle.Moved]]], list[Report]] = {}
        for report in reports:
            to = _plan(report, cancel_requested=report.job.id in stopping)
            groups.setdefault((to, _verb(to, report.outcome)), []).append(report)
        for (to, verb), group in groups.items():
            ends = [_attempt_end(r, to) for r in group]
            if verb is lifecycle.retry_later:
                moved = verb(ends, delays=[_retry_delay_of(r) for r in group])
            else:
                moved = verb(ends)
            won = {m.job_id for m in moved}
            accepted |= won
            if final is not None:
                final.update(dict.fromkeys(won, to))
    return accepted


@dataclass(slots=True, kw_only=True)
class BatchRecord:
    """What ``record_batch`` did with a batch of reports.

    - ``recorded``: the reports written, in order (a report whose result could not be stored
      appears as its FAILED replacement); ``accepted`` and ``final`` as for ``record_outcomes``.
    - ``superseded``: reports dropped unwritten because the batch held a newer attempt's report
      for the same job.
    - ``unrecorded``: (report, why) pairs that could not be written even on their own, not even
      as FAILED; their leases expire and the lease rescuer takes them over.
    - ``locked``: reports not written because their job row stayed locked by another session past
      the connection's ``lock_timeout``; the caller may try them again while their leases last.
    """

    recorded: list[Report] = field(default_factory=list)
    accepted: set[uuid.UUID] = field(default_factory=set)
    final: dict[uuid.UUID, JobStatus] = field(default_factory=dict)
    superseded: list[Report] = field(default_factory=list)
    unrecorded: list[tuple[Report, str]] = field(default_factory=list)
    locked: list[Report] = field(default_factory=list)


def latest_per_job(reports: Sequence[Report]) -> tuple[list[Report], list[Report]]:
    """Split ``reports`` into (one report per job, the rest), keeping each job's latest attempt.

    Two reports for one job (a stale run beside the re-claimed one) cannot share a batch: only
    the latest attempt's lease token can be current, and one statement moves a job (and inserts
    its attempt row) once. Order is kept; for equal attempts the first report wins.
    """
    latest: dict[uuid.UUID, Report] = {}
    older: list[Report] = []
    for report in reports:
        held = latest.get(report.job.id)
        if held is None:
            latest[report.job.id] = report
        elif report.job.attempt > held.job.attempt:
            older.append(held)
            latest[report.job.id] = report
        else:
            older.append(report)
    if not older:
        return list(reports), older
    return list(latest.values()), older


def record_batch(reports: Sequence[Report], *, split_locked: bool = True) -> BatchRecord:
    """Record a worker's batch of outcomes so that no report PostgreSQL refuses blocks the others.

    One transaction for the whole batch (``record_outcomes``) when it goes through, the common
    case. If it fails for any reason but a transient one (``dberrors.db_error_is_transient``:
    the connection or the server, not the data), each report is recorded on its own; one that
    still fails is recorded as FAILED (``PERMANENT``) with the database's error, e.g. a result
    ``jsonb`` refuses (``"\u0000"``, a number beyond ``numeric``, nesting past PostgreSQL's stack
    depth: an OperationalError, SQLSTATE 54001, yet about the data); one that fails even so is
    returned in ``unrecorded`` (the caller logs and counts it), never retried. One whose job row
    another session keeps locked past the connection's ``lock_timeout`` (SQLSTATE 55P03; the
    worker's flusher sets ``OUTCOME_LOCK_TIMEOUT_MS``) is returned in ``locked``, unwritten: a
    handler that locked its own row from a connection of its own must not hold up the outcomes
    of every job after it, and a lock on the whole table (a migration's ALTER TABLE, a CREATE
    INDEX, an operator's LOCK TABLE) is over after a while, so the caller tries those again.
    With ``split_locked`` False (such a retry), a batch refused as a whole for a lock is returned
    in ``locked`` as it is, without a second wait for each report.

    Raises the transient error (one of ``CONNECTION_ERRORS`` in practice: a lost or refused
    connection, a shutdown, a deadlock, a full disk) when the database cannot take the batch now:
    the caller retries the same batch later, which is safe because every write is fenced by its
    lease token (a report already written is then dropped as no longer holding its lease).
    Rule: DESIGN.md, "No component stops on one bad item: only connection errors are retried".
    """
    batch, superseded = latest_per_job(reports)
    done = BatchRecord(superseded=superseded)
    try:
        done.accepted = record_outcomes(batch, final=done.final)
        done.recorded = list(batch)
        return done
    except Exception as exc:  # any other error is about some report's data: find which
        if db_error_is_transient(exc):
            raise
        if not split_locked and db_error_sqlstate(exc) == LOCK_NOT_AVAILABLE:
            done.locked = list(batch)
            return done
        if len(batch) > 1:
            logger.warning("%d outcomes refused as a batch (%s); recording each on its own", len(batch), _brief(exc))
    for report in batch:
        try:
            done.accepted |= record_outcomes([report], final=done.final)
            done.recorded.append(report)
            continue
        except Exception as exc:
            if db_error_is_transient(exc):
                raise
            if db_error_sqlstate(exc) == LOCK_NOT_AVAILABLE:  # as FAILED it would wait for the same lock
                done.locked.append(report)
                continue
            refused = _brief(exc)
        what = "the handler's result" if report.outcome == Outcome.SUCCEEDED else f"the {report.outcome} outcome"
        failed = Report(
            job=report.job,
            outcome=Outcome.PERMANENT,
            error=f"{what} could not be stored: {refused}",
            finished_at=report.finished_at,
            started_at=report.started_at,
        )
        try:
            done.accepted |= record_outcomes([failed], final=done.final)
            done.recorded.append(failed)
        except Exception as exc:
            if db_error_is_transient(exc):
                raise
            done.unrecorded.append((report, f"{refused}; then as FAILED: {_brief(exc)}"))
    return done


def _brief(exc: BaseException) -> str:
    """The first line of a database error, with its class: what a job's error can quote."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:MAX_DB_ERROR_CHARS]


# Outcomes that would run the job again (or dead-letter it) unless its cancellation was requested.
_RETRY_OUTCOMES = frozenset({Outcome.RETRYABLE, Outcome.TIMED_OUT, Outcome.HANDED_BACK, Outcome.CRASHED})
# The job's ``isolated`` flag after an outcome (None: unchanged); any other outcome clears it.
_ISOLATED_AFTER: dict[Outcome, bool | None] = {Outcome.CRASHED: True, Outcome.HANDED_BACK: None}


def storable_text(text: str) -> str:
    """Return ``text`` as PostgreSQL's ``text`` type accepts it: NUL removed, lone surrogates replaced.

    PostgreSQL refuses the NUL character (U+0000) in text, and psycopg cannot encode a lone
    UTF-16 surrogate (e.g. from a handler's ``str(exc)``) to UTF-8: NUL is removed, a lone
    surrogate becomes "?". Costs one scan when the text is clean.
    """
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _locked_cancel_requests(reports: Sequence[Report]) -> set[uuid.UUID]:
    """Lock the jobs of ``reports`` that this run still holds; return those whose cancel was requested.

    A run that failed, timed out or was handed back after its owner asked to cancel it ends
    CANCELLED, never RETRYING or DEAD (the lease rescuer follows the same rule); ``_plan`` reads
    the request for those runs only. ``FOR UPDATE``
    (in id order, as ``lifecycle`` locks) makes a concurrent ``job_cancel`` either
    commit its request before we read it, or wait and then find the job no longer RUNNING.
    """
    if not reports:
        return set()
    with prepared.cursor() as cursor:
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
