"""DuePromoter: moves due SCHEDULED and RETRYING jobs to QUEUED in batches, with one NOTIFY per batch."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import connection, transaction

from scheduler import lifecycle
from scheduler.notify import notify_queued
from scheduler.states import JobStatus

logger = logging.getLogger(__name__)

BATCH = 1000  # jobs per transaction
_NEXT_DUE_SQL = """
    SELECT extract(epoch FROM min(scheduled_at) - clock_timestamp())
    FROM stint_job WHERE status IN ('SCHEDULED', 'RETRYING')
"""


class DuePromoter:
    """Promote jobs whose ``scheduled_at`` has come (database clock unless ``now`` is given)."""

    name = "promoter"
    interval_seconds = 0.2  # seconds
    leader_only = False

    def __init__(self, *, batch: int = BATCH) -> None:
        self.batch = batch
        # Seconds from the end of the last idle run until the earliest SCHEDULED/RETRYING job falls
        # due (None: none waits, or the run promoted something): the loop wakes then
        # (``SchedulerLoop``), so a delayed job is promoted within milliseconds of its due time
        # instead of at the next idle poll (up to a second later).
        self.next_due_seconds: float | None = None

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Promote every due job, ``batch`` at a time; return how many moved.

        When nothing was due (and ``now`` is the database clock), also sets ``next_due_seconds``.

        Rows are taken with ``FOR UPDATE SKIP LOCKED`` so several schedulers split the work and
        none promotes a job twice; the transition's status guard is the final word.
        """
        total = 0
        self.next_due_seconds = None
        while True:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        """
                        SELECT id, status, queue FROM stint_job
                        WHERE status IN ('SCHEDULED', 'RETRYING') AND scheduled_at <= coalesce(%s, now())
                        ORDER BY scheduled_at
                        LIMIT %s
                        FOR UPDATE SKIP LOCKED
                        """,
                        [now, self.batch],
                    )
                    rows = cursor.fetchall()
                if not rows:
                    break
                queues: set[str] = set()
                for source in (JobStatus.SCHEDULED, JobStatus.RETRYING):
                    ids = [r[0] for r in rows if r[1] == source]
                    moved = lifecycle.promote(ids, source=source)
                    won = {m.job_id for m in moved}
                    queues.update(r[2] for r in rows if r[0] in won)
                    total += len(won)
                notify_queued(queues)
            if len(rows) < self.batch:
                break
        if total:
            logger.info("promoted %d due jobs", total)
        elif now is None:
            with connection.cursor() as cursor:
                # The first entry of job_due_scan; clock_timestamp(): the statement's own time.
                cursor.execute(_NEXT_DUE_SQL)
                row = cursor.fetchone()
            self.next_due_seconds = float(row[0]) if row and row[0] is not None else None
        return total
