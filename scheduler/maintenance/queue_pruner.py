"""Queue retention: deletes queue rows nothing refers to any more, race-free against the writers that use them.

A queue row is created by the first job, schedule or pause that names it (``stint_queue``, River's
``river_queue``), so any USER can add rows by naming new queues; this service (``run_scheduler``)
is their retention rule, as River's ``QueueCleaner`` is. A row goes once, for
``SCHEDULER["QUEUE_RETENTION_DAYS"]`` (default 7; 0 keeps every row), it has not been written
(created, paused, resumed) nor seen in use, and nothing refers to it: no job of any status (each
job's own retention applies first), no pause, no database or settings limit on the queue, no
schedule firing into it, no live worker serving it by name; ``default`` is always kept. A row this
service finds with jobs is marked seen (``updated_at``), so a busy queue is read again only a
retention later.

Race-freedom. A job does not reference its queue row by a foreign key: an enqueue inserts the
row in its own statement with ``ON CONFLICT DO NOTHING`` (``lifecycle.insert_jobs``), which takes
no row lock when the row exists, so a pruner cannot see that job until it commits. Every writer
that makes a queue needed (enqueue, pause or resume, schedule create or edit) first inserts its
row that way in the same transaction, so it holds a lock on ``stint_queue`` until it commits (a
cron fire inserts no row: its schedule keeps the queue).
Each batch therefore, in one transaction (and one pruner at a time, an advisory lock):

1. deletes its candidates, locked ``FOR UPDATE SKIP LOCKED`` (a row a writer locked is skipped);
   from here a writer's insert of one of them waits for this transaction, and when it commits,
   inserts the row anew;
2. waits (at most ``wait_seconds``) until every other transaction that held a write lock on
   ``stint_queue`` at that moment has ended, as ``CREATE INDEX CONCURRENTLY`` waits for older
   writers: those are the only ones that may have passed a deleted row without waiting;
3. checks, with a fresh snapshot, that nothing refers to the deleted names now, and commits.

If a writer waits for this transaction meanwhile, the wait runs out, or the check finds a
reference, the batch is rolled back (nothing deleted; the next run starts again), so a writer is
never failed or left waiting long and no job, schedule or limit is left without its queue row.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from django.db import connection, transaction

from scheduler.conf import conf
from scheduler.models import DEFAULT_QUEUE

logger = logging.getLogger(__name__)

BATCH = 10_000  # queue rows examined, and at most deleted, per batch
MAX_BATCHES = 10  # batches per run
INTERVAL_SECONDS = 300.0  # seconds between runs
WAIT_SECONDS = 5.0  # seconds a batch waits for older writers of stint_queue before it gives up
POLL_SECONDS = 0.02  # seconds between two looks at those writers
LOCK_KEY = "stint.queue_pruner"  # advisory lock: one batch at a time (two would wait for each other)

# Nothing but jobs refers to the row ``q`` (the caller checks jobs): the rule of the module docstring.
_UNREFERENCED = """
    NOT q.paused
    AND q.updated_at < coalesce(%(now)s, now()) - make_interval(days => %(days)s)
    AND q.name <> ALL(%(kept)s)
    AND NOT EXISTS (SELECT 1 FROM stint_flow_limit l WHERE l.scope = 'queue' AND l.name = q.name)
    AND NOT EXISTS (SELECT 1 FROM stint_schedule s WHERE s.job_queue = q.name)
    AND NOT EXISTS (SELECT 1 FROM stint_worker_node w WHERE w.stopped_at IS NULL AND w.queues ? q.name)
"""

# One snapshot, no lock held during the scan: the candidates (oldest first), whether each has a job
# (one pass over stint_job: a hash of the candidates' names), and those with one marked seen.
_CANDIDATES = f"""
    WITH candidates AS MATERIALIZED (
        SELECT q.name FROM stint_queue q
        WHERE {_UNREFERENCED}
        ORDER BY q.updated_at, q.name
        LIMIT %(batch)s
    ),
    used AS MATERIALIZED (
        SELECT DISTINCT j.queue AS name FROM stint_job j WHERE j.queue IN (SELECT name FROM candidates)
    ),
    seen AS (
        UPDATE stint_queue q SET updated_at = coalesce(%(now)s, now()) FROM used WHERE q.name = used.name
    )
    SELECT c.name, u.name IS NOT NULL FROM candidates c LEFT JOIN used u ON u.name = c.name
"""  # noqa: S608 - constant SQL

_DELETE = f"""
    DELETE FROM stint_queue d WHERE d.name IN (
        SELECT q.name FROM stint_queue q
        WHERE q.name = ANY(%(names)s) AND {_UNREFERENCED}
        FOR UPDATE OF q SKIP LOCKED
    )
    RETURNING d.name
"""  # noqa: S608 - constant SQL

# Transactions other than this one holding a write lock on stint_queue (RowExclusiveLock: INSERT,
# UPDATE, DELETE; RowShareLock: SELECT ... FOR UPDATE), by virtual transaction id.
_WRITERS = """
    SELECT DISTINCT virtualtransaction FROM pg_locks
    WHERE locktype = 'relation'
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND relation = 'stint_queue'::regclass
      AND mode IN ('RowExclusiveLock', 'RowShareLock')
      AND pid IS DISTINCT FROM pg_backend_pid()
"""

# Which of ``writers`` still hold their lock, and whether anyone waits for this transaction.
_STILL_WRITING = f"""
    SELECT ARRAY({_WRITERS} AND virtualtransaction = ANY(%(writers)s)),
           EXISTS (SELECT 1 FROM pg_locks w WHERE NOT w.granted AND pg_backend_pid() = ANY(pg_blocking_pids(w.pid)))
"""  # noqa: S608 - constant SQL

_REFERENCED = """
    SELECT EXISTS (SELECT 1 FROM stint_job j WHERE j.queue IN (SELECT unnest(%(names)s::text[])))
        OR EXISTS (SELECT 1 FROM stint_schedule s WHERE s.job_queue = ANY(%(names)s))
        OR EXISTS (SELECT 1 FROM stint_flow_limit l WHERE l.scope = 'queue' AND l.name = ANY(%(names)s))
        OR EXISTS (SELECT 1 FROM stint_worker_node w WHERE w.stopped_at IS NULL AND w.queues ?| %(names)s::text[])
"""


def kept_queue_names() -> list[str]:
    """Return the queue names kept whatever their rows say: ``default`` and the queues limited in code or settings.

    Database limits are checked in SQL; these come from ``flow.limits.effective_limits``.
    """
    from scheduler.flow.limits import effective_limits
    from scheduler.flow.models import LimitScope

    return sorted({DEFAULT_QUEUE} | {lim.name for lim in effective_limits().values() if lim.scope == LimitScope.QUEUE})


class QueuePruner:
    """Delete queue rows nothing has used for ``QUEUE_RETENTION_DAYS`` (module docstring); ``run_once(now) -> rows``."""

    name = "queue_pruner"
    interval_seconds = INTERVAL_SECONDS
    leader_only = False

    def __init__(
        self, *, batch_size: int = BATCH, max_batches: int = MAX_BATCHES, wait_seconds: float = WAIT_SECONDS
    ) -> None:
        """Examine at most ``max_batches`` batches of ``batch_size`` rows per run; wait ``wait_seconds`` per batch."""
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.wait_seconds = wait_seconds

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete unused queue rows older than the retention; return how many.

        ``now`` (aware) defaults to the database clock; it dates the retention and the "seen in
        use" mark. A batch given up (a writer came, the wait ran out, another pruner is at work)
        ends the run: the next one starts again. Raises only database errors.
        """
        days = conf().queue_retention_days
        if days <= 0:
            return 0
        params = {"now": now, "days": days, "kept": kept_queue_names(), "batch": self.batch_size}
        total = 0
        for _ in range(self.max_batches):
            with connection.cursor() as cursor:
                cursor.execute(_CANDIDATES, params)
                rows = cursor.fetchall()
            unused = [name for name, used in rows if not used]
            deleted = self._delete(unused, params) if unused else 0
            if deleted is None:
                break
            total += deleted
            if len(rows) < self.batch_size:
                break
        if total:
            logger.info("queue pruner: deleted %d queues unused for %d days", total, days)
        return total

    def _delete(self, names: list[str], params: dict) -> int | None:
        """Delete ``names`` that are still unused, race-free (module docstring); None when the batch was given up."""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [LOCK_KEY])
            if not cursor.fetchone()[0]:
                return None
            cursor.execute(_DELETE, {**params, "names": names})
            deleted = [row[0] for row in cursor.fetchall()]
            if not deleted:
                return 0
            cursor.execute(_WRITERS)
            writers = [row[0] for row in cursor.fetchall()]
            deadline = time.monotonic() + self.wait_seconds
            while writers:
                cursor.execute(_STILL_WRITING, {"writers": writers})
                writers, waited_for = cursor.fetchone()
                if waited_for or (writers and time.monotonic() > deadline):
                    # A writer of a deleted name waits for this transaction: give the batch up
                    # rather than make it wait. Or an older writer is still open: try next run.
                    logger.debug("queue pruner: batch given up (a writer %s)", "waits" if waited_for else "is open")
                    transaction.set_rollback(True)
                    return None
                if writers:
                    time.sleep(POLL_SECONDS)
            cursor.execute(_REFERENCED, {"names": deleted})
            if cursor.fetchone()[0]:  # an older writer committed a job, schedule or limit for one of them
                transaction.set_rollback(True)
                return None
            return len(deleted)
