"""LeaseRescuer requeues or dead-letters RUNNING jobs whose lease expired; WorkerReaper marks silent workers."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import connection, transaction

from scheduler import lifecycle, metrics
from scheduler.conf import conf
from scheduler.leasing import retry_delay
from scheduler.lifecycle import NOW, NULL, Sql
from scheduler.states import EventType, JobStatus

logger = logging.getLogger(__name__)

BATCH = 500  # jobs per transaction


class LeaseRescuer:
    """Rescue jobs whose worker stopped heartbeating (Oban's Lifeline, River's JobRescuer).

    Each expired RUNNING job gets its attempt marked LOST and moves to RETRYING (event
    JOB_LEASE_EXPIRED, due after backoff), to DEAD when no attempts remain, or to CANCELLED when
    its cancellation had been requested. The move is fenced by the expired lease token, so a
    worker that comes back late cannot overwrite it. Delivery is therefore at-least-once.
    """

    name = "rescuer"
    interval_seconds = 1.0  # seconds
    leader_only = False

    def __init__(self, *, batch: int = BATCH) -> None:
        self.batch = batch

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Rescue every expired lease, ``batch`` at a time; return how many jobs moved."""
        total = 0
        while True:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        """
                        SELECT id, type, lease_token, attempts, attempts_base, max_retries, cancel_requested, queue
                        FROM stint_job
                        WHERE status = 'RUNNING' AND lease_expires_at < coalesce(%s, now())
                        ORDER BY lease_expires_at
                        LIMIT %s
                        FOR UPDATE SKIP LOCKED
                        """,
                        [now, self.batch],
                    )
                    rows = cursor.fetchall()
                if not rows:
                    break
                retry, dead, cancel = [], [], []
                for row in rows:
                    _, _, _, attempts, base, max_retries, cancelled, _ = row
                    if cancelled:
                        cancel.append(row)
                    elif 1 + max_retries - (attempts - base) > 0:
                        retry.append(row)
                    else:
                        dead.append(row)
                common = {"lease_owner": NULL, "lease_token": NULL, "lease_expires_at": NULL}
                error = "lease expired: the worker stopped heartbeating"
                moved = []
                if retry:
                    delays = [retry_delay(r[1], r[3] - r[4]) for r in retry]
                    moved += lifecycle.transition(
                        job_ids=[r[0] for r in retry],
                        to=JobStatus.RETRYING,
                        expected=JobStatus.RUNNING,
                        event=EventType.JOB_LEASE_EXPIRED,
                        assign={
                            **common,
                            "last_error": error,
                            "scheduled_at": Sql("now() + make_interval(secs => v.delay)"),
                        },
                        per_row={"delay": ("float8", delays)},
                        lease_tokens=[r[2] for r in retry],
                        event_payloads=[{"reason": "lease_expired", "backoff_seconds": d} for d in delays],
                    )
                if dead:
                    moved += lifecycle.transition(
                        job_ids=[r[0] for r in dead],
                        to=JobStatus.DEAD,
                        expected=JobStatus.RUNNING,
                        assign={**common, "last_error": error, "finished_at": NOW},
                        lease_tokens=[r[2] for r in dead],
                        event_payloads=[{"reason": "lease_expired"}] * len(dead),
                    )
                if cancel:
                    moved += lifecycle.transition(
                        job_ids=[r[0] for r in cancel],
                        to=JobStatus.CANCELLED,
                        expected=JobStatus.RUNNING,
                        assign={**common, "finished_at": NOW},
                        lease_tokens=[r[2] for r in cancel],
                        event_payloads=[{"reason": "lease_expired"}] * len(cancel),
                    )
                if moved:
                    with connection.cursor() as cursor:
                        cursor.execute(
                            """
                            UPDATE stint_job_attempt a SET status = 'LOST', finished_at = now(), error = %s
                            FROM unnest(%s::uuid[], %s::int[]) AS v(job_id, attempt)
                            WHERE a.job_id = v.job_id AND a.attempt_number = v.attempt AND a.status = 'RUNNING'
                            """,
                            [error, [m.job_id for m in moved], [m.attempts for m in moved]],
                        )
                total += len(moved)
                _count(moved, {r[0]: (r[1], r[7]) for r in rows}, retry, dead)
            if len(rows) < self.batch:
                break
        if total:
            logger.warning("rescued %d jobs with expired leases", total)
            metrics.leases_rescued_total.inc(total)
        return total


def _count(moved: list, labels: dict, retry: list, dead: list) -> None:
    """Count rescued jobs as retried, dead or cancelled, labelled by type and queue."""
    retry_ids = {r[0] for r in retry}
    dead_ids = {r[0] for r in dead}
    for m in moved:
        job_type, queue = labels[m.job_id]
        metrics.jobs_failed_total.labels(job_type, queue).inc()
        if m.job_id in retry_ids:
            metrics.jobs_retried_total.labels(job_type, queue).inc()
        elif m.job_id in dead_ids:
            metrics.jobs_dead_total.labels(job_type, queue).inc()
        else:
            metrics.jobs_cancelled_total.labels(job_type, queue).inc()


class WorkerReaper:
    """Mark WorkerNodes that stopped heartbeating as gone (``stopped_at``)."""

    name = "worker_reaper"
    interval_seconds = 5.0  # seconds
    leader_only = False

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Set ``stopped_at`` on nodes silent for ``WORKER_DEAD_AFTER_SECONDS``; return how many."""
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE stint_worker_node SET stopped_at = coalesce(%s, now())
                WHERE stopped_at IS NULL
                  AND last_heartbeat_at < coalesce(%s, now()) - make_interval(secs => %s)
                """,
                [now, now, conf().worker_dead_after_seconds],
            )
            count = cursor.rowcount
        if count:
            logger.warning("marked %d silent workers as gone", count)
        return count
