"""The worker's bookkeeping in-process (scheduler.workers.inflight): deadlines, cancellation, one outcome per job.

``InFlight`` reads the time only through the clock it is given, so these tests move a
``FakeClock`` by hand instead of sleeping. Most run ``ManualPool``, a pool whose handlers
return when the test says so (``finish``); two run the real ``ThreadPool`` with handlers that
wait on an event; the last records what ``InFlight`` reported with ``leasing.record_batch``,
the call the worker's flusher makes, against the test database.
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
import uuid
from typing import Any

import pytest

import scheduler
from scheduler import leasing
from scheduler.job_actions import job_cancel
from scheduler.leasing import Outcome, Report
from scheduler.models import Attempt, Job
from scheduler.registry import JobContext, handler
from scheduler.states import AttemptStatus, JobStatus
from scheduler.workers.inflight import CLAIM_AHEAD_MAX_WAIT, InFlight
from scheduler.workers.pool import PoolFull, Running, ThreadPool, UnsendableJob
from scheduler.workers.waiting_board import ID_BYTES, WaitingBoard, capacity_for, read_waiting
from tests.support.clock import FakeClock
from tests.support.factories import claimed_job
from tests.support.processes import wait_until

WAIT = 10.0  # seconds a real pool thread may take to return once released

GATE = threading.Event()  # TEST_INFLIGHT_GATED handlers return once it is set


@handler("TEST_INFLIGHT_GATED")
def _gated(payload: Any, ctx: JobContext) -> str:
    GATE.wait(WAIT)
    return "done"


@handler("TEST_INFLIGHT_UNTIL_CANCELLED")
def _until_cancelled(payload: Any, ctx: JobContext) -> None:
    ctx.cancel_flag.wait(WAIT)
    ctx.check_cancelled()


class ManualPool:
    """A pool whose handlers return when the test calls ``finish``; it never runs a handler.

    ``kind`` "threads": ``abort`` only sets the cancel flag and the slot stays busy until the
    handler returns, as a thread cannot be killed. "processes": ``abort`` kills the child, so
    the slot is free at once. ``refuse`` makes the next ``submit`` raise it.
    """

    def __init__(self, slots: int, kind: str = "threads") -> None:
        self.slots = slots
        self.kind = kind
        self.inflight: InFlight | None = None
        self.running: dict[uuid.UUID, Running] = {}
        self.lost: list[Running] = []
        self.refuse: Exception | None = None

    def busy(self) -> int:
        return len(self.running)

    def load(self) -> int:
        return len(self.running)  # it never queues a job beyond its slots

    def submit(self, entry: Running) -> None:
        if self.refuse is not None:
            refuse, self.refuse = self.refuse, None
            raise refuse
        if len(self.running) >= self.slots:
            raise PoolFull("no idle slot")
        self.running[entry.job.id] = entry

    def abort(self, entry: Running) -> bool:
        entry.cancel_flag.set()
        if self.kind == "threads":
            return False
        return self.running.pop(entry.job.id, None) is not None

    def reap_lost(self) -> list[Running]:
        lost, self.lost = self.lost, []
        for entry in lost:
            self.running.pop(entry.job.id, None)
        return lost

    def finish(self, entry: Running, outcome: Outcome, **fields: Any) -> bool:
        """The handler of ``entry`` returns ``outcome``: its slot frees, then the pool calls back."""
        del self.running[entry.job.id]
        return self.inflight.on_done(entry, Report(job=entry.job, outcome=outcome, **fields))


def make(slots: int = 2, kind: str = "threads") -> tuple[InFlight, ManualPool, FakeClock, list[Report]]:
    """An ``InFlight`` on a ``ManualPool`` and a ``FakeClock``; the list collects its reports."""
    pool, clock, reports = ManualPool(slots, kind), FakeClock(), []
    pool.inflight = InFlight(pool, reports.append, clock=clock, worker_id="w-test")
    return pool.inflight, pool, clock, reports


def outcomes(reports: list[Report]) -> list[tuple[uuid.UUID, Outcome, str | None]]:
    return [(r.job.id, r.outcome, r.error) for r in reports]


# -- deadlines -------------------------------------------------------------------------------


def test_a_job_is_reported_timed_out_exactly_when_the_clock_reaches_its_deadline() -> None:
    inflight, _, clock, reports = make()
    (entry,) = inflight.start([claimed_job(timeout_seconds=30)])

    clock.advance(29.5)
    assert inflight.enforce_deadlines() == []
    assert reports == []
    assert inflight.pending() == [entry]

    clock.advance(0.5)
    assert inflight.enforce_deadlines() == [entry]
    assert outcomes(reports) == [(entry.job.id, Outcome.TIMED_OUT, "timed out after 30 s")]
    assert inflight.pending() == []
    assert entry.cancel_flag.is_set()  # the handler is told to stop

    clock.advance(60)
    assert inflight.enforce_deadlines() == []  # reported once
    assert len(reports) == 1


def test_the_worker_sleeps_until_the_earliest_pending_deadline_or_its_next_poll() -> None:
    inflight, pool, clock, _ = make(slots=3)
    short, long = inflight.start([claimed_job(timeout_seconds=10), claimed_job(timeout_seconds=30)])

    assert inflight.seconds_to_next_deadline(at_most=60) == 10
    assert inflight.seconds_to_next_deadline(at_most=2) == 2
    clock.advance(4)
    assert inflight.seconds_to_next_deadline(at_most=60) == 6
    pool.finish(short, Outcome.SUCCEEDED)
    assert inflight.seconds_to_next_deadline(at_most=60) == 26
    clock.advance(40)
    assert inflight.seconds_to_next_deadline(at_most=60) == 0  # overdue: enforce at once
    assert inflight.enforce_deadlines() == [long]


def test_a_timed_out_thread_keeps_its_slot_until_its_handler_returns_and_its_late_result_is_discarded() -> None:
    inflight, pool, clock, reports = make(slots=1, kind="threads")
    (entry,) = inflight.start([claimed_job(timeout_seconds=5)])
    clock.advance(5)
    inflight.enforce_deadlines()

    assert inflight.free() == 0  # a thread cannot be killed
    assert inflight.stuck == 1
    assert pool.finish(entry, Outcome.SUCCEEDED, result="too late") is False

    assert [r.outcome for r in reports] == [Outcome.TIMED_OUT]
    assert inflight.free() == 1
    assert inflight.stuck == 0


def test_a_thread_whose_lease_was_lost_returning_late_leaves_the_stuck_threads_counted() -> None:
    # Before: every late return on the thread pool took one off ``stuck``, also that of a job dropped
    # for its lost lease, which was never counted: a thread still hung past its timeout was then no
    # longer counted, and a worker whose every slot hung never stopped for a fresh process (_wedged).
    inflight, pool, clock, _ = make(slots=2, kind="threads")
    hung, dropped = inflight.start([claimed_job(timeout_seconds=5), claimed_job(timeout_seconds=60)])
    clock.advance(5)
    assert inflight.enforce_deadlines() == [hung]
    assert inflight.stuck == 1

    assert inflight.lease_lost(dropped.job.id) is True
    assert pool.finish(dropped, Outcome.SUCCEEDED) is False  # discarded: the rescuer owns its job
    assert inflight.stuck == 1  # the hung thread still holds its slot

    assert pool.finish(hung, Outcome.SUCCEEDED) is False
    assert inflight.stuck == 0


def test_a_thread_whose_lease_was_lost_is_counted_stuck_once_it_runs_past_its_timeout() -> None:
    # Before: a job dropped for its lost lease left its thread uncounted for good, however long the
    # handler hung, so a worker whose every slot hung that way never stopped for a fresh process
    # (_wedged) and never ran a job again.
    inflight, pool, clock, _ = make(slots=1, kind="threads")
    (entry,) = inflight.start([claimed_job(timeout_seconds=30)])
    assert inflight.lease_lost(entry.job.id) is True
    clock.advance(29)
    inflight.enforce_deadlines()
    assert inflight.stuck == 0  # within its timeout: it may yet return

    clock.advance(1)
    assert inflight.enforce_deadlines() == []  # no outcome: the rescuer owns its job
    assert inflight.stuck == 1
    inflight.enforce_deadlines()
    assert inflight.stuck == 1  # counted once

    assert pool.finish(entry, Outcome.SUCCEEDED) is False
    assert inflight.stuck == 0


def test_a_timed_out_process_slot_is_killed_and_free_at_once() -> None:
    inflight, pool, clock, reports = make(slots=1, kind="processes")
    inflight.start([claimed_job(timeout_seconds=5)])
    clock.advance(5)
    inflight.enforce_deadlines()

    assert [r.outcome for r in reports] == [Outcome.TIMED_OUT]
    assert inflight.free() == 1
    assert inflight.stuck == 0


# -- cancellation ----------------------------------------------------------------------------


def test_a_cancelled_thread_job_is_told_to_stop_and_reported_cancelled_when_its_handler_returns() -> None:
    inflight, pool, _, reports = make(kind="threads")
    (entry,) = inflight.start([claimed_job()])

    inflight.cancel(entry.job.id)
    assert entry.cancel_flag.is_set()
    assert reports == []  # the handler decides: it may still finish
    assert inflight.pending() == [entry]

    assert pool.finish(entry, Outcome.CANCELLED, error="cancelled") is True
    assert outcomes(reports) == [(entry.job.id, Outcome.CANCELLED, "cancelled")]
    assert inflight.free() == 2


def test_a_cancelled_process_job_has_its_child_killed_and_is_reported_cancelled_at_once() -> None:
    inflight, _, _, reports = make(slots=1, kind="processes")
    (entry,) = inflight.start([claimed_job()])

    inflight.cancel(entry.job.id)

    assert outcomes(reports) == [(entry.job.id, Outcome.CANCELLED, "cancelled: child process killed")]
    assert inflight.pending() == []
    assert inflight.free() == 1


def test_a_cancel_for_a_job_not_held_or_already_reported_changes_nothing() -> None:
    inflight, pool, clock, reports = make(kind="processes")
    (entry,) = inflight.start([claimed_job(timeout_seconds=1)])
    clock.advance(1)
    inflight.enforce_deadlines()

    inflight.cancel(entry.job.id)
    inflight.cancel(uuid.uuid4())

    assert [r.outcome for r in reports] == [Outcome.TIMED_OUT]


# -- outcomes and slots ----------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [Outcome.SUCCEEDED, Outcome.RETRYABLE, Outcome.PERMANENT, Outcome.CRASHED])
def test_each_outcome_is_reported_once_and_frees_its_slot(outcome: Outcome) -> None:
    inflight, pool, _, reports = make(slots=2)
    first, second = inflight.start([claimed_job(), claimed_job()])
    assert inflight.free() == 0

    assert pool.finish(first, outcome, error="e") is True
    assert outcomes(reports) == [(first.job.id, outcome, "e")]
    assert inflight.free() == 1
    assert inflight.held() == [(second.job.id, second.job.lease_token)]

    pool.finish(second, Outcome.SUCCEEDED)
    assert inflight.free() == 2
    assert inflight.pending() == []


def test_a_job_the_pool_cannot_take_gets_its_outcome_at_once_and_holds_no_slot() -> None:
    inflight, pool, _, reports = make(slots=1)
    taken, full = inflight.start([claimed_job(), claimed_job()])
    pool.refuse = UnsendableJob("PicklingError: no")
    (unsendable,) = inflight.start([claimed_job()])

    assert outcomes(reports) == [
        (full.job.id, Outcome.HANDED_BACK, "no idle slot"),
        (unsendable.job.id, Outcome.PERMANENT, "cannot run in a child: PicklingError: no"),
    ]
    assert inflight.pending() == [taken]


def test_shutdown_hands_back_every_pending_job_once_and_a_late_result_is_discarded() -> None:
    inflight, pool, _, reports = make(slots=3)
    done, left, also_left = inflight.start([claimed_job(), claimed_job(), claimed_job()])
    pool.finish(done, Outcome.SUCCEEDED, result=1)

    assert inflight.hand_back_all("worker shut down") == [left, also_left]
    assert inflight.hand_back_all("worker shut down") == []

    assert outcomes(reports)[1:] == [
        (left.job.id, Outcome.HANDED_BACK, "worker shut down"),
        (also_left.job.id, Outcome.HANDED_BACK, "worker shut down"),
    ]
    assert pool.finish(left, Outcome.SUCCEEDED) is False
    assert len(reports) == 3


def test_a_lost_lease_drops_the_job_without_an_outcome() -> None:
    inflight, pool, _, reports = make()
    (entry,) = inflight.start([claimed_job()])

    assert inflight.lease_lost(entry.job.id) is True
    assert inflight.lease_lost(entry.job.id) is False

    assert inflight.held() == []
    assert entry.cancel_flag.is_set()
    assert pool.finish(entry, Outcome.SUCCEEDED) is False
    assert reports == []  # the rescuer owns the job now


def test_the_job_of_a_lost_pool_thread_is_reported_retryable() -> None:
    inflight, pool, _, reports = make()
    (entry,) = inflight.start([claimed_job()])
    pool.lost = [entry]

    assert inflight.reap_lost() == [entry]

    assert outcomes(reports) == [(entry.job.id, Outcome.RETRYABLE, "its pool thread died while running it")]
    assert inflight.free() == 2


# -- the real thread pool --------------------------------------------------------------------


class Callbacks:
    """The pool's ``on_done``: hands the call to ``InFlight`` and queues what it answered."""

    def __init__(self) -> None:
        self.inflight: InFlight | None = None
        self.answers: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def __call__(self, entry: Running, report: Report) -> None:
        self.answers.put(self.inflight.on_done(entry, report))

    def next(self) -> bool:
        return self.answers.get(timeout=WAIT)


@pytest.fixture
def threads() -> Any:
    """``(InFlight, FakeClock, reports, callbacks)`` on a real one-slot ``ThreadPool``."""
    GATE.clear()
    callbacks, clock, reports = Callbacks(), FakeClock(), []
    pool = ThreadPool(1, callbacks)
    callbacks.inflight = InFlight(pool, reports.append, clock=clock, worker_id="w-test")
    try:
        yield callbacks.inflight, clock, reports, callbacks
    finally:
        GATE.set()
        pool.close()


def begun(entry: Running) -> Running:
    """Wait until a pool thread began ``entry`` (a thread takes a submitted job a moment later)."""
    wait_until(lambda: entry.begun, what="a slot began the job")
    return entry


def test_on_the_thread_pool_a_timed_out_handler_holds_its_slot_until_it_returns(threads) -> None:
    inflight, clock, reports, callbacks = threads
    (entry,) = inflight.start([claimed_job("TEST_INFLIGHT_GATED", timeout_seconds=5)])
    begun(entry)  # its timeout runs from here
    clock.advance(5)
    inflight.enforce_deadlines()
    assert inflight.free() == 0

    GATE.set()
    assert callbacks.next() is False  # the late "done" is discarded

    assert [r.outcome for r in reports] == [Outcome.TIMED_OUT]
    assert inflight.free() == 1
    assert inflight.stuck == 0


def test_on_the_thread_pool_a_cancelled_handler_ends_cancelled_and_frees_its_slot(threads) -> None:
    inflight, _, reports, callbacks = threads
    (entry,) = inflight.start([claimed_job("TEST_INFLIGHT_UNTIL_CANCELLED")])

    inflight.cancel(begun(entry).job.id)
    assert callbacks.next() is True

    assert [(r.outcome, r.error) for r in reports] == [(Outcome.CANCELLED, "cancelled")]
    assert inflight.free() == 1


# -- jobs claimed ahead: waiting in the thread pool's queue for a slot ------------------------


def test_a_job_claimed_ahead_starts_its_timeout_and_its_start_time_when_a_slot_begins_it(threads) -> None:
    inflight, clock, reports, callbacks = threads
    first, ahead = inflight.start(
        [claimed_job("TEST_INFLIGHT_UNTIL_CANCELLED"), claimed_job("TEST_INFLIGHT_GATED", timeout_seconds=5)]
    )
    begun(first)
    assert not ahead.begun  # one slot: the second waits in the pool's queue
    assert inflight.free() == 0

    clock.advance(4)
    inflight.cancel(first.job.id)  # the slot frees after 4 s
    assert callbacks.next() is True
    begun(ahead)
    clock.advance(4.9)  # 8.9 s after its claim, 4.9 s after it began: not timed out
    assert inflight.enforce_deadlines() == []
    clock.advance(0.1)
    assert inflight.enforce_deadlines() == [ahead]

    timed_out = reports[-1]
    assert timed_out.outcome == Outcome.TIMED_OUT
    # Its start is when the slot began it: the claim's time plus the 4 s it waited.
    assert timed_out.started_at == ahead.job.started_at + dt.timedelta(seconds=4)
    assert reports[0].outcome == Outcome.CANCELLED and reports[0].started_at is None  # no wait: the claim's time


def test_a_job_claimed_ahead_that_waits_past_the_limit_is_handed_back_unrun(threads) -> None:
    inflight, clock, reports, callbacks = threads
    running, ahead = inflight.start(
        [claimed_job("TEST_INFLIGHT_GATED", timeout_seconds=60), claimed_job("TEST_INFLIGHT_GATED", timeout_seconds=60)]
    )
    begun(running)
    clock.advance(CLAIM_AHEAD_MAX_WAIT - 0.1)
    assert inflight.enforce_deadlines() == []
    assert inflight.seconds_to_next_deadline(at_most=60) == pytest.approx(0.1)  # the claim loop wakes for it
    clock.advance(0.1)
    assert inflight.enforce_deadlines() == []  # not timed out: handed back

    assert [(r.job.id, r.outcome) for r in reports] == [(ahead.job.id, Outcome.HANDED_BACK)]
    assert "handed back unrun" in reports[0].error
    assert [e.job.id for e in inflight.pending()] == [running.job.id]
    GATE.set()
    assert callbacks.next() is True  # the running job ends as usual
    wait_until(lambda: inflight.free() == 1, what="the handed-back job left the queue")
    assert not ahead.begun  # the slot skipped it: it never ran
    assert [r.outcome for r in reports] == [Outcome.HANDED_BACK, Outcome.SUCCEEDED]


def test_only_the_jobs_claimed_ahead_that_no_slot_began_are_handed_back_when_the_worker_drains(threads) -> None:
    inflight, _, reports, callbacks = threads
    running, *waiting = inflight.start([claimed_job("TEST_INFLIGHT_GATED") for _ in range(3)])
    begun(running)

    assert inflight.hand_back_waiting() == waiting
    assert [(r.job.id, r.outcome) for r in reports] == [(e.job.id, Outcome.HANDED_BACK) for e in waiting]
    assert [e.job.id for e in inflight.pending()] == [running.job.id]  # the grace period is for this one
    GATE.set()
    assert callbacks.next() is True
    wait_until(lambda: inflight.free() == 1, what="the handed-back jobs left the queue")
    assert not any(e.begun for e in waiting)


class SlowToBeginPool(ManualPool):
    """A ``ManualPool`` whose slots begin a job only when the test calls ``begin`` (threads starved, say)."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self._begin: Any = None

    def watch_begins(self, begin: Any) -> None:
        self._begin = begin

    def submit(self, entry: Running) -> None:
        self.running[entry.job.id] = entry  # queued: it may wait beyond the slots

    def begin(self, entry: Running) -> bool:
        return self._begin(entry)


def test_a_job_that_had_a_free_slot_at_its_claim_is_never_handed_back_for_waiting() -> None:
    # A handler holding the GIL can keep a free slot's thread from beginning its job for longer
    # than CLAIM_AHEAD_MAX_WAIT; only the jobs claimed beyond the free slots wait for a busy one.
    pool, clock, reports = SlowToBeginPool(1), FakeClock(), []
    inflight = InFlight(pool, reports.append, clock=clock, worker_id="w-test")
    slotted, ahead = inflight.start([claimed_job(timeout_seconds=5), claimed_job(timeout_seconds=5)])

    clock.advance(CLAIM_AHEAD_MAX_WAIT + 60)
    assert inflight.enforce_deadlines() == []
    assert [(r.job.id, r.outcome) for r in reports] == [(ahead.job.id, Outcome.HANDED_BACK)]
    assert pool.begin(slotted) is True
    assert pool.begin(ahead) is False  # handed back: its slot skips it
    clock.advance(4.9)
    assert inflight.enforce_deadlines() == []  # its timeout runs from when it began
    clock.advance(0.1)
    assert inflight.enforce_deadlines() == [slotted]


def test_the_waiting_board_lists_exactly_the_held_jobs_that_no_slot_has_begun() -> None:
    # What the supervisor reads if the whole process dies: a job is listed before any slot can
    # begin it, and cleared when a slot begins it or it ends unrun (cancelled, handed back).
    array = bytearray(ID_BYTES * capacity_for(2))
    pool, clock, reports = SlowToBeginPool(2), FakeClock(), []
    inflight = InFlight(pool, reports.append, clock=clock, worker_id="w-test", waiting_board=WaitingBoard(array))
    first, second, third, fourth = inflight.start([claimed_job() for _ in range(4)])
    assert read_waiting(array) == {first.job.id, second.job.id, third.job.id, fourth.job.id}

    assert pool.begin(first) is True
    assert read_waiting(array) == {second.job.id, third.job.id, fourth.job.id}
    inflight.cancel(second.job.id)  # claimed ahead, not begun: CANCELLED unrun
    assert read_waiting(array) == {third.job.id, fourth.job.id}
    assert pool.begin(third) is True
    assert inflight.hand_back_waiting() == [fourth]
    assert read_waiting(array) == set()
    assert [(r.job.id, r.outcome) for r in reports] == [
        (second.job.id, Outcome.CANCELLED),
        (fourth.job.id, Outcome.HANDED_BACK),
    ]
    # Freed entries serve the next claim.
    (fifth,) = inflight.start([claimed_job()])
    assert read_waiting(array) == {fifth.job.id}


def test_a_pool_whose_jobs_begin_when_submitted_lists_nothing_on_the_waiting_board() -> None:
    # A process pool's job may be running in a child from its submit on: never listed as unbegun.
    array = bytearray(ID_BYTES * capacity_for(2))
    pool, reports = ManualPool(2, kind="processes"), []
    pool.inflight = InFlight(pool, reports.append, clock=FakeClock(), waiting_board=WaitingBoard(array))
    pool.inflight.start([claimed_job(), claimed_job()])
    assert read_waiting(array) == set()


def test_a_job_claimed_ahead_whose_cancel_is_requested_ends_cancelled_without_running(threads) -> None:
    inflight, _, reports, callbacks = threads
    running, ahead = inflight.start([claimed_job("TEST_INFLIGHT_GATED"), claimed_job("TEST_INFLIGHT_GATED")])
    begun(running)
    inflight.cancel(ahead.job.id)
    assert [(r.job.id, r.outcome) for r in reports] == [(ahead.job.id, Outcome.CANCELLED)]
    GATE.set()
    assert callbacks.next() is True
    wait_until(lambda: inflight.free() == 1, what="the cancelled job left the queue")
    assert not ahead.begun


def test_the_thread_pool_never_counts_more_busy_slots_than_it_has_and_claims_ahead_only_up_to_its_room(threads) -> None:
    inflight, _, _, callbacks = threads
    entries = inflight.start([claimed_job("TEST_INFLIGHT_GATED") for _ in range(3)])
    begun(entries[0])
    pool = inflight.pool
    assert (pool.busy(), pool.load()) == (1, 3)  # one slot: busy is 1 however many jobs wait
    assert inflight.free() == 0
    assert inflight.room(ahead=1) == 0 and inflight.room(ahead=5) == 3
    GATE.set()
    for _ in entries:
        assert callbacks.next() is True
    assert inflight.recent_run is not None  # the claim loop's measure of short runs


# -- what the flusher records ----------------------------------------------------------------


@pytest.mark.django_db
def test_the_reported_outcomes_recorded_as_one_batch_end_each_job_as_its_outcome_says() -> None:
    timed_out = scheduler.enqueue("DEMO_TASK", timeout_seconds=5, max_retries=1)
    cancelled, succeeded, handed_back = (scheduler.enqueue("DEMO_TASK", timeout_seconds=60) for _ in range(3))
    inflight, pool, clock, reports = make(slots=4)
    entries = {e.job.id: e for e in inflight.start(leasing.claim_jobs(worker_id="w-test", limit=4, queues=None))}

    clock.advance(5)
    inflight.enforce_deadlines()
    job_cancel(job_id=cancelled.id)  # requested while it runs: the worker's poll passes it on
    inflight.cancel(cancelled.id)
    pool.finish(entries[cancelled.id], Outcome.CANCELLED, error="cancelled")
    pool.finish(entries[succeeded.id], Outcome.SUCCEEDED, result={"ok": True})
    inflight.hand_back_all("worker shut down")
    done = leasing.record_batch(reports)

    assert done.accepted == {timed_out.id, cancelled.id, succeeded.id, handed_back.id}
    statuses = dict(Job.objects.values_list("id", "status"))
    assert statuses == {
        timed_out.id: JobStatus.RETRYING,
        cancelled.id: JobStatus.CANCELLED,
        succeeded.id: JobStatus.SUCCESS,
        handed_back.id: JobStatus.RETRYING,
    }
    attempts = dict(Attempt.objects.values_list("job_id", "status"))
    assert attempts == {
        timed_out.id: AttemptStatus.TIMED_OUT,
        cancelled.id: AttemptStatus.CANCELLED,
        succeeded.id: AttemptStatus.SUCCEEDED,
        handed_back.id: AttemptStatus.LOST,
    }
