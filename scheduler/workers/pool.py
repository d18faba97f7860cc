"""Bounded execution pools: daemon threads, or one child process per slot that can be killed.

Both pools run ``run_handler`` for a claimed job and call ``on_done(entry, report)`` when it
returns. ``busy()`` counts slots whose handler has not returned yet, including a thread that
overran its timeout: a thread cannot be killed, so it keeps its slot until it returns
(DESIGN.md). A process slot is freed by killing its child and starting a new one.

Whatever a handler raises is its outcome (``run_handler``), so a slot keeps serving. A slot
thread that is lost anyway (an exception raised into it from outside, a bug of ours) is found
by ``reap_lost()``, which the worker calls every poll: it starts a replacement and returns the
job the thread held, for the worker to report. A pool child that dies is replaced at once and
its job reported CRASHED, with how the process died; so is one whose pipe to the worker closed
while it still runs (a handler closed it), after it is killed. Each pool child leads a process
group of its own (``process_group``): a handler that signals its group ends only its own child,
and a child that dies or is killed takes what its handler forked with it.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from core.stop_signals import exit_now, install_stack_dump
from scheduler.leasing import Outcome, Report
from scheduler.lifecycle import Claimed
from scheduler.retry import is_backoff_seconds
from scheduler.workers.process_group import (
    ignore_stop_signals,
    kill_group,
    kill_leftovers,
    lead_own_group,
    stop_signals_held,
)

logger = logging.getLogger(__name__)

CHILD_START_TIMEOUT = 60.0  # seconds to wait for a child process to say it is ready
CHILD_REAP_SECONDS = 2.0  # seconds to wait for a child whose pipe closed to be reaped (its exit code)
CHILD_EXITING_SECONDS = 0.1  # seconds from a child's pipe closing to its exit code, at most, when it exits
CHILD_EXIT_SECONDS = 5.0  # seconds an idle child asked to exit (pool closing) gets before it is killed
CHILD_CHECK_SECONDS = 0.2  # seconds between the reader's checks that each child still lives
PROMETHEUS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's multiprocess mode
PARENT_CHECK_SECONDS = 0.5  # seconds between a child's checks that its worker process still lives


class CancelEvent:
    """A job's cancel flag: ``threading.Event``'s ``is_set``/``set``/``wait``, its Event made only if waited on.

    One per claimed job, and almost never waited on (``JobContext.sleep`` waits): an Event (a
    Condition and its lock) costs about 3 us to make, a plain flag nothing. ``wait(timeout)``
    (seconds) returns True once set, else False after ``timeout``.
    """

    __slots__ = ("_flag", "_event")
    _lock = threading.Lock()  # guards every instance's lazy Event (set and wait are rare)

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        """True once ``set`` was called."""
        return self._flag

    def set(self) -> None:
        """Set the flag and wake every ``wait``."""
        with self._lock:
            self._flag = True
            if self._event is not None:
                self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout`` seconds passed; return whether it is set."""
        with self._lock:
            if self._flag:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


@dataclass(slots=True, eq=False)
class Running:
    """A job this worker holds: its lease, deadline (monotonic seconds), cancel flag and state.

    ``claimed``: monotonic seconds when its claim returned. ``begun``: a slot began running it
    (``InFlight.begin``); until then it waits in the thread pool's queue and its ``deadline`` is
    the time by which it is handed back if no slot took it (infinite for a job that had a free
    slot at its claim); from then on ``started`` is when its slot began it and ``deadline`` is
    ``started + timeout_seconds``.
    """

    job: Claimed
    deadline: float
    started: float
    claimed: float = 0.0
    begun: bool = False
    cancel_flag: CancelEvent = field(default_factory=CancelEvent)
    finalized: bool = False  # an outcome was reported; any later result is discarded
    stuck: bool = False  # thread pool: reported TIMED_OUT while its handler runs on (counted in InFlight.stuck)
    returned: bool = False  # its handler returned after the job had its outcome (InFlight.on_done)
    slot: int | None = None  # process pool: the child running it
    board_index: int | None = None  # its entry on the waiting board while no slot has begun it (``waiting_board``)


DoneCallback = Callable[[Running, Report], None]


class PoolFull(Exception):  # noqa: N818 - reads as a state
    """No pool slot could take the job right now; hand it back."""


class UnsendableJob(Exception):  # noqa: N818
    """The job cannot be sent to a pool child process; it can never run there."""


def describe_exit(exitcode: int | None) -> str:
    """Say how a process ended from its ``exitcode`` (``multiprocessing`` / ``Popen`` convention).

    ``1`` -> "exit code 1"; ``-11`` -> "signal 11: SIGSEGV"; None -> "exit status unknown".
    """
    if exitcode is None:
        return "exit status unknown"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
    return f"signal {-exitcode}: {name}"


def died_while_running(exitcode: int | None) -> str:
    """The error of an attempt lost because its process died, e.g. "worker process died (exit code 1) ..."."""
    return f"worker process died ({describe_exit(exitcode)}) while running this job"


def killed_while_running(why: str) -> str:
    """The error of an attempt whose pool child was killed because it ``why`` ("closed its pipe to the worker")."""
    return f"its pool child {why} while running this job; the child was killed"


def reap(process: Any, seconds: float) -> int | None:
    """Wait at most ``seconds`` for ``process`` (a ``multiprocessing`` process) to exit; return its exit code or None.

    Never blocks past ``seconds``: ``Process.join`` waits on the process's sentinel and then in a
    blocking ``waitpid``, so a child whose handler closed its end of the sentinel (closing every
    descriptor it does not own) would hold the caller until that child exits by itself. This
    polls the non-blocking ``exitcode`` instead.
    """
    deadline = time.monotonic() + seconds
    while (code := process.exitcode) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return code


class ThreadPool:
    """``slots`` daemon threads taking jobs from a queue, watched by ``reap_lost()``.

    The queue may hold more jobs than there are idle threads (jobs claimed ahead, ``runner``):
    each waits there until a thread frees. With ``watch_begins(begin)``, a thread that takes a
    job first calls ``begin(entry)``, and skips the job when it returns False (it was handed
    back, cancelled or lost while it waited).
    """

    kind = "threads"

    def __init__(self, slots: int, on_done: DoneCallback) -> None:
        self.slots = slots
        self._on_done = on_done
        self._on_begin: Callable[[Running], bool] | None = None
        self._tasks: queue.SimpleQueue[Running | None] = queue.SimpleQueue()
        self._busy = 0  # threads running a handler (it took its job, the handler has not returned)
        self._waiting = 0  # jobs submitted that no thread has taken yet
        self._lock = threading.Lock()
        self._closed = False
        # Per slot: the job its thread took (until it is reported), and whether that job still
        # counts in ``busy`` (until its handler returned).
        self._current: list[Running | None] = [None] * slots
        self._counted = [False] * slots
        self._threads = [self._start(slot) for slot in range(slots)]

    def _start(self, slot: int) -> threading.Thread:
        thread = threading.Thread(target=self._loop, args=(slot,), name=f"stint-slot-{slot}", daemon=True)
        thread.start()
        return thread

    def watch_begins(self, begin: Callable[[Running], bool]) -> None:
        """Have each thread call ``begin(entry)`` when it takes a job, and skip the job when that returns False."""
        self._on_begin = begin

    def busy(self) -> int:
        """Slots taken: threads whose handler has not returned, plus jobs waiting for one; at most ``slots``."""
        return min(self.slots, self._busy + self._waiting)

    def load(self) -> int:
        """Jobs in the pool: threads whose handler has not returned plus queued jobs (may exceed ``slots``)."""
        return self._busy + self._waiting

    def submit(self, entry: Running) -> None:
        """Queue ``entry.job`` for the next free thread; it waits in the queue while every thread is busy."""
        with self._lock:
            self._waiting += 1
        self._tasks.put(entry)

    def abort(self, entry: Running) -> bool:
        """Threads cannot be killed: set the cancel flag and return False."""
        entry.cancel_flag.set()
        return False

    def close(self) -> None:
        """Stop idle threads; threads still running a handler die with the process (daemon)."""
        self._closed = True
        for _ in self._threads:
            self._tasks.put(None)

    def reap_lost(self) -> list[Running]:
        """Replace every slot thread that died; return the jobs they held (to report), and count them.

        ``run_handler`` turns whatever a handler raises into an outcome, so a slot thread dies
        only of something raised into it from outside or of a bug of ours; its slot would
        otherwise be gone for good while the worker kept claiming jobs for it.
        """
        from scheduler import metrics  # not at the top: pool children import this module (see _child_main)

        lost: list[Running] = []
        if self._closed:
            return lost
        for slot, thread in enumerate(self._threads):
            if thread.is_alive():
                continue
            with self._lock:
                entry, self._current[slot] = self._current[slot], None
                if self._counted[slot]:
                    self._counted[slot] = False
                    self._busy -= 1
            self._threads[slot] = self._start(slot)
            metrics.worker_threads_lost_total.inc()
            logger.error(
                "pool thread %s died%s; a new thread took its slot",
                thread.name,
                f" while running job {entry.job.id}" if entry is not None else "",
                extra={"job_id": str(entry.job.id)} if entry is not None else {},
            )
            if entry is not None:
                lost.append(entry)
        return lost

    def _loop(self, slot: int) -> None:
        from scheduler.workers.execute import run_handler

        while True:
            entry = self._tasks.get()
            if entry is None:
                return
            # Outside the pool's lock: ``begin`` takes InFlight's, which is never held while this one is wanted.
            if self._on_begin is not None and not self._on_begin(entry):
                with self._lock:
                    self._waiting -= 1
                continue  # handed back, cancelled or lost while it waited: it has its outcome
            with self._lock:
                self._waiting -= 1
                self._busy += 1
                self._current[slot] = entry
                self._counted[slot] = True
            try:
                report = run_handler(entry.job, entry.cancel_flag, pool_slot=True)  # never raises: errors are outcomes
            finally:
                with self._lock:
                    if self._counted[slot]:
                        self._counted[slot] = False
                        self._busy -= 1
            try:
                self._on_done(entry, report)
            except Exception:  # the slot keeps serving; the job's deadline reports it if this did not
                logger.exception("reporting job %s failed", entry.job.id, extra={"job_id": str(entry.job.id)})
            self._current[slot] = None


def _exit_with_parent(parent_pid: int, own_group: bool) -> None:
    """Exit this child once its worker process is gone (re-parented: the worker was SIGKILLed).

    Nothing else would stop it: its handler would run on beside the attempt that the lease
    rescue starts, and a hung one forever. With ``own_group`` (it leads its process group), what
    its handler forked goes too: SIGKILL to the whole group, this child included.
    """
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_SECONDS)
    if own_group:
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _child_main(conn: Connection, parent_pid: int) -> None:
    """Entry point of a pool child: set Django up once, then run jobs sent by the parent."""
    import django

    # Its own process group: a handler's os.killpg(os.getpgrp(), ...) must not reach its worker
    # process and the jobs beside it there.
    own_group = lead_own_group()
    # The parent decides when children stop (a message, or SIGKILL). Process managers signal every
    # process of the unit (honcho, systemd's KillMode=control-group): a child that died of that
    # SIGTERM would fail its job before the parent's graceful drain.
    ignore_stop_signals()  # the parent started us with them blocked (stop_signals_held)
    install_stack_dump()  # a SIGUSR1 meant for this process dumps its stacks rather than killing it
    threading.Thread(
        target=_exit_with_parent, args=(parent_pid, own_group), name="stint-parent-watch", daemon=True
    ).start()
    # A pool child reports no metrics: keep it out of the supervisor's multiprocess metrics
    # directory (prometheus-client reads the variable when it is first imported, in setup()).
    os.environ.pop(PROMETHEUS_DIR_VARIABLE, None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from core.db_role import set_process_role
    from scheduler.workers.execute import run_handler

    set_process_role("worker-child")

    conn.send_bytes(READY_MESSAGE)
    flag = threading.Event()
    try:
        while True:
            try:
                job = conn.recv()
            except EOFError:
                break
            if job is None:
                break
            conn.send_bytes(encode_report(run_handler(job, flag, pool_slot=True)))
    finally:
        from scheduler import tracing

        tracing.shutdown()  # export this child's last spans: exit_now skips the atexit hook that would
    exit_now(0)  # not the interpreter's exit: a thread or atexit hook a handler left would hold it


# A child's messages to its worker are JSON text, never pickles: unpickling runs whatever code the
# data names (``__reduce__``), and a handler's result (a str subclass, say) would then run in the
# worker process itself, beside every other job, or hang its only reader thread.
READY_MESSAGE = b'"ready"'


def encode_report(report: Report) -> bytes:
    """A child's report as JSON bytes: ``[job id, outcome value, result, error, traceback, retry_after]``.

    Plain JSON values; ``retry_after`` is the delay the handler asked for (``Report.retry_after``),
    a number ``run_handler`` already read and bounded, or null. ``run_handler`` has checked that
    the result is JSON; a hostile one that encodes differently the second time, or not at all, is
    reported PERMANENT here instead.
    """
    job_id = str(report.job.id)
    try:
        return json.dumps(
            [job_id, report.outcome.value, report.result, report.error, report.traceback, report.retry_after]
        ).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        return json.dumps([job_id, Outcome.PERMANENT.value, None, f"result is not JSON: {exc}", "", None]).encode()


def decode_message(data: bytes) -> str | tuple[str, Outcome, Any, str, str, float | None]:
    """Read a child's message: "ready", or (job id, outcome, result, error, traceback, retry_after).

    Raises ValueError for anything else (then the child is not to be trusted: it is killed),
    ``retry_after`` included: null, or a number of seconds a job may wait
    (``retry.is_backoff_seconds``), as ``run_handler`` makes it. The caller also checks that the
    job id is the one the child is running.
    """
    message = json.loads(data)
    if message == "ready":
        return message
    if not isinstance(message, list) or len(message) != 6:
        raise ValueError("not a report")
    job_id, outcome, result, error, tb, retry_after = message
    if not (isinstance(job_id, str) and isinstance(error, str) and isinstance(tb, str)):
        raise ValueError("not a report")
    if retry_after is not None and not is_backoff_seconds(retry_after):
        raise ValueError("not a report: its delay is not a number of seconds a job may wait")
    return job_id, Outcome(outcome), result, error, tb, None if retry_after is None else float(retry_after)


@dataclass(slots=True, eq=False)
class _Child:
    process: Any
    conn: Connection
    entry: Running | None = None
    ready: bool = False


class ProcessPool:
    """One spawned child process per slot; a timed-out or cancelled job's child is killed and replaced."""

    kind = "processes"

    def __init__(self, slots: int, on_done: DoneCallback) -> None:
        self.slots = slots
        self._on_done = on_done
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._children: list[_Child] = [self._spawn() for _ in range(slots)]
        self._closing = False
        self._reader = threading.Thread(target=self._read_loop, name="stint-pool-reader", daemon=True)
        self._reader.start()
        self._wait_ready()

    def _spawn(self) -> _Child:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_child_main, args=(child, os.getpid()), daemon=True, name="stint-pool-child")
        with stop_signals_held():
            process.start()
        child.close()
        return _Child(process=process, conn=parent)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + CHILD_START_TIMEOUT
        while time.monotonic() < deadline:
            with self._lock:
                if all(c.ready for c in self._children):
                    return
            time.sleep(0.02)
        logger.warning("not every pool child was ready within %.0f s", CHILD_START_TIMEOUT)

    def busy(self) -> int:
        """Slots running a job, plus slots whose child is (re)starting."""
        with self._lock:
            return sum(1 for c in self._children if c.entry is not None or not c.ready)

    def load(self) -> int:
        """The same as ``busy()``: this pool never queues a job beyond its slots."""
        return self.busy()

    def submit(self, entry: Running) -> None:
        """Send ``entry.job`` to an idle ready child.

        Raises ``PoolFull`` if no child is idle (one died between ``busy()`` and now), or
        ``UnsendableJob`` if the job cannot be sent to a child (it cannot be pickled); the slot
        stays free either way.
        """
        with self._lock:
            for index, child in enumerate(self._children):
                if child.ready and child.entry is None:
                    try:
                        child.conn.send(entry.job)
                    except (OSError, EOFError) as exc:
                        raise PoolFull(f"pool child {child.process.pid} is gone: {exc}") from exc
                    except Exception as exc:  # pickling: RecursionError, PicklingError, ...
                        raise UnsendableJob(f"{type(exc).__name__}: {exc}") from exc
                    child.entry = entry
                    entry.slot = index
                    return
        raise PoolFull("no idle pool child")

    def abort(self, entry: Running) -> bool:
        """Kill the child running ``entry`` (SIGKILL) and start a replacement; return True."""
        entry.cancel_flag.set()
        with self._lock:
            if entry.slot is None or self._children[entry.slot].entry is not entry:
                return False
            old = self._children[entry.slot]
            kill_group(old.process)  # and what its handler forked
            old.conn.close()
            self._children[entry.slot] = self._spawn()
        reap(old.process, CHILD_REAP_SECONDS)
        return True

    def reap_lost(self) -> list[Running]:
        """Restart the reader thread if it died (a bug of ours); return [] (a dead child's job is reported by it)."""
        from scheduler import metrics

        if self._closing or self._reader.is_alive():
            return []
        metrics.worker_threads_lost_total.inc()
        logger.error("the pool's reader thread died; a new one took over")
        self._reader = threading.Thread(target=self._read_loop, name="stint-pool-reader", daemon=True)
        self._reader.start()
        return []

    def close(self) -> None:
        """Ask idle children to exit and kill the busy ones."""
        self._closing = True
        with self._lock:
            children = list(self._children)
        for child in children:
            try:
                if child.entry is None:
                    child.conn.send(None)
                else:
                    kill_group(child.process)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + CHILD_EXIT_SECONDS  # one for all: they exit side by side
        for child in children:
            if reap(child.process, max(0.0, deadline - time.monotonic())) is None:
                logger.warning("pool child %s did not exit when asked; killing it", child.process.pid)
                kill_group(child.process)
                reap(child.process, CHILD_REAP_SECONDS)

    def _read_loop(self) -> None:
        next_check = 0.0
        while not self._closing:
            with self._lock:
                conns = {c.conn: c for c in self._children if not c.conn.closed}
            if not conns:
                time.sleep(0.05)
                continue
            try:
                ready = wait(list(conns), timeout=CHILD_CHECK_SECONDS)
            except (OSError, ValueError):  # a connection closed by abort() under us
                continue
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHILD_CHECK_SECONDS
                self._check_alive(conns, ready)
            for conn in ready:
                child = conns[conn]
                try:
                    message = decode_message(conn.recv_bytes())
                except (EOFError, OSError):
                    self._child_died(child)
                    continue
                except (ValueError, TypeError, RecursionError):  # not _child_main's: a handler wrote to the pipe
                    logger.error("pool child %s sent an unreadable message; killing it", child.process.pid)
                    self._child_died(child, why="sent an unreadable message")
                    continue
                if message == "ready":
                    with self._lock:
                        child.ready = True
                    continue
                job_id, outcome, result, error, tb, retry_after = message
                with self._lock:
                    entry = child.entry
                    honest = entry is not None and job_id == str(entry.job.id)
                    if honest:
                        child.entry = None
                if not honest:  # a report for no job or another job: a handler wrote to the pipe
                    logger.error(
                        "pool child %s sent a report for a job it is not running; killing it", child.process.pid
                    )
                    self._child_died(child, why="sent a report for a job it is not running")
                    continue
                try:
                    self._on_done(
                        entry,
                        Report(
                            job=entry.job,
                            outcome=outcome,
                            result=result,
                            error=error,
                            traceback=tb,
                            retry_after=retry_after,
                        ),
                    )
                except Exception:  # keep reading; the job's deadline reports it if this did not
                    logger.exception("reporting job %s failed", entry.job.id, extra={"job_id": str(entry.job.id)})

    def _check_alive(self, conns: dict[Connection, _Child], ready: list[Any]) -> None:
        """Report each child that exited although its pipe did not close: its own child (a fork) holds the pipe.

        Without this its job would stay held, and its slot lost, until the job's timeout. A pipe
        with data or end-of-file waiting is left to the next read, so a report sent just before
        the exit is not lost.
        """
        for conn, child in conns.items():
            if conn in ready or child.process.exitcode is None:
                continue
            try:
                if conn.poll():
                    continue
            except (OSError, ValueError):  # closed by abort() under us
                continue
            self._child_died(child)

    def _child_died(self, child: _Child, *, why: str = "") -> None:
        """Replace ``child``, which exited, closed its pipe or (``why``) must be killed; report its job CRASHED."""
        with self._lock:
            if child not in self._children or self._closing:
                return  # killed on purpose by abort() or close()
            index = self._children.index(child)
            entry = child.entry
            child.conn.close()
            self._children[index] = self._spawn()
        # Still running with its pipe closed, it closed the pipe itself (a handler closing descriptors
        # it does not own): it can never report, and must not run on beside its job's retry. One
        # that is exiting closes its pipe a moment before its exit code is there (and keeps that
        # code whatever signal comes).
        alive = reap(child.process, CHILD_EXITING_SECONDS) is None
        if alive:
            kill_group(child.process)
        exitcode = reap(child.process, CHILD_REAP_SECONDS)
        # What its handler forked (one holding its pipe, say) must not run on beside the job's retry.
        if exitcode is not None and kill_leftovers(child.process.pid):
            logger.warning("pool child %s left processes in its process group; killed them", child.process.pid)
        if not why and alive and exitcode == -signal.SIGKILL:
            why = "closed its pipe to the worker"
        logger.error(
            "pool child %s %s%s",
            child.process.pid,
            f"{why}; killed" if why else f"died ({describe_exit(exitcode)})",
            f" while running job {entry.job.id}" if entry is not None else "",
            extra={"job_id": str(entry.job.id)} if entry is not None else {},
        )
        if entry is not None:
            error = killed_while_running(why) if why else died_while_running(exitcode)
            self._on_done(entry, Report(job=entry.job, outcome=Outcome.CRASHED, error=error))
