"""The cron firer: the leader materializes due schedule fires as jobs, fenced by its leadership token."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connection, transaction

from core.db_clock import db_now
from core.dberrors import db_error_is_transient
from core.stored_json import unreadable_why
from scheduler import lifecycle, metrics, tracing
from scheduler.cron import FirePlan, plan_fires, spec_of
from scheduler.exceptions import InvalidSchedule
from scheduler.leadership import fence_check
from scheduler.lifecycle import NewJob
from scheduler.notify import notify_queued
from scheduler.schedules import schedule_job
from scheduler.states import FINISHED, JobStatus

if TYPE_CHECKING:
    from scheduler.leadership import Leadership

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.2  # seconds between runs (an idle run is one index probe): the most a fire waits to start
BATCH_SIZE = 2000  # schedules locked and fired per transaction
# A fire due longer ago than this counts as missed even under a continuous leader (a stuck tick,
# an outage of the database); fires due before the current leader's term began always do.
MISFIRE_GRACE_SECONDS = 60  # seconds
CATCH_UP_LIMIT = 100  # missed fires a catch_up schedule materializes after one outage

_SCAN = """
    SELECT id, owner_id, name, cron, interval_seconds, timezone, job_type, job_payload::text, job_priority,
           job_queue, job_max_retries, job_timeout_seconds, misfire_policy, overlap_policy, next_fire_at
    FROM stint_schedule
    WHERE enabled = true AND next_fire_at <= %s
    ORDER BY next_fire_at
    LIMIT %s
    FOR NO KEY UPDATE SKIP LOCKED
"""
# The latest fire of each schedule, one index probe each (unique index on (schedule_id, fire_time)).
_LATEST_STATUS = """
    SELECT s.id, j.status
    FROM unnest(%s::bigint[]) AS s(id)
    CROSS JOIN LATERAL (
        SELECT status FROM stint_job
        WHERE schedule_id = s.id AND fire_time IS NOT NULL
        ORDER BY fire_time DESC
        LIMIT 1
    ) AS j
"""
# Schedules sharing a timetable share (next_fire_at, last_fired_at): send each distinct pair once
# and a small slot number per row, which keeps the statement short for thousands of rows.
_ADVANCE = """
    UPDATE stint_schedule AS s
    SET next_fire_at = (%s::timestamptz[])[v.slot],
        last_fired_at = greatest(s.last_fired_at, (%s::timestamptz[])[v.slot])
    FROM unnest(%s::bigint[], %s::int[]) AS v(id, slot)
    WHERE s.id = v.id
"""


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """The columns of a due schedule the firer reads, in ``_SCAN``'s order (``job_payload`` as JSON text)."""

    id: int
    owner_id: int
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    job_type: str
    job_payload: str
    job_priority: int
    job_queue: str
    job_max_retries: int
    job_timeout_seconds: int
    misfire_policy: str
    overlap_policy: str
    next_fire_at: dt.datetime


def _end_if_idle(*, seconds: float) -> None:
    """Have the server end this session if it sits idle for ``seconds`` inside the current transaction.

    ``SET LOCAL idle_in_transaction_session_timeout`` (PostgreSQL docs, "Client Connection
    Defaults"), for this transaction only. A fire transaction waits on nothing but the database,
    so it is idle for milliseconds between statements; a leader stopped between two of them
    (SIGSTOP, a stalled host) holds the fence row and its schedules' rows, and its successor,
    leading one lock TTL later, would wait for the session-wide bound instead
    (``STINT_DB_IDLE_IN_TRANSACTION_SECONDS``, 60 s by default). With ``seconds`` the lock TTL,
    the server rolls the frozen term's transaction back as its lock expires.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, true)", [str(max(1, round(seconds * 1000)))]
        )


class CronFirer:
    """Fire due schedules while ``leadership`` is held (a ``leader_only`` service of ``run_scheduler``).

    Each batch is one transaction, which the server ends if it is left idle for a lock TTL
    (``_end_if_idle``): lock up to ``batch_size`` due enabled schedules with ``FOR NO
    KEY UPDATE SKIP LOCKED`` (one scan of the partial index on ``next_fire_at``), check the
    fencing token (``fence_check``: a stale token writes nothing), plan each one's fires
    (``cron.plan_fires`` with the misfire policy; overlap ``skip`` fires nothing while the latest
    fire's job is unfinished, and at most one fire per run), insert the jobs with
    ``lifecycle.create_jobs`` (the unique (schedule, fire_time) skips any already there), advance
    ``next_fire_at`` and ``last_fired_at``, and send one NOTIFY. Fires due before the unbroken
    leadership this term continues began (``Leadership.leading_since``: a handover within half a
    lock TTL is no break), or more than ``misfire_grace_seconds`` ago, count as missed.
    """

    name = "cron_firer"
    leader_only = True

    def __init__(
        self,
        *,
        leadership: Leadership,
        interval_seconds: float = TICK_SECONDS,
        batch_size: int = BATCH_SIZE,
        misfire_grace_seconds: float = MISFIRE_GRACE_SECONDS,
        catch_up_limit: int = CATCH_UP_LIMIT,
    ) -> None:
        """Fire for ``leadership``; the other arguments are the tunables above."""
        self.leadership = leadership
        self.interval_seconds = interval_seconds
        self.batch_size = batch_size
        self.misfire_grace = dt.timedelta(seconds=misfire_grace_seconds)
        self.catch_up_limit = catch_up_limit

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Fire every schedule due at ``now`` (default: the database clock); return how many jobs were created.

        Returns 0 without touching anything unless this process leads; when the database holds a
        newer fencing token, ends the leadership term (``Leadership.fenced_out``) and stops.
        """
        lead = self.leadership
        token = lead.token
        if token is None or not lead.is_leader:
            return 0
        if now is None:
            now = db_now()
        since = lead.leading_since or now
        missed_before = max(since, now - self.misfire_grace)
        created = advanced = 0
        fenced = False
        while not fenced and lead.is_leader:  # a term past its local TTL stops between batches
            with transaction.atomic():
                _end_if_idle(seconds=lead.ttl_seconds)
                rows = self._lock_due(now)
                if not rows:
                    break
                # The fence is checked only when there is something to write, in the same transaction.
                fenced = not fence_check(role=lead.role, token=token, holder=lead.holder)
                if not fenced:
                    created += self._fire_isolating(rows, now=now, missed_before=missed_before)
                    advanced += len(rows)
            if len(rows) < self.batch_size:
                break
        if fenced:
            lead.fenced_out()
        if created:
            metrics.cron_fires_total.inc(created)
            logger.info("cron: created %d jobs for %d due schedules", created, advanced, extra={"token": token})
        return created

    def _lock_due(self, now: dt.datetime) -> list[DueSchedule]:
        with connection.cursor() as cursor:
            cursor.execute(_SCAN, [now, self.batch_size])
            return [DueSchedule(*row) for row in cursor.fetchall()]

    def _plan(self, row: DueSchedule, *, now: dt.datetime, missed_before: dt.datetime, memo: dict) -> FirePlan:
        key = (row.cron, row.interval_seconds, row.timezone, row.next_fire_at, row.misfire_policy)
        plan = memo.get(key)
        if plan is None:
            try:
                spec = spec_of(
                    cron=row.cron,
                    interval_seconds=row.interval_seconds,
                    timezone=row.timezone,
                    anchor=row.next_fire_at,
                    stored=True,
                )
                plan = plan_fires(
                    spec,
                    next_fire_at=row.next_fire_at,
                    now=now,
                    missed_before=missed_before,
                    misfire_policy=row.misfire_policy,
                    catch_up_limit=self.catch_up_limit,
                )
            except (InvalidSchedule, KeyError, ValueError):
                # A row the API would refuse (edited by hand): stop it rather than fail every tick.
                logger.exception("cron: schedule %s cannot be planned; it will not fire", row.id)
                plan = FirePlan(fires=(), dropped=0, next_fire_at=None)
            memo[key] = plan
        return plan

    def _fire_isolating(self, rows: Sequence[DueSchedule], *, now: dt.datetime, missed_before: dt.datetime) -> int:
        """Fire ``rows`` (``_fire``) in a savepoint; after a refusal of their data, each one alone.

        The schedule table's checks are looser than the job table's (a template edited by hand with
        a timeout of 0 or 11 retries can be stored), and one such row failed the whole batch's insert
        on every tick: no schedule fired. So did a template payload edited by hand that ``jsonb``
        holds but Python's json cannot read (a number past 4,300 digits: ValueError; nesting past
        the recursion limit: RecursionError). A row that still fails alone is stopped as one whose
        timetable cannot be planned is (no next fire: an edit starts it again) and logged. A
        transient error (the connection, a deadlock) is raised: the batch is tried again next tick.
        """
        try:
            with transaction.atomic():
                return self._fire(rows, now=now, missed_before=missed_before)
        except (DatabaseError, ValueError, RecursionError) as exc:
            if db_error_is_transient(exc):
                raise
        created = 0
        for row in rows:
            try:
                with transaction.atomic():
                    created += self._fire([row], now=now, missed_before=missed_before)
            except (DatabaseError, ValueError, RecursionError) as exc:
                if db_error_is_transient(exc):
                    raise
                # ValueError and RecursionError: its payload, read by json, in the words the API and pages use.
                what = (
                    "job cannot be stored"
                    if isinstance(exc, DatabaseError)
                    else f"job payload cannot be read ({unreadable_why(exc)})"
                )
                logger.exception(
                    "cron: schedule %s's %s; it will not fire", row.id, what, extra={"schedule_id": row.id}
                )
                with connection.cursor() as cursor:
                    cursor.execute("UPDATE stint_schedule SET next_fire_at = NULL WHERE id = %s", [row.id])
        return created

    def _fire(self, rows: Sequence[DueSchedule], *, now: dt.datetime, missed_before: dt.datetime) -> int:
        memo: dict = {}
        plans = {row.id: self._plan(row, now=now, missed_before=missed_before, memo=memo) for row in rows}
        guarded = [row.id for row in rows if row.overlap_policy == "skip" and plans[row.id].fires]
        busy = self._busy(guarded)
        jobs: list[NewJob] = []
        last_fired: dict[int, dt.datetime] = {}
        payloads: dict[str, Any] = {}  # schedules often share a payload: parse each text once
        for row in rows:
            fires = plans[row.id].fires
            if row.overlap_policy == "skip":
                if row.id in busy and fires:
                    logger.debug("cron: schedule %s skips %d fires: its last job is unfinished", row.id, len(fires))
                fires = () if row.id in busy else fires[:1]
            if plans[row.id].dropped:
                logger.info(
                    "cron: schedule %s dropped %d missed fires (%s)",
                    row.id,
                    plans[row.id].dropped,
                    row.misfire_policy,
                    extra={"schedule_id": row.id},
                )
            if fires and row.job_payload not in payloads:
                payloads[row.job_payload] = json.loads(row.job_payload)
            jobs += [
                schedule_job(row, payload=payloads[row.job_payload], fire_time=fire_time, scheduled_at=fire_time)
                for fire_time in fires
            ]
            if fires:
                last_fired[row.id] = fires[-1]
        inserted = lifecycle.create_jobs(jobs)
        tracing.record_cron_fires(jobs, inserted)  # a span per fire, linked from its job's attempts
        queued_ids = {job_id for job_id, status in inserted if status == JobStatus.QUEUED}
        notify_queued(job.queue for job in jobs if job.id in queued_ids)
        slots: dict[tuple[dt.datetime | None, dt.datetime | None], int] = {}
        ids, row_slots = [], []
        for row in rows:
            pair = (plans[row.id].next_fire_at, last_fired.get(row.id))
            ids.append(row.id)
            row_slots.append(slots.setdefault(pair, len(slots) + 1))
        with connection.cursor() as cursor:
            cursor.execute(_ADVANCE, [[n for n, _ in slots], [lf for _, lf in slots], ids, row_slots])
        return len(inserted)

    def _busy(self, schedule_ids: list[int]) -> set[int]:
        """Return the schedules among ``schedule_ids`` whose latest fire's job is not finished."""
        if not schedule_ids:
            return set()
        finished = {str(s) for s in FINISHED}
        with connection.cursor() as cursor:
            cursor.execute(_LATEST_STATUS, [schedule_ids])
            return {sid for sid, status in cursor.fetchall() if status not in finished}
