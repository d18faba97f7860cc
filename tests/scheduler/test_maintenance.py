"""Tests for scheduler.maintenance: the due promoter, the lease rescuer, the worker reaper, the pruner and the loop.

Services are driven through ``run_once(now)`` with an explicit ``now``; nothing waits on timers.
The concurrency tests run several services at once on threads, each with its own connection.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models import F

from core.pg_connect import pg_connect
from scheduler import leasing, selectors
from scheduler.leasing import Outcome, Report
from scheduler.lifecycle import Claimed
from scheduler.maintenance import default_services
from scheduler.maintenance.loop import SchedulerLoop
from scheduler.maintenance.promoter import DuePromoter
from scheduler.maintenance.pruner import WORKER_RETENTION_SECONDS, Pruner
from scheduler.maintenance.rescuer import LeaseRescuer, WorkerReaper, rescue_held_by
from scheduler.models import Job, JobAttempt, OutboxEvent, WorkerNode
from scheduler.notify import CHANNEL
from scheduler.services import enqueue, enqueue_many, job_cancel
from scheduler.states import AttemptStatus, EventType, JobStatus

WORKER = "test-host:1:abc"
LEASE = 30  # seconds


@pytest.fixture(autouse=True)
def _scheduler_settings(settings) -> None:
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "LEASE_SECONDS": LEASE,
        "BACKOFF_BASE_SECONDS": 1.0,
        "BACKOFF_MAX_SECONDS": 30.0,
        "BACKOFF_JITTER": False,
        "WORKER_DEAD_AFTER_SECONDS": 60,
    }


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def later(seconds: float) -> dt.datetime:
    return db_now() + dt.timedelta(seconds=seconds)


def claim(limit: int = 1) -> list[Claimed]:
    return leasing.claim_jobs(worker_id=WORKER, limit=limit, queues=None)


def running_job(**options: Any) -> tuple[Job, Claimed]:
    """Enqueue a DEMO_TASK and claim it; it must be the only claimable job."""
    job = enqueue("DEMO_TASK", {}, **options)
    (claimed,) = claim()
    assert claimed.id == job.id
    return job, claimed


def status(job: Job | Claimed) -> str:
    return Job.objects.values_list("status", flat=True).get(id=job.id)


def events(job: Job | Claimed) -> list[str]:
    return list(OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").values_list("event_type", flat=True))


def attempts(job: Job | Claimed) -> list[tuple[int, str]]:
    """The job's attempts as the API lists them: the finished rows, then a RUNNING job's current one."""
    rows = list(JobAttempt.objects.filter(job_id=job.id).values_list("attempt_number", "status"))
    running = selectors.job_running_attempt(job_id=job.id)
    return rows + ([(running.attempt_number, running.status)] if running else [])


def run_on_threads(functions: list[Callable[[], Any]]) -> list[Any]:
    """Start every function at the same instant on its own thread (own connection); return results."""
    barrier = threading.Barrier(len(functions))
    results: list[Any] = [None] * len(functions)
    errors: list[Exception] = []

    def run(index: int, function: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = function()
        except Exception as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(functions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a service thread hung"
    if errors:
        raise errors[0]
    return results


# -- DuePromoter -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_promoter_moves_only_due_scheduled_and_retrying_jobs() -> None:
    retrying, claimed = running_job()
    leasing.record_outcomes([Report(job=claimed, outcome=Outcome.RETRYABLE, error="boom")])  # due in 1 s
    scheduled = enqueue("DEMO_TASK", {}, scheduled_at=later(10))
    not_due = enqueue("DEMO_TASK", {}, scheduled_at=later(100))
    cancelled = enqueue("DEMO_TASK", {}, scheduled_at=later(5))
    job_cancel(job_id=cancelled.id)
    queued = enqueue("DEMO_TASK", {})
    running = enqueue("DEMO_TASK", {}, priority="HIGH")
    claim()
    before = {j.id: status(j) for j in (retrying, scheduled, not_due, cancelled, queued, running)}
    assert before == {
        retrying.id: "RETRYING",
        scheduled.id: "SCHEDULED",
        not_due.id: "SCHEDULED",
        cancelled.id: "CANCELLED",
        queued.id: "QUEUED",
        running.id: "RUNNING",
    }

    assert DuePromoter().run_once(now=later(0.5)) == 0
    assert DuePromoter().run_once(now=later(5)) == 1
    assert status(retrying) == JobStatus.QUEUED
    assert DuePromoter().run_once(now=later(10)) == 1  # due exactly now counts
    assert status(scheduled) == JobStatus.QUEUED
    assert DuePromoter().run_once(now=later(10)) == 0

    assert [status(j) for j in (not_due, cancelled, queued, running)] == ["SCHEDULED", "CANCELLED", "QUEUED", "RUNNING"]
    assert events(scheduled) == ["JOB_CREATED", "JOB_SCHEDULED", "JOB_QUEUED"]
    assert events(retrying)[-2:] == ["JOB_RETRIED", "JOB_QUEUED"]
    promoted = OutboxEvent.objects.get(job_id=scheduled.id, event_type=EventType.JOB_QUEUED)
    assert (promoted.from_status, promoted.to_status) == ("SCHEDULED", "QUEUED")


@pytest.mark.django_db
def test_an_idle_promoter_reports_when_the_next_delayed_job_falls_due() -> None:
    promoter = DuePromoter()
    assert promoter.run_once() == 0
    assert promoter.next_due_seconds is None  # nothing waits

    enqueue("DEMO_TASK", {}, scheduled_at=later(30))
    assert promoter.run_once() == 0
    assert promoter.next_due_seconds is not None and 20 < promoter.next_due_seconds <= 30

    assert promoter.run_once(now=later(31)) == 1
    assert promoter.next_due_seconds is None  # it promoted: the loop runs it again at its interval


@pytest.mark.django_db
def test_promoter_works_through_every_batch() -> None:
    enqueue_many([{"type": "DEMO_TASK", "scheduled_at": later(60)} for _ in range(10)])

    assert DuePromoter(batch=3).run_once(now=later(61)) == 10
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 10


@pytest.fixture
def listener() -> Iterator[psycopg.Connection]:
    """A separate autocommit connection listening on the workers' channel."""
    with pg_connect() as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn


def notifications(conn: psycopg.Connection) -> list[str]:
    """Return the payloads received so far, up to a sentinel we send last (commit order is delivery order)."""
    sentinel = f"sentinel-{uuid.uuid4()}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, sentinel])
    payloads = []
    for note in conn.notifies(timeout=10):
        if note.payload == sentinel:
            return payloads
        payloads.append(note.payload)
    raise AssertionError(f"sentinel notification not received; got {payloads}")


@pytest.mark.django_db(transaction=True)
def test_promoter_notifies_once_per_batch_naming_the_queues(listener: psycopg.Connection) -> None:
    due = later(60)
    enqueue_many([{"type": "DEMO_TASK", "queue": q, "scheduled_at": due} for q in ["b", "a", "b", "a", "b"]])
    assert notifications(listener) == []  # SCHEDULED jobs wake nobody

    assert DuePromoter().run_once(now=later(61)) == 5
    assert notifications(listener) == ["a,b"]

    assert DuePromoter().run_once(now=later(61)) == 0
    assert notifications(listener) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_promoters_never_promote_a_job_twice() -> None:
    due = later(60)
    ids = enqueue_many([{"type": "DEMO_TASK", "scheduled_at": due} for _ in range(300)])
    at = later(61)

    counts = run_on_threads([lambda: DuePromoter(batch=20).run_once(now=at) for _ in range(4)])

    assert sum(counts) == 300
    assert Job.objects.filter(id__in=ids, status=JobStatus.QUEUED).count() == 300
    per_job = Counter(
        OutboxEvent.objects.filter(job_id__in=ids, event_type=EventType.JOB_QUEUED).values_list("job_id", flat=True)
    )
    assert set(per_job.values()) == {1}
    assert len(per_job) == 300


# -- LeaseRescuer ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_rescuer_leaves_live_leases_alone() -> None:
    job, _ = running_job()

    assert LeaseRescuer().run_once() == 0
    assert LeaseRescuer().run_once(now=later(LEASE)) == 0  # expires at exactly now + LEASE
    assert status(job) == JobStatus.RUNNING
    assert attempts(job) == [(1, AttemptStatus.RUNNING)]


@pytest.mark.django_db
def test_rescuer_retries_an_expired_lease_with_backoff() -> None:
    job, _ = running_job(max_retries=2)

    assert LeaseRescuer().run_once(now=later(LEASE + 1)) == 1

    rescued = Job.objects.get(id=job.id)
    assert rescued.status == JobStatus.RETRYING
    assert rescued.scheduled_at == db_now() + dt.timedelta(seconds=1)
    assert (rescued.lease_owner, rescued.lease_token, rescued.lease_expires_at) == (None, None, None)
    assert "lease expired" in rescued.last_error
    assert attempts(job) == [(1, AttemptStatus.LOST)]
    assert JobAttempt.objects.get(job_id=job.id).finished_at is not None
    event = OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").last()
    assert (event.event_type, event.from_status, event.to_status) == ("JOB_LEASE_EXPIRED", "RUNNING", "RETRYING")
    assert event.payload["backoff_seconds"] == 1.0
    assert LeaseRescuer().run_once(now=later(LEASE + 1)) == 0


@pytest.mark.django_db
def test_rescuer_dead_letters_when_no_attempts_are_left() -> None:
    job, _ = running_job(max_retries=1)
    LeaseRescuer().run_once(now=later(LEASE + 1))
    DuePromoter().run_once(now=later(3600))
    (second,) = claim()
    assert second.attempt == 2

    assert LeaseRescuer().run_once(now=later(LEASE + 1)) == 1

    dead = Job.objects.get(id=job.id)
    assert dead.status == JobStatus.DEAD
    assert dead.finished_at is not None
    assert attempts(job) == [(1, AttemptStatus.LOST), (2, AttemptStatus.LOST)]
    assert events(job)[-1] == EventType.JOB_DEAD


@pytest.mark.django_db
def test_rescuer_cancels_an_expired_job_whose_cancel_was_requested() -> None:
    job, _ = running_job(max_retries=3)
    job_cancel(job_id=job.id)

    assert LeaseRescuer().run_once(now=later(LEASE + 1)) == 1

    assert status(job) == JobStatus.CANCELLED
    assert attempts(job) == [(1, AttemptStatus.LOST)]
    assert events(job)[-1] == EventType.JOB_CANCELLED


@pytest.mark.django_db
def test_rescuer_works_through_every_batch() -> None:
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(7)])
    claim(limit=7)

    assert LeaseRescuer(batch=2).run_once(now=later(LEASE + 1)) == 7
    assert JobAttempt.objects.filter(status=AttemptStatus.LOST).count() == 7


@pytest.mark.django_db(transaction=True)
def test_concurrent_rescuers_never_rescue_a_job_twice() -> None:
    ids = enqueue_many([{"type": "DEMO_TASK"} for _ in range(200)])
    assert len(claim(limit=200)) == 200
    at = later(LEASE + 1)

    counts = run_on_threads([lambda: LeaseRescuer(batch=15).run_once(now=at) for _ in range(3)])

    assert sum(counts) == 200
    assert Job.objects.filter(id__in=ids, status=JobStatus.RETRYING).count() == 200
    expired = Counter(
        OutboxEvent.objects.filter(job_id__in=ids, event_type=EventType.JOB_LEASE_EXPIRED).values_list(
            "job_id", flat=True
        )
    )
    assert len(expired) == 200
    assert set(expired.values()) == {1}
    assert JobAttempt.objects.filter(job_id__in=ids, status=AttemptStatus.LOST).count() == 200


@pytest.mark.django_db(transaction=True)
def test_a_rescue_racing_late_completions_lets_exactly_one_side_win() -> None:
    ids = enqueue_many([{"type": "DEMO_TASK"} for _ in range(200)])
    claimed = claim(limit=200)
    at = later(LEASE + 1)

    def complete() -> int:
        accepted = set()
        for start in range(0, len(claimed), 10):
            batch = claimed[start : start + 10]
            accepted |= leasing.record_outcomes([Report(job=c, outcome=Outcome.SUCCEEDED, result=1) for c in batch])
        return len(accepted)

    completed, rescued = run_on_threads([complete, lambda: LeaseRescuer(batch=10).run_once(now=at)])

    assert completed + rescued == 200
    rows = dict(Job.objects.filter(id__in=ids).values_list("id", "status"))
    attempt_rows = dict(JobAttempt.objects.filter(job_id__in=ids).values_list("job_id", "status"))
    finals = Counter(
        OutboxEvent.objects.filter(
            job_id__in=ids, event_type__in=[EventType.JOB_COMPLETED, EventType.JOB_LEASE_EXPIRED]
        ).values_list("job_id", flat=True)
    )
    assert set(finals.values()) == {1}
    assert len(finals) == 200
    for job_id in ids:
        expected_attempt = {"SUCCESS": "SUCCEEDED", "RETRYING": "LOST"}[rows[job_id]]
        assert attempt_rows[job_id] == expected_attempt


# -- rescue of a dead worker process's jobs (the run_workers supervisor) ------------------------

DIED = "worker process died (signal 11: SIGSEGV) while running this job"


@pytest.mark.django_db
def test_the_jobs_of_a_dead_worker_process_are_rescued_at_once_and_isolated() -> None:
    retried, last_try, cancelled, elsewhere = (enqueue("DEMO_TASK", {}, max_retries=m) for m in (2, 1, 2, 2))
    mine = claim(limit=3)
    assert {c.id for c in mine} == {retried.id, last_try.id, cancelled.id}
    leasing.claim_jobs(worker_id="other-host:2:def", limit=1, queues=None)  # ``elsewhere``
    Job.objects.filter(id=last_try.id).update(attempts=F("attempts") + 1)  # its last attempt is running
    JobAttempt.objects.filter(job_id=last_try.id).update(attempt_number=2)
    job_cancel(job_id=cancelled.id)

    assert rescue_held_by(worker_id=WORKER, error=DIED, isolate=True) == 3  # before any lease expired

    rows = {j.id: j for j in Job.objects.all()}
    assert [rows[j.id].status for j in (retried, last_try, cancelled, elsewhere)] == [
        JobStatus.RETRYING,
        JobStatus.DEAD,
        JobStatus.CANCELLED,
        JobStatus.RUNNING,
    ]
    assert all(rows[j.id].isolated for j in (retried, last_try, cancelled))
    assert not rows[elsewhere.id].isolated
    assert rows[retried.id].last_error == DIED
    assert rows[retried.id].attempts_left == 2  # the lost attempt counts, as after a lease expiry
    for job in (retried, last_try, cancelled):
        attempt = JobAttempt.objects.filter(job_id=job.id).get()
        assert (attempt.status, attempt.error) == (AttemptStatus.LOST, DIED)
    event = OutboxEvent.objects.filter(job_id=retried.id).order_by("sequence").last()
    assert (event.event_type, event.payload["reason"], event.payload["error"]) == (
        EventType.JOB_LEASE_EXPIRED,
        "worker_died",
        DIED,
    )
    assert rescue_held_by(worker_id=WORKER, error=DIED, isolate=True) == 0  # fenced: once only
    assert LeaseRescuer().run_once(now=later(LEASE + 1)) == 1  # only ``elsewhere``'s lease


@pytest.mark.django_db
def test_a_late_outcome_of_a_rescued_dead_process_changes_nothing() -> None:
    job, claimed = running_job(max_retries=2)
    assert rescue_held_by(worker_id=WORKER, error=DIED, isolate=True) == 1

    assert leasing.record_outcomes([Report(job=claimed, outcome=Outcome.SUCCEEDED, result=1)]) == set()

    assert status(job) == JobStatus.RETRYING
    assert attempts(job) == [(1, AttemptStatus.LOST)]


# -- WorkerReaper and Pruner -----------------------------------------------------------------


def make_node(*, last_heartbeat_at: dt.datetime, stopped_at: dt.datetime | None = None) -> WorkerNode:
    return WorkerNode.objects.create(
        id=f"host:{uuid.uuid4().hex[:8]}",
        hostname="host",
        pid=1,
        queues=[],
        concurrency=1,
        pool="threads",
        started_at=last_heartbeat_at,
        last_heartbeat_at=last_heartbeat_at,
        stopped_at=stopped_at,
    )


@pytest.mark.django_db
def test_reaper_marks_only_silent_workers_gone() -> None:
    now = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    silent = make_node(last_heartbeat_at=now - dt.timedelta(seconds=61))
    quiet = make_node(last_heartbeat_at=now - dt.timedelta(seconds=59))
    gone_before = now - dt.timedelta(hours=1)
    gone = make_node(last_heartbeat_at=now - dt.timedelta(hours=2), stopped_at=gone_before)

    assert WorkerReaper().run_once(now=now) == 1
    assert WorkerReaper().run_once(now=now) == 0

    nodes = {n.id: n.stopped_at for n in WorkerNode.objects.all()}
    assert nodes == {silent.id: now, quiet.id: None, gone.id: gone_before}


@pytest.mark.django_db
def test_pruner_deletes_only_long_stopped_workers() -> None:
    now = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    keep_for = dt.timedelta(seconds=WORKER_RETENTION_SECONDS)
    old = make_node(last_heartbeat_at=now - keep_for * 2, stopped_at=now - keep_for - dt.timedelta(seconds=1))
    recent = make_node(last_heartbeat_at=now - keep_for, stopped_at=now - keep_for + dt.timedelta(seconds=1))
    live = make_node(last_heartbeat_at=now - keep_for * 2)

    assert Pruner().run_once(now=now) >= 1

    assert set(WorkerNode.objects.values_list("id", flat=True)) == {recent.id, live.id}
    assert not WorkerNode.objects.filter(id=old.id).exists()


# -- SchedulerLoop ---------------------------------------------------------------------------


class FakeService:
    """A service that counts its runs and may raise."""

    def __init__(
        self,
        name: str,
        *,
        interval: float = 0.0,
        fails: bool = False,
        leader_only: bool = False,
        on_run: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.on_run = on_run
        self.interval_seconds = interval
        self.leader_only = leader_only
        self.fails = fails
        self.runs = 0

    def run_once(self, now: dt.datetime | None = None) -> int:
        self.runs += 1
        if self.on_run is not None:
            self.on_run()
        if self.fails:
            raise RuntimeError(f"{self.name} broke")
        return 2


class FakeLeadership:
    def __init__(self, leading: bool) -> None:
        self.leading = leading
        self.released = False

    def acquire_or_renew(self) -> bool:
        return self.leading

    def release(self) -> None:
        self.released = True


def test_a_failing_service_run_is_logged_and_counts_nothing() -> None:
    fast, broken = FakeService("fast"), FakeService("broken", fails=True)
    loop = SchedulerLoop(services=[broken, fast])

    assert loop._run_one(broken) == 0
    assert loop._run_one(fast) == 2
    assert (fast.runs, broken.runs) == (1, 1)


@pytest.mark.parametrize("leading", [True, False])
def test_loop_runs_leader_services_only_while_leading(leading: bool) -> None:
    loop = SchedulerLoop(services=[], leadership=FakeLeadership(leading), tick_seconds=0.01)
    # The loop ends once every service that may run has run: cron too while leading.
    plain = FakeService("plain", on_run=None if leading else loop.stop)
    cron = FakeService("cron", leader_only=True, on_run=lambda: plain.runs and loop.stop())
    loop.services, loop.leader_services = [plain], [cron]

    assert loop.run() == 0

    assert plain.runs >= 1
    assert (cron.runs >= 1) if leading else (cron.runs == 0)


def test_loop_stops_and_releases_leadership() -> None:
    leadership = FakeLeadership(True)
    loop = SchedulerLoop(services=[], leadership=leadership, tick_seconds=0.01)
    loop.stop()

    assert loop.run() == 0
    assert leadership.released


def test_default_services_cover_promotion_rescue_reaping_and_pruning() -> None:
    names = {s.name for s in default_services()}
    assert {"promoter", "rescuer", "worker_reaper", "pruner"} <= names


def test_an_idle_service_backs_off_to_at_most_a_second_and_a_busy_one_keeps_its_interval() -> None:
    from scheduler.maintenance.loop import IDLE_MAX_SECONDS, idle_interval

    assert idle_interval(0.1, 0, now=100.0) == 0.1
    assert idle_interval(0.1, 2, now=100.0) == pytest.approx(0.4)
    assert idle_interval(0.1, 50, now=100.0) == IDLE_MAX_SECONDS
    # Backed off, it wakes just after the next whole second, when cron fires fall due.
    assert idle_interval(0.1, 50, now=100.7) == pytest.approx(0.305)
    assert idle_interval(60.0, 50, now=100.7) == 60.0  # a slow service keeps its own interval


class IdleService(FakeService):
    """Finds nothing to do, but knows when work falls due."""

    def __init__(self, due: float | None) -> None:
        super().__init__("idle", interval=60.0)
        self.next_due_seconds = due

    def run_once(self, now: dt.datetime | None = None) -> int:
        self.runs += 1
        return 0


class RecordingStop:
    """Stands in for the loop's stop event: records each wait, then stops the loop."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def is_set(self) -> bool:
        return bool(self.waits)

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return True


def test_the_loop_wakes_a_service_when_its_work_falls_due_before_its_next_poll() -> None:
    loop = SchedulerLoop(services=[])
    loop._stop = RecordingStop()

    loop._service_loop(IdleService(due=0.25), leader_only=False)

    assert loop._stop.waits == [0.25]
