"""Rescue: take RUNNING jobs from a worker that died (lease expired, or process seen dying); mark silent workers."""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from django.db import connection, transaction

from scheduler import lifecycle, metrics
from scheduler.conf import conf
from scheduler.leasing import retry_delay
from scheduler.retry import after_failed_attempt, attempts_left
from scheduler.selectors import worker_alive_sql, worker_dead_after_seconds
from scheduler.states import AttemptStatus, JobStatus

logger = logging.getLogger(__name__)

BATCH = 500  # jobs per transaction


# Columns ``rescue`` needs of each job, in this order.
RESCUE_COLUMNS = (
    "id, type, lease_token, attempts, attempts_base, max_retries, cancel_requested, queue, lease_owner, started_at"
)
LOCK_TIMEOUT_MS = 5000  # how long a rescue of a dead process's jobs waits for a row lock


def _lost(
    job_id: uuid.UUID,
    token: uuid.UUID,
    owner: str | None,
    started_at: Any,
    *,
    error: str,
    isolated: bool | None,
    reason: str,
) -> lifecycle.AttemptEnd:
    """The LOST attempt of a job taken from its worker (``rescue``, ``hand_back_unrun``)."""
    return lifecycle.AttemptEnd(
        job_id=job_id,
        lease_token=token,
        status=AttemptStatus.LOST,
        worker=owner or "",
        started_at=started_at,
        error=error,
        isolated=isolated,
        reason=reason,
    )


def rescue(rows: Sequence[tuple], *, error: str, reason: str, isolate: bool = False) -> list[lifecycle.Moved]:
    """Take RUNNING jobs from the worker that held them; return the jobs that moved.

    ``rows`` are ``RESCUE_COLUMNS`` tuples of jobs the caller has locked in its transaction.
    Each job's attempt is marked LOST with ``error``, and the job moves as
    ``retry.after_failed_attempt`` decides: to RETRYING (event JOB_LEASE_EXPIRED, due after its
    backoff), to DEAD when no attempts remain, or to CANCELLED when its cancellation had been
    requested (``lifecycle.rescue_leases``); ``reason`` goes in the event payload. Every move
    is fenced by the lease token read with the row, so a worker that comes back late cannot
    overwrite it, and a rescue racing another rescue or a late outcome moves each job once.
    ``isolate`` marks the jobs ``isolated`` (they were running in a process that died: only an
    isolation slot runs them next). The lost attempt counts against the budget of 1 +
    max_retries (DESIGN.md: RUNNING -> RETRYING/DEAD when the lease expired). Used by the
    ``LeaseRescuer`` and by the ``run_workers`` supervisor when a worker process dies.
    """
    ends, next_statuses, delays = [], [], []
    for job_id, job_type, token, attempts, base, max_retries, cancelled, _queue, owner, started_at in rows:
        left = attempts_left(attempts=attempts, attempts_base=base, max_retries=max_retries)
        to = after_failed_attempt(attempts_left=left, cancel_requested=cancelled)
        ends.append(
            _lost(job_id, token, owner, started_at, error=error, isolated=True if isolate else None, reason=reason)
        )
        next_statuses.append(to)
        delays.append(retry_delay(job_type, attempts - base) if to == JobStatus.RETRYING else 0.0)
    moved = lifecycle.rescue_leases(ends, next_statuses=next_statuses, delays=delays)
    _count(moved, {r[0]: (r[1], r[7]) for r in rows}, dict(zip([r[0] for r in rows], next_statuses, strict=True)))
    return moved


def rescue_held_by(*, worker_id: str, error: str, isolate: bool, unbegun: Collection[uuid.UUID] = frozenset()) -> int:
    """Rescue (see ``rescue``) every RUNNING job whose lease ``worker_id`` holds; return how many moved.

    For a worker process known to be dead (its supervisor saw it exit), so its jobs need not
    wait for their leases to expire. ``unbegun``: ids of jobs the process held but had not begun
    (its ``waiting_board``): each of those is handed back instead (``hand_back_unrun``), unless
    its cancellation was requested. Locks the rows in id order, waiting at most
    ``LOCK_TIMEOUT_MS`` for a lock the dead process's own transaction may still hold while
    PostgreSQL notices the closed connection; raises the database's error then (the caller
    tries again). One transaction.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [str(LOCK_TIMEOUT_MS)])
            cursor.execute(
                f"""
                SELECT {RESCUE_COLUMNS} FROM stint_job
                WHERE status = 'RUNNING' AND lease_owner = %s
                ORDER BY id
                FOR UPDATE
                """,  # noqa: S608 - a constant column list
                [worker_id],
            )
            rows = cursor.fetchall()
        back, lost = [], []
        for row in rows:  # RESCUE_COLUMNS: [0] the id, [6] cancel_requested
            (back if row[0] in unbegun and not row[6] else lost).append(row)
        moved = rescue(lost, error=error, reason="worker_died", isolate=isolate) if lost else []
        handed = hand_back_unrun(back) if back else []
    if moved:
        metrics.leases_rescued_total.inc(len(moved))
    return len(moved) + len(handed)


# The error of a job its dead worker process had claimed but not begun (``hand_back_unrun``).
UNRUN_ERROR = "its worker process died before a slot began it, so it was handed back unrun"


def hand_back_unrun(rows: Sequence[tuple]) -> list[lifecycle.Moved]:
    """Hand back jobs a dead worker process held but never began; return the jobs that moved.

    ``rows`` are ``RESCUE_COLUMNS`` tuples the caller has locked. Each job moves as a worker's
    own hand-back does (``lifecycle.hand_back``: RETRYING due now, a LOST attempt row that does
    not count against the budget, JOB_RETRIED with ``UNRUN_ERROR``), fenced by the lease token
    read with the row; its ``isolated`` flag is left as it was, since it never ran in the
    process that died. Logged (INFO) with how many.
    """
    ends = [
        _lost(job_id, token, owner, started_at, error=UNRUN_ERROR, isolated=None, reason="worker_died")
        for job_id, _type, token, _attempts, _base, _max, _cancelled, _queue, owner, started_at in rows
    ]
    moved = lifecycle.hand_back(ends)
    if moved:
        logger.info(
            "handed back %d jobs a dead worker process had claimed but not begun (%s)",
            len(moved),
            rows[0][8],
            extra={"worker": rows[0][8]},
        )
    return moved


class LeaseRescuer:
    """Rescue jobs whose worker stopped heartbeating (Oban's Lifeline, River's JobRescuer).

    Each expired RUNNING job is taken over by ``rescue``: attempt LOST, then RETRYING, DEAD or
    CANCELLED, fenced by the expired lease token. Delivery is therefore at-least-once. Its
    ``isolated`` flag is left as it was: an expired lease says the worker went silent (a host
    lost, a process killed from outside), not that the job killed it.

    A database that stalls (frozen by SIGSTOP, a paused VM or stalled storage) holds the workers'
    heartbeats and this query alike while its clock runs on: when it answers again, every lease
    it held past its end looks expired, though its workers are alive. So a run whose query
    waited ``stall_seconds`` or more rescues nothing, and the rescuer holds off for one and a
    half heartbeat intervals, time for every live worker to renew its leases, even when that
    query found no expired lease (another scheduler's rescuer, holding off, had them locked,
    and a heartbeat skips locked rows); a worker silent after that is rescued as before. Once
    per stall: the runs after the hold rescue even if their queries are slow too (a database
    under load, not frozen, would otherwise hold rescue off for ever), until a query answers
    within ``stall_seconds`` again. Rescue of a dead host is delayed by at most that much after
    a stall.
    """

    name = "rescuer"
    interval_seconds = 1.0  # seconds
    leader_only = False
    stall_seconds = 2.0  # a rescue query that waited this long met a stalled database

    def __init__(self, *, batch: int = BATCH) -> None:
        self.batch = batch
        self._hold_until = 0.0  # monotonic: no rescue before this (after a stall)
        self._stall_held = False  # held off for the current stall already

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Rescue every expired lease, ``batch`` at a time; return how many jobs moved (0 while holding off)."""
        if time.monotonic() < self._hold_until:
            return 0
        total = 0
        while True:
            started = time.monotonic()
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"""
                        SELECT {RESCUE_COLUMNS}
                        FROM stint_job
                        WHERE status = 'RUNNING' AND lease_expires_at < coalesce(%s, now())
                        ORDER BY lease_expires_at
                        LIMIT %s
                        FOR UPDATE SKIP LOCKED
                        """,  # noqa: S608 - a constant column list
                        [now, self.batch],
                    )
                    rows = cursor.fetchall()
                waited = time.monotonic() - started
                if waited < self.stall_seconds:
                    self._stall_held = False  # a prompt answer: the next stall holds off again
                elif not self._stall_held:
                    # Rows or none: another scheduler's rescuer may hold the expired rows locked while it
                    # holds off (SKIP LOCKED gave us none), and this one's next query would be prompt.
                    self._stall_held = True  # once per stall: a database that stays slow still gets its rescues
                    hold = 1.5 * conf().heartbeat_seconds
                    self._hold_until = time.monotonic() + hold
                    logger.warning(
                        "rescue query waited %.1f s for the database: rescuing no lease for %.1f s, "
                        "while live workers heartbeat",
                        waited,
                        hold,
                    )
                    break  # nothing changed; the rows' locks go with the transaction
                if not rows:
                    break
                total += len(rescue(rows, error=EXPIRED_ERROR, reason="lease_expired"))
            if len(rows) < self.batch:
                break
        if total:
            logger.warning("rescued %d jobs with expired leases", total)
            metrics.leases_rescued_total.inc(total)
        return total


EXPIRED_ERROR = "lease expired: the worker stopped heartbeating"


def _count(moved: list, labels: dict, next_statuses: dict) -> None:
    """Count rescued jobs as retried, dead or cancelled, labelled by type and queue."""
    for m in moved:
        job_type, queue = labels[m.job_id]
        metrics.jobs_failed_total.labels(job_type, queue).inc()
        {
            JobStatus.RETRYING: metrics.jobs_retried_total,
            JobStatus.DEAD: metrics.jobs_dead_total,
            JobStatus.CANCELLED: metrics.jobs_cancelled_total,
        }[next_statuses[m.job_id]].labels(job_type, queue).inc()


class WorkerReaper:
    """Mark WorkerNodes that stopped heartbeating as gone (``stopped_at``)."""

    name = "worker_reaper"
    interval_seconds = 5.0  # seconds
    leader_only = False

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Set ``stopped_at`` on nodes silent for ``WORKER_DEAD_AFTER_SECONDS``; return how many."""
        with connection.cursor() as cursor:
            silent = worker_alive_sql(now="coalesce(%(now)s, now())")
            cursor.execute(
                "UPDATE stint_worker_node SET stopped_at = coalesce(%(now)s, now())"  # noqa: S608 - constant SQL
                f" WHERE stopped_at IS NULL AND NOT {silent}",
                {"now": now, "dead_after": worker_dead_after_seconds()},
            )
            count = cursor.rowcount
        if count:
            logger.warning("marked %d silent workers as gone", count)
        return count
