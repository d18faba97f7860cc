"""The retention pruner (scheduler.maintenance.pruner): finished jobs leave with everything keyed by them.

Driven through ``Pruner().run_once(now)`` with an explicit ``now``; the rows are seeded directly.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import connection

from audit.models import AuditEvent
from core.pg_connect import pg_connect
from scheduler import metrics
from scheduler.jobs import data_cleanup
from scheduler.maintenance.pruner import WORKER_RETENTION_SECONDS, Pruner, action_log_prune, jobs_prune
from scheduler.models import (
    Attempt,
    CronSchedule,
    IdempotencyRecord,
    Job,
    JobAttempt,
    OutboxEvent,
    Queue,
    WorkerNode,
)
from scheduler.registry import JobContext
from scheduler.states import AttemptStatus, JobStatus
from tests.support.factories import JobFactory, UserFactory, outbox_row, worker_node
from tests.support.jobs import db_now

pytestmark = pytest.mark.django_db
logger = logging.getLogger(__name__)

NOW = dt.datetime(2030, 6, 1, 12, 0, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
TRAIT = {
    JobStatus.SUCCESS: "succeeded",
    JobStatus.FAILED: "failed",
    JobStatus.DEAD: "dead",
    JobStatus.CANCELLED: "cancelled",
}


@pytest.fixture(autouse=True)
def _retention(settings) -> None:
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "RETENTION_SUCCESS_DAYS": 7,
        "RETENTION_CANCELLED_DAYS": 7,
        "RETENTION_FAILED_DAYS": 30,
        "RETENTION_DEAD_DAYS": 30,
    }


def finished(status: str, *, age: dt.timedelta, published: bool = True, **fields) -> Job:
    """A job finished ``age`` before NOW: an attempt, a result, an outbox row of two events and their audit rows."""
    job = JobFactory(**{TRAIT[status]: True}, **fields)
    Job.objects.filter(id=job.id).update(finished_at=NOW - age)
    JobAttempt.objects.create(job=job, attempt_number=1, status=AttemptStatus.FAILED, started_at=NOW - age)
    Job.objects.filter(id=job.id).update(
        result_attempt=1, result_status=AttemptStatus.FAILED, result={"n": 1}, result_at=NOW - age
    )
    events = [
        {"event_id": uuid.uuid4(), "event_type": event, "job_id": job.id, "owner_id": job.owner_id,
         "sequence": sequence, "to_status": "QUEUED"}
        for sequence, event in enumerate(("JOB_CREATED", "JOB_QUEUED"), start=1)
    ]  # fmt: skip
    outbox_row(*events, occurred_at=NOW - age, published_at=(NOW - age) if published else None)
    for e in events:
        AuditEvent.objects.create(
            event_id=e["event_id"],
            job_id=job.id,
            event_type=e["event_type"],
            owner_id=job.owner_id,
            sequence=e["sequence"],
            to_status="QUEUED",
            occurred_at=NOW - age,
        )
    return job


def left(*jobs: Job) -> dict[str, set[uuid.UUID]]:
    """Which of ``jobs`` still have rows in each table."""
    ids = [j.id for j in jobs]
    return {
        "jobs": set(Job.objects.filter(id__in=ids).values_list("id", flat=True)),
        "attempts": set(Attempt.objects.filter(job_id__in=ids).values_list("job_id", flat=True)),
        "results": set(Job.objects.filter(id__in=ids, result_attempt__isnull=False).values_list("id", flat=True)),
        "audit": set(AuditEvent.objects.filter(job_id__in=ids).values_list("job_id", flat=True)),
    }


def everywhere(*jobs: Job) -> dict[str, set[uuid.UUID]]:
    ids = {j.id for j in jobs}
    return {table: ids for table in ("jobs", "attempts", "results", "audit")}


def test_the_pruner_keeps_what_the_settings_keep_and_deletes_the_rest_with_its_rows() -> None:
    expired = [
        finished(JobStatus.SUCCESS, age=7 * DAY + dt.timedelta(minutes=1)),
        finished(JobStatus.CANCELLED, age=8 * DAY),
        finished(JobStatus.FAILED, age=31 * DAY),
        finished(JobStatus.DEAD, age=30 * DAY + dt.timedelta(minutes=1)),
    ]
    kept = [
        finished(JobStatus.SUCCESS, age=7 * DAY - dt.timedelta(minutes=1)),
        finished(JobStatus.CANCELLED, age=6 * DAY),
        finished(JobStatus.FAILED, age=29 * DAY),  # a FAILED job is kept longer than a SUCCESS one
        finished(JobStatus.DEAD, age=29 * DAY),
    ]
    unfinished = JobFactory(running=True)
    Job.objects.filter(id=unfinished.id).update(created_at=NOW - 90 * DAY)
    before = metrics.jobs_pruned_total.labels(status="SUCCESS")._value.get()

    assert Pruner().run_once(now=NOW) == 4

    assert left(*expired) == {table: set() for table in everywhere()}
    assert left(*kept) == everywhere(*kept)
    # Their published events stay in the outbox (a row holds many jobs' events) until the outbox pruner.
    assert set(OutboxEvent.objects.values_list("job_id", flat=True)) == {j.id for j in expired + kept}
    assert Job.objects.filter(id=unfinished.id).exists()
    assert metrics.jobs_pruned_total.labels(status="SUCCESS")._value.get() == before + 1
    assert Pruner().run_once(now=NOW) == 0


def test_zero_days_keeps_a_status_forever(settings) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "RETENTION_SUCCESS_DAYS": 0}
    ancient = finished(JobStatus.SUCCESS, age=3650 * DAY)
    dead = finished(JobStatus.DEAD, age=31 * DAY)

    assert Pruner().run_once(now=NOW) == 1

    assert left(ancient) == everywhere(ancient)
    assert not Job.objects.filter(id=dead.id).exists()


def test_jobs_still_needed_are_kept_however_old() -> None:
    owner = UserFactory()
    schedule = CronSchedule.objects.create(
        owner=owner, name="every minute", cron="* * * * *", job_type="DEMO_TASK", overlap_policy="skip"
    )
    older_fire = finished(
        JobStatus.SUCCESS, age=20 * DAY, owner=owner, schedule=schedule, fire_time=NOW - 20 * DAY - DAY
    )
    latest_fire = finished(JobStatus.SUCCESS, age=20 * DAY, owner=owner, schedule=schedule, fire_time=NOW - 20 * DAY)
    keyed = finished(JobStatus.SUCCESS, age=20 * DAY, owner=owner)
    IdempotencyRecord.objects.create(owner=owner, key="k", fingerprint="f", job=keyed, expires_at=NOW + DAY)
    expired_key = finished(JobStatus.SUCCESS, age=20 * DAY, owner=owner)
    IdempotencyRecord.objects.create(owner=owner, key="old", fingerprint="f", job=expired_key, expires_at=NOW - DAY)
    unpublished = finished(JobStatus.SUCCESS, age=20 * DAY, published=False)

    assert Pruner().run_once(now=NOW) == 2  # the older fire, and the job of the expired key (with its record)

    # The overlap check reads each schedule's latest fire; an unexpired key must replay its job; an
    # unpublished event must reach Kafka and the audit trail first.
    assert left(older_fire, latest_fire, keyed, expired_key, unpublished)["jobs"] == {
        latest_fire.id,
        keyed.id,
        unpublished.id,
    }
    assert not IdempotencyRecord.objects.filter(key="old").exists()


def test_a_run_works_in_bounded_batches_and_the_next_run_goes_on() -> None:
    jobs = [finished(JobStatus.SUCCESS, age=(10 + i) * DAY) for i in range(5)]

    assert Pruner(batch_size=2, max_batches=2).run_once(now=NOW) == 4
    assert Job.objects.filter(id__in=[j.id for j in jobs]).count() == 1
    assert Pruner(batch_size=2, max_batches=2).run_once(now=NOW) == 1
    # Oldest first: the youngest expired job was the one left for the second run.
    assert jobs_prune(status=JobStatus.SUCCESS, days=7, now=NOW) == 0


def test_a_retention_below_one_day_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        jobs_prune(status=JobStatus.SUCCESS, days=0, now=NOW)


def test_expired_refresh_tokens_and_sessions_are_pruned_and_live_ones_kept() -> None:
    from django.contrib.sessions.models import Session
    from rest_framework_simplejwt.token_blacklist.models import BlacklistedToken, OutstandingToken

    user = UserFactory()

    def token(jti: str, *, expires: dt.datetime, blacklisted: bool = False) -> OutstandingToken:
        row = OutstandingToken.objects.create(user=user, jti=jti, token="t", expires_at=expires)
        if blacklisted:
            BlacklistedToken.objects.create(token=row)
        return row

    token("expired", expires=NOW - DAY)
    token("expired-blacklisted", expires=NOW - DAY, blacklisted=True)
    token("live", expires=NOW + DAY)
    token("live-blacklisted", expires=NOW + DAY, blacklisted=True)  # must stay refused until it expires
    Session.objects.create(session_key="old", session_data="", expire_date=NOW - DAY)
    Session.objects.create(session_key="new", session_data="", expire_date=NOW + DAY)

    assert Pruner().run_once(now=NOW) == 1 + 2 + 1  # one blacklist entry, two tokens, one session

    assert set(OutstandingToken.objects.values_list("jti", flat=True)) == {"live", "live-blacklisted"}
    assert list(BlacklistedToken.objects.values_list("token__jti", flat=True)) == ["live-blacklisted"]
    assert list(Session.objects.values_list("session_key", flat=True)) == ["new"]


@pytest.mark.django_db
def test_pruner_deletes_only_long_stopped_workers() -> None:
    now = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    keep_for = dt.timedelta(seconds=WORKER_RETENTION_SECONDS)
    old = worker_node(last_heartbeat_at=now - keep_for * 2, stopped_at=now - keep_for - dt.timedelta(seconds=1))
    recent = worker_node(last_heartbeat_at=now - keep_for, stopped_at=now - keep_for + dt.timedelta(seconds=1))
    live = worker_node(last_heartbeat_at=now - keep_for * 2)

    assert Pruner().run_once(now=now) >= 1

    assert set(WorkerNode.objects.values_list("id", flat=True)) == {recent.id, live.id}
    assert not WorkerNode.objects.filter(id=old.id).exists()


# -- audit rows whose job is gone --------------------------------------------------------------------

# The event that leaves a job in each status (scheduler.states.TRANSITIONS).
EVENT_INTO = {
    JobStatus.QUEUED: "JOB_QUEUED",
    JobStatus.RUNNING: "JOB_STARTED",
    JobStatus.SUCCESS: "JOB_COMPLETED",
    JobStatus.FAILED: "JOB_FAILED",
    JobStatus.DEAD: "JOB_DEAD",
    JobStatus.CANCELLED: "JOB_CANCELLED",
}


def trail(
    final: str, *, received: dt.datetime, job_id: uuid.UUID | None = None, owner_id: int | None = None
) -> uuid.UUID:
    """A job's audit trail as the consumer stores it: JOB_CREATED, then the event into ``final`` at ``received``.

    ``job_id`` defaults to a job that never existed (a foreign event's). Returns the job id.
    """
    job_id = job_id or uuid.uuid4()
    for sequence, (event, status, at) in enumerate(
        [("JOB_CREATED", JobStatus.CREATED, received - dt.timedelta(hours=1)), (EVENT_INTO[final], final, received)],
        start=1,
    ):
        row = AuditEvent.objects.create(
            event_id=uuid.uuid4(),
            job_id=job_id,
            event_type=event,
            owner_id=owner_id,
            sequence=sequence,
            to_status=status,
            occurred_at=at,
        )
        AuditEvent.objects.filter(id=row.id).update(received_at=at)  # auto_now_add: set after the insert
    return job_id


def trails_left(*job_ids: uuid.UUID) -> set[uuid.UUID]:
    return set(AuditEvent.objects.filter(job_id__in=job_ids).values_list("job_id", flat=True))


def test_data_cleanup_leaves_a_jobs_trail_which_goes_when_the_job_would_have_gone(user) -> None:
    now = db_now()
    jobs = {status: JobFactory(owner=user, **{TRAIT[status]: True}) for status in (JobStatus.SUCCESS, JobStatus.FAILED)}
    for status, job in jobs.items():
        Job.objects.filter(id=job.id).update(finished_at=now - 3 * DAY)
        trail(status, received=now - 3 * DAY, job_id=job.id, owner_id=user.pk)
    ctx = JobContext(job_id=uuid.uuid4(), attempt=1, owner_id=user.pk, logger=logging.LoggerAdapter(logger, {}))
    assert data_cleanup({"older_than_days": 2}, ctx) == {"deleted": 2}  # the built-in handler, called as a worker does
    ids = [job.id for job in jobs.values()]
    assert trails_left(*ids) == set(ids)  # the trail outlives the job: its owner can still read it

    assert Pruner().run_once(now=now + 3 * DAY) == 0  # as old as a SUCCESS job still kept
    assert Pruner().run_once(now=now + 5 * DAY) == 2  # the SUCCESS job would have gone
    assert trails_left(*ids) == {jobs[JobStatus.FAILED].id}
    assert Pruner().run_once(now=now + 26 * DAY) == 0
    assert Pruner().run_once(now=now + 28 * DAY) == 2
    assert trails_left(*ids) == set()


def test_an_orphaned_trail_is_kept_for_the_retention_of_its_last_status_a_foreign_one_for_the_longest() -> None:
    expired = [
        trail(JobStatus.SUCCESS, received=NOW - 7 * DAY - dt.timedelta(minutes=1)),
        trail(JobStatus.CANCELLED, received=NOW - 8 * DAY),
        trail(JobStatus.FAILED, received=NOW - 31 * DAY),
        trail(JobStatus.DEAD, received=NOW - 30 * DAY - dt.timedelta(minutes=1)),
        trail(JobStatus.QUEUED, received=NOW - 31 * DAY),  # never finished, or never a Stint job: the longest
    ]
    kept = [
        trail(JobStatus.SUCCESS, received=NOW - 7 * DAY + dt.timedelta(minutes=1)),
        trail(JobStatus.FAILED, received=NOW - 29 * DAY),
        trail(JobStatus.RUNNING, received=NOW - 29 * DAY),
    ]
    live = JobFactory(running=True)
    Job.objects.filter(id=live.id).update(created_at=NOW - 400 * DAY)
    trail(JobStatus.RUNNING, received=NOW - 400 * DAY, job_id=live.id)  # its job exists: kept however old
    unreadable = uuid.uuid4()  # stored before parse_event bounded occurred_at: Python cannot read it
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO stint_audit_event (event_id, job_id, event_type, sequence, attempt, from_status, to_status,
                                              schema_version, payload, occurred_at, received_at)
               VALUES (%s, %s, 'JOB_QUEUED', 2, 0, 'CREATED', 'QUEUED', 1, '{}',
                       '10000-01-01 13:59:59+00', %s)""",
            [uuid.uuid4(), unreadable, NOW - 31 * DAY],
        )

    assert Pruner().run_once(now=NOW) == 2 * len(expired) + 1

    assert trails_left(*expired, unreadable) == set()
    assert trails_left(*kept, live.id) == {*kept, live.id}
    assert AuditEvent.objects.filter(job_id=live.id).count() == 2
    assert Pruner().run_once(now=NOW) == 0


def test_an_orphaned_trail_is_kept_forever_as_its_status_is(settings) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "RETENTION_SUCCESS_DAYS": 0}
    success = trail(JobStatus.SUCCESS, received=NOW - 3650 * DAY)
    unfinished = trail(JobStatus.QUEUED, received=NOW - 3650 * DAY)  # could have become a SUCCESS job
    failed = trail(JobStatus.FAILED, received=NOW - 31 * DAY)

    assert Pruner().run_once(now=NOW) == 2

    assert trails_left(success, unfinished, failed) == {success, unfinished}


def test_the_orphan_sweep_reads_bounded_batches_goes_on_at_the_next_run_and_starts_over_at_the_end() -> None:
    live = JobFactory(running=True)
    trail(JobStatus.RUNNING, received=NOW - 400 * DAY, job_id=live.id)  # rows 1-2
    gone = [trail(JobStatus.SUCCESS, received=NOW - 10 * DAY) for _ in range(3)]  # rows 3-8
    pruner = Pruner(audit_batch_size=3, audit_max_batches=1)

    assert [pruner.run_once(now=NOW) for _ in range(3)] == [1, 3, 2]  # rows 1-3, 4-6, 7-8: the end
    assert trails_left(*gone) == set()
    Job.objects.filter(id=live.id).delete()  # behind the sweep: found when it starts over

    assert pruner.run_once(now=NOW) == 2
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_orphaned_row_another_session_holds_locked_is_skipped_and_the_rest_deleted() -> None:
    gone = [trail(JobStatus.SUCCESS, received=NOW - 10 * DAY) for _ in range(2)]
    held = AuditEvent.objects.filter(job_id=gone[0]).order_by("sequence").last()  # its last event
    with pg_connect(autocommit=False) as session, connection.cursor() as cursor:
        session.execute("SELECT 1 FROM stint_audit_event WHERE id = %s FOR UPDATE", [held.id])
        cursor.execute("SET statement_timeout = '10s'")  # a pruner that waited on the lock would fail, not hang
        try:
            assert Pruner().run_once(now=NOW) == 3
        finally:
            cursor.execute("RESET statement_timeout")
        session.rollback()

    assert list(AuditEvent.objects.values_list("id", flat=True)) == [held.id]
    assert Pruner().run_once(now=NOW) == 1


class TestOperatorActionRetention:
    """The operator action history (``scheduler.action_log``: Django's ``LogEntry``) goes after its retention."""

    def _entry(self, user, *, age: dt.timedelta) -> LogEntry:
        queue = Queue.objects.get_or_create(name="default")[0]
        entry = LogEntry.objects.log_actions(user_id=user.pk, queryset=[queue], action_flag=CHANGE, single_object=True)
        LogEntry.objects.filter(pk=entry.pk).update(action_time=NOW - age)
        return entry

    def test_the_pruner_deletes_entries_past_the_retention_and_keeps_the_rest(self, settings, user):
        settings.SCHEDULER = {**settings.SCHEDULER, "OPERATOR_LOG_RETENTION_DAYS": 30}
        old = [self._entry(user, age=31 * DAY) for _ in range(5)]
        recent = self._entry(user, age=29 * DAY)

        assert Pruner(action_log_batch_size=2).run_once(NOW) == 5  # three statements of at most two

        assert not LogEntry.objects.filter(pk__in=[e.pk for e in old]).exists()
        assert list(LogEntry.objects.values_list("pk", flat=True)) == [recent.pk]

    def test_zero_days_keeps_them_forever(self, settings, user):
        settings.SCHEDULER = {**settings.SCHEDULER, "OPERATOR_LOG_RETENTION_DAYS": 0}
        entry = self._entry(user, age=3650 * DAY)

        Pruner().run_once(NOW)

        assert LogEntry.objects.filter(pk=entry.pk).exists()

    def test_a_statement_reads_only_the_oldest_batch(self, user):
        old = self._entry(user, age=40 * DAY)
        recent = self._entry(user, age=DAY)
        skewed = self._entry(user, age=40 * DAY)  # written after a newer one (clock skew): waits for it

        assert action_log_prune(days=30, now=NOW, limit=1) == 1
        assert action_log_prune(days=30, now=NOW, limit=1) == 0  # read only the recent one
        assert set(LogEntry.objects.values_list("pk", flat=True)) == {recent.pk, skewed.pk}
        assert not LogEntry.objects.filter(pk=old.pk).exists()

    def test_a_retention_below_one_day_is_refused(self):
        with pytest.raises(ValueError):
            action_log_prune(days=0)
