"""The worker's claim loop, in-process: when it claims (scheduler.workers.runner)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import tests.support.hostile.jobs  # noqa: F401 - registers the HOSTILE_* job types in this process too
from scheduler import leasing, metrics
from scheduler.enqueuing import enqueue
from scheduler.flow import claim as flow_claim
from scheduler.leasing import Outcome, Report
from scheduler.models import Attempt, Job
from scheduler.states import AttemptStatus, JobStatus
from scheduler.workers.inflight import InFlight
from scheduler.workers.pool import ThreadPool
from scheduler.workers.runner import Worker, WorkerOptions
from tests.support.jobs import attempts
from tests.support.processes import WAIT, wait_until
from tests.support.subprocess_env import database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claims(monkeypatch) -> list[int]:
    """The jobs each claim got, in order: ``leasing.claim_jobs`` as it is, counted."""
    got: list[int] = []
    real_claim = leasing.claim_jobs

    def counted(**kwargs):
        jobs = real_claim(**kwargs)
        got.append(len(jobs))
        return jobs

    monkeypatch.setattr(leasing, "claim_jobs", counted)
    return got


def test_a_worker_claims_when_notified_never_merely_because_a_slot_freed(claims: list[int]) -> None:
    ready = threading.Event()
    earlier = set(threading.enumerate())  # threads other tests left behind are not this worker's
    # No poll falls due during the test: only NOTIFY (or a full claim) may start a claim.
    worker = Worker(WorkerOptions(concurrency=4, poll_seconds=3600, heartbeat_seconds=3600), ready=ready.set)

    def run() -> None:
        worker.run()
        connection.close()  # the test's thread plays the worker process's main thread

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert ready.wait(WAIT)
        for _ in range(5):
            job = enqueue("DEMO_TASK")
            wait_until(lambda job=job: Job.objects.get(id=job.id).status == JobStatus.SUCCESS, what="job done")
    finally:
        worker.stop()
        thread.join(WAIT)
        # Its listener and heartbeat threads close their connections as they end.
        wait_until(
            lambda: not [t for t in set(threading.enumerate()) - earlier if t.name.startswith("stint-")],
            what="worker threads ended",
        )

    assert sum(claims) == 5
    # At most the start-up claim and the one when LISTEN begins find nothing; each of the five
    # completions freed a slot and claimed nothing.
    assert claims.count(0) <= 2, claims


def claim_observations() -> float:
    (family,) = metrics.worker_claim_duration_seconds.collect()
    return next(s.value for s in family.samples if s.name == "worker_claim_duration_seconds_count")


def test_every_claim_of_a_worker_is_timed_in_the_claim_histogram_empty_ones_too(claims: list[int]) -> None:
    before = claim_observations()
    worker = Worker(WorkerOptions(concurrency=4, poll_seconds=3600, heartbeat_seconds=3600))
    worker.pool = ThreadPool(4, worker._on_done)
    worker.inflight = InFlight(worker.pool, worker._reports.put, clock=time.monotonic, worker_id=worker.id)
    try:
        enqueue("DEMO_TASK")
        assert worker._claim(4, cooldown=False) == (1, 4)
        assert worker._claim(4, cooldown=False) == (0, 4)  # nothing left: an empty claim, timed all the same
    finally:
        worker.pool.close()

    assert claims == [1, 0]
    assert claim_observations() - before == 2


def test_a_claim_in_autocommit_is_one_statement_and_commits_by_itself() -> None:
    job = enqueue("DEMO_TASK")
    assert connection.get_autocommit()
    flow_claim.limits_apply()  # the flow limits' cache (read about once a second) is not the claim
    with CaptureQueriesContext(connection) as queries:
        (claimed,) = leasing.claim_jobs(worker_id="w-test", limit=5, queues=None)
    assert len(queries) == 1
    assert not connection.in_atomic_block
    # Committed: another connection sees the lease at once.
    with psycopg.connect(database_url(), autocommit=True) as other:
        row = other.execute("SELECT status, lease_token FROM stint_job WHERE id = %s", [job.id]).fetchone()
    assert row == (JobStatus.RUNNING, claimed.lease_token)


def test_a_batch_of_successes_in_autocommit_is_one_statement_with_attempts_and_results() -> None:
    for _ in range(3):
        enqueue("DEMO_TASK")
    claimed = leasing.claim_jobs(worker_id="w-test", limit=5, queues=None)
    with CaptureQueriesContext(connection) as queries:
        done = leasing.record_batch(
            [Report(job=c, outcome=Outcome.SUCCEEDED, result={"n": i}) for i, c in enumerate(claimed)]
        )
    assert len(queries) == 1  # job moves, events, attempts and results: one statement, its own transaction
    assert done.accepted == {c.id for c in claimed}
    for i, c in enumerate(claimed):
        assert Job.objects.get(id=c.id).stored_result.result == {"n": i}
        attempt = Attempt.objects.get(job_id=c.id)
        assert (attempt.status, attempt.worker, attempt.started_at) == ("SUCCEEDED", "w-test", c.started_at)


def test_a_refused_single_statement_batch_in_autocommit_still_records_the_others() -> None:
    good, bad = enqueue("DEMO_TASK"), enqueue("DEMO_TASK")
    claimed = {c.id: c for c in leasing.claim_jobs(worker_id="w-test", limit=5, queues=None)}
    done = leasing.record_batch(
        [
            Report(job=claimed[good.id], outcome=Outcome.SUCCEEDED, result={"ok": 1}),
            Report(job=claimed[bad.id], outcome=Outcome.SUCCEEDED, result={"text": "a\u0000b"}),  # jsonb refuses
        ]
    )
    assert done.final == {good.id: JobStatus.SUCCESS, bad.id: JobStatus.FAILED}
    assert Attempt.objects.filter(job_id__in=[good.id, bad.id]).count() == 2


def test_a_dead_flusher_or_heartbeat_thread_is_started_again_at_the_next_poll(caplog) -> None:
    """A handler shares the worker's interpreter and may break what these threads call; they must come back."""
    worker = Worker(WorkerOptions(concurrency=1, heartbeat_seconds=3600))
    dead = [threading.Thread(target=lambda: None, name=f"stint-{role}") for role in ("flush", "heartbeat")]
    for thread in dead:
        thread.start()
        thread.join()
    worker._threads = list(dead)
    try:
        worker._revive_threads()

        assert [t.name for t in worker._threads] == ["stint-flush", "stint-heartbeat"]
        assert all(t.is_alive() and t not in dead for t in worker._threads)
        assert "its flush thread died; starting it again" in caplog.text
        assert "its heartbeat thread died; starting it again" in caplog.text
    finally:
        worker._done.set()  # both loops end on it
        for thread in worker._threads:
            thread.join(WAIT)
    assert not any(t.is_alive() for t in worker._threads)


def test_an_outcome_whose_job_row_another_session_keeps_locked_does_not_hold_up_the_others() -> None:
    """A handler may lock its own job row from a connection of its own and keep it locked.

    Without the flusher's lock_timeout this test would wait for the holder, for ever. The locked
    outcome waits for a retry (while its lease lasts, then it is left to lease rescue).
    """
    locked, free = enqueue("DEMO_TASK"), enqueue("DEMO_TASK")
    claimed = {c.id: c for c in leasing.claim_jobs(worker_id="w-test", limit=5, queues=None)}
    worker = Worker(WorkerOptions(concurrency=1))
    unrecorded = metrics.worker_outcomes_unrecorded_total._value.get()
    with psycopg.connect(database_url()) as holder:  # a transaction, open until the block ends
        holder.execute("SELECT 1 FROM stint_job WHERE id = %s FOR UPDATE", [locked.id])

        worker._flush([Report(job=claimed[j.id], outcome=Outcome.SUCCEEDED, result={"ok": 1}) for j in (locked, free)])

        assert Job.objects.get(id=free.id).status == JobStatus.SUCCESS
        assert Job.objects.get(id=locked.id).status == JobStatus.RUNNING
    assert [report.job.id for report, _ in worker._locked] == [locked.id]  # to be tried again
    assert metrics.worker_outcomes_unrecorded_total._value.get() == unrecorded


def test_an_outcome_refused_while_the_job_table_was_locked_is_recorded_once_the_lock_is_gone(caplog) -> None:
    """A migration's ALTER TABLE, a plain CREATE INDEX or an operator's LOCK TABLE holds every job row a while.

    Found with ``LOCK TABLE stint_job`` held 25 s from psql under load: each outcome reported
    meanwhile was dropped after the flusher's 1 s lock_timeout, and its job ran again once its
    lease expired, although its handler had succeeded and the lease was still the worker's.
    """
    job = enqueue("DEMO_TASK")
    (claimed,) = leasing.claim_jobs(worker_id="w-test", limit=1, queues=None)
    worker = Worker(WorkerOptions(concurrency=1))
    worker._threads = [worker._start_thread("flush")]
    try:
        with psycopg.connect(database_url()) as holder:  # a transaction, open until the block ends
            holder.execute("LOCK TABLE stint_job IN SHARE MODE")  # every UPDATE waits; reads go on
            worker._reports.put(Report(job=claimed, outcome=Outcome.SUCCEEDED, result={"ok": 1}))
            wait_until(lambda: "locked by another session" in caplog.text, what="the outcome refused for the lock")
            assert Job.objects.get(id=job.id).status == JobStatus.RUNNING

        wait_until(lambda: Job.objects.get(id=job.id).status == JobStatus.SUCCESS, what="the outcome recorded")
    finally:
        worker._done.set()
        for thread in worker._threads:
            thread.join(WAIT)
    assert list(Attempt.objects.filter(job_id=job.id).values_list("attempt_number", "status")) == [(1, "SUCCEEDED")]


def test_an_outcome_whose_row_stays_locked_past_its_lease_is_given_up_to_lease_rescue(settings) -> None:
    job = enqueue("DEMO_TASK")
    (claimed,) = leasing.claim_jobs(worker_id="w-test", limit=1, queues=None)
    now = [1000.0]
    worker = Worker(WorkerOptions(concurrency=1), clock=lambda: now[0])
    unrecorded = metrics.worker_outcomes_unrecorded_total._value.get()
    with psycopg.connect(database_url()) as holder:  # a transaction, open until the block ends
        holder.execute("SELECT 1 FROM stint_job WHERE id = %s FOR UPDATE", [job.id])
        worker._flush([Report(job=claimed, outcome=Outcome.SUCCEEDED, result={"ok": 1})])
        now[0] += settings.SCHEDULER["LEASE_SECONDS"] - 1  # within the lease: tried again, still locked
        worker._retry_locked()
        assert len(worker._locked) == 1
        assert metrics.worker_outcomes_unrecorded_total._value.get() == unrecorded
        now[0] += 2  # past it: the rescuer's
        worker._retry_locked()

    assert worker._locked == []
    assert metrics.worker_outcomes_unrecorded_total._value.get() == unrecorded + 1
    assert Job.objects.get(id=job.id).status == JobStatus.RUNNING


def test_a_pool_child_that_locks_the_job_table_is_still_timed_out_and_killed(monkeypatch) -> None:
    """The claim loop enforces deadlines; a lock that a handler holds must not stop it doing so.

    Its claims and cancel checks read the job table: they waited for the child's lock, which only
    that loop could end (by killing the child at its deadline), so the worker (and every session
    that touches the job table) waited for as long as the handler chose to hold it.
    """
    monkeypatch.setenv("STINT_EXTRA_APPS", "tests.support.hostile")  # read by the spawned pool child
    monkeypatch.setenv("DATABASE_URL", database_url())  # the test database
    job = enqueue("HOSTILE_LOCK_JOBS", {"sleep": 30}, timeout_seconds=1, max_retries=1)
    ready = threading.Event()
    worker = Worker(
        WorkerOptions(concurrency=1, pool="processes", poll_seconds=0.1, heartbeat_seconds=3600), ready=ready.set
    )
    timed_out = metrics.jobs_timed_out_total.labels("HOSTILE_LOCK_JOBS", "default")
    before = timed_out._value.get()

    def run() -> None:
        worker.run()
        connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert ready.wait(WAIT)
        # Read in this process, not in the job table: the lock holds every reader of that table.
        wait_until(lambda: timed_out._value.get() == before + 1, what="the job timed out while its child held the lock")
    finally:
        worker.stop(force=True)
        thread.join(WAIT)
    assert not thread.is_alive()
    assert Job.objects.get(id=job.id).status == JobStatus.RETRYING
    assert attempts(job) == [(1, AttemptStatus.TIMED_OUT)]
