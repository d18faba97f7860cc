"""Pruner: deletes finished jobs by their retention, expired keys, tokens, sessions, gone workers, old operator actions.

Retention of finished jobs (``SCHEDULER["RETENTION_<STATUS>_DAYS"]``, 0 keeps forever) is
applied per status in bounded batches, each one statement in its own short transaction: it
locks up to ``JOB_BATCH_SIZE`` of the oldest expired jobs of one status (``FOR UPDATE SKIP
LOCKED``, so concurrent pruners and a racing retry or recover never collide) and deletes them
together with everything keyed by them: attempts, idempotency records and audit events (the
result lives in the job row).
Their published outbox events stay until the outbox pruner deletes their rows by age (an outbox
row holds the events of one statement, often of many jobs); the event reconciler (which
re-publishes a published outbox event that has no audit row) skips events whose job is gone, so
it never resurrects a pruned trail.

A job is kept, whatever its age, while something still needs it:

- it is the latest fire of its schedule: the cron firer's ``overlap_policy = skip`` check reads
  the status of each schedule's latest fire (``CronFirer._busy``), so deleting it would let the
  check fall back on an older, possibly unfinished, fire;
- an unexpired ``IdempotencyRecord`` names it: a replay of that key must return the job;
- it has an unpublished outbox event: the event reaches Kafka and the audit trail first.

Audit rows whose job is gone (DATA_CLEANUP deleted the job, which leaves its trail for its owner
to read, or the events were never a Stint job's) have the same retention as their job would have
had: a trail goes once its last event (highest sequence) was received longer ago than the
retention of the status that event names, and a trail that does not end in a finished status
(foreign events, a job deleted before it finished) is kept for the longest retention. A status
kept forever (0) keeps such trails forever. They are found by a sweep over the audit table in
primary-key order, ``AUDIT_SCAN_BATCH`` rows a statement, that goes on where the previous run
stopped and starts over at the end, so every row is looked at again, whatever the table holds;
a row another session holds locked is skipped (``SKIP LOCKED``) and looked at in the next sweep.
Rows of a trail left without its last event (its last event arrived before the others, or was
deleted while another row was locked) are judged by what is left: they go at the latest after
the longest retention.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from django.db import connection, transaction

from scheduler import metrics
from scheduler.conf import conf
from scheduler.events import EVENTS_OF
from scheduler.idempotency import idempotency_prune
from scheduler.states import JobStatus

logger = logging.getLogger(__name__)

WORKER_RETENTION_SECONDS = 7 * 86400  # seconds a stopped worker node is kept for operators
JOB_BATCH_SIZE = 500  # jobs deleted per statement (each with its ~10-20 dependent rows)
JOB_MAX_BATCHES = 100  # statements per status per run: at most 50,000 jobs of a status a minute

# The candidates are read from the partial index job_finished_scan (status, finished_at) in
# finished_at order; every dependent table is reached by an index on its job id. A job with an
# unpublished event waits (``unpublished``: the job ids in the unpublished outbox rows old enough
# to hold a doomed job's events, whose last event occurred at its finished_at; read once through
# outbox_unpublished, a set that is empty while the relay keeps up). Its published events are not
# deleted here: an outbox row holds the events of many jobs, and the outbox pruner deletes whole
# rows by age (``OUTBOX_RETENTION_DAYS``); the audit reconciler skips events of deleted jobs.
_PRUNE_JOBS = f"""
    WITH unpublished AS MATERIALIZED (
        SELECT DISTINCT e.job_id
        FROM stint_outbox o {EVENTS_OF}
        WHERE o.published_at IS NULL
          AND o.occurred_at < coalesce(%(now)s, now()) - make_interval(days => %(days)s)
    ),
    doomed AS (
        SELECT j.id FROM stint_job j
        WHERE j.status = %(status)s
          AND j.finished_at < coalesce(%(now)s, now()) - make_interval(days => %(days)s)
          AND (j.schedule_id IS NULL OR EXISTS (
                SELECT 1 FROM stint_job later
                WHERE later.schedule_id = j.schedule_id AND later.fire_time > j.fire_time))
          AND NOT EXISTS (
                SELECT 1 FROM stint_idempotency i
                WHERE i.job_id = j.id AND i.expires_at > coalesce(%(now)s, now()))
          AND NOT EXISTS (SELECT 1 FROM unpublished u WHERE u.job_id = j.id)
        ORDER BY j.finished_at
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ),
    attempts AS (DELETE FROM stint_job_attempt a USING doomed d WHERE a.job_id = d.id),
    keys AS (DELETE FROM stint_idempotency i USING doomed d WHERE i.job_id = d.id),
    audit AS (DELETE FROM stint_audit_event e USING doomed d WHERE e.job_id = d.id)
    DELETE FROM stint_job j USING doomed d WHERE j.id = d.id
"""  # noqa: S608 - constant SQL


AUDIT_SCAN_BATCH = 5_000  # audit rows the orphan sweep reads per statement
AUDIT_SCAN_MAX_BATCHES = 10  # statements per run: 50,000 rows a minute

# One step of the orphan sweep (module docstring): read the ``limit`` audit rows after id
# ``after`` (primary key), keep the job ids among them whose job does not exist, look up each such
# trail's last event (index audit_job_sequence, backwards), and delete the rows read whose trail
# expired: its last event received before ``now`` minus the days of its status (``days``, a JSON
# object {status: days}; any other status ``other_days``; 0 keeps). Returns the last id read, how
# many rows were read and how many were deleted.
_PRUNE_ORPHANED_AUDIT = """
    WITH seen AS MATERIALIZED (
        SELECT a.id, a.job_id FROM stint_audit_event a
        WHERE a.id > %(after)s ORDER BY a.id LIMIT %(limit)s
    ),
    orphaned AS (
        SELECT DISTINCT s.job_id FROM seen s
        WHERE NOT EXISTS (SELECT 1 FROM stint_job j WHERE j.id = s.job_id)
    ),
    expired AS (
        SELECT o.job_id FROM orphaned o
        CROSS JOIN LATERAL (
            SELECT a.to_status, a.received_at FROM stint_audit_event a
            WHERE a.job_id = o.job_id ORDER BY a.sequence DESC LIMIT 1
        ) last
        CROSS JOIN LATERAL (
            SELECT coalesce((%(days)s::jsonb ->> last.to_status)::int, %(other_days)s) AS days
        ) kept
        WHERE kept.days > 0
          AND last.received_at < coalesce(%(now)s, now()) - make_interval(days => kept.days)
    ),
    doomed AS (
        SELECT a.id FROM stint_audit_event a
        WHERE a.id IN (SELECT s.id FROM seen s JOIN expired x ON x.job_id = s.job_id)
        FOR UPDATE SKIP LOCKED
    ),
    deleted AS (DELETE FROM stint_audit_event a USING doomed d WHERE a.id = d.id RETURNING 1)
    SELECT (SELECT max(id) FROM seen), (SELECT count(*) FROM seen), (SELECT count(*) FROM deleted)
"""

AUTH_BATCH_SIZE = 10_000  # expired tokens, blacklist entries and sessions deleted per statement per run
_PRUNE_BLACKLISTED = """
    DELETE FROM token_blacklist_blacklistedtoken WHERE id IN (
        SELECT b.id FROM token_blacklist_blacklistedtoken b
        JOIN token_blacklist_outstandingtoken t ON t.id = b.token_id
        WHERE t.expires_at < coalesce(%(now)s, now()) LIMIT %(limit)s)
"""
_PRUNE_OUTSTANDING = """
    DELETE FROM token_blacklist_outstandingtoken WHERE id IN (
        SELECT t.id FROM token_blacklist_outstandingtoken t
        WHERE t.expires_at < coalesce(%(now)s, now())
          AND NOT EXISTS (SELECT 1 FROM token_blacklist_blacklistedtoken b WHERE b.token_id = t.id)
        LIMIT %(limit)s)
"""
_PRUNE_SESSIONS = """
    DELETE FROM django_session WHERE session_key IN (
        SELECT session_key FROM django_session WHERE expire_date < coalesce(%(now)s, now()) LIMIT %(limit)s)
"""


ACTION_LOG_BATCH_SIZE = 10_000  # operator action history entries deleted per statement
ACTION_LOG_MAX_BATCHES = 10  # statements per run: at most 100,000 entries a minute
# The expired among the ``limit`` oldest entries (primary-key order, read from its index, so a run
# reads at most ``limit`` rows a statement however large the table is). Entries are written in
# time order (Django's action_time is the writing process's clock): one out of order by clock skew
# between web hosts is kept until those before it are gone, seconds later.
_PRUNE_ACTION_LOG = """
    DELETE FROM django_admin_log WHERE id IN (
        SELECT oldest.id FROM (SELECT id, action_time FROM django_admin_log ORDER BY id LIMIT %(limit)s) oldest
        WHERE oldest.action_time < coalesce(%(now)s, now()) - make_interval(days => %(days)s))
"""


def action_log_prune(*, days: int, now: dt.datetime | None = None, limit: int = ACTION_LOG_BATCH_SIZE) -> int:
    """Delete the operator action entries older than ``days`` days among the ``limit`` oldest; return how many.

    The history is ``django.contrib.admin``'s ``LogEntry`` (``scheduler.action_log``), Django's own
    admin entries included. ``now`` defaults to the database clock. One statement in its own short
    transaction. Raises ``ValueError`` for ``days`` below 1 (0 means "keep": the caller skips it).
    """
    if days < 1:
        raise ValueError("days must be at least 1")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_PRUNE_ACTION_LOG, {"days": days, "now": now, "limit": limit})
        return cursor.rowcount


def retention_days() -> dict[str, int]:
    """Return {finished status: days a job of it is kept} from the settings; 0 means forever."""
    settings = conf()
    return {
        JobStatus.SUCCESS: settings.retention_success_days,
        JobStatus.CANCELLED: settings.retention_cancelled_days,
        JobStatus.FAILED: settings.retention_failed_days,
        JobStatus.DEAD: settings.retention_dead_days,
    }


def jobs_prune(*, status: str, days: int, now: dt.datetime | None = None, limit: int = JOB_BATCH_SIZE) -> int:
    """Delete up to ``limit`` ``status`` jobs finished more than ``days`` days before ``now``; return how many.

    ``now`` defaults to the database clock. Deletes each job's attempts, result, idempotency
    records, outbox rows and audit events in the same statement (module docstring: what is
    never deleted, and why). Raises ``ValueError`` for ``days`` below 1 (0 means "keep": the
    caller skips the status).
    """
    if days < 1:
        raise ValueError("days must be at least 1")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_PRUNE_JOBS, {"status": str(status), "days": days, "now": now, "limit": limit})
        return cursor.rowcount


def audit_orphans_prune(
    *, after: int, now: dt.datetime | None = None, limit: int = AUDIT_SCAN_BATCH
) -> tuple[int, int]:
    """Delete the expired orphaned audit rows among the ``limit`` rows after id ``after``; return (deleted, next).

    One step of the orphan sweep (module docstring: which trails expire), one statement in its own
    short transaction. ``next`` is the last audit row id read, or 0 when fewer than ``limit`` rows
    were left (the sweep reached the end and starts over). ``now`` defaults to the database clock.
    Rows another session holds locked are skipped. Raises only database errors.
    """
    days = retention_days()
    finished = {str(status): kept for status, kept in days.items()}
    other_days = 0 if 0 in days.values() else max(days.values())  # could have ended in any finished status
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _PRUNE_ORPHANED_AUDIT,
            {"after": after, "limit": limit, "days": json.dumps(finished), "other_days": other_days, "now": now},
        )
        last, read, deleted = cursor.fetchone()
    return deleted, (last if read >= limit else 0)


class Pruner:
    """Delete rows that have outlived their purpose, in bounded batches."""

    name = "pruner"
    interval_seconds = 60.0  # seconds
    leader_only = False

    def __init__(
        self,
        *,
        batch_size: int = JOB_BATCH_SIZE,
        max_batches: int = JOB_MAX_BATCHES,
        audit_batch_size: int = AUDIT_SCAN_BATCH,
        audit_max_batches: int = AUDIT_SCAN_MAX_BATCHES,
        action_log_batch_size: int = ACTION_LOG_BATCH_SIZE,
        action_log_max_batches: int = ACTION_LOG_MAX_BATCHES,
    ) -> None:
        """Bound each run: jobs in ``max_batches`` statements of ``batch_size`` per status, audit rows in
        ``audit_max_batches`` statements each reading ``audit_batch_size`` of them, operator action
        entries in ``action_log_max_batches`` statements of ``action_log_batch_size``.
        """
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.audit_batch_size = audit_batch_size
        self.audit_max_batches = audit_max_batches
        self.action_log_batch_size = action_log_batch_size
        self.action_log_max_batches = action_log_max_batches
        self._audit_after = 0  # the orphan sweep's position: the last audit row id it read

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Prune expired finished jobs, orphaned audit rows, idempotency keys, refresh tokens, sessions, old workers
        and operator action entries (``OPERATOR_LOG_RETENTION_DAYS``).

        Returns how many rows were deleted; ``now`` defaults to the database clock. Jobs are
        counted once each (not their dependent rows) and in ``jobs_pruned_total{status}``.
        """
        total = self._prune_jobs(now)
        total += idempotency_prune(now=now)
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM stint_worker_node WHERE stopped_at < coalesce(%s, now()) - make_interval(secs => %s)",
                [now, WORKER_RETENTION_SECONDS],
            )
            total += cursor.rowcount
            # Every login and refresh records a token (simplejwt's blacklist app) and every page
            # sign-in a session: once expired they serve nothing (an expired token is refused
            # whether blacklisted or not), and nothing else ever deletes them.
            for sql in (_PRUNE_BLACKLISTED, _PRUNE_OUTSTANDING, _PRUNE_SESSIONS):
                cursor.execute(sql, {"now": now, "limit": AUTH_BATCH_SIZE})
                total += cursor.rowcount
        total += self._prune_orphaned_audit(now)
        total += self._prune_action_log(now)
        if total:
            logger.info("pruned %d rows", total)
        return total

    def _prune_action_log(self, now: dt.datetime | None) -> int:
        days = conf().operator_log_retention_days
        if not days:
            return 0
        total = 0
        for _ in range(self.action_log_max_batches):
            deleted = action_log_prune(days=days, now=now, limit=self.action_log_batch_size)
            total += deleted
            if deleted < self.action_log_batch_size:
                break
        if total:
            logger.info("pruned %d operator action entries older than %d days", total, days)
        return total

    def _prune_orphaned_audit(self, now: dt.datetime | None) -> int:
        if not any(retention_days().values()):
            return 0  # every status is kept forever: so is every trail
        total = 0
        for _ in range(self.audit_max_batches):
            deleted, self._audit_after = audit_orphans_prune(
                after=self._audit_after, now=now, limit=self.audit_batch_size
            )
            total += deleted
            if not self._audit_after:
                break
        if total:
            logger.info("pruned %d audit events whose job is gone", total)
        return total

    def _prune_jobs(self, now: dt.datetime | None) -> int:
        total = 0
        for status, days in retention_days().items():
            if not days:
                continue
            deleted = 0
            for _ in range(self.max_batches):
                batch = jobs_prune(status=status, days=days, now=now, limit=self.batch_size)
                deleted += batch
                if batch < self.batch_size:
                    break
            if deleted:
                metrics.jobs_pruned_total.labels(status=str(status)).inc(deleted)
                logger.info("pruned %d %s jobs finished over %d days ago", deleted, status, days)
            total += deleted
        return total
