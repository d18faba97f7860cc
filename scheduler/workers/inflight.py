"""The jobs one worker process holds, and the one outcome each of them gets.

``InFlight`` is the worker's bookkeeping, apart from its threads and its database calls: the
running set (job id -> ``Running``), each job's deadline, cancellation, and finalization (the
first outcome of a job is reported, any later one is discarded). It reads the time only
through ``clock`` (monotonic seconds; ``time.monotonic`` in production), so a test can drive
deadlines with a clock of its own, in-process, without sleeping
(``tests/scheduler/workers/test_inflight.py``). Outcomes go to ``report``: the worker's queue,
which its flusher records in batches (``scheduler.workers.runner``).

Every method is thread-safe: the claim loop, the pool's threads (``begin``, ``on_done``) and the
heartbeat thread call them concurrently.

Claimed ahead: a thread pool's queue may hold jobs beyond its free slots (the worker claims
ahead while runs are short, ``runner.CLAIM_AHEAD_MAX_RUN``). Such a job is held (its lease is
heartbeated) but not begun: its timeout starts when a slot begins it (``begin``), and its
``started_at`` is then corrected at its outcome. One still waiting after ``CLAIM_AHEAD_MAX_WAIT``
(every slot busy with long runs), when the worker drains, or once its queue is paused, is handed
back unrun (``hand_back_waiting``); one whose cancel is requested ends CANCELLED without running.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from scheduler import metrics
from scheduler.leasing import Outcome, Report
from scheduler.lifecycle import Claimed, UnreadablePayload
from scheduler.workers.pool import PoolFull, Running, UnsendableJob
from scheduler.workers.waiting_board import WaitingBoard

logger = logging.getLogger(__name__)

Clock = Callable[[], float]  # monotonic seconds
LOST_THREAD_ERROR = "its pool thread died while running it"
# Seconds a job claimed ahead may wait in the thread pool's queue for a slot before it is handed
# back unrun (no attempt spent): reached only while every slot runs something long.
CLAIM_AHEAD_MAX_WAIT = 5.0
# Seconds of waiting for a slot past which a run's started_at is corrected to when its slot began
# it; below it the claim's time stands (an outcome then carries no start time of its own).
START_SLACK = 0.001
# Weight of each new run in the recent average run time (an exponential moving average).
RUN_AVERAGE_WEIGHT = 0.2
WAITED_TOO_LONG_ERROR = "claimed ahead; no slot freed within {seconds:g} s, so it was handed back unrun"
DRAINED_ERROR = "claimed ahead; the worker stopped before a slot began it, so it was handed back unrun"
PAUSED_ERROR = "claimed ahead; its queue was paused before a slot began it, so it was handed back unrun"


class Pool(Protocol):
    """What ``InFlight`` needs of a pool (``ThreadPool``, ``ProcessPool``)."""

    kind: str
    slots: int

    def busy(self) -> int: ...

    def load(self) -> int: ...

    def submit(self, entry: Running) -> None: ...

    def abort(self, entry: Running) -> bool: ...

    def reap_lost(self) -> list[Running]: ...


class InFlight:
    """The running set of one worker: deadlines, cancellation and exactly one outcome per held job.

    ``pool`` runs the jobs and calls ``on_done`` when a handler returns; ``report`` receives each
    job's one outcome (a ``Report``; one from a returned handler carries its ``run_seconds``, for
    the receiver to observe in ``jobs_execution_duration_seconds``); ``clock`` gives monotonic seconds (deadlines are
    ``clock() + job.timeout_seconds`` from when a slot begins the job); ``worker_id`` only names
    the worker in log lines. A pool with ``watch_begins`` (``ThreadPool``) tells ``begin`` when a
    slot takes a job, so its jobs may wait in its queue (claimed ahead); any other pool's jobs
    begin when submitted. ``waiting_board`` (such a pool only; ``waiting_board.WaitingBoard``)
    lists each job from before it goes to the pool until a slot begins it or it ends unrun, for
    the supervisor to hand those back unrun if the whole process dies.
    """

    def __init__(
        self,
        pool: Pool,
        report: Callable[[Report], None],
        *,
        clock: Clock = time.monotonic,
        worker_id: str = "",
        waiting_board: WaitingBoard | None = None,
    ) -> None:
        self.pool = pool
        self._board = waiting_board if getattr(pool, "watch_begins", None) is not None else None
        self.clock = clock
        self._report = report
        self._worker_id = worker_id
        self._lock = threading.Lock()
        self._running: dict[uuid.UUID, Running] = {}
        self._stuck = 0  # threads still running a handler past its reported timeout
        # Begun thread-pool jobs dropped for a lost lease whose handler has not returned: counted
        # stuck once they run past their deadline (``enforce_deadlines``).
        self._dropped: list[Running] = []
        self._recent_run: float | None = None  # seconds: average of the recent runs (None: none yet)
        watch = getattr(pool, "watch_begins", None)
        self._begins_later = watch is not None
        if watch is not None:
            watch(self.begin)

    # -- reading ----------------------------------------------------------------------------

    def free(self) -> int:
        """Slots that can take a job now: the pool's slots less its busy ones and its waiting jobs (never below 0)."""
        return max(0, self.pool.slots - self.pool.load())

    def room(self, ahead: int) -> int:
        """Jobs to claim now to fill every free slot and queue up to ``ahead`` more (never below 0).

        ``ahead`` counts only for a pool whose jobs may wait for a slot (``ThreadPool``).
        """
        ahead = ahead if self._begins_later else 0
        return max(0, self.pool.slots + ahead - self.pool.load())

    @property
    def recent_run(self) -> float | None:
        """Seconds: the recent runs' average (a timed-out run counts its timeout); None before the first."""
        return self._recent_run

    def pending(self) -> list[Running]:
        """The held jobs that have no outcome yet."""
        with self._lock:
            return [e for e in self._running.values() if not e.finalized]

    def held(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """(job id, lease token) of each held job without an outcome: what the heartbeat extends."""
        return [(e.job.id, e.job.lease_token) for e in self.pending()]

    def seconds_to_next_deadline(self, at_most: float) -> float:
        """Seconds (>= 0) until the earliest pending deadline, or ``at_most`` if that is sooner."""
        now = self.clock()
        timeout = max(0.0, at_most)
        for entry in self.pending():
            timeout = min(timeout, max(0.0, entry.deadline - now))
        return timeout

    @property
    def stuck(self) -> int:
        """Threads still running a handler past its job's deadline (reported timed out, or dropped: lease lost)."""
        return self._stuck

    # -- jobs entering ---------------------------------------------------------------------

    def start(self, jobs: Sequence[Claimed]) -> list[Running]:
        """Hold each claimed job with its deadline and hand it to the pool; return the entries.

        A job the pool cannot take is given its outcome at once: HANDED_BACK when no slot was
        free after all (``PoolFull``: a pool child died since ``free()``), PERMANENT when it
        cannot be sent to a child process (``UnsendableJob``) or its payload cannot be read
        (``lifecycle.UnreadablePayload``).
        """
        entries = []
        later = self._begins_later
        # The first jobs fill the free slots; the rest are claimed ahead and wait for a slot.
        free = self.free()
        for job in jobs:
            now = self.clock()
            if not later:
                deadline = now + job.timeout_seconds
            elif free > 0:
                # A slot is free for it: it is never handed back for waiting (a handler that holds
                # the GIL may keep that slot's thread from beginning it for a while).
                free -= 1
                deadline = math.inf
            else:
                deadline = now + CLAIM_AHEAD_MAX_WAIT  # until a slot begins it: when it is handed back unrun
            entry = Running(job=job, deadline=deadline, started=now, claimed=now, begun=not later)
            with self._lock:
                self._running[job.id] = entry
                if self._board is not None:  # listed before any slot can begin it
                    entry.board_index = self._board.put(job.id)
            entries.append(entry)
            if job.payload.__class__ is UnreadablePayload:  # a row edited by hand: no handler could read it
                self._conclude(entry, Outcome.PERMANENT, f"its payload cannot be read: {job.payload.why}")
                continue
            try:
                self.pool.submit(entry)
            except PoolFull as exc:
                self._conclude(entry, Outcome.HANDED_BACK, str(exc))
            except UnsendableJob as exc:
                self._conclude(entry, Outcome.PERMANENT, f"cannot run in a child: {exc}")
        return entries

    def begin(self, entry: Running) -> bool:
        """Pool callback: a slot takes ``entry``. Start its timeout now; False if it already has its outcome.

        A job claimed ahead was handed back, cancelled or lost while it waited: the slot skips it.
        """
        with self._lock:
            if entry.finalized:
                return False
            now = self.clock()
            entry.started = now
            entry.deadline = now + entry.job.timeout_seconds
            entry.begun = True
            self._unlist(entry)  # before its handler runs: a listed job never began
        return True

    def _unlist(self, entry: Running) -> None:
        """Clear ``entry``'s waiting-board entry, if it has one (callers hold ``_lock``)."""
        if entry.board_index is not None:
            self._board.clear(entry.board_index)
            entry.board_index = None

    # -- outcomes ----------------------------------------------------------------------------

    def _started_at(self, entry: Running) -> dt.datetime | None:
        """When ``entry``'s slot began it, on the database's clock, if it waited past ``START_SLACK``; else None.

        The claim's ``started_at`` (database clock) plus the wait measured on ``clock``.
        """
        waited = entry.started - entry.claimed
        if not entry.begun or waited <= START_SLACK:
            return None
        return entry.job.started_at + dt.timedelta(seconds=waited)

    def _observe_run(self, seconds: float) -> None:
        # Unlocked: pool threads race here, and a lost update only drops one run from the average.
        recent = self._recent_run
        self._recent_run = seconds if recent is None else recent + (seconds - recent) * RUN_AVERAGE_WEIGHT

    def finalize(self, entry: Running) -> bool:
        """Mark ``entry`` as given its outcome and drop it from the set; False if it already was."""
        with self._lock:
            if entry.finalized:
                return False
            entry.finalized = True
            self._running.pop(entry.job.id, None)
            self._unlist(entry)
            return True

    def on_done(self, entry: Running, report: Report) -> bool:
        """Pool callback: a handler returned ``report``. Report it; False when it came late (discarded).

        Late means the job already has its outcome (timed out, cancelled, lease lost, handed
        back); a thread that was counted stuck after its timeout is counted free again, and only
        such a thread (``Running.stuck``): one whose job was dropped for its lost lease or handed
        back never was.
        """
        if not self.finalize(entry):
            with self._lock:
                entry.returned = True
                if entry.stuck:
                    entry.stuck = False
                    self._stuck = max(0, self._stuck - 1)
                    metrics.worker_stuck_threads.set(self._stuck)
            return False
        # Observed by the report's receiver, one batch at a time (``metrics.observe_many``).
        report.run_seconds = run = self.clock() - entry.started
        report.started_at = self._started_at(entry)
        self._observe_run(run)
        self._report(report)
        return True

    def enforce_deadlines(self) -> list[Running]:
        """Report TIMED_OUT for every begun job whose deadline is at or before ``clock()``; return them.

        The pool aborts each one: a process slot's child is killed (the slot is free at once); a
        thread cannot be killed, so its slot stays busy until the handler returns (``stuck``).
        A job claimed ahead (beyond the slots free at its claim) that no slot began by its deadline
        (``CLAIM_AHEAD_MAX_WAIT`` after its claim) is handed back unrun instead (HANDED_BACK: no
        attempt spent), and not returned; a job a free slot was waiting for has no deadline until
        that slot's thread begins it.
        """
        now = self.clock()
        if self._dropped:
            self._count_dropped_overruns(now)
        late = [e for e in self.pending() if e.deadline <= now]
        timed_out = []
        for entry in late:
            if not entry.begun:
                if self._finalize_waiting(entry):
                    self._report(
                        Report(
                            job=entry.job,
                            outcome=Outcome.HANDED_BACK,
                            error=WAITED_TOO_LONG_ERROR.format(seconds=CLAIM_AHEAD_MAX_WAIT),
                        )
                    )
                    metrics.worker_claimed_ahead_handed_back_total.inc()
                    logger.warning(
                        "job %s: claimed ahead, it waited %.1f s with every slot busy; handed back unrun",
                        entry.job.id,
                        now - entry.claimed,
                        extra={"job_id": str(entry.job.id), "attempt": entry.job.attempt, "worker": self._worker_id},
                    )
                    continue
                if entry.deadline > self.clock():  # a slot began it just now: its deadline moved on
                    continue
            if not self.finalize(entry):
                continue
            job = entry.job
            self._observe_run(float(job.timeout_seconds))
            metrics.jobs_timed_out_total.labels(job.type, job.queue).inc()
            if not self.pool.abort(entry):
                with self._lock:
                    if not entry.returned:  # not if its handler returned since the deadline: its slot is free
                        entry.stuck = True
                        self._stuck += 1
                        metrics.worker_stuck_threads.set(self._stuck)
                logger.warning(
                    "job %s overran its %d s timeout; its thread keeps its slot until the handler returns",
                    job.id,
                    job.timeout_seconds,
                    extra={"job_id": str(job.id), "attempt": job.attempt, "worker": self._worker_id},
                )
            self._report(
                Report(
                    job=job,
                    outcome=Outcome.TIMED_OUT,
                    error=f"timed out after {job.timeout_seconds} s",
                    started_at=self._started_at(entry),
                )
            )
            timed_out.append(entry)
        return timed_out

    def _count_dropped_overruns(self, now: float) -> None:
        """Count stuck each thread of a job dropped for its lost lease that runs past its deadline (``now``)."""
        with self._lock:
            keep = []
            for entry in self._dropped:
                if entry.returned:
                    continue
                if entry.deadline > now:
                    keep.append(entry)
                    continue
                entry.stuck = True
                self._stuck += 1
                metrics.worker_stuck_threads.set(self._stuck)
                logger.warning(
                    "job %s: its lease was lost and its handler runs past its %d s timeout; its thread keeps its"
                    " slot until the handler returns",
                    entry.job.id,
                    entry.job.timeout_seconds,
                    extra={"job_id": str(entry.job.id), "attempt": entry.job.attempt, "worker": self._worker_id},
                )
            self._dropped = keep

    def _finalize_waiting(self, entry: Running) -> bool:
        """Like ``finalize``, for a job no slot has begun: False once one has (or it has its outcome)."""
        with self._lock:
            if entry.finalized or entry.begun:
                return False
            entry.finalized = True
            self._running.pop(entry.job.id, None)
            self._unlist(entry)
            return True

    def cancel(self, job_id: uuid.UUID) -> None:
        """A cancel was requested for ``job_id``: set its cancel flag.

        A thread's handler sees the flag (``ctx.cancelled``) and ends CANCELLED through
        ``on_done``; a process slot's child is killed and the job reported CANCELLED at once.
        """
        with self._lock:
            entry = self._running.get(job_id)
        if entry is None or entry.finalized:
            return
        entry.cancel_flag.set()
        if self._finalize_waiting(entry):  # claimed ahead, not begun: it never runs
            self._report(Report(job=entry.job, outcome=Outcome.CANCELLED, error="cancelled before it started"))
            return
        if self.pool.kind == "processes" and self.finalize(entry):
            self.pool.abort(entry)
            self._report(Report(job=entry.job, outcome=Outcome.CANCELLED, error="cancelled: child process killed"))

    def lease_lost(self, job_id: uuid.UUID) -> bool:
        """The heartbeat found ``job_id``'s lease gone: drop it without an outcome; False if not held.

        A thread still running its handler keeps its slot; past the job's deadline it is counted
        ``stuck`` (``enforce_deadlines``), as a timed-out one is, so slots all held that way stop
        the worker for a fresh process (``runner._wedged``).
        """
        with self._lock:
            entry = self._running.get(job_id)
        if entry is None or not self.finalize(entry):
            return False
        if not self.pool.abort(entry) and entry.begun:  # a thread runs its handler on: watch its deadline
            with self._lock:
                if not entry.returned:
                    self._dropped.append(entry)
        logger.warning(
            "job %s: lease lost; its result will be discarded",
            job_id,
            extra={"job_id": str(job_id), "worker": self._worker_id},
        )
        return True

    def reap_lost(self) -> list[Running]:
        """Report RETRYABLE for each job whose pool thread died (``pool.reap_lost``); return them."""
        lost = [e for e in self.pool.reap_lost() if self.finalize(e)]
        for entry in lost:
            began = self._started_at(entry)
            self._report(Report(job=entry.job, outcome=Outcome.RETRYABLE, error=LOST_THREAD_ERROR, started_at=began))
        return lost

    def hand_back_waiting(self, error: str = DRAINED_ERROR, *, queues: Collection[str] | None = None) -> list[Running]:
        """Report HANDED_BACK (with ``error``) for every job claimed ahead that no slot has begun; return them.

        ``queues``: only the jobs of these queues (None: of every queue). The worker's drain
        calls it first: those jobs go back at once, unrun and with no attempt spent, for another
        worker to run, instead of starting during the grace period. Each poll calls it for the
        paused queues (``PAUSED_ERROR``): a paused queue's jobs wait QUEUED (``queues.queue_pause``),
        and one claimed before the pause has not started yet.
        """
        with self._lock:
            waiting = [
                e
                for e in self._running.values()
                if not e.begun and not e.finalized and (queues is None or e.job.queue in queues)
            ]
        waiting = [e for e in waiting if self._finalize_waiting(e)]
        for entry in waiting:
            self._report(Report(job=entry.job, outcome=Outcome.HANDED_BACK, error=error))
        return waiting

    def hand_back_all(self, error: str = "worker shut down") -> list[Running]:
        """Report HANDED_BACK (with ``error``) for every pending job, aborting it; return them.

        One a slot began after a wait (claimed ahead) reports that start (``_started_at``).
        """
        leftovers = [e for e in self.pending() if self.finalize(e)]
        for entry in leftovers:
            self.pool.abort(entry)
            self._report(
                Report(job=entry.job, outcome=Outcome.HANDED_BACK, error=error, started_at=self._started_at(entry))
            )
        return leftovers

    def _conclude(self, entry: Running, outcome: Outcome, error: str) -> None:
        if self.finalize(entry):
            self._report(Report(job=entry.job, outcome=outcome, error=error))
