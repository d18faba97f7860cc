"""The self-checking event trail: every published outbox event must reach the audit table, or it is published again.

``AuditReconciler`` walks the outbox in publication order (``published_at``, then ``id``) from a
checkpoint kept in ``stint_outbox_reconcile``. An event published more than
``AUDIT_RECONCILE_AFTER_SECONDS`` ago (default 300) and less than the outbox retention ago must
have its audit row (``stint_audit_event.event_id`` is unique). One that does not is copied,
with its event id, into a new unpublished outbox row (its row's other events are not sent
again), so the relay sends it again; the audit consumer's
``ON CONFLICT (event_id) DO NOTHING`` makes a second copy harmless (DESIGN.md, "Rules that keep
it correct"). A re-published event comes back into the walk with its new ``published_at`` and is
checked again. Repairs are counted in ``audit_events_repaired_total`` and logged.

An event is called lost only if the audit consumer has got past it: its newest row was stored
at least ``AUDIT_RECONCILE_AFTER_SECONDS`` after the event was published, or holds an event that
occurred after the missing one was published (so the consumer stored events published later;
finding F5 of docs/chaos-findings.md: a broker lost acknowledged events, the consumer stored
the later ones, and then the traffic stopped). While the consumer is stopped or far behind,
missing events are waiting, not lost, and re-publishing them would only double the topic. The
walk then stops at the first such event and says so in the log.

Why a checkpoint in publication order is safe: ``published_at`` is ``clock_timestamp()`` at the
relay's mark, and the relay's transaction commits at once or is ended (rolled back) by the
server within its lock-hold limit (``OUTBOX_LOCK_HOLD_SECONDS``, default 60 s; the relay's
``idle_in_transaction_session_timeout``); the walk only reads events published more than
``AUDIT_RECONCILE_AFTER_SECONDS`` ago, which must be at least that limit plus
``COMMIT_MARGIN_SECONDS`` (``minimum_reconcile_after_seconds``; config/settings.py enforces it),
so no event becomes visible behind the checkpoint. A shorter grace would not repair a wrong
event (an event that is merely late is only published twice): it could let a late-committing
event escape the check for good.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass

from django.db import connection, transaction

from scheduler import metrics
from scheduler.events import ENTRY_SQL, EVENTS_OF
from scheduler.kafka import event_stream_conf

logger = logging.getLogger(__name__)

BATCH_SIZE = 2_000  # outbox events compared per statement (whole rows: at least one row)
MAX_BATCHES = 10  # statements per run; a run that reaches it continues at the next interval
INTERVAL_SECONDS = 15.0  # at most; a short grace shortens it (a quarter of the grace), so repairs are not late
WAITING_LOG_SECONDS = 300.0  # a stalled walk is logged at most this often
SAMPLE_LOGGED = 10  # events named in a repair's log line
STATE_NAME = "audit"
COMMIT_MARGIN_SECONDS = 10  # a relay's mark statement and its commit take well under a second (5,000 rows)

# The next published rows after the checkpoint, whole, until they hold %(limit)s events, each event
# with whether it is accounted for: its audit row exists, or its job is gone (the job pruner deleted
# the job with its audit rows; its published events stay in the outbox until the outbox retention,
# and publishing them again would only bring back audit rows of a deleted job).
_SCAN_SQL = f"""
    SELECT o.id, e.event_id, e.job_id, e.sequence, e.event_type, o.published_at,
           a.id IS NOT NULL OR NOT EXISTS (SELECT FROM stint_job j WHERE j.id = e.job_id) AS audited
    FROM (
        SELECT id, events, packed_events, published_at FROM (
            SELECT id, events, packed_events, published_at,
                   sum(event_count) OVER (ORDER BY published_at, id) - event_count AS before
            FROM (
                SELECT id, events, packed_events, event_count, published_at
                FROM stint_outbox
                WHERE published_at IS NOT NULL
                  AND published_at >= %(lo)s AND (published_at > %(lo)s OR id > %(lo_id)s)
                  AND published_at < %(hi)s
                ORDER BY published_at, id
                LIMIT %(limit)s
            ) oldest
        ) c
        WHERE before < %(limit)s
    ) o {EVENTS_OF}
    LEFT JOIN stint_audit_event a ON a.event_id = e.event_id
    ORDER BY o.published_at, o.id, e.position
"""  # noqa: S608 - constant SQL

# A repair: a new, unpublished outbox row per walked row with lost events, holding copies of
# exactly those events (same event ids, occurred_at and schema version). The row they came from
# stays published, so its other events are not sent again.
_REPAIR_SQL = f"""
    INSERT INTO stint_outbox (schema_version, occurred_at, event_count, events)
    SELECT o.schema_version, o.occurred_at, count(*), jsonb_agg({ENTRY_SQL} ORDER BY e.position)
    FROM stint_outbox o {EVENTS_OF}
    WHERE o.id = ANY(%(rows)s) AND e.event_id = ANY(%(events)s::uuid[])
    GROUP BY o.id
    ORDER BY o.id
    RETURNING event_count
"""  # noqa: S608 - constant SQL


def minimum_reconcile_after_seconds(*, lock_hold_seconds: int) -> int:
    """Return the shortest allowed ``AUDIT_RECONCILE_AFTER_SECONDS`` for a relay lock hold of ``lock_hold_seconds``.

    See the module docstring: a mark commits within the lock hold of its ``published_at`` or
    not at all, and ``COMMIT_MARGIN_SECONDS`` covers the mark statement and the commit themselves.
    """
    return lock_hold_seconds + COMMIT_MARGIN_SECONDS


@dataclass(frozen=True, slots=True, kw_only=True)
class _Batch:
    scanned: int
    repaired: int
    more: bool  # a full batch was walked without stopping: the next one may be due too


class AuditReconciler:
    """Background service: re-publish published outbox events that never reached the audit table.

    ``run_once`` walks up to ``MAX_BATCHES`` batches of about ``batch_size`` events (whole outbox
    rows) and returns how many events it queued for re-publication. Several schedulers may run
    it: the walk's checkpoint row is locked ``FOR UPDATE SKIP LOCKED``, so one walks while the others skip that run.
    """

    name = "audit_reconciler"
    leader_only = False

    def __init__(
        self,
        *,
        after: dt.timedelta | None = None,
        retention: dt.timedelta | None = None,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        conf = event_stream_conf()
        self.after = after if after is not None else dt.timedelta(seconds=conf.audit_reconcile_after_seconds)
        self.retention = retention if retention is not None else dt.timedelta(days=conf.outbox_retention_days)
        self.batch_size = batch_size
        self.interval_seconds = min(INTERVAL_SECONDS, self.after.total_seconds() / 4)
        self._waiting_logged_at: float | None = None

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Compare the next published events with the audit table; return how many were re-published.

        ``now`` (aware) defaults to the database clock. Raises only database errors.
        """
        repaired = 0
        for _ in range(MAX_BATCHES):
            batch = self._batch(now)
            repaired += batch.repaired
            if not batch.more:
                break
        return repaired

    def _batch(self, now: dt.datetime | None) -> _Batch:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO stint_outbox_reconcile (name, checked_id, repaired_total) VALUES (%s, 0, 0)"
                " ON CONFLICT (name) DO NOTHING",
                [STATE_NAME],
            )
            cursor.execute(
                "SELECT checked_published_at, checked_id, coalesce(%s, now()) FROM stint_outbox_reconcile"
                " WHERE name = %s FOR UPDATE SKIP LOCKED",
                [now, STATE_NAME],
            )
            state = cursor.fetchone()
            if state is None:
                return _Batch(scanned=0, repaired=0, more=False)  # another scheduler is walking
            checked_at, checked_id, clock = state
            hi = clock - self.after
            oldest = clock - self.retention
            if checked_at is None or checked_at < oldest:
                checked_at, checked_id = oldest, 0
            cursor.execute(_SCAN_SQL, {"lo": checked_at, "lo_id": checked_id, "hi": hi, "limit": self.batch_size})
            rows = cursor.fetchall()
            newest_received, newest_occurred = (
                self._newest_received(cursor) if any(not r[6] for r in rows) else (None, None)
            )
            lost: list[tuple] = []
            waiting: tuple | None = None
            index = 0
            while index < len(rows) and waiting is None:
                # One outbox row's events: the checkpoint moves past a row only once all of them are accounted for.
                row_id, published_at = rows[index][0], rows[index][5]
                end = index
                while end < len(rows) and rows[end][0] == row_id:
                    end += 1
                row_lost = []
                for event in rows[index:end]:
                    if not event[6]:
                        past_it = newest_received is not None and (
                            newest_received >= published_at + self.after or newest_occurred > published_at
                        )
                        if not past_it:
                            waiting = event
                            break
                        row_lost.append(event)
                if waiting is None:
                    lost.extend(row_lost)
                    checked_at, checked_id = published_at, row_id
                index = end
            if waiting is None and len(rows) < self.batch_size:
                # Everything published before ``hi`` has been walked (and committed: see the module doc).
                checked_at, checked_id = max(checked_at, hi), 0
            repaired = 0
            if lost:
                cursor.execute(
                    _REPAIR_SQL,
                    {"rows": sorted({r[0] for r in lost}), "events": [str(r[1]) for r in lost]},
                )
                repaired = sum(count for (count,) in cursor.fetchall())
            cursor.execute(
                """
                UPDATE stint_outbox_reconcile
                SET checked_published_at = %s, checked_id = %s, last_run_at = %s,
                    repaired_total = repaired_total + %s,
                    last_repair_at = CASE WHEN %s > 0 THEN %s ELSE last_repair_at END
                WHERE name = %s
                """,
                [checked_at, checked_id, clock, repaired, repaired, clock, STATE_NAME],
            )
        if repaired:
            metrics.audit_events_repaired_total.inc(repaired)
            logger.warning(
                "audit reconciler: %d events published over %d s ago had no audit row; copied for re-publication"
                " (job id, sequence, event type: %s)",
                repaired,
                self.after.total_seconds(),
                ", ".join(f"{r[2]} #{r[3]} {r[4]}" for r in lost[:SAMPLE_LOGGED]),
            )
        if waiting is not None:
            self._log_waiting(waiting, newest_received)
        else:
            self._waiting_logged_at = None
        return _Batch(scanned=len(rows), repaired=repaired, more=waiting is None and len(rows) >= self.batch_size)

    @staticmethod
    def _newest_received(cursor) -> tuple[dt.datetime | None, dt.datetime | None]:
        # The newest row by primary key, not max(received_at): an index probe, not a scan.
        cursor.execute("SELECT received_at, occurred_at FROM stint_audit_event ORDER BY id DESC LIMIT 1")
        row = cursor.fetchone()
        return (row[0], row[1]) if row else (None, None)

    def _log_waiting(self, row: tuple, newest_received: dt.datetime | None) -> None:
        if self._waiting_logged_at is not None and time.monotonic() - self._waiting_logged_at < WAITING_LOG_SECONDS:
            return
        self._waiting_logged_at = time.monotonic()
        logger.warning(
            "audit reconciler: event %s (job %s #%d) published at %s has no audit row, but the audit consumer's"
            " newest row was stored at %s, less than %d s after that, and holds an older event: it is stopped or"
            " behind; waiting for it before re-publishing",
            row[1],
            row[2],
            row[3],
            row[5].isoformat(),
            newest_received.isoformat() if newest_received else "never",
            self.after.total_seconds(),
        )
