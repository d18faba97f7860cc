"""Tests for scheduler.leasing: batched claims, fenced heartbeats and fenced, batched outcome writes.

Each test runs in one transaction, so the database's ``now()`` is the same instant for every
statement of a test: due times and leases can be compared exactly against ``db_now()``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext

from scheduler import leasing, lifecycle, selectors
from scheduler.enqueuing import enqueue
from scheduler.exceptions import RetryableError
from scheduler.flow import claim as flow_claim
from scheduler.flow import limits as flow_limits
from scheduler.job_actions import job_cancel
from scheduler.leasing import Outcome, Report
from scheduler.lifecycle import Claimed
from scheduler.maintenance.promoter import DuePromoter
from scheduler.maintenance.rescuer import LeaseRescuer
from scheduler.models import Attempt, Job, JobAttempt, OutboxEvent
from scheduler.registry import handler
from scheduler.states import AttemptStatus, EventType, JobStatus
from tests.support.subprocess_env import database_url

pytestmark = pytest.mark.django_db

WORKER = "test-host:1:abc"
SLOW_BACKOFF = "TEST_LEASING_SLOW_BACKOFF"


@handler(SLOW_BACKOFF, backoff_base_seconds=5.0, backoff_max_seconds=7.0)
def _slow_backoff(payload: Any, ctx: Any) -> None:
    """A type with its own backoff: 5 s, then capped at 7 s."""
    raise RetryableError("always")


@pytest.fixture(autouse=True)
def _scheduler_settings(settings) -> None:
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "LEASE_SECONDS": 30,
        "BACKOFF_BASE_SECONDS": 1.0,
        "BACKOFF_MAX_SECONDS": 30.0,
        "BACKOFF_JITTER": False,
    }


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def ago(seconds: float) -> dt.datetime:
    return db_now() - dt.timedelta(seconds=seconds)


def make_job(type_: str = "DEMO_TASK", payload: Any = None, **options: Any) -> Job:
    return enqueue(type_, payload or {}, **options)


def claim(limit: int = 1, **options: Any) -> list[Claimed]:
    return leasing.claim_jobs(worker_id=options.pop("worker_id", WORKER), limit=limit, queues=None, **options)


def claim_one(job: Job) -> Claimed:
    """Claim ``job``, which must be the only claimable one."""
    (claimed,) = claim(limit=1)
    assert claimed.id == job.id
    return claimed


def claim_each(*jobs: Job) -> list[Claimed]:
    """Claim exactly ``jobs`` in one batch; return their claims in the order given."""
    claimed = {c.id: c for c in claim(limit=len(jobs) + 1)}
    assert set(claimed) == set(ids(jobs))
    return [claimed[j.id] for j in jobs]


def promote_all() -> int:
    return DuePromoter().run_once(now=db_now() + dt.timedelta(days=1))


def reload(job: Job | Claimed) -> Job:
    return Job.objects.get(id=job.id)


def attempts(job: Job | Claimed) -> list[tuple[int, str]]:
    """The job's attempts as the API lists them: the finished rows, then a RUNNING job's current one."""
    rows = list(Attempt.objects.filter(job_id=job.id).values_list("attempt_number", "status"))
    running = selectors.job_running_attempt(job_id=job.id)
    return rows + ([(running.attempt_number, running.status)] if running else [])


def events(job: Job | Claimed) -> list[str]:
    return list(OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").values_list("event_type", flat=True))


def report(job: Claimed, outcome: Outcome, **fields: Any) -> Report:
    return Report(job=job, outcome=outcome, **fields)


def record(*reports: Report) -> set[uuid.UUID]:
    return leasing.record_outcomes(list(reports))


def ids(items: Sequence[Job | Claimed]) -> list[uuid.UUID]:
    return [i.id for i in items]


# -- claim -----------------------------------------------------------------------------------


def test_claim_orders_by_priority_then_scheduled_at_then_created_at() -> None:
    low_oldest = make_job(priority="LOW", scheduled_at=ago(600))
    medium_late = make_job(priority="MEDIUM", scheduled_at=ago(10))
    medium_early = make_job(priority="MEDIUM", scheduled_at=ago(20))
    high_now = make_job(priority="HIGH")
    high_early = make_job(priority="HIGH", scheduled_at=ago(30))
    # Same priority and due time: the older row goes first.
    same_due = ago(20)
    tie_newer = make_job(priority="MEDIUM", scheduled_at=same_due)
    tie_older = make_job(priority="MEDIUM", scheduled_at=same_due)
    Job.objects.filter(id=tie_newer.id).update(created_at=ago(5))
    Job.objects.filter(id=tie_older.id).update(created_at=ago(50))
    Job.objects.filter(id=medium_early.id).update(scheduled_at=ago(25))

    order = [claim(limit=1)[0].id for _ in range(7)]

    assert order == ids([high_early, high_now, medium_early, tie_older, tie_newer, medium_late, low_oldest])
    assert claim(limit=1) == []


def test_claim_orders_integer_priorities_between_the_named_points_highest_first() -> None:
    # Django Tasks' -100..100 scale: each job is due, the lower priorities were enqueued earlier.
    values = [-100, "LOW", -5, "MEDIUM", 37, "HIGH", 100]
    jobs = [make_job(priority=p, scheduled_at=ago(100 - i)) for i, p in enumerate(values)]

    order = [claim(limit=1)[0].id for _ in jobs]

    assert order == ids(reversed(jobs))
    started = OutboxEvent.objects.filter(event_type=EventType.JOB_STARTED, job_id__in=order).order_by("id")
    assert [e.payload["priority"] for e in started] == ["100", "HIGH", "37", "MEDIUM", "-5", "LOW", "-100"]


def test_claim_takes_at_most_limit_and_writes_lease_and_event_and_the_attempt_shows_running() -> None:
    jobs = [make_job() for _ in range(5)]

    claimed = claim(limit=3)

    assert len(claimed) == 3
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 2
    now = db_now()
    for c in claimed:
        job = reload(c)
        assert job.status == JobStatus.RUNNING
        assert (job.attempts, c.attempt) == (1, 1)
        assert job.lease_owner == WORKER
        assert job.lease_token == c.lease_token is not None
        # From the claim's statement (statement_timestamp()), a moment after this test's now().
        assert job.lease_expires_at == job.started_at + dt.timedelta(seconds=30)
        assert now <= job.started_at < now + dt.timedelta(seconds=5)
        assert not Attempt.objects.filter(job_id=job.id).exists()  # its row is written once, at its outcome
        running = selectors.job_running_attempt(job_id=job.id)
        assert (running.attempt_number, running.status, running.worker) == (1, AttemptStatus.RUNNING, WORKER)
        assert (running.started_at, running.lease_token) == (job.started_at, c.lease_token)
        assert events(job)[-1] == EventType.JOB_STARTED
    assert len({c.lease_token for c in claimed}) == 3
    assert {c.id for c in claimed} < set(ids(jobs))


def test_claim_with_no_free_slots_claims_nothing() -> None:
    make_job()
    assert claim(limit=0) == []
    assert Job.objects.get().status == JobStatus.QUEUED


def test_claim_is_one_statement_whatever_the_batch(monkeypatch) -> None:
    # The flow limits (scheduler.flow.limits) are read at most once a second and the held flags
    # released every 30 s, not per claim: both done first and not due again during the test.
    monkeypatch.setattr(flow_limits, "CACHE_SECONDS", 3600.0)
    monkeypatch.setattr(flow_claim, "RELEASE_EVERY", 3600.0)
    claim(limit=0)
    for _ in range(30):
        make_job()
    with CaptureQueriesContext(connection) as one:
        assert len(claim(limit=1)) == 1
    with CaptureQueriesContext(connection) as many:
        assert len(claim(limit=25)) == 25
    assert len(many) == len(one)


def test_claim_only_from_the_given_queues() -> None:
    a = make_job(queue="a")
    b = make_job(queue="b")
    c = make_job(queue="c")

    claimed = leasing.claim_jobs(worker_id=WORKER, limit=10, queues=["a", "b"])

    assert sorted(ids(claimed)) == sorted(ids([a, b]))
    assert reload(c).status == JobStatus.QUEUED
    assert ids(leasing.claim_jobs(worker_id=WORKER, limit=10, queues=None)) == [c.id]


def test_claim_skips_paused_queues() -> None:
    paused = make_job(queue="paused", priority="HIGH")
    live = make_job(queue="live", priority="LOW")

    claimed = leasing.claim_jobs(worker_id=WORKER, limit=10, queues=None, paused=["paused"])

    assert ids(claimed) == [live.id]
    assert reload(paused).status == JobStatus.QUEUED
    assert leasing.claim_jobs(worker_id=WORKER, limit=10, queues=["paused"], paused=["paused"]) == []


def test_claim_ignores_jobs_that_are_not_queued() -> None:
    make_job(scheduled_at=db_now() + dt.timedelta(hours=1))
    cancelled = make_job()
    job_cancel(job_id=cancelled.id)
    failed = make_job()
    record(report(claim_one(failed), Outcome.RETRYABLE, error="boom"))

    assert claim(limit=10) == []
    assert sorted(Job.objects.values_list("status", flat=True)) == ["CANCELLED", "RETRYING", "SCHEDULED"]


# -- fencing ---------------------------------------------------------------------------------


def test_a_completion_after_the_lease_was_rescued_is_discarded() -> None:
    job = make_job(payload={"result": "late"})
    first = claim_one(job)
    assert LeaseRescuer().run_once(now=db_now() + dt.timedelta(seconds=31)) == 1

    assert record(report(first, Outcome.SUCCEEDED, result={"late": True})) == set()

    rescued = reload(job)
    assert rescued.status == JobStatus.RETRYING
    assert rescued.lease_token is None
    assert attempts(job) == [(1, AttemptStatus.LOST)]
    assert Job.objects.get(id=job.id).stored_result is None

    # The rescued job runs again; the first worker's late report still cannot touch it.
    promote_all()
    second = claim_one(job)
    assert second.attempt == 2
    assert record(report(first, Outcome.SUCCEEDED, result={"late": True})) == set()
    assert record(report(first, Outcome.RETRYABLE, error="late failure")) == set()
    assert reload(job).status == JobStatus.RUNNING
    assert attempts(job) == [(1, AttemptStatus.LOST), (2, AttemptStatus.RUNNING)]

    assert record(report(second, Outcome.SUCCEEDED, result={"on": 2})) == {job.id}
    assert reload(job).status == JobStatus.SUCCESS
    assert attempts(job) == [(1, AttemptStatus.LOST), (2, AttemptStatus.SUCCEEDED)]
    assert Job.objects.get(id=job.id).stored_result.result == {"on": 2}


def test_an_outcome_is_recorded_once() -> None:
    job = make_job()
    claimed = claim_one(job)

    assert record(report(claimed, Outcome.TIMED_OUT, error="timed out")) == {job.id}
    # The thread pool's late result for the same run arrives after the timeout was recorded.
    assert record(report(claimed, Outcome.SUCCEEDED, result=1)) == set()

    assert reload(job).status == JobStatus.RETRYING
    assert attempts(job) == [(1, AttemptStatus.TIMED_OUT)]
    assert Job.objects.get(id=job.id).stored_result is None
    assert events(job).count(EventType.JOB_RETRIED) == 1


def test_an_attempt_row_is_written_once_and_a_second_one_is_refused_with_its_outcome() -> None:
    job = make_job()
    claimed = claim_one(job)
    # Only the outcome writes the running attempt's row, so none can be there; were one there (a
    # bug), the unique (job, attempt_number) index refuses the outcome whole: no second row.
    JobAttempt.objects.create(job_id=job.id, attempt_number=1, status=AttemptStatus.LOST, started_at=claimed.started_at)

    done = leasing.record_batch([report(claimed, Outcome.PERMANENT, error="PermanentError: no")])

    assert done.accepted == set()
    assert [r.job.id for r, _why in done.unrecorded] == [job.id]
    assert "attempt_unique_number" in done.unrecorded[0][1]
    assert reload(job).status == JobStatus.RUNNING
    assert attempts(job) == [(1, AttemptStatus.LOST)]
    assert Job.objects.get(id=job.id).stored_result is None


def test_complete_records_succeeded_attempts_only() -> None:
    claimed = claim_one(make_job())
    end = lifecycle.AttemptEnd(job_id=claimed.id, lease_token=claimed.lease_token, status=AttemptStatus.FAILED)

    with pytest.raises(ValueError, match="SUCCEEDED"):
        lifecycle.complete([end])

    assert reload(claimed).status == JobStatus.RUNNING


# -- heartbeat -------------------------------------------------------------------------------


def test_heartbeat_extends_only_leases_still_held(settings) -> None:
    held, finished, other = (make_job() for _ in range(3))
    c_held, c_finished, c_other = claim_each(held, finished, other)
    record(report(c_finished, Outcome.SUCCEEDED))
    before = reload(other).lease_expires_at
    settings.SCHEDULER = {**settings.SCHEDULER, "LEASE_SECONDS": 600}

    still, cancel = leasing.heartbeat(
        worker_id=WORKER,
        jobs=[(held.id, c_held.lease_token), (finished.id, c_finished.lease_token), (other.id, uuid.uuid4())],
    )

    assert (still, cancel) == ({held.id}, set())
    assert reload(held).lease_expires_at == db_now() + dt.timedelta(seconds=600)
    assert reload(other).lease_expires_at == before
    assert reload(finished).lease_expires_at is None


def test_heartbeat_reports_cancel_requested() -> None:
    keep, stop = make_job(), make_job()
    c_keep, c_stop = claim_each(keep, stop)

    assert job_cancel(job_id=stop.id).status == JobStatus.RUNNING

    still, cancel = leasing.heartbeat(
        worker_id=WORKER, jobs=[(keep.id, c_keep.lease_token), (stop.id, c_stop.lease_token)]
    )
    assert still == {keep.id, stop.id}
    assert cancel == {stop.id}
    assert leasing.cancel_requested([keep.id, stop.id]) == {stop.id}


def waits_for_the_lower_id_holding_nothing(
    low: Claimed, high: Claimed, write: Callable[[], Any], what: str
) -> list[Any]:
    """Run ``write`` in a thread while this test holds ``low``'s row lock; return ``[its result]``.

    Asserts that ``write`` came to wait for that lock, and that meanwhile ``high``'s row was
    free: a writer that locks in id order waits for the lower id holding nothing.
    """
    backend: list[int] = []
    result: list[Any] = []

    def run() -> None:
        try:
            connection.ensure_connection()
            backend.append(connection.connection.info.backend_pid)
            result.append(write())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM stint_job WHERE id = %s FOR UPDATE", [low.id])
            thread.start()
            deadline = time.monotonic() + 10
            waiting = False
            while not waiting and time.monotonic() < deadline:
                time.sleep(0.02)
                cursor.execute("SELECT count(*) > 0 FROM pg_locks WHERE pid = ANY(%s) AND NOT granted", [backend])
                waiting = cursor.fetchone()[0]
            assert waiting, f"the {what} never waited for the lock held here"
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT id FROM stint_job WHERE id = %s FOR UPDATE NOWAIT", [high.id])
            high_free = True
        except OperationalError:
            high_free = False
    thread.join(timeout=10)

    assert high_free, f"the {what} locked the higher id first, then waited for the lower one"
    return result


@pytest.mark.django_db(transaction=True)
def test_heartbeat_skips_a_row_another_session_holds_and_still_counts_it_held(settings) -> None:
    """A handler may keep its own job row locked from a connection of its own: the other leases must still be extended.

    The heartbeat used to wait for such a lock (``FOR UPDATE``, no timeout) for as long as the
    handler's connection lived, and every other lease of its worker expired meanwhile.
    """
    locked, free = claim_each(make_job(), make_job())
    settings.SCHEDULER = {**settings.SCHEDULER, "LEASE_SECONDS": 600}
    before = reload(locked).lease_expires_at
    beat: list[Any] = []

    def run() -> None:
        try:
            jobs = [(locked.id, locked.lease_token), (free.id, free.lease_token)]
            beat.append(leasing.heartbeat(worker_id=WORKER, jobs=jobs))
        finally:
            connection.close()

    with psycopg.connect(database_url()) as holder:  # a transaction, open until the block ends
        holder.execute("SELECT 1 FROM stint_job WHERE id = %s FOR UPDATE", [locked.id])
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the heartbeat waited for the locked row"

    assert beat == [({locked.id, free.id}, set())]  # both still held
    assert reload(free).lease_expires_at > db_now() + dt.timedelta(seconds=590)  # extended by the 600 s lease
    assert reload(locked).lease_expires_at == before  # not extended this time


def test_heartbeat_with_nothing_held_does_nothing() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert leasing.heartbeat(worker_id=WORKER, jobs=[]) == (set(), set())
    assert len(queries) == 0


@pytest.mark.django_db(transaction=True)
def test_a_mixed_outcome_batch_locks_all_its_rows_in_id_order_before_its_statements() -> None:
    # A batch of several target statuses is one statement per status: each locks its own jobs in
    # id order, but the higher id's group (SUCCESS, listed first) would lock before the lower id's
    # (FAILED), and a heartbeat locking both in id order deadlocked with it (seen in
    # `make loadtest --chaos`). Another transaction holds the lower id here: the batch must wait for
    # it holding nothing, so the higher id stays free.
    low, high = sorted(claim_each(make_job(), make_job()), key=lambda c: c.id)
    recorded = waits_for_the_lower_id_holding_nothing(
        low,
        high,
        lambda: record(
            report(high, Outcome.SUCCEEDED, result=1), report(low, Outcome.PERMANENT, error="PermanentError")
        ),
        "batch",
    )

    assert recorded == [{low.id, high.id}]
    assert (reload(low).status, reload(high).status) == (JobStatus.FAILED, JobStatus.SUCCESS)


@pytest.mark.django_db(transaction=True)
def test_a_one_statement_batch_locks_its_rows_in_id_order_whatever_order_its_reports_came_in() -> None:
    # The usual batch (every run succeeded) is one statement, its reports in the order the runs
    # ended. Its row locks were taken in that order (the FOR UPDATE of the LATERAL lookup is applied
    # inside it, row by row as the input is read), not in id order as the statement's ORDER BY meant.
    low, high = sorted(claim_each(make_job(), make_job()), key=lambda c: c.id)
    recorded = waits_for_the_lower_id_holding_nothing(
        low,
        high,
        lambda: record(report(high, Outcome.SUCCEEDED, result=1), report(low, Outcome.SUCCEEDED, result=2)),
        "batch",
    )

    assert recorded == [{low.id, high.id}]
    assert (reload(low).status, reload(high).status) == (JobStatus.SUCCESS, JobStatus.SUCCESS)


# -- record_outcomes -------------------------------------------------------------------------


def test_success_stores_result_attempt_and_event() -> None:
    job = make_job()
    claimed = claim_one(job)

    assert record(report(claimed, Outcome.SUCCEEDED, result={"echo": "hi", "attempt": 1})) == {job.id}

    done = reload(job)
    assert done.status == JobStatus.SUCCESS
    assert done.finished_at == db_now()
    # The successful attempt is kept in the job row, which keeps its worker and lease token.
    assert (done.lease_owner, done.lease_token, done.lease_expires_at) == (claimed.worker, claimed.lease_token, None)
    assert not JobAttempt.objects.filter(job_id=job.id).exists()
    attempt = Attempt.objects.get(job_id=job.id)
    assert (attempt.id, attempt.attempt_number, attempt.status, attempt.worker, attempt.lease_token) == (
        str(job.id),
        1,
        AttemptStatus.SUCCEEDED,
        claimed.worker,
        claimed.lease_token,
    )
    assert (attempt.started_at, attempt.finished_at, attempt.error, attempt.traceback) == (
        claimed.started_at,
        db_now(),
        "",
        "",
    )
    result = Job.objects.get(id=job.id).stored_result
    assert (result.attempt, result.status, result.result) == (1, AttemptStatus.SUCCEEDED, {"echo": "hi", "attempt": 1})
    assert events(job) == ["JOB_CREATED", "JOB_QUEUED", "JOB_STARTED", "JOB_COMPLETED"]
    assert list(OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").values_list("sequence", flat=True)) == [
        1,
        2,
        3,
        4,
    ]


def test_retryable_failure_retries_after_backoff() -> None:
    job = make_job(max_retries=3)
    first = claim_one(job)

    assert record(report(first, Outcome.RETRYABLE, error="RetryableError: boom", traceback="Traceback...")) == {job.id}

    retrying = reload(job)
    assert retrying.status == JobStatus.RETRYING
    assert retrying.scheduled_at == db_now() + dt.timedelta(seconds=1)
    assert retrying.last_error == "RetryableError: boom"
    assert retrying.finished_at is None
    attempt = Attempt.objects.get(job_id=job.id)
    assert (attempt.status, attempt.error, attempt.traceback) == (
        AttemptStatus.FAILED,
        "RetryableError: boom",
        "Traceback...",
    )
    assert Job.objects.get(id=job.id).stored_result is None
    retried = OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").last()
    assert retried.event_type == EventType.JOB_RETRIED
    assert retried.payload["backoff_seconds"] == 1.0

    # Not due yet at the database's now; due one backoff later.
    assert DuePromoter().run_once() == 0
    assert DuePromoter().run_once(now=db_now() + dt.timedelta(seconds=1)) == 1
    second = claim_one(job)
    record(report(second, Outcome.RETRYABLE, error="again"))
    assert reload(job).scheduled_at == db_now() + dt.timedelta(seconds=2)


def test_backoff_is_capped_and_per_type(settings) -> None:
    job = make_job(SLOW_BACKOFF, max_retries=5)
    delays = []
    for _ in range(3):
        record(report(claim_one(job), Outcome.RETRYABLE, error="boom"))
        delays.append((reload(job).scheduled_at - db_now()).total_seconds())
        promote_all()
    assert delays == [5.0, 7.0, 7.0]


def test_jitter_keeps_the_retry_within_the_backoff(settings) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "BACKOFF_JITTER": True, "BACKOFF_BASE_SECONDS": 10.0}
    jobs = [make_job() for _ in range(20)]
    claimed = claim(limit=20)
    record(*(report(c, Outcome.RETRYABLE, error="boom") for c in claimed))
    delays = [(reload(j).scheduled_at - db_now()).total_seconds() for j in jobs]
    assert all(0.0 <= d <= 10.0 for d in delays)
    assert len(set(delays)) > 1


def test_no_attempts_left_dead_letters() -> None:
    job = make_job(max_retries=1)
    record(report(claim_one(job), Outcome.RETRYABLE, error="first"))
    promote_all()

    assert record(report(claim_one(job), Outcome.TIMED_OUT, error="timed out after 300 s")) == {job.id}

    dead = reload(job)
    assert dead.status == JobStatus.DEAD
    assert dead.attempts == 2
    assert dead.finished_at == db_now()
    assert dead.last_error == "timed out after 300 s"
    assert attempts(job) == [(1, AttemptStatus.FAILED), (2, AttemptStatus.TIMED_OUT)]
    assert events(job)[-1] == EventType.JOB_DEAD
    assert Job.objects.get(id=job.id).stored_result.result is None


def test_permanent_error_fails_without_retrying() -> None:
    job = make_job(max_retries=5)

    assert record(report(claim_one(job), Outcome.PERMANENT, error="PermanentError: bad input")) == {job.id}

    failed = reload(job)
    assert failed.status == JobStatus.FAILED
    assert failed.last_error == "PermanentError: bad input"
    assert failed.finished_at == db_now()
    assert attempts(job) == [(1, AttemptStatus.FAILED)]
    assert events(job)[-1] == EventType.JOB_FAILED


def test_cancelled_run_ends_cancelled() -> None:
    job = make_job()
    claimed = claim_one(job)
    job_cancel(job_id=job.id)

    assert record(report(claimed, Outcome.CANCELLED, error="cancelled")) == {job.id}

    assert reload(job).status == JobStatus.CANCELLED
    assert attempts(job) == [(1, AttemptStatus.CANCELLED)]
    assert events(job)[-1] == EventType.JOB_CANCELLED


def test_a_failure_after_cancel_was_requested_is_not_retried() -> None:
    job = make_job(max_retries=3)
    claimed = claim_one(job)
    job_cancel(job_id=job.id)

    assert record(report(claimed, Outcome.RETRYABLE, error="boom while stopping")) == {job.id}

    assert reload(job).status == JobStatus.CANCELLED
    assert attempts(job) == [(1, AttemptStatus.FAILED)]


def test_hand_back_requeues_at_once_without_spending_the_budget() -> None:
    job = make_job(max_retries=1)

    for attempt in (1, 2):
        claimed = claim_one(job)
        assert claimed.attempt == attempt
        assert record(report(claimed, Outcome.HANDED_BACK, error="worker shut down")) == {job.id}
        handed = reload(job)
        assert handed.status == JobStatus.RETRYING
        assert handed.scheduled_at == db_now()
        assert handed.attempts_left == 2
        assert DuePromoter().run_once() == 1

    # Two hand-backs later the budget of 1 + max_retries is whole: one failure retries, the next is final.
    record(report(claim_one(job), Outcome.RETRYABLE, error="one"))
    assert reload(job).status == JobStatus.RETRYING
    promote_all()
    record(report(claim_one(job), Outcome.RETRYABLE, error="two"))
    assert reload(job).status == JobStatus.DEAD
    assert attempts(job) == [
        (1, AttemptStatus.LOST),
        (2, AttemptStatus.LOST),
        (3, AttemptStatus.FAILED),
        (4, AttemptStatus.FAILED),
    ]


def test_a_retry_after_the_handlers_delay_is_due_then_spends_an_attempt_and_says_so_in_its_event() -> None:
    job = make_job(SLOW_BACKOFF, max_retries=3)  # its own backoff would be 5 s

    error = "RetryAfter: rate limited (retried in 2.5 s, as the handler asked)"
    assert record(report(claim_one(job), Outcome.RETRYABLE, error=error, retry_after=2.5)) == {job.id}

    retrying = reload(job)
    assert (retrying.status, retrying.last_error) == (JobStatus.RETRYING, error)
    assert retrying.scheduled_at == db_now() + dt.timedelta(seconds=2.5)
    assert retrying.attempts_left == 3  # one of the 1 + 3 spent, as by any retryable error
    assert attempts(job) == [(1, AttemptStatus.FAILED)]
    retried = OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").last()
    assert retried.event_type == EventType.JOB_RETRIED
    assert (retried.payload["backoff_seconds"], retried.payload["reason"]) == (2.5, "retry_after")


def test_a_retry_after_with_no_attempts_left_is_dead_and_after_a_cancel_request_cancelled() -> None:
    job = make_job(max_retries=1)
    record(report(claim_one(job), Outcome.RETRYABLE, error="first"))
    promote_all()

    assert record(report(claim_one(job), Outcome.RETRYABLE, error="RetryAfter", retry_after=60.0)) == {job.id}
    assert reload(job).status == JobStatus.DEAD
    assert events(job)[-1] == EventType.JOB_DEAD

    stopping = make_job(max_retries=3)
    claimed = claim_one(stopping)
    job_cancel(job_id=stopping.id)
    record(report(claimed, Outcome.RETRYABLE, error="RetryAfter", retry_after=60.0))
    assert reload(stopping).status == JobStatus.CANCELLED


def test_handler_delays_ride_in_the_one_retry_statement_beside_the_backoffs() -> None:
    def statements_for(*asked: float | None) -> tuple[int, list[float]]:
        jobs = [make_job() for _ in asked]
        claimed = claim_each(*jobs)
        with CaptureQueriesContext(connection) as queries:
            record(
                *(report(c, Outcome.RETRYABLE, error="e", retry_after=a) for c, a in zip(claimed, asked, strict=True))
            )
        return len(queries), [(reload(j).scheduled_at - db_now()).total_seconds() for j in jobs]

    plain, plain_delays = statements_for(None, None, None)
    mixed, mixed_delays = statements_for(None, 7.0, 0.0)

    assert mixed == plain
    assert (plain_delays, mixed_delays) == ([1.0, 1.0, 1.0], [1.0, 7.0, 0.0])


@pytest.mark.parametrize("asked", [float("nan"), float("inf"), -1.0, 1e12])
def test_a_report_whose_delay_the_database_cannot_schedule_gets_the_backoff(asked: float) -> None:
    # run_handler never makes one; a Report built elsewhere must not fail its whole batch.
    job = make_job()

    assert record(report(claim_one(job), Outcome.RETRYABLE, error="e", retry_after=asked)) == {job.id}

    assert reload(job).scheduled_at == db_now() + dt.timedelta(seconds=1)
    assert OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").last().payload["reason"] == "retryable"


def test_a_mixed_batch_is_written_in_one_go() -> None:
    jobs = [make_job(max_retries=2) for _ in range(7)]
    stale = claim_each(*jobs)[6]
    LeaseRescuer().run_once(now=db_now() + dt.timedelta(seconds=31))  # rescues all seven ...
    promote_all()
    c = claim_each(*jobs)  # ... which run again; the seventh gets a report from its first run
    c[6] = stale

    accepted = record(
        report(c[0], Outcome.SUCCEEDED, result=[1, 2]),
        report(c[1], Outcome.RETRYABLE, error="boom"),
        report(c[2], Outcome.PERMANENT, error="bad"),
        report(c[3], Outcome.CANCELLED, error="cancelled"),
        report(c[4], Outcome.TIMED_OUT, error="slow"),
        report(c[5], Outcome.HANDED_BACK, error="shutdown"),
        report(c[6], Outcome.SUCCEEDED, result="stale"),
    )

    assert accepted == set(ids(jobs[:6]))
    statuses = [reload(j).status for j in jobs]
    assert statuses == ["SUCCESS", "RETRYING", "FAILED", "CANCELLED", "RETRYING", "RETRYING", "RUNNING"]
    assert [attempts(j)[-1][1] for j in jobs] == ["SUCCEEDED", "FAILED", "FAILED", "CANCELLED", "TIMED_OUT", "LOST"] + [
        "RUNNING"
    ]
    assert Job.objects.get(id=jobs[0].id).stored_result.result == [1, 2]
    assert Job.objects.get(id=jobs[6].id).stored_result is None


def test_outcome_writes_do_not_grow_with_the_batch() -> None:
    def statements_for(n: int) -> int:
        for _ in range(n):
            make_job()
        claimed = claim(limit=n)
        with CaptureQueriesContext(connection) as queries:
            assert len(record(*(report(c, Outcome.SUCCEEDED, result=i) for i, c in enumerate(claimed)))) == n
        return len(queries)

    assert statements_for(2) == statements_for(40)
    assert Job.objects.filter(status=JobStatus.SUCCESS).count() == 42


def test_recording_nothing_touches_nothing() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert leasing.record_outcomes([]) == set()
    assert len(queries) == 0


# -- record_batch: outcomes PostgreSQL refuses never block the others -------------------------


def batch(*reports: Report) -> leasing.BatchRecord:
    return leasing.record_batch(list(reports))


def test_a_result_postgresql_refuses_ends_its_job_failed_and_the_rest_of_the_batch_is_recorded() -> None:
    good, nul, surrogate, failing = (make_job(max_retries=2) for _ in range(4))
    c_good, c_nul, c_surrogate, c_failing = claim_each(good, nul, surrogate, failing)

    done = batch(
        report(c_good, Outcome.SUCCEEDED, result={"ok": 1}),
        report(c_nul, Outcome.SUCCEEDED, result={"text": "a\u0000b"}),  # valid JSON; jsonb refuses it
        report(c_surrogate, Outcome.SUCCEEDED, result=["\ud800"]),  # a lone surrogate: refused too
        report(c_failing, Outcome.RETRYABLE, error="boom"),
    )

    assert done.accepted == {good.id, nul.id, surrogate.id, failing.id}
    assert done.unrecorded == [] and done.superseded == []
    assert [reload(j).status for j in (good, nul, surrogate, failing)] == ["SUCCESS", "FAILED", "FAILED", "RETRYING"]
    assert Job.objects.get(id=good.id).stored_result.result == {"ok": 1}
    for job in (nul, surrogate):
        failed = reload(job)
        assert failed.last_error.startswith("the handler's result could not be stored: DataError: ")
        assert attempts(job) == [(1, AttemptStatus.FAILED)]
        assert Job.objects.get(id=job.id).stored_result.result is None
        assert events(job)[-1] == EventType.JOB_FAILED
    assert [r.outcome for r in done.recorded] == [Outcome.SUCCEEDED, Outcome.PERMANENT, Outcome.PERMANENT, "RETRYABLE"]
    assert done.final == {good.id: "SUCCESS", nul.id: "FAILED", surrogate.id: "FAILED", failing.id: "RETRYING"}


def test_a_result_postgresql_refuses_with_an_operational_error_is_isolated_not_retried_forever() -> None:
    # PostgreSQL refuses a jsonb this deep with "stack depth limit exceeded" (SQLSTATE 54001), which
    # psycopg raises as an OperationalError, the class of a lost connection: the batch must still be
    # split and the neighbour recorded, not the whole batch raised to be retried (found by an
    # adversarial check: the worker then retried it every second, forever, recording nothing).
    good, deep = make_job(max_retries=2), make_job(max_retries=2)
    c_good, c_deep = claim_each(good, deep)
    nested: list = []
    for _ in range(40_000):
        nested = [nested]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)  # so that Python can encode it, as a handler that raised the limit could
    try:
        done = batch(report(c_deep, Outcome.SUCCEEDED, result=nested), report(c_good, Outcome.SUCCEEDED, result=1))
    finally:
        sys.setrecursionlimit(limit)

    assert done.accepted == {good.id, deep.id} and done.unrecorded == []
    assert (reload(good).status, reload(deep).status) == (JobStatus.SUCCESS, JobStatus.FAILED)
    assert reload(deep).last_error.startswith("the handler's result could not be stored: OperationalError: ")


def test_nul_and_lone_surrogates_are_stripped_from_errors_and_tracebacks() -> None:
    job = make_job(max_retries=2)
    claimed = claim_one(job)

    done = batch(report(claimed, Outcome.RETRYABLE, error="bad\x00byte \udc80!", traceback="Trace\x00back \ud800"))

    assert done.accepted == {job.id}
    assert reload(job).last_error == "badbyte ?!"
    attempt = Attempt.objects.get(job_id=job.id)
    assert (attempt.error, attempt.traceback) == ("badbyte ?!", "Traceback ?")
    assert events(job)[-1] == EventType.JOB_RETRIED


def test_a_batch_never_holds_two_reports_for_one_job_the_latest_attempt_wins() -> None:
    job = make_job(max_retries=2)
    stale = claim_one(job)
    LeaseRescuer().run_once(now=db_now() + dt.timedelta(seconds=31))
    promote_all()
    current = claim_one(job)
    late, latest = report(stale, Outcome.SUCCEEDED, result="stale"), report(current, Outcome.SUCCEEDED, result="new")

    done = batch(latest, late)

    assert done.superseded == [late]
    assert done.accepted == {job.id} and done.recorded == [latest]
    assert reload(job).status == JobStatus.SUCCESS
    assert attempts(job) == [(1, AttemptStatus.LOST), (2, AttemptStatus.SUCCEEDED)]
    assert Job.objects.get(id=job.id).stored_result.result == "new"


def test_a_report_that_cannot_be_written_even_as_failed_is_set_aside_and_the_others_recorded() -> None:
    good, broken = make_job(), make_job()
    c_good, c_broken = claim_each(good, broken)
    # A report no statement can take (a lease token that is not a UUID: a bug of ours).
    malformed = report(dataclasses.replace(c_broken, lease_token="not-a-uuid"), Outcome.SUCCEEDED, result=1)

    done = batch(malformed, report(c_good, Outcome.SUCCEEDED, result=2))

    assert done.accepted == {good.id}
    assert [(r, why.split(":")[0]) for r, why in done.unrecorded] == [(malformed, "DataError")]
    assert (reload(good).status, reload(broken).status) == (JobStatus.SUCCESS, JobStatus.RUNNING)


@pytest.mark.django_db(transaction=True)
def test_only_a_connection_error_is_raised_to_retry_the_whole_batch() -> None:
    job = make_job()
    claimed = claim_one(job)
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])

    with pytest.raises(leasing.CONNECTION_ERRORS):
        batch(report(claimed, Outcome.SUCCEEDED, result=1))

    connection.close()
    assert batch(report(claimed, Outcome.SUCCEEDED, result=1)).accepted == {job.id}  # the retry goes through
    assert reload(job).status == JobStatus.SUCCESS


# -- crashes and isolation -------------------------------------------------------------------


def test_a_crashed_run_is_lost_counts_as_an_attempt_and_isolates_its_job_until_a_run_survives() -> None:
    job = make_job(max_retries=2)

    assert record(report(claim_one(job), Outcome.CRASHED, error="worker process died (exit code 1)")) == {job.id}
    crashed = reload(job)
    assert (crashed.status, crashed.isolated, crashed.attempts_left) == (JobStatus.RETRYING, True, 2)
    assert attempts(job) == [(1, AttemptStatus.LOST)]
    assert OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").last().payload["reason"] == "crashed"

    promote_all()
    assert claim(limit=1) == []  # an ordinary worker never claims an isolated job
    isolated = claim(limit=1, isolated=True)
    assert [c.id for c in isolated] == [job.id]
    record(report(isolated[0], Outcome.HANDED_BACK, error="worker shut down"))
    assert reload(job).isolated is True  # a hand-back proves nothing
    promote_all()
    (again,) = claim(limit=1, isolated=True)
    record(report(again, Outcome.RETRYABLE, error="an ordinary failure"))
    assert reload(job).isolated is False  # it ran without killing its process: it may share one again
    promote_all()
    assert [c.id for c in claim(limit=1)] == [job.id]


def test_an_isolation_slot_claims_only_isolated_jobs() -> None:
    ordinary, isolated = make_job(), make_job()
    Job.objects.filter(id=isolated.id).update(isolated=True)
    assert leasing.isolated_jobs_waiting(queues=None) is True
    assert leasing.isolated_jobs_waiting(queues=["elsewhere"]) is False

    assert [c.id for c in claim(limit=5, isolated=True)] == [isolated.id]
    assert [c.id for c in claim(limit=5)] == [ordinary.id]
    assert leasing.isolated_jobs_waiting(queues=None) is False
