"""The lease rescuer and the worker reaper (scheduler.maintenance.rescuer).

Services are driven through ``run_once(now)`` with an explicit ``now``; nothing waits on timers.
The concurrency tests run several services at once on threads, each with its own connection.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter

import pytest
from django.db import connection
from django.db.models import F

from core.pg_connect import pg_connect
from scheduler import leasing
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.job_actions import job_cancel
from scheduler.leasing import Outcome, Report
from scheduler.maintenance.promoter import DuePromoter
from scheduler.maintenance.rescuer import UNRUN_ERROR, LeaseRescuer, WorkerReaper, rescue_held_by
from scheduler.models import Attempt, Job, JobAttempt, OutboxEvent, WorkerNode
from scheduler.states import AttemptStatus, EventType, JobStatus
from tests.support.factories import worker_node
from tests.support.jobs import (
    LEASE,
    WORKER,
    attempts,
    claim,
    db_now,
    events,
    later,
    run_on_threads,
    running_job,
    status,
)
from tests.support.net import FreezableProxy

pytestmark = pytest.mark.usefixtures("maintenance_settings")


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
    assert Attempt.objects.get(job_id=job.id).finished_at is not None
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
def test_a_rescue_stores_no_result_and_a_rescued_cancel_keeps_the_jobs_error() -> None:
    # What the rescue verb writes besides the move (lifecycle.rescue_leases): the LOST attempt
    # with the error, no result row, and for a cancel neither last_error nor an error in the event.
    dead, _ = running_job(max_retries=1)
    Job.objects.filter(id=dead.id).update(attempts=2)  # its last attempt of 1 + max_retries
    cancelled, _ = running_job(max_retries=3)
    Job.objects.filter(id=cancelled.id).update(last_error="earlier")
    job_cancel(job_id=cancelled.id)

    assert LeaseRescuer().run_once(now=later(LEASE + 1)) == 2

    assert status(dead) == JobStatus.DEAD
    assert status(cancelled) == JobStatus.CANCELLED
    assert not Job.objects.filter(id__in=[dead.id, cancelled.id], result_attempt__isnull=False).exists()
    assert Job.objects.get(id=cancelled.id).last_error == "earlier"
    last = {j.id: OutboxEvent.objects.filter(job_id=j.id).order_by("sequence").last() for j in (dead, cancelled)}
    assert last[dead.id].payload["reason"] == "lease_expired"
    assert "lease expired" in last[dead.id].payload["error"]
    assert last[cancelled.id].payload["reason"] == "lease_expired"
    assert "error" not in last[cancelled.id].payload
    lost = Attempt.objects.get(job_id=cancelled.id)
    assert (lost.status, "lease expired" in lost.error) == (AttemptStatus.LOST, True)


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
    assert Attempt.objects.filter(status=AttemptStatus.LOST).count() == 7


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
    assert Attempt.objects.filter(job_id__in=ids, status=AttemptStatus.LOST).count() == 200


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
    attempt_rows = dict(Attempt.objects.filter(job_id__in=ids).values_list("job_id", "status"))
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
    retried, last_try, cancelled = (enqueue("DEMO_TASK", {}, max_retries=m) for m in (2, 1, 2))
    # Lower priority: claimed last. One transaction gives the four jobs the same scheduled_at and
    # created_at, so without it the claim order among them is the index's, not the test's.
    elsewhere = enqueue("DEMO_TASK", {}, max_retries=2, priority="LOW")
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
        attempt = Attempt.objects.filter(job_id=job.id).get()
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
def test_the_jobs_a_dead_worker_process_had_not_begun_are_handed_back_unrun_with_no_attempt_spent() -> None:
    begun, waiting, waiting_cancelled = (enqueue("DEMO_TASK", {}, max_retries=1) for _ in range(3))
    assert {c.id for c in claim(limit=3)} == {begun.id, waiting.id, waiting_cancelled.id}
    job_cancel(job_id=waiting_cancelled.id)

    unbegun = {waiting.id, waiting_cancelled.id}  # its waiting board (scheduler.workers.waiting_board)
    assert rescue_held_by(worker_id=WORKER, error=DIED, isolate=True, unbegun=unbegun) == 3

    rows = {j.id: j for j in Job.objects.all()}
    # The job that began: rescued LOST, its attempt spent, isolated (it may have killed the process).
    assert (rows[begun.id].status, rows[begun.id].isolated, rows[begun.id].attempts_left) == (
        JobStatus.RETRYING,
        True,
        1,
    )
    # The job no slot began: handed back, due now, no attempt spent, not isolated.
    handed = rows[waiting.id]
    assert (handed.status, handed.isolated, handed.attempts_left, handed.last_error) == (
        JobStatus.RETRYING,
        False,
        2,
        UNRUN_ERROR,
    )
    assert handed.scheduled_at <= db_now()
    attempt = Attempt.objects.get(job_id=waiting.id)
    assert (attempt.status, attempt.error) == (AttemptStatus.LOST, UNRUN_ERROR)
    event = OutboxEvent.objects.filter(job_id=waiting.id).order_by("sequence").last()
    assert (event.event_type, event.payload["error"]) == (EventType.JOB_RETRIED, UNRUN_ERROR)
    # A cancel requested while it waited wins: CANCELLED, as a rescue of it would end it.
    assert rows[waiting_cancelled.id].status == JobStatus.CANCELLED
    assert rescue_held_by(worker_id=WORKER, error=DIED, isolate=True, unbegun=unbegun) == 0  # fenced: once only


@pytest.mark.django_db
def test_a_job_handed_back_unrun_keeps_its_place_in_line() -> None:
    """It was due and waiting; handed back, it is claimed before the jobs that were queued after it."""
    # One test transaction gives every row one now(): the due times are set apart explicitly.
    first = enqueue("DEMO_TASK", {}, scheduled_at=db_now() - dt.timedelta(seconds=2))
    second = enqueue("DEMO_TASK", {}, scheduled_at=db_now() - dt.timedelta(seconds=1))  # same priority
    assert [c.id for c in claim(limit=1)] == [first.id]
    assert rescue_held_by(worker_id=WORKER, error=DIED, isolate=True, unbegun={first.id}) == 1

    DuePromoter().run_once()
    assert [c.id for c in claim(limit=1)] == [first.id]
    assert status(second) == JobStatus.QUEUED


@pytest.mark.django_db
def test_a_late_outcome_of_a_rescued_dead_process_changes_nothing() -> None:
    job, claimed = running_job(max_retries=2)
    assert rescue_held_by(worker_id=WORKER, error=DIED, isolate=True) == 1

    assert leasing.record_outcomes([Report(job=claimed, outcome=Outcome.SUCCEEDED, result=1)]) == set()

    assert status(job) == JobStatus.RETRYING
    assert attempts(job) == [(1, AttemptStatus.LOST)]


# -- WorkerReaper -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_reaper_marks_only_silent_workers_gone() -> None:
    now = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    silent = worker_node(last_heartbeat_at=now - dt.timedelta(seconds=61))
    quiet = worker_node(last_heartbeat_at=now - dt.timedelta(seconds=59))
    gone_before = now - dt.timedelta(hours=1)
    gone = worker_node(last_heartbeat_at=now - dt.timedelta(hours=2), stopped_at=gone_before)

    assert WorkerReaper().run_once(now=now) == 1
    assert WorkerReaper().run_once(now=now) == 0

    nodes = {n.id: n.stopped_at for n in WorkerNode.objects.all()}
    assert nodes == {silent.id: now, quiet.id: None, gone.id: gone_before}


@pytest.mark.django_db(transaction=True)
def test_rescuer_gives_live_workers_a_heartbeat_after_the_database_froze_past_their_leases(settings) -> None:
    """A frozen database (SIGSTOP, a paused VM) stops heartbeats and the rescue query alike.

    Its clock runs on, so when it answers again every lease looks expired, and the rescuer's
    query, sent during the freeze, runs first: measured on the dev stack, a 45 s SIGSTOP of
    PostgreSQL made the rescuer take two jobs from a live worker whose outcomes were waiting to be
    written (LOST, run twice). A rescuer whose query waited that long rescues nothing until the
    workers had a heartbeat's time; a worker that stays silent is rescued after it.
    """
    settings.SCHEDULER = {**settings.SCHEDULER, "LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.5}
    job, claimed = running_job()
    saved = dict(connection.settings_dict)
    with FreezableProxy((saved["HOST"] or "127.0.0.1", int(saved["PORT"] or 5432))) as proxy:
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port))
        try:
            rescuer = LeaseRescuer()
            assert rescuer.run_once() == 0  # connected through the proxy; the lease is live
            proxy.freeze()
            thaw = threading.Timer(LeaseRescuer.stall_seconds + 0.5, proxy.thaw)
            thaw.start()
            assert rescuer.run_once() == 0  # its query ran after the thaw, past the 1 s lease: held off
            thaw.join()
        finally:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)
    assert status(job) == JobStatus.RUNNING
    held, _ = leasing.heartbeat(worker_id=WORKER, jobs=[(claimed.id, claimed.lease_token)])
    assert held == {claimed.id}  # the live worker keeps its job
    assert rescuer.run_once() == 0
    time.sleep(1.5 * 0.5 + 1.2)  # past the hold and the renewed lease, with no heartbeat
    assert rescuer.run_once() == 1  # a worker silent after the freeze is rescued as before
    assert attempts(job) == [(1, AttemptStatus.LOST)]


@pytest.mark.django_db
def test_a_database_that_stays_slow_delays_rescue_once_not_for_ever(monkeypatch) -> None:
    """Rescue queries that all wait ``stall_seconds`` (a database under load, not a freeze) hold it off once.

    The hold after a stall gives live workers a heartbeat's time; a run after it rescues even if
    its query was slow again, until a query answers quickly and a new stall can hold again.
    """
    job, _ = running_job()
    Job.objects.filter(id=job.id).update(lease_expires_at=F("lease_expires_at") - dt.timedelta(hours=1))
    rescuer = LeaseRescuer()
    monkeypatch.setattr(rescuer, "stall_seconds", 0.0)  # every query counts as one that waited
    assert rescuer.run_once() == 0  # the first slow query: held off while live workers heartbeat
    rescuer._hold_until = 0.0  # the hold has run out
    assert rescuer.run_once() == 1  # slow again: rescued all the same
    assert status(job) == JobStatus.RETRYING


@pytest.mark.django_db(transaction=True)
def test_a_stalled_rescue_query_that_found_the_leases_locked_by_another_rescuer_holds_off_too(
    monkeypatch, settings
) -> None:
    """Every scheduler runs a rescuer; after a freeze each one's query has stalled, not only the one that got rows.

    The first rescuer to answer locks the expired rows (``FOR UPDATE``) while it decides to hold
    off, so another's stalled query skips them (``SKIP LOCKED``) and gets none; a live worker's
    heartbeat meanwhile skips them too. That other rescuer, not held, would take the live workers'
    jobs on its next, prompt query a second later, unless their next heartbeat beat it (a race
    read in the code after pg-freeze's logs showed one scheduler of two holding off; no run lost
    an attempt to it).
    """
    settings.SCHEDULER = {**settings.SCHEDULER, "HEARTBEAT_SECONDS": 10.0}  # a hold of 15 s: both runs fall in it
    job, claimed = running_job()
    Job.objects.filter(id=job.id).update(lease_expires_at=F("lease_expires_at") - dt.timedelta(hours=1))
    other = LeaseRescuer()
    with pg_connect(autocommit=False) as first:  # the rescuer that got the rows, holding off
        first.execute("SELECT id FROM stint_job WHERE id = %s FOR UPDATE", [job.id])
        monkeypatch.setattr(other, "stall_seconds", 0.0)  # its query waited out the freeze
        assert other.run_once() == 0  # nothing: the rows were locked
        first.rollback()  # the first rescuer held off: nothing changed
    monkeypatch.setattr(other, "stall_seconds", LeaseRescuer.stall_seconds)  # the next query answers at once
    assert other.run_once() == 0  # held off all the same: the live worker gets its heartbeat
    held, _ = leasing.heartbeat(worker_id=WORKER, jobs=[(claimed.id, claimed.lease_token)])
    assert held == {claimed.id}
    other._hold_until = 0.0  # the hold has run out
    assert other.run_once() == 0  # the lease is live again: the worker keeps its job
    assert status(job) == JobStatus.RUNNING
