"""The ``run_workers`` supervisor: a prefork master that keeps its worker processes running.

A ``Supervisor`` starts ``processes`` worker processes, each a ``Worker`` with its own pool of
``concurrency`` slots, and on demand one isolation slot: a worker process that claims only
isolated jobs and runs each in a pool child process of its own. It holds no lease and runs no
handler, so no handler can take it down. When one of its processes dies:

- the jobs it was running are handed to rescue at once (``rescuer.rescue_held_by``), fenced
  by their lease tokens, instead of after their lease expires: each attempt is LOST with how
  the process died ("worker process died (signal 11: SIGSEGV) while running this job"), counts
  against its job's budget, and the job becomes isolated (README, Operations / crashes); the
  jobs it had claimed that no slot had begun (a thread pool's, listed on its
  ``waiting_board``) are handed back unrun instead, no attempt spent and not isolated;
- it is replaced at once, or after a backoff (1 s doubling to 30 s) while its replacements
  keep dying before they are ready (a database that is down, a broken deployment).

Each worker process leads a process group of its own (``process_group``), so a handler that
signals its group (``os.killpg(os.getpgrp(), SIGKILL)``, ``os.kill(0, SIGTERM)``) reaches its own
process only: the supervisor reaps it like any crash. A process that died or was killed takes
what its handlers forked with it (its group is killed when it is reaped); one that stopped
cleanly leaves its group alone.

Signals (DESIGN.md, Processes): the supervisor alone acts on SIGTERM/SIGINT; its processes
ignore them, since process managers signal every process of the unit. The first signal tells each process
to stop claiming and drain within the grace period, a second one to hand back at once; the
supervisor exits 0 once they have exited, killing one still there ``STOP_MARGIN_SECONDS`` past
its deadline (its jobs rescued). Each process watches its pipe to the supervisor: when the
supervisor dies, even of SIGKILL, the pipe closes and the process drains and exits too.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from django.db import close_old_connections, connection
from django.db.models.functions import Now

from core.db_threads import bound_lock_waits
from core.process_sessions import stat_fields
from scheduler import leasing, metrics
from scheduler.conf import conf
from scheduler.maintenance.rescuer import rescue_held_by
from scheduler.models import WorkerNode
from scheduler.queues import queues_unused
from scheduler.workers.child import FORCE, READY, STOP, make_worker_id, pulse_seconds, worker_process_main
from scheduler.workers.claim_board import ClaimBoard
from scheduler.workers.inflight import CLAIM_AHEAD_MAX_WAIT
from scheduler.workers.pool import PROMETHEUS_DIR_VARIABLE, describe_exit, died_while_running
from scheduler.workers.process_group import kill_group, kill_leftovers, stop_signals_held
from scheduler.workers.runner import WEDGED_EXIT_CODE, WorkerOptions
from scheduler.workers.waiting_board import read_waiting, shared_array

logger = logging.getLogger(__name__)

ISOLATION = "isolation"  # the slot name of the isolation process; the others are "0", "1", ...
DEFAULT_ISOLATION_SLOTS = 2  # jobs the isolation process runs at once, each in its own child process
ISOLATION_IDLE_SECONDS = 30.0  # seconds an isolation process waits for work before it exits
# How long a statement of the supervisor's loop (the isolation check, a rescue, marking a worker
# stopped) waits for a lock: each is retried later when it fails, so a handler's LOCK TABLE
# stint_job must not hold the loop (reaping, restarts, signals) as long as the lock lasts.
LOCK_TIMEOUT_MS = 1000
RESTART_BACKOFF_BASE = 1.0  # seconds before the first restart of a process that died before it was ready
RESTART_BACKOFF_MAX = 30.0  # seconds, at most
STOP_MARGIN_SECONDS = 10.0  # seconds past the grace period (or a forced stop) before a process is killed
RESCUE_RETRY_SECONDS = 1.0  # seconds between tries of a rescue the database refused
RESCUE_GIVE_UP_SECONDS = 300.0  # after this the lease rescuer has long taken those jobs over
# Pulses a worker process may miss (``child.pulse_seconds``) before its supervisor takes it for
# starved: a handler holds its GIL, so neither its heartbeat nor its deadlines run.
STARVED_AFTER_PULSES = 3


def default_processes() -> int:
    """Worker processes by default: one per CPU core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` from ``/proc/<pid>/stat`` ("R", "S", "T" stopped...); None if unknown.

    proc(5): the third field, after the parenthesized command name (which may hold spaces and
    parentheses itself, hence the last ")").
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:  # gone, or not Linux
        return None
    fields = stat_fields(text)
    return fields[0].decode() if fields else None


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorOptions:
    """``processes`` worker processes running ``worker``; an isolation process of ``isolation_slots``.

    ``log_level`` is the root logging level of the worker processes; ``metrics_port`` (0: off)
    serves the metrics of every worker process, summed, from the supervisor.
    """

    processes: int
    worker: WorkerOptions
    isolation_slots: int = DEFAULT_ISOLATION_SLOTS
    log_level: int = logging.INFO
    metrics_port: int = 0


@dataclass(slots=True, eq=False)
class _Child:
    slot: str
    process: Any  # multiprocessing's SpawnProcess
    control: Connection
    worker_id: str
    ready: bool = False
    closed: bool = False  # its end of the pipe closed: it is exiting
    told: str = ""  # "", STOP or FORCE: the last stop message sent
    killed: bool = False  # by the supervisor, past its stop deadline
    stopped_since: float | None = None  # monotonic time it was first seen stopped (SIGSTOP), if it still is
    frozen: bool = False  # killed by the supervisor after it stayed stopped for a lease
    pulse: Any = None  # shared double: the monotonic time of the process's last pulse (0.0: none yet)
    starved_since: float | None = None  # its last pulse before it starved, while starved (leases renewed)
    starved_killed: bool = False  # killed by the supervisor: starved past a job's timeout
    ahead: Any = None  # shared bool: the process has claimed jobs ahead of its free slots (``runner._ahead``)
    waiting: Any = None  # shared bytes: its ``WaitingBoard`` (the jobs no slot has begun; a thread pool's), or None


@dataclass(slots=True, eq=False)
class _Rescue:
    worker_id: str
    error: str
    isolate: bool
    since: float  # monotonic
    unbegun: frozenset[uuid.UUID] = frozenset()  # its jobs no slot had begun: handed back unrun


def warn_unused_queues(names: list[str], *, pid: int) -> None:
    """Log one WARNING naming those of ``names`` (``run_workers --queues``) that nothing uses (``queues_unused``).

    A typo (``reprots``) would leave the workers waiting on a queue no job is ever sent to, in
    silence. Run once per supervisor, in a thread of its own; a failed check (the database down at
    start) is logged at INFO and nothing else, since the workers must start regardless. Closes
    the thread's database connection.
    """
    try:
        unused = queues_unused(names=names)
    except Exception as exc:  # never stop or hold up start-up for an advisory check
        logger.info("supervisor %s: the --queues names could not be checked (%s)", pid, exc)
        unused = []
    finally:
        connection.close()
    if unused:
        logger.warning(
            "supervisor %s: --queues names queues no job, schedule or task uses: %s; check for a typo (the"
            " workers serve them as given)",
            pid,
            ", ".join(repr(name) for name in unused),
        )


class Supervisor:
    """The ``run_workers`` process. ``run()`` blocks until ``stop()`` and every worker process exited; returns 0."""

    def __init__(self, options: SupervisorOptions) -> None:
        if options.processes < 1 or options.isolation_slots < 1:
            raise ValueError("processes and isolation_slots must be >= 1")
        self.options = options
        self.pid = os.getpid()
        self._ctx = multiprocessing.get_context("spawn")
        self._children: dict[str, _Child] = {}
        self._restart_at: dict[str, float] = {}  # slot -> monotonic time of its next start
        self._failures: dict[str, int] = {}  # slot -> deaths before ready, in a row
        self._rescues: list[_Rescue] = []  # rescues the database refused, to try again
        self._next_rescue_try = 0.0
        self._stopping = threading.Event()
        self._force = threading.Event()
        self._deadline: float | None = None  # monotonic time after which processes are killed
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_writer.setblocking(False)
        self._metrics_dir: str | None = None
        # How often the pulses of the worker processes are read: a starved one's leases must be
        # renewed well within a lease of its last heartbeat.
        self._pulse_check_seconds = pulse_seconds(options.worker.heartbeat_seconds)

        # Where its ordinary processes publish their claims, one row each (slot "0" is row 0...).
        self._board = ClaimBoard(options.processes, self._ctx)

    # -- control ---------------------------------------------------------------------------

    def stop(self, *, force: bool = False) -> None:
        """Drain every worker process within the grace period (``force``, or a second call: hand back now)."""
        if self._stopping.is_set() or force:
            self._force.set()
        self._stopping.set()
        try:
            self._wake_writer.send(b"\0")
        except OSError:  # the buffer is full: the loop is awake anyway
            pass

    def run(self) -> int:
        """Start the worker processes and keep them running until stopped; return 0."""
        self._serve_metrics()
        logger.info(
            "supervisor %s: %d worker %s of %d slots (--pool %s), queues %s",
            self.pid,
            self.options.processes,
            "process" if self.options.processes == 1 else "processes",
            self.options.worker.concurrency,
            self.options.worker.pool,
            ",".join(self.options.worker.queues or ["*"]),
        )
        if self.options.worker.queues:
            # In a thread: the check is one bounded query, but start-up never waits on the database.
            threading.Thread(
                target=warn_unused_queues,
                args=(self.options.worker.queues,),
                kwargs={"pid": self.pid},
                name="stint-queue-check",
                daemon=True,
            ).start()
        try:
            for index in range(self.options.processes):
                self._start(str(index))
            self._loop()
        finally:
            for child in self._children.values():  # only on an error of ours: they drain and exit
                child.control.close()
            if self._metrics_dir is not None:
                shutil.rmtree(self._metrics_dir, ignore_errors=True)
            close_old_connections()
        logger.info("supervisor %s stopped", self.pid)
        return 0

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        next_check = next_pulse_check = 0.0
        poll = self.options.worker.poll_seconds
        while True:
            if self._stopping.is_set():
                self._tell_stop()
                if not self._children:
                    return
            controls = {c.control: c for c in self._children.values() if not c.ready and not c.closed}
            sentinels = {c.process.sentinel: c for c in self._children.values()}
            ready = wait([*controls, *sentinels, self._wake_reader], timeout=self._timeout(poll))
            for item in ready:
                if item is self._wake_reader:
                    self._wake_reader.recv(4096)
                elif item in controls:
                    self._read_ready(controls[item])
            for child in list(self._children.values()):
                if child.process.exitcode is not None:
                    self._reap(child)
            if self._rescues and time.monotonic() >= self._next_rescue_try:
                self._retry_rescues()
            now = time.monotonic()
            if self._stopping.is_set():
                if self._deadline is not None and now >= self._deadline:
                    self._kill_all()
                continue
            for slot, at in list(self._restart_at.items()):
                if now >= at:
                    del self._restart_at[slot]
                    self._restart(slot)
            if now >= next_check:
                next_check = now + poll
                self._start_isolation_if_needed()
                self._kill_frozen(now)
            if now >= next_pulse_check:
                next_pulse_check = now + self._pulse_check_seconds
                self._keep_starved_leases(now)

    def _timeout(self, poll: float) -> float:
        now = time.monotonic()
        timeout = min(poll, self._pulse_check_seconds)
        for at in self._restart_at.values():
            timeout = min(timeout, at - now)
        if self._deadline is not None:
            timeout = min(timeout, self._deadline - now)
        if self._rescues:
            timeout = min(timeout, self._next_rescue_try - now)
        return max(0.0, timeout)

    # -- worker processes ------------------------------------------------------------------

    def _start(self, slot: str) -> None:
        isolation = slot == ISOLATION
        options = dataclasses.replace(self.options.worker, supervisor_pid=self.pid)
        if isolation:
            options = dataclasses.replace(
                options,
                isolation=True,
                pool="processes",
                concurrency=self.options.isolation_slots,
                idle_exit_seconds=ISOLATION_IDLE_SECONDS,
            )
        ours, theirs = self._ctx.Pipe()
        token = uuid.uuid4().hex[:6]
        board = None if isolation else (self._board.array, int(slot), self._board.rows)
        pulse = self._ctx.RawValue(ctypes.c_double, 0.0)
        ahead = self._ctx.RawValue(ctypes.c_bool, False)
        waiting = None
        if not isolation and options.pool == "threads":
            waiting = shared_array(self._ctx, options.concurrency)
        process = self._ctx.Process(
            target=worker_process_main,
            args=(theirs, dataclasses.asdict(options), token, self.options.log_level, board, pulse, ahead, waiting),
            name=f"stint-worker-{slot}",
            daemon=False,  # an isolation process starts pool children of its own
        )
        with stop_signals_held():  # a SIGTERM to our group while it starts up is not its death
            process.start()
        theirs.close()
        child = _Child(
            slot=slot,
            process=process,
            control=ours,
            worker_id=make_worker_id(process.pid, token),
            pulse=pulse,
            ahead=ahead,
            waiting=waiting,
        )
        self._children[slot] = child
        logger.info(
            "supervisor %s: started worker process %s (%s)",
            self.pid,
            process.pid,
            "the isolation slot" if isolation else f"slot {slot}",
        )

    def _restart(self, slot: str) -> None:
        """Start ``slot``'s process again; if the system refuses a new process, try again after a backoff.

        Nothing when ``slot`` has a process already: a second start would orphan the first one
        (its supervisor pipe closed, it would drain and exit). Seen with the isolation slot: its
        dying process's rescue started a new one, then its reaping scheduled another.
        """
        if slot in self._children:
            return
        try:
            self._start(slot)
        except OSError:  # out of processes or memory: the supervisor must outlive it
            failures = self._failures.get(slot, 0) + 1
            self._failures[slot] = failures
            delay = min(RESTART_BACKOFF_BASE * 2 ** (failures - 1), RESTART_BACKOFF_MAX)
            logger.exception(
                "supervisor %s: could not start a process for slot %s; again in %.0f s", self.pid, slot, delay
            )
            self._restart_at[slot] = time.monotonic() + delay

    def _kill_frozen(self, now: float) -> None:
        """SIGKILL a worker process that has stayed stopped (SIGSTOP, SIGTSTP) for a whole lease.

        Nothing else would end it: it neither exits nor heartbeats, its leases expire and its
        jobs are rescued, but its slot of ``run_workers`` stays taken by a process that runs
        nothing (seen: a handler that SIGSTOPped its own process). Killed, it is reaped like a
        crash: its jobs are rescued at once and isolated, and a new process takes its slot.
        ``now``: monotonic seconds. Linux only (``/proc``); elsewhere nothing is done.
        """
        lease = conf().lease_seconds
        for child in self._children.values():
            if child.killed or child.frozen or child.process.exitcode is not None:
                continue
            if process_state(child.process.pid) not in ("T", "t"):
                child.stopped_since = None
                continue
            if child.stopped_since is None:
                child.stopped_since = now
            elif now - child.stopped_since >= lease:
                logger.error(
                    "supervisor %s: worker process %s has been stopped (SIGSTOP) for %.0f s; killing it",
                    self.pid,
                    child.process.pid,
                    now - child.stopped_since,
                    extra={"worker": child.worker_id},
                )
                kill_group(child.process)
                child.frozen = True

    def _keep_starved_leases(self, now: float) -> None:
        """Renew the leases of each worker process in which no thread runs; kill one starved past a job's timeout.

        A handler that holds the GIL without a break (``re`` backtracking catastrophically, a C
        extension's long call) stops every other thread of its process: the heartbeat, the claim
        loop that enforces deadlines, the other jobs' handlers. Its leases expired and the lease
        rescuer took all its jobs, innocent neighbours included, while their first attempts were
        still to go on (run twice). The supervisor is another process, never starved, and knows
        the process is alive: it renews those leases (``leasing.extend_leases_held_by``) while the
        process misses its pulses. Once a job it holds has run past its timeout (plus a heartbeat
        interval, and once it has claimed ahead the longest a job claimed ahead may wait for a
        slot), a deadline only killing the whole process can enforce, it kills the process:
        reaped like a crash, its jobs LOST and isolated (README, Operations / crashes).
        A stopped process (SIGSTOP) is ``_kill_frozen``'s. ``now``: monotonic seconds.
        """
        silent_after = STARVED_AFTER_PULSES * self._pulse_check_seconds
        for child in self._children.values():
            if not child.ready or child.killed or child.frozen or child.starved_killed:
                continue
            last = child.pulse.value
            if not last or now - last < silent_after or child.process.exitcode is not None:
                if child.starved_since is not None:
                    logger.warning(
                        "supervisor %s: worker process %s runs again (a handler had held its GIL for %.1f s)",
                        self.pid,
                        child.process.pid,
                        last - child.starved_since,
                        extra={"worker": child.worker_id},
                    )
                    child.starved_since = None
                continue
            if process_state(child.process.pid) in ("T", "t"):
                continue
            try:
                bound_lock_waits(LOCK_TIMEOUT_MS)
                # Past a held job's timeout, counted from its claim (the database's started_at): a
                # heartbeat interval, plus, once the process has claimed ahead, the longest a job
                # claimed ahead waits for a slot: its timeout starts when a slot begins it.
                overdue_after = self.options.worker.heartbeat_seconds
                if child.ahead is not None and child.ahead.value:
                    overdue_after += CLAIM_AHEAD_MAX_WAIT
                held, overdue = leasing.extend_leases_held_by(worker_id=child.worker_id, overdue_after=overdue_after)
            except Exception:  # the database is down: the rescuer's stall guard covers that; again next check
                logger.warning(
                    "supervisor %s: could not renew the leases of starved worker process %s",
                    self.pid,
                    child.process.pid,
                    exc_info=True,
                )
                connection.close()
                continue
            if child.starved_since is None:
                child.starved_since = last
                logger.warning(
                    "supervisor %s: no thread of worker process %s has run for %.1f s (a handler holds its GIL);"
                    " renewing its %d leases",
                    self.pid,
                    child.process.pid,
                    now - last,
                    held,
                    extra={"worker": child.worker_id},
                )
            if overdue:
                logger.error(
                    "supervisor %s: worker process %s has held its GIL for %.1f s, past a job's timeout; killing it",
                    self.pid,
                    child.process.pid,
                    now - last,
                    extra={"worker": child.worker_id},
                )
                kill_group(child.process)
                child.starved_killed = True

    def _read_ready(self, child: _Child) -> None:
        try:
            message = child.control.recv()
        except (EOFError, OSError):
            child.closed = True  # it is exiting: its sentinel says so
            return
        if message == READY:
            child.ready = True
            self._failures.pop(child.slot, None)

    def _reap(self, child: _Child) -> None:
        """Handle the exit of ``child``: rescue its jobs, mark it stopped, schedule its replacement."""
        del self._children[child.slot]
        child.control.close()
        code = child.process.exitcode
        pid = child.process.pid
        if self._metrics_dir is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, self._metrics_dir)
        stopped_cleanly = code == 0 and (child.told or child.slot == ISOLATION)
        wedged = code == WEDGED_EXIT_CODE and not child.killed
        if wedged:  # it stopped itself: hung handlers held all its thread slots (it handed back the rest)
            error, isolate = "worker process replaced: hung handlers held all its slots", False
            logger.warning(
                "supervisor %s: worker process %s (%s) stopped with every slot held by a hung handler;"
                " starting a fresh one",
                self.pid,
                pid,
                child.worker_id,
                extra={"worker": child.worker_id},
            )
        elif child.killed:
            error, isolate = "worker process killed by its supervisor: it outlived the shutdown grace period", False
        elif child.frozen:
            error, isolate = "worker process stopped (SIGSTOP) for a whole lease; killed by its supervisor", True
        elif child.starved_killed:
            error = "worker process held its GIL (no other thread ran) past a job's timeout; killed by its supervisor"
            isolate = True
        elif stopped_cleanly:  # told to stop (or an idle isolation slot): it handed its jobs back
            error, isolate = "worker process exited (exit code 0) while running this job", True
        else:  # exit code 0 included: a handler's os._exit(0) kills its neighbours as surely as a crash
            error, isolate = died_while_running(code), True
        # What its handlers forked dies with it (a fork must not run on beside its job's retry, nor a
        # hung handler's subprocess for ever); a clean stop leaves a handler's daemon alone (README).
        if not stopped_cleanly and kill_leftovers(pid):
            logger.warning(
                "supervisor %s: worker process %s left processes in its process group (forked by its handlers);"
                " killed them",
                self.pid,
                pid,
                extra={"worker": child.worker_id},
            )
        if not stopped_cleanly and not wedged:
            metrics.worker_processes_died_total.inc()
            logger.error(
                "supervisor %s: worker process %s (%s) %s (%s)",
                self.pid,
                pid,
                child.worker_id,
                "was killed" if child.killed else "died",
                describe_exit(code),
                extra={"worker": child.worker_id},
            )
        # The jobs it had claimed that no slot began never ran: they go back unrun, no attempt spent.
        unbegun = read_waiting(child.waiting) if child.waiting is not None else frozenset()
        self._rescue(
            _Rescue(worker_id=child.worker_id, error=error, isolate=isolate, since=time.monotonic(), unbegun=unbegun)
        )
        try:
            bound_lock_waits(LOCK_TIMEOUT_MS)
            WorkerNode.objects.filter(id=child.worker_id, stopped_at__isnull=True).update(
                stopped_at=Now(), busy_slots=0
            )
        except Exception:  # the database is down: the worker reaper marks it gone later
            logger.warning("supervisor %s: could not mark worker %s stopped", self.pid, child.worker_id)
            connection.close()
        if self._stopping.is_set() or (child.slot == ISOLATION and code == 0):
            return  # stopping, or an idle isolation process: started again when needed
        delay = 0.0
        if not child.ready:
            failures = self._failures.get(child.slot, 0) + 1
            self._failures[child.slot] = failures
            delay = min(RESTART_BACKOFF_BASE * 2 ** (failures - 1), RESTART_BACKOFF_MAX)
            logger.warning(
                "supervisor %s: worker process for slot %s died before it was ready (%d in a row); "
                "starting another in %.0f s",
                self.pid,
                child.slot,
                failures,
                delay,
            )
        self._restart_at[child.slot] = time.monotonic() + delay

    def _rescue(self, rescue: _Rescue) -> None:
        """Hand the jobs of a dead worker process to rescue now; keep the rescue to retry if the database refused."""
        try:
            bound_lock_waits(LOCK_TIMEOUT_MS)
            moved = rescue_held_by(
                worker_id=rescue.worker_id, error=rescue.error, isolate=rescue.isolate, unbegun=rescue.unbegun
            )
        except Exception:  # database down or a lock held too long: try again in a moment
            logger.warning(
                "supervisor %s: could not rescue the jobs of worker %s yet", self.pid, rescue.worker_id, exc_info=True
            )
            connection.close()
            if time.monotonic() - rescue.since < RESCUE_GIVE_UP_SECONDS:
                self._rescues.append(rescue)
                self._next_rescue_try = time.monotonic() + RESCUE_RETRY_SECONDS
            return
        if moved:
            logger.warning(
                "supervisor %s: rescued %d jobs of worker %s: %s",
                self.pid,
                moved,
                rescue.worker_id,
                rescue.error,
                extra={"worker": rescue.worker_id},
            )
            if rescue.isolate and not self._stopping.is_set() and ISOLATION not in self._children:
                self._restart_at.pop(ISOLATION, None)
                self._restart(ISOLATION)  # it gets ready while their backoff runs

    def _retry_rescues(self) -> None:
        pending, self._rescues = self._rescues, []
        for rescue in pending:
            self._rescue(rescue)

    def _start_isolation_if_needed(self) -> None:
        """Start the isolation process when an isolated job waits in our queues and none runs."""
        if ISOLATION in self._children or ISOLATION in self._restart_at:
            return
        try:
            bound_lock_waits(LOCK_TIMEOUT_MS)
            waiting = leasing.isolated_jobs_waiting(queues=self.options.worker.queues)
        except Exception:  # the database is down: the worker processes say so; look again next poll
            connection.close()
            return
        if waiting:
            self._restart(ISOLATION)

    # -- stopping --------------------------------------------------------------------------

    def _tell_stop(self) -> None:
        """Send STOP (then FORCE) to every process once; set the deadline after which they are killed."""
        self._restart_at.clear()
        now = time.monotonic()
        force = self._force.is_set()
        if self._deadline is None:
            self._deadline = now + self.options.worker.grace_seconds + STOP_MARGIN_SECONDS
        if force:
            self._deadline = min(self._deadline, now + STOP_MARGIN_SECONDS)
        message = FORCE if force else STOP
        for child in self._children.values():
            if child.told == message or child.told == FORCE:
                continue
            try:
                child.control.send(message)
            except (OSError, ValueError):  # it is exiting: its sentinel says so
                pass
            child.told = message

    def _kill_all(self) -> None:
        for child in self._children.values():
            if not child.killed and child.process.exitcode is None:
                logger.warning(
                    "supervisor %s: worker process %s did not stop in time; killing it", self.pid, child.process.pid
                )
                kill_group(child.process)
                child.killed = True

    # -- metrics ---------------------------------------------------------------------------

    def _serve_metrics(self) -> None:
        """Serve the worker processes' metrics, which they write to a fresh directory (prometheus multiprocess mode)."""
        if not self.options.metrics_port:
            return
        self._metrics_dir = tempfile.mkdtemp(prefix="stint-worker-metrics-")
        # Read by prometheus-client in each worker process when it is first imported.
        os.environ[PROMETHEUS_DIR_VARIABLE] = self._metrics_dir
        metrics.serve(self.options.metrics_port, role="workers", multiprocess_dir=self._metrics_dir)
