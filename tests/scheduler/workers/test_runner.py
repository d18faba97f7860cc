"""The worker's claim loop, in-process: when it claims (scheduler.workers.runner)."""

from __future__ import annotations

import datetime as dt
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
from scheduler.flow import limits as flow_limits
from scheduler.leasing import Outcome, Report
from scheduler.models import Attempt, Job, OutboxEvent, WorkerNode
from scheduler.notify import CHANNEL
from scheduler.queues import queue_pause
from scheduler.registry import handler
from scheduler.states import AttemptStatus, EventType, JobStatus
from scheduler.workers.inflight import InFlight
from scheduler.workers.pool import ThreadPool
from scheduler.workers.runner import Worker, WorkerOptions
from scheduler.workers.wakeup import Listener, WaitSet
from tests.support.jobs import attempts, events
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


def test_a_claim_in_autocommit_is_one_statement_and_commits_by_itself(monkeypatch) -> None:
    job = enqueue("DEMO_TASK")
    assert connection.get_autocommit()
    # The flow limits' cache (read about once a second) and the held-flag release (every 30 s)
    # are not the claim: both done now and not due again during the test, however slow the machine.
    monkeypatch.setattr(flow_limits, "CACHE_SECONDS", 3600.0)
    monkeypatch.setattr(flow_claim, "RELEASE_EVERY", 3600.0)
    flow_claim.limits_apply()
    flow_claim.release_due()
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


# -- claim ahead ------------------------------------------------------------------------------


def gated_handler(job_type: str) -> threading.Event:
    """Register a handler of ``job_type`` that returns "done" once the event returned is set (or after WAIT)."""
    gate = threading.Event()

    @handler(job_type)
    def _gated(payload, ctx) -> str:
        gate.wait(WAIT)
        return "done"

    return gate


AHEAD_GATE = gated_handler("TEST_RUNNER_GATED")


@pytest.fixture
def one_slot_worker():
    """A ``Worker`` with one thread slot, its pool and ``InFlight`` made as ``run()`` makes them; not running."""
    AHEAD_GATE.clear()
    worker = Worker(WorkerOptions(concurrency=1, poll_seconds=3600, heartbeat_seconds=3600, grace_seconds=0.5))
    worker.pool = ThreadPool(1, worker._on_done)
    worker.inflight = InFlight(worker.pool, worker._reports.put, clock=time.monotonic, worker_id=worker.id)
    # A listener never opened: the drain waits on the waker alone.
    listener = Listener(
        {}, CHANNEL, on_notify=str, on_connect=object, wake=worker._wake.set, retry_seconds=1, name="test"
    )
    worker._wake.open()
    worker._waitset = WaitSet(worker._wake, listener)
    try:
        yield worker
    finally:
        AHEAD_GATE.set()
        worker.pool.close()
        worker._wake.close()


def flush(worker: Worker) -> None:
    """Record what the worker reported so far, as its flusher would."""
    batch = []
    while not worker._reports.empty():
        batch.append(worker._reports.get())
    worker._flush(batch)


def test_a_handler_that_replaces_time_monotonic_cannot_put_the_claim_loop_to_sleep(
    one_slot_worker: Worker, monkeypatch
) -> None:
    # A handler's test double (a frozen clock: time.monotonic returning 0) made the claim cooldown
    # sleep for the whole uptime of the machine: the claim loop claimed, polled and enforced no
    # deadline again while the heartbeat kept every lease it held alive.
    from scheduler.workers import runner

    worker = one_slot_worker
    slept: list[float] = []
    monkeypatch.setattr(runner, "_sleep", slept.append)
    worker._last_claim = time.monotonic()  # the claim before, on the real clock
    monkeypatch.setattr(time, "monotonic", lambda: 0.0)  # what the handler left behind
    worker._claim(1, cooldown=True)
    assert slept and max(slept) <= runner.CLAIM_COOLDOWN


def test_claims_ahead_only_while_a_backlog_of_short_runs_lasts(one_slot_worker: Worker) -> None:
    worker = one_slot_worker
    assert worker._ahead(backlog=True) == 0  # no run yet
    worker.inflight._observe_run(0.001)
    assert worker._ahead(backlog=True) == 1  # the slots' count
    assert worker._ahead(backlog=False) == 0  # the queue ran dry: claim for the free slots only
    worker.inflight._observe_run(60.0)
    assert worker._ahead(backlog=True) == 0  # runs are long again


def test_a_job_claimed_ahead_is_handed_back_unrun_when_the_worker_drains(one_slot_worker: Worker) -> None:
    worker = one_slot_worker
    running, waiting = (enqueue("TEST_RUNNER_GATED", max_retries=1) for _ in range(2))
    assert worker._claim(worker.inflight.room(ahead=1), cooldown=False, ahead=1) == (2, 2)
    wait_until(lambda: worker.pool._busy == 1, what="the slot began the first job")

    threading.Timer(0.2, AHEAD_GATE.set).start()  # the running job ends within the grace period
    worker._drain()
    flush(worker)

    assert Job.objects.get(id=running.id).status == JobStatus.SUCCESS
    back = Job.objects.get(id=waiting.id)
    assert back.status == JobStatus.RETRYING  # due now: the promoter queues it, another worker runs it
    assert back.scheduled_at <= back.updated_at
    assert back.attempts_left == 2  # the unrun attempt cost nothing: still 1 + max_retries to go
    (attempt,) = Attempt.objects.filter(job_id=waiting.id)
    assert attempt.status == AttemptStatus.LOST and "handed back unrun" in attempt.error
    assert events(back) == [EventType.JOB_CREATED, EventType.JOB_QUEUED, EventType.JOB_STARTED, EventType.JOB_RETRIED]
    sequences = list(
        OutboxEvent.objects.filter(job_id=waiting.id).order_by("sequence").values_list("sequence", flat=True)
    )
    assert sequences == list(range(1, len(sequences) + 1))  # gapless


def test_a_job_claimed_ahead_records_when_its_slot_began_it_as_its_start(one_slot_worker: Worker) -> None:
    worker = one_slot_worker
    first, ahead = (enqueue("TEST_RUNNER_GATED") for _ in range(2))
    assert worker._claim(worker.inflight.room(ahead=1), cooldown=False, ahead=1) == (2, 2)
    claimed_at = Job.objects.get(id=ahead.id).started_at
    time.sleep(0.3)  # the second job waits this long for the slot
    AHEAD_GATE.set()
    wait_until(lambda: worker._reports.qsize() == 2, what="both jobs ran")
    flush(worker)

    job = Job.objects.get(id=ahead.id)
    assert job.status == JobStatus.SUCCESS
    assert job.started_at - claimed_at >= dt.timedelta(seconds=0.3)
    assert job.started_at <= job.finished_at
    (attempt,) = Attempt.objects.filter(job_id=ahead.id)  # the successful attempt, from the job row
    assert attempt.started_at == job.started_at
    assert Job.objects.get(id=first.id).started_at <= job.started_at


def test_the_heartbeat_reports_no_more_busy_slots_than_the_worker_has(one_slot_worker: Worker) -> None:
    worker = one_slot_worker
    for _ in range(2):
        enqueue("TEST_RUNNER_GATED")
    worker._register()
    assert worker._claim(worker.inflight.room(ahead=1), cooldown=False, ahead=1) == (2, 2)
    worker._heartbeat()
    assert WorkerNode.objects.get(id=worker.id).busy_slots == 1
    assert metrics.worker_slots_busy._value.get() == 1


def test_a_job_claimed_ahead_holds_its_flow_limit_unit_while_it_waits(one_slot_worker: Worker, settings) -> None:
    worker = one_slot_worker
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [{"scope": "type", "name": "TEST_RUNNER_GATED", "concurrency": 2}],
    }
    flow_limits.forget_cache()
    try:
        for _ in range(5):
            enqueue("TEST_RUNNER_GATED")
        # One slot and one ahead: both units of the limit, one of them by a job that only waits.
        assert worker._claim(worker.inflight.room(ahead=1), cooldown=False, ahead=1) == (2, 2)
        assert leasing.claim_jobs(worker_id="w-other", limit=5, queues=None) == []
        assert Job.objects.filter(type="TEST_RUNNER_GATED", status=JobStatus.RUNNING).count() == 2
    finally:
        flow_limits.forget_cache()


def test_a_job_claimed_ahead_whose_queue_is_paused_while_it_waits_is_handed_back_unrun(one_slot_worker: Worker) -> None:
    worker = one_slot_worker
    running, waiting = (enqueue("TEST_RUNNER_GATED", queue="pausing", max_retries=1) for _ in range(2))
    assert worker._claim(worker.inflight.room(ahead=1), cooldown=False, ahead=1) == (2, 2)
    wait_until(lambda: worker.pool._busy == 1, what="the slot began the first job")

    queue_pause(name="pausing")
    worker._poll_control()  # the poll that reads the pause
    AHEAD_GATE.set()  # the slot frees: the waiting job must not start in the paused queue
    wait_until(lambda: worker._reports.qsize() == 2, what="both jobs have their outcome")
    flush(worker)

    assert Job.objects.get(id=running.id).status == JobStatus.SUCCESS  # it had begun: it runs to its end
    back = Job.objects.get(id=waiting.id)
    assert back.status == JobStatus.RETRYING
    assert back.attempts_left == 2  # unrun: no attempt spent
    (attempt,) = Attempt.objects.filter(job_id=waiting.id)
    assert attempt.status == AttemptStatus.LOST and "paused" in attempt.error


HOLD_GATE = gated_handler("TEST_RUNNER_HELD")


def test_a_job_claimed_ahead_handed_back_at_shutdown_after_it_began_records_when_its_slot_began_it(
    one_slot_worker: Worker,
) -> None:
    worker = one_slot_worker
    HOLD_GATE.clear()
    try:
        enqueue("TEST_RUNNER_GATED", priority="HIGH")
        late = enqueue("TEST_RUNNER_HELD")
        assert worker._claim(worker.inflight.room(ahead=1), cooldown=False, ahead=1) == (2, 2)
        claimed_at = Job.objects.get(id=late.id).started_at
        time.sleep(0.3)  # the second job waits this long for the slot
        AHEAD_GATE.set()
        wait_until(
            lambda: [e.job.id for e in worker.inflight.pending() if e.begun] == [late.id], what="the slot began it"
        )
        worker._drain()  # it runs past the grace period: handed back, unfinished
        flush(worker)
    finally:
        HOLD_GATE.set()

    (attempt,) = Attempt.objects.filter(job_id=late.id)
    assert attempt.status == AttemptStatus.LOST and attempt.error == "worker shut down"
    assert attempt.started_at - claimed_at >= dt.timedelta(seconds=0.3)  # not the claim's time
    assert attempt.started_at <= attempt.finished_at


PACE_GATE = gated_handler("TEST_RUNNER_PACED")


def test_a_claim_a_concurrency_limit_held_back_is_made_again_once_a_job_of_the_worker_finishes(
    monkeypatch, settings
) -> None:
    """Found by a probe: a limit of 10 drained 20 ms jobs at about 20 jobs/s, one claim per poll.

    The claim that the limit left short ends the backlog; the finished job frees a unit, and the
    worker must claim again then, not at its next poll (an hour away here) or a NOTIFY (none comes).
    """
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [{"scope": "type", "name": "TEST_RUNNER_PACED", "concurrency": 1}],
    }
    flow_limits.forget_cache()
    flow_claim.reset_state()
    PACE_GATE.clear()
    calls = {"begun": 0, "ended": 0}
    got: list[int] = []
    real_claim = leasing.claim_jobs

    def counted(**kwargs):
        calls["begun"] += 1
        try:
            jobs = real_claim(**kwargs)
            got.append(len(jobs))
            return jobs
        finally:
            calls["ended"] += 1

    monkeypatch.setattr(leasing, "claim_jobs", counted)
    first, second = enqueue("TEST_RUNNER_PACED"), enqueue("TEST_RUNNER_PACED")
    ready = threading.Event()
    earlier = set(threading.enumerate())
    worker = Worker(WorkerOptions(concurrency=4, poll_seconds=3600, heartbeat_seconds=3600), ready=ready.set)

    def run() -> None:
        worker.run()
        connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert ready.wait(WAIT)
        # Its start-up claims are over (the first, and the one when LISTEN began): each left the
        # second job waiting for the limit's one unit, held by the first job.
        wait_until(
            lambda: (
                worker._listener._conn is not None
                and not worker._notified
                and calls["begun"] == calls["ended"]
                and Job.objects.get(id=first.id).status == JobStatus.RUNNING
            ),
            what="the start-up claims ended",
        )
        assert Job.objects.get(id=second.id).status == JobStatus.QUEUED
        PACE_GATE.set()  # the first job ends; no NOTIFY, no poll due
        wait_until(lambda: Job.objects.get(id=second.id).status == JobStatus.SUCCESS, what="the second job ran")
    finally:
        PACE_GATE.set()
        worker.stop()
        thread.join(WAIT)
        wait_until(
            lambda: not [t for t in set(threading.enumerate()) - earlier if t.name.startswith("stint-")],
            what="worker threads ended",
        )
        flow_limits.forget_cache()
        flow_claim.reset_state()

    assert Job.objects.get(id=first.id).status == JobStatus.SUCCESS
    assert sum(got) == 2
    # One claim per outcome batch at most while the limit held jobs back: no claim in a loop.
    assert len(got) <= 4, got


@pytest.mark.parametrize(
    ("payload_sql", "why"),
    [
        # jsonb keeps it; Python reads 4,300 digits at most
        ("""('{"n": 1' || repeat('0', 5000) || '}')::jsonb""", "it holds a number of more than 4300 digits"),
        # deeper than Python's json can read
        ("""(repeat('[', 5000) || repeat(']', 5000))::jsonb""", "it nests deeper than Python can read"),
    ],
    ids=["a number of 5001 digits", "nested 5000 deep"],
)
def test_a_job_whose_payload_python_cannot_read_fails_alone_and_the_jobs_claimed_beside_it_run(
    payload_sql, why
) -> None:
    # A row edited by hand: decoding its payload raised out of the claim, after the claim had
    # committed. The worker process died on every claim that met it, each job claimed beside it
    # lost an attempt, and the job itself was only dead-lettered once its budget was spent.
    bad = enqueue("DEMO_TASK", {}, priority="HIGH")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE stint_job SET payload = {payload_sql} WHERE id = %s", [bad.id])  # noqa: S608
    good = [enqueue("DEMO_TASK", {"result": n}) for n in range(3)]
    worker = Worker(WorkerOptions(concurrency=4, poll_seconds=0.2, heartbeat_seconds=3600))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - the test reports what ended the worker
            outcome.append(exc)
        finally:
            connection.close()  # the test's thread plays the worker process's main thread

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(
            lambda: (
                outcome
                or not Job.objects.filter(
                    id__in=[bad.id, *(g.id for g in good)], status__in=[JobStatus.QUEUED, JobStatus.RUNNING]
                ).exists()
            ),
            what="every job finished",
        )
    finally:
        worker.stop()
        thread.join(WAIT)

    assert outcome == []
    for job in good:
        assert attempts(job) == [(1, AttemptStatus.SUCCEEDED)]
    assert attempts(bad) == [(1, AttemptStatus.FAILED)]
    status, error = Job.objects.values_list("status", "last_error").get(id=bad.id)  # not the payload: unreadable
    assert status == JobStatus.FAILED
    # In the words the API's ``unreadable`` and the pages use, not Python's (sys.set_int_max_str_digits()).
    assert error == f"its payload cannot be read: {why}"
