"""The worker: claims due jobs into free slots, enforces timeouts and cancellation, and writes outcomes in batches.

One ``Worker`` runs in each worker process of a ``run_workers`` supervisor
(``scheduler.workers.supervisor``). Threads of one worker process:
- main: the claim loop. It waits in one ``poll`` for its own ``LISTEN stint_jobs`` connection
  and for a freed slot (``scheduler.workers.wakeup``), or ``poll_seconds``; reads the
  notifications itself (no thread between a NOTIFY and its claim), claims up to the free slots
  in one statement (and, in the thread pool while a backlog of short jobs lasts, up to as many
  again, claimed ahead: ``CLAIM_AHEAD_MAX_RUN``), enforces deadlines, polls cancellations and
  paused queues, and replaces pool threads that were lost (``reap_lost``). The running set,
  deadlines, cancellation and each job's one outcome are ``InFlight``'s
  (``scheduler.workers.inflight``), which reads the time through the worker's ``clock``. The
  processes of one ``run_workers`` share a claim board (``scheduler.workers.claim_board``): a
  process woken only by a NOTIFY that a sibling's claim has already served does not claim.
- flusher: collects reports for a few milliseconds and records each batch in one transaction
  (``leasing.record_batch``: a report the database refuses is split out, never retried).
- heartbeat: extends every held lease in one statement per interval and refreshes the node.
- stint-listen-connect: short-lived; opens the LISTEN connection (at start and after it was
  lost) so that a connect that hangs never holds up the claim loop, which adopts the connection
  once it is open (``wakeup.Listener``) and polls meanwhile.
No database transaction is open while a handler runs.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connection
from django.db.models.functions import Now

from core.db_role import application_name_for
from core.db_threads import bound_lock_waits
from core.pg_connect import pg_connection_params
from scheduler import leasing, metrics
from scheduler.conf import conf
from scheduler.leasing import Outcome, Report
from scheduler.models import WorkerNode
from scheduler.notify import CHANNEL
from scheduler.states import JobStatus, priority_label
from scheduler.workers.child import make_worker_id
from scheduler.workers.claim_board import BoardView, NoteLog, Verdict, parse_payload, paused_key
from scheduler.workers.inflight import PAUSED_ERROR, Clock, InFlight
from scheduler.workers.pool import ProcessPool, Running, ThreadPool
from scheduler.workers.waiting_board import WaitingBoard
from scheduler.workers.wakeup import Listener, WaitSet, Waker

logger = logging.getLogger(__name__)

FLUSH_WINDOW = 0.002  # seconds a flush waits to gather more reports
# Seconds between two claims while jobs keep finishing: lets freed slots accumulate so that one
# statement claims several jobs instead of one per freed slot (River's fetch cooldown).
CLAIM_COOLDOWN = 0.003
FLUSH_MAX = 1000  # reports per outcome transaction
# How long an outcome write waits for a job row's lock (the flusher's session ``lock_timeout``).
# Its usual rivals, a heartbeat or a cancel, hold rows for milliseconds; a row locked longer is
# split out of the batch and left to lease rescue (``leasing.record_batch``).
OUTCOME_LOCK_TIMEOUT_MS = 1000
# How long a statement of the claim loop (claims, cancel and pause checks) waits for a lock. Claims
# skip locked rows and their flow-limit locks are held for one short claim transaction, so a longer
# wait means a session holding the job table (seen: a handler's LOCK TABLE stint_job in a pool
# child): the loop must not wait with it, since only the loop can end that handler (its deadline).
CLAIM_LOCK_TIMEOUT_MS = 1000
# Seconds between two tries of the outcomes refused for a locked job row: each try may keep the
# flusher waiting OUTCOME_LOCK_TIMEOUT_MS. They are tried while their leases last (the lease
# time from the first refusal), so a lock on the whole table (a migration's ALTER TABLE, a
# CREATE INDEX, an operator's LOCK TABLE) no longer makes every job that finished meanwhile run
# again; what is still locked then is left to lease rescue.
LOCKED_RETRY_SECONDS = 1.0
# Seconds between two looks at the claim board while a sibling's claim that saw our NOTIFY runs.
SIBLING_RECHECK = 0.0005
DB_RETRY_SECONDS = 1.0  # seconds between attempts while the database is unreachable
# Exit status of a worker process that stopped because every slot of its thread pool was held by
# a handler past its timeout (EX_TEMPFAIL, sysexits.h): its supervisor starts a fresh one at once.
WEDGED_EXIT_CODE = 75
# Claim ahead: while the last claim filled all it asked for (a backlog) and the recent runs
# average at most this many seconds, a thread-pool worker claims up to its slots' count of jobs
# beyond its free slots, to wait in the pool's queue. A slot that frees then takes its next job at
# once instead of idling through the claim loop's wake-up and a claim's round trip (a no-op drain,
# 2 processes x 100 slots: each claim left only after most of a batch had run, 59-67 jobs per claim).
# Such a job's timeout starts when a slot begins it; one that waits past
# ``inflight.CLAIM_AHEAD_MAX_WAIT`` (every slot busy with long runs), or when the worker stops, is
# handed back unrun. It may start before a higher-priority job that arrives while it waits, by
# about one run: the bound is why only short runs are claimed ahead. The process pool never does.
CLAIM_AHEAD_MAX_RUN = 0.05  # seconds
# Default slots per worker process. A claim takes at most the free slots, so the slots bound the
# batch that one claim and one outcome transaction carry: with short jobs, throughput grows with
# them (a no-op drain, one process: about 750 jobs/s at 5 slots, 2,000 at 20, 4,500-5,600 at 50,
# 4,700-8,800 at 100, on a loaded 2-core box). 50 threads keep most of that while a handler
# that uses the ORM holds at most 50 database connections per process; a process slot is a
# child process, so that pool keeps 5.
DEFAULT_THREAD_SLOTS = 50
DEFAULT_PROCESS_SLOTS = 5
# Bound once at import: a handler that replaces ``time.sleep`` (a test double left behind, a
# hostile one) must not break the worker's own waits, nor one that replaces ``time.monotonic``
# (a frozen clock returning 0 made the claim cooldown sleep for the machine's whole uptime).
_sleep = time.sleep
_monotonic = time.monotonic
_monotonic_ns = time.monotonic_ns
_DB_ERRORS = (OperationalError, InterfaceError, DatabaseError, psycopg.Error)


def default_concurrency(pool: str) -> int:
    """Return the default slots per worker process for ``pool`` ("threads" or "processes")."""
    return DEFAULT_PROCESS_SLOTS if pool == "processes" else DEFAULT_THREAD_SLOTS


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """How a worker runs. Seconds everywhere; ``queues`` None means all queues.

    ``isolation``: an isolation slot, which claims only isolated jobs (and runs each in a pool
    child process of its own); ``idle_exit_seconds``: stop after this long with no job;
    ``supervisor_pid``: the ``run_workers`` supervisor that started this process, if any.
    """

    concurrency: int = DEFAULT_THREAD_SLOTS
    queues: Sequence[str] | None = None
    pool: str = "threads"
    poll_seconds: float = 1.0
    heartbeat_seconds: float = 10.0
    grace_seconds: float = 25.0
    isolation: bool = False
    idle_exit_seconds: float | None = None
    supervisor_pid: int | None = None


class Worker:
    """One worker process. ``run()`` blocks until ``stop()`` and returns the exit code (0)."""

    def __init__(
        self,
        options: WorkerOptions,
        *,
        worker_id: str | None = None,
        ready: Callable[[], None] | None = None,
        clock: Clock = time.monotonic,
        board: BoardView | None = None,
        ahead_mark: Any = None,
        waiting: Any = None,
    ) -> None:
        """``worker_id`` defaults to a new ``make_worker_id``; ``ready`` is called once it has registered.

        ``clock`` (monotonic seconds, ``time.monotonic`` by default) times the jobs' deadlines, the
        polls, the idle exit and the shutdown grace period; the claim cooldown and the flush window
        are waits on real time. ``board``: this process's row on its supervisor's claim board
        (None: claim on every NOTIFY). ``ahead_mark``: a shared bool (``multiprocessing`` ``RawValue``)
        set once this worker claims ahead, for its supervisor's rule on starved processes, or None.
        ``waiting``: the buffer of a ``waiting_board.WaitingBoard`` its supervisor reads if this
        process dies (a thread pool's only), or None.
        """
        if options.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.options = options
        self._ready = ready
        self.id = worker_id or make_worker_id(os.getpid(), uuid.uuid4().hex[:6])
        self._wake = Waker()  # set by other threads (a slot freed, stop): ends the claim loop's wait
        self._notified = False  # a NOTIFY for our queues arrived since the last claim (claim loop only)
        # The last claim left jobs waiting only for a concurrency flow limit's unit
        # (``leasing.claim_held_for_units``; the claim loop writes it, the flusher reads it), and
        # the flusher recorded outcomes since the claim before it began, which may have freed such
        # units: then a claim follows without waiting for a poll or a NOTIFY (``_claim_loop``).
        self._held_for_units = False
        self._outcomes_recorded = False
        self._notes = NoteLog()  # the NOTIFYs received, for the claim board
        self._wanted = frozenset(options.queues or ())
        self._listener: Listener | None = None
        self._waitset: WaitSet | None = None
        self._board = board
        self._ahead_mark = ahead_mark
        self._waiting = waiting
        self._recheck = False  # a sibling's running claim may serve our NOTIFY: look again soon
        self.exit_code = 0  # what run() returns (WEDGED_EXIT_CODE: hung handlers held every slot)
        self._stopping = threading.Event()
        self._force = threading.Event()
        self._done = threading.Event()
        self._reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._clock = clock
        self._paused: list[str] = []
        self._paused_key = 0  # claim_board.paused_key(self._paused)
        self._jobs_done = 0  # outcomes recorded (flusher thread writes, heartbeat reads): WorkerNode.jobs_done
        self._last_claim = 0.0
        self._last_busy = clock()
        pool_cls = ProcessPool if options.pool == "processes" else ThreadPool
        self._pool_cls = pool_cls
        self.pool: ThreadPool | ProcessPool | None = None
        self.inflight: InFlight | None = None
        self._threads: list[threading.Thread] = []  # the flusher and the heartbeat
        # The flusher's only: outcomes refused for a locked job row, each with the clock time at
        # which it is given up, and when they are next tried.
        self._locked: list[tuple[Report, float]] = []
        self._locked_retry_at = 0.0

    # -- control ---------------------------------------------------------------------------

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming; finish running jobs within the grace period (``force``: hand them back now)."""
        if self._stopping.is_set() or force:
            self._force.set()
        self._stopping.set()
        self._wake.set()

    def run(self) -> int:
        """Run until stopped; hand back what did not finish within the grace period; return the exit code.

        0, or ``WEDGED_EXIT_CODE`` when it stopped because hung handlers held every slot (``_wedged``).
        """
        self.pool = self._pool_cls(self.options.concurrency, self._on_done)
        self.inflight = InFlight(
            self.pool,
            self._reports.put,
            clock=self._clock,
            worker_id=self.id,
            waiting_board=WaitingBoard(self._waiting) if self._waiting is not None else None,
        )
        metrics.worker_slots_total.set(self.options.concurrency)
        self._register()
        # Django's own parameters for the alias (libpq options, keepalives), named stint-worker-listen.
        self._listener = Listener(
            pg_connection_params(application_name=application_name_for("listen")),
            CHANNEL,
            on_notify=self._on_notify,
            on_connect=self._on_listen,
            wake=self._wake.set,
            retry_seconds=DB_RETRY_SECONDS,
            name=f"worker {self.id}",
        )
        self._wake.open()
        self._waitset = WaitSet(self._wake, self._listener)
        self._listener.ensure()  # starts opening it; the claim loop adopts it (and claims) when it is open
        self._threads = [self._start_thread("flush"), self._start_thread("heartbeat")]
        logger.info(
            "worker %s started: %d slots (--pool %s), queues %s%s",
            self.id,
            self.options.concurrency,
            self.pool.kind,
            ",".join(self.options.queues or ["*"]),
            " (isolation slot: isolated jobs only)" if self.options.isolation else "",
        )
        if self._ready is not None:
            self._ready()
        try:
            self._claim_loop()
            self._drain()
        finally:
            self._done.set()
            self._listener.shut()
            self._threads[0].join(timeout=30)  # the flusher records the last outcomes
            self.pool.close()
            self._wake.close()
            self._unregister()
            close_old_connections()
        logger.info("worker %s stopped", self.id)
        return self.exit_code

    # -- main loop -------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        next_poll = 0.0
        # Claim only when work is known or a poll is due, never merely because a slot freed: a
        # NOTIFY arrived (``_notified``), or the last claim filled every slot it asked for, so the
        # queue may hold more (``backlog``). At a low rate this halves the claim transactions:
        # the claim after each job's completion would find nothing. One more: the last claim left
        # jobs that only a full concurrency flow limit refused (``_held_for_units``), and outcomes
        # of this worker's jobs were recorded since, which may have freed units (``_refill_due``).
        # Jobs finishing in a sibling process or on another host free units too; this worker sees
        # those at its next claim for another reason (its poll at the latest).
        backlog = True
        while True:
            self._wake.clear()
            if self._stopping.is_set():  # after the clear: a stop() that came before it is seen here
                break
            self._listener.ensure()  # adopt a (re)opened LISTEN connection, or start reopening a lost one
            self._listener.read()  # notifications that came while the loop did not wait
            now = self._clock()
            try:
                # Before any statement: a statement that fails (or waits for a lock) must not keep a
                # job past its deadline, above all one whose handler holds that lock.
                self.inflight.enforce_deadlines()
                if self._wedged():
                    break
                poll_due = now >= next_poll
                bound_lock_waits(CLAIM_LOCK_TIMEOUT_MS)
                if poll_due:
                    self._poll_control()
                    next_poll = now + self.options.poll_seconds
                ahead = self._ahead(backlog)
                free = self.inflight.room(ahead)
                refill = self._refill_due()
                if free > 0 and (poll_due or backlog or self._notified or refill):
                    self._notified = False  # before the claim: a NOTIFY read after it claims again
                    self._outcomes_recorded = False  # likewise: outcomes recorded after it call for one more
                    claimed, free = self._claim(
                        free,
                        cooldown=backlog or refill,
                        notified_only=not (poll_due or backlog or refill),
                        ahead=ahead,
                    )
                    backlog = free > 0 and claimed == free
                else:
                    claimed, free = 0, 0
            except _DB_ERRORS:
                logger.exception("worker %s: database error in the claim loop; retrying", self.id)
                connection.close()
                self._stopping.wait(DB_RETRY_SECONDS)
                continue
            if free > 0 and claimed == free:
                continue  # the queue may hold more: claim again once a slot frees (busy is now full)
            if self._refill_due() and self.inflight.free() > 0:
                continue  # outcomes recorded while the claim ran may have freed a unit it found taken
            if self._idle_too_long(claimed):
                logger.info("worker %s: no job for %.0f s; stopping", self.id, self.options.idle_exit_seconds)
                self.stop()
                break
            self._waitset.wait(self._next_timeout(next_poll))

    def _refill_due(self) -> bool:
        """True when the last claim left jobs only a full concurrency limit refused, and outcomes were recorded since.

        Outcomes leave RUNNING when the flusher records them, so only then may their units admit
        the jobs held back. A claim that this starts waits out ``CLAIM_COOLDOWN`` after the last
        one, so completions close together share it; with no outcome recorded, no claim follows.
        """
        return self._held_for_units and self._outcomes_recorded

    def _ahead(self, backlog: bool) -> int:
        """Jobs to claim beyond the free slots: the slots' count while ``backlog`` lasts and runs are short, else 0.

        Short: the recent runs average at most ``CLAIM_AHEAD_MAX_RUN`` (none yet: not short). Only
        the thread pool queues jobs ahead of a slot (``InFlight.room``); an isolation slot never
        claims ahead.
        """
        if not backlog or self.options.isolation:
            return 0
        recent = self.inflight.recent_run
        if recent is None or recent > CLAIM_AHEAD_MAX_RUN:
            return 0
        return self.options.concurrency

    def _wedged(self) -> bool:
        """True, after saying so and starting the stop, when every thread slot runs a handler past its timeout.

        A thread cannot be killed, so such a handler keeps its slot until it returns (DESIGN.md);
        once all of them do, this process would never run a job again. It stops instead (no
        job is pending: each has its TIMED_OUT outcome) and exits ``WEDGED_EXIT_CODE``, and its
        supervisor starts a fresh process, whose exit ends the hung threads too.
        """
        slots = self.options.concurrency
        if self.pool.kind != "threads" or self.inflight.stuck < slots:
            return False
        logger.error(
            "worker %s: every one of its %d slots is held by a handler past its timeout; stopping so that"
            " a fresh process takes its place",
            self.id,
            slots,
        )
        self.exit_code = WEDGED_EXIT_CODE
        self.stop()
        return True

    def _idle_too_long(self, claimed: int) -> bool:
        """True when ``idle_exit_seconds`` is set and this worker ran nothing for that long."""
        if self.options.idle_exit_seconds is None:
            return False
        now = self._clock()
        if claimed or self.pool.busy() or self.inflight.pending():
            self._last_busy = now
        return now - self._last_busy > self.options.idle_exit_seconds

    def _next_timeout(self, next_poll: float) -> float:
        timeout = self.inflight.seconds_to_next_deadline(at_most=next_poll - self._clock())
        retry = self._listener.seconds_to_retry()
        if retry is not None:  # not listening: wake to reopen the connection or adopt it
            timeout = min(timeout, retry)
        if self._recheck:
            self._recheck = False
            timeout = min(timeout, SIBLING_RECHECK)
        return timeout

    def _claim(self, free: int, *, cooldown: bool, notified_only: bool = False, ahead: int = 0) -> tuple[int, int]:
        """Claim up to ``free`` jobs; return (claimed, asked for).

        ``free`` is re-counted after the cooldown, as ``InFlight.room(ahead)``.

        ``notified_only``: only a NOTIFY asks for this claim; it is not made, and (0, 0) returned,
        when a sibling process's claim serves that NOTIFY (``claim_board``): one that finished
        (counted in ``worker_claims_skipped_total``), or one still running, and then we look again
        after ``SIBLING_RECHECK`` seconds (the NOTIFY stays pending).

        ``cooldown``: the last claim filled every slot it asked for, so jobs are waiting and this
        claim may wait out ``CLAIM_COOLDOWN`` to gather freed slots into one statement. After a
        short claim the queue was empty: a NOTIFY then means a new job, claimed at once (waiting
        would only add to its pickup lag).
        """
        wait = min(CLAIM_COOLDOWN, self._last_claim + CLAIM_COOLDOWN - _monotonic()) if cooldown else 0.0
        if wait > 0:
            _sleep(wait)
            free = self.inflight.room(ahead)
        board = self._board
        if board is not None:
            verdict = board.begin_claim(
                self._notes.latest, self._notes, paused=self._paused_key, notified_only=notified_only
            )
            if verdict is Verdict.SKIP:
                metrics.worker_claims_skipped_total.inc()
                return 0, 0
            if verdict is Verdict.WAIT:
                self._notified = True
                self._recheck = True
                return 0, 0
        self._last_claim = started = _monotonic()
        try:
            jobs = leasing.claim_jobs(
                worker_id=self.id,
                limit=free,
                queues=self.options.queues,
                paused=self._paused,
                isolated=self.options.isolation,
            )
        except BaseException:
            if board is not None:
                board.claim_finished(short=False)
            raise
        self._held_for_units = leasing.claim_held_for_units()
        if board is not None:
            # Short: it took every job it saw (not so under flow limits, which leave jobs behind).
            board.claim_finished(short=len(jobs) < free and leasing.short_claim_took_all())
        took = _monotonic() - started
        self.inflight.start(jobs)  # before the metrics: the handlers need not wait for them
        if ahead and jobs and self._ahead_mark is not None and not self._ahead_mark.value:
            self._ahead_mark.value = True
        # Every claim, empty ones too: their time grows with the dead entries that jobs leave in
        # the claim index until a VACUUM of stint_job (README, Operations).
        metrics.worker_claim_duration_seconds.observe(took)
        lags: dict[tuple[str, str], list[float]] = {}
        for job in jobs:
            lag = max(0.0, (job.started_at - job.scheduled_at).total_seconds())
            lags.setdefault((job.queue, priority_label(job.priority)), []).append(lag)
        for labels, values in lags.items():
            metrics.observe_many(metrics.child(metrics.jobs_schedule_lag_seconds, *labels), values)
        return len(jobs), free

    def _start_thread(self, role: str) -> threading.Thread:
        target = self._flush_loop if role == "flush" else self._heartbeat_loop
        thread = threading.Thread(target=target, name=f"stint-{role}", daemon=True)
        thread.start()
        return thread

    def _revive_threads(self) -> None:
        """Start the flusher or the heartbeat again if it died; each poll.

        They catch the errors they expect, but a handler shares their interpreter and may break
        what they call (seen: one replaced ``time.sleep`` with a function that raises). A dead
        flusher would leave every later outcome unrecorded, a dead heartbeat every lease to expire
        under a running handler.
        """
        for index, thread in enumerate(self._threads):
            if thread.is_alive() or self._done.is_set():
                continue
            role = thread.name.removeprefix("stint-")
            logger.error("worker %s: its %s thread died; starting it again", self.id, role)
            self._threads[index] = self._start_thread(role)

    def _poll_control(self) -> None:
        from scheduler.models import Queue

        self.inflight.reap_lost()
        self._revive_threads()
        self._paused = list(Queue.objects.filter(paused=True).values_list("name", flat=True))
        self._paused_key = paused_key(self._paused)
        if self._paused:  # jobs claimed ahead before the pause have not started: they wait QUEUED too
            back = self.inflight.hand_back_waiting(PAUSED_ERROR, queues=frozenset(self._paused))
            if back:
                logger.info("worker %s handed back %d jobs claimed ahead in paused queues", self.id, len(back))
        ids = [e.job.id for e in self.inflight.pending()]
        for job_id in leasing.cancel_requested(ids):
            self.inflight.cancel(job_id)

    def _on_done(self, entry: Running, report: Report) -> None:
        """Pool callback: a handler returned (possibly after its timeout, then it is discarded)."""
        self.inflight.on_done(entry, report)
        self._wake.set()

    # -- shutdown --------------------------------------------------------------------------

    def _drain(self) -> None:
        # Jobs claimed ahead that no slot began go back at once, unrun, for another worker to run.
        waiting = self.inflight.hand_back_waiting()
        if waiting:
            logger.info("worker %s handed back %d jobs claimed ahead that had not started", self.id, len(waiting))
        deadline = self._clock() + self.options.grace_seconds
        while not self._force.is_set():
            self._wake.clear()  # before the look: a job that finishes after it sets the waker again
            if not self.inflight.pending() or self._clock() >= deadline:
                break
            self.inflight.enforce_deadlines()
            self._waitset.wait(min(0.05, max(0.0, deadline - self._clock())))
        leftovers = self.inflight.hand_back_all("worker shut down")
        if leftovers:
            logger.warning("worker %s handed back %d unfinished jobs", self.id, len(leftovers))

    # -- background threads ----------------------------------------------------------------

    def _on_notify(self, payload: str) -> None:
        """A notification read by the claim loop: note it when it names one of our queues (or none)."""
        token, names = parse_payload(payload)
        if not self._wanted or not names or not self._wanted.isdisjoint(names):
            self._notes.append(token, _monotonic_ns())
            self._notified = True

    def _on_listen(self) -> None:
        """LISTEN began: anything enqueued while nobody listened was not notified, so claim."""
        self._notes.append(None, _monotonic_ns())  # no token: a claim follows for sure
        self._notified = True

    def _flush_loop(self) -> None:
        while True:
            self._retry_locked()
            try:
                first = self._reports.get(timeout=0.1)
            except queue.Empty:
                if self._done.is_set():
                    for report, _ in self._locked:
                        self._unrecorded(report, "its job row was still locked when the worker stopped")
                    self._locked = []
                    connection.close()  # this thread's own connection
                    return
                continue
            # Gather for FLUSH_WINDOW, then take what came: a blocking get per report would wake
            # this thread once per job (a context switch and a GIL hand-off each).
            _sleep(FLUSH_WINDOW)
            batch = [first]
            while len(batch) < FLUSH_MAX:
                try:
                    batch.append(self._reports.get_nowait())
                except queue.Empty:
                    break
            self._observe_run_times(batch)
            self._flush(batch)

    @staticmethod
    def _observe_run_times(batch: list[Report]) -> None:
        """Observe the ``run_seconds`` of ``batch`` in ``jobs_execution_duration_seconds``: one write per label set.

        Per job, in the pool threads, it cost two locked writes to the multiprocess metrics files each.
        """
        runs: dict[tuple[str, str], list[float]] = {}
        for report in batch:
            if report.run_seconds is not None:
                runs.setdefault((report.job.type, report.job.queue), []).append(report.run_seconds)
        for labels, values in runs.items():
            try:
                metrics.observe_many(metrics.child(metrics.jobs_execution_duration_seconds, *labels), values)
            except Exception:  # a metric must never cost the outcomes
                logger.exception("could not observe %d run times", len(values))

    def _retry_locked(self) -> None:
        """Record again, as one batch, the outcomes refused for a locked job row; give up those past their lease."""
        if not self._locked or self._clock() < self._locked_retry_at:
            return
        now = self._clock()
        pending, self._locked = self._locked, []
        for report, give_up in pending:
            if now >= give_up:
                self._unrecorded(report, "its job row stayed locked by another session for as long as its lease")
        pending = [(report, give_up) for report, give_up in pending if now < give_up]
        if pending:
            self._flush([report for report, _ in pending], give_up={id(report): t for report, t in pending})

    def _flush(self, batch: list[Report], *, give_up: dict[int, float] | None = None) -> None:
        """Record ``batch``; ``give_up`` (a retry of locked outcomes): when each report, by ``id()``, is given up."""
        while True:
            try:
                bound_lock_waits(OUTCOME_LOCK_TIMEOUT_MS)
                done = leasing.record_batch(batch, split_locked=give_up is None)
                break
            except leasing.CONNECTION_ERRORS:
                logger.exception("worker %s: could not record %d outcomes; retrying", self.id, len(batch))
                connection.close()
                if self._force.is_set() and self._done.is_set():
                    return  # the leases expire and the rescuer takes over
                _sleep(DB_RETRY_SECONDS)
            except Exception:  # a bug of ours: the flusher must go on with the next batch
                logger.exception("worker %s: could not record %d outcomes; left to lease rescue", self.id, len(batch))
                metrics.worker_outcomes_unrecorded_total.inc(len(batch))
                connection.close()
                return
        if done.recorded:
            # Their jobs left RUNNING: units of a concurrency flow limit may be free again.
            self._outcomes_recorded = True
            if self._held_for_units:
                self._wake.set()
        for report in done.superseded:
            self._log_discarded(report, "a newer attempt's outcome was reported with it")
        for report, why in done.unrecorded:
            self._unrecorded(report, why)
        if done.locked:
            self._keep_locked(done.locked, give_up or {})
        counts: collections.Counter[tuple[Any, str, str]] = collections.Counter()
        log_outcomes = logger.isEnabledFor(logging.INFO)
        for report in done.recorded:
            job = report.job
            if job.id not in done.accepted:
                self._log_discarded(report, "lease no longer held")
                continue
            self._jobs_done += 1
            to = done.final.get(job.id)
            if report.outcome not in (Outcome.SUCCEEDED, Outcome.CANCELLED, Outcome.HANDED_BACK):
                counts[(metrics.jobs_failed_total, job.type, job.queue)] += 1
            if to == JobStatus.SUCCESS:
                counts[(metrics.jobs_completed_total, job.type, job.queue)] += 1
            elif to == JobStatus.CANCELLED:
                counts[(metrics.jobs_cancelled_total, job.type, job.queue)] += 1
            elif to == JobStatus.DEAD:
                counts[(metrics.jobs_dead_total, job.type, job.queue)] += 1
            elif to == JobStatus.RETRYING and report.outcome != Outcome.HANDED_BACK:
                counts[(metrics.jobs_retried_total, job.type, job.queue)] += 1
            if log_outcomes:
                logger.info(
                    "job %s %s attempt %d: %s%s",
                    job.id,
                    job.type,
                    job.attempt,
                    report.outcome,
                    f" ({report.error})" if report.error else "",
                    extra={"job_id": str(job.id), "attempt": job.attempt, "worker": self.id},
                )
        # One increment per label set and batch, not one per job.
        for (metric, job_type, job_queue), n in counts.items():
            metrics.child(metric, job_type, job_queue).inc(n)

    def _keep_locked(self, reports: list[Report], give_up: dict[int, float]) -> None:
        """Keep ``reports`` (refused for a locked job row) for ``_retry_locked``; new ones get a lease's time."""
        now = self._clock()
        lease = conf().lease_seconds
        for report in reports:
            if id(report) not in give_up:
                logger.warning(
                    "job %s: outcome %s waits: its job row is locked by another session; trying again every %s s"
                    " for up to %s s (its lease)",
                    report.job.id,
                    report.outcome,
                    LOCKED_RETRY_SECONDS,
                    lease,
                    extra={"job_id": str(report.job.id), "attempt": report.job.attempt, "worker": self.id},
                )
            self._locked.append((report, give_up.get(id(report), now + lease)))
        self._locked_retry_at = now + LOCKED_RETRY_SECONDS

    def _unrecorded(self, report: Report, why: str) -> None:
        metrics.worker_outcomes_unrecorded_total.inc()
        logger.error(
            "job %s: outcome %s could not be recorded (%s); its lease will expire and be rescued",
            report.job.id,
            report.outcome,
            why,
            extra={"job_id": str(report.job.id), "attempt": report.job.attempt, "worker": self.id},
        )

    def _log_discarded(self, report: Report, why: str) -> None:
        logger.info(
            "job %s: outcome %s discarded (%s)",
            report.job.id,
            report.outcome,
            why,
            extra={"job_id": str(report.job.id), "attempt": report.job.attempt, "worker": self.id},
        )

    def _heartbeat_loop(self) -> None:
        while not self._done.wait(self.options.heartbeat_seconds):
            try:
                self._heartbeat()
            except _DB_ERRORS:
                logger.exception("worker %s: heartbeat failed", self.id)
                connection.close()
        connection.close()  # this thread's own connection

    def _heartbeat(self) -> None:
        held = self.inflight.held()
        still, cancel = leasing.heartbeat(worker_id=self.id, jobs=held)
        for job_id, _ in held:
            if job_id not in still:
                self.inflight.lease_lost(job_id)
        for job_id in cancel:
            self.inflight.cancel(job_id)
        busy = self.pool.busy()
        metrics.worker_slots_busy.set(busy)
        WorkerNode.objects.filter(id=self.id).update(
            last_heartbeat_at=Now(), busy_slots=busy, stopped_at=None, jobs_done=self._jobs_done
        )

    # -- registration ----------------------------------------------------------------------

    def _register(self) -> None:
        WorkerNode.objects.create(
            id=self.id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            supervisor_pid=self.options.supervisor_pid,
            isolation=self.options.isolation,
            queues=list(self.options.queues or []),
            concurrency=self.options.concurrency,
            pool=self.pool.kind,
            started_at=Now(),
            last_heartbeat_at=Now(),
        )

    def _unregister(self) -> None:
        try:
            WorkerNode.objects.filter(id=self.id).update(stopped_at=Now(), busy_slots=0, jobs_done=self._jobs_done)
        except _DB_ERRORS:
            logger.warning("worker %s: could not mark itself stopped", self.id)
