"""Real ``manage.py run_workers``/``run_scheduler`` processes for a test, and polling on database state.

A test starts commands through the ``procs`` fixture (``procs.worker()``, ``procs.scheduler()``);
they connect to the test database (``DATABASE_URL`` built from the test connection) and run with
short leases, heartbeats and polls (``FAST``). Every process is stopped in teardown (SIGKILL to
its session, every process it started, if SIGTERM is not enough, after a SIGUSR1 that makes each
of its processes write every thread's stack to the log) and its log is written to stderr there, which pytest shows only
when the test failed. Tests wait with ``wait_until`` (a bounded poll), never on fixed sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from core.process_sessions import signal_session
from scheduler.models import Job, WorkerNode
from scheduler.states import JobStatus
from tests.support.jobs import status
from tests.support.subprocess_env import database_url

ROOT = Path(__file__).resolve().parents[2]  # the checkout: manage.py's directory
WAIT = 20.0  # seconds any one awaited condition may take
READY_WAIT = 60.0  # seconds for processes to start: ten at once on two busy cores is slow
STOP_WAIT = 10.0  # seconds a process may take to exit after SIGTERM in teardown
DUMP_WAIT = 0.3  # seconds each process's stack dump gets before the next one's (they share the log)
LOG_TAIL = 6000  # characters of each process log shown on failure
FAST = {
    "STINT_LEASE_SECONDS": "3",
    "STINT_HEARTBEAT_SECONDS": "0.5",
    "STINT_POLL_SECONDS": "0.2",
    "STINT_BACKOFF_BASE_SECONDS": "0.1",
    "STINT_BACKOFF_MAX_SECONDS": "0.2",
    "STINT_WORKER_DEAD_AFTER_SECONDS": "30",
    "KAFKA_TOPIC": "stint-test-workers",  # run_scheduler's outbox relay never feeds the real topic
    "LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}

T = TypeVar("T")


@dataclass(eq=False)
class Proc:
    """A started ``manage.py`` command; its stdout and stderr go to ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    processes: int = 0  # run_workers: its worker processes

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def send(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = WAIT) -> int:
        return self.popen.wait(timeout=timeout)


class Processes:
    """Starts worker and scheduler commands for one test and stops them all afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.env = {**os.environ, **FAST, "DATABASE_URL": database_url()}
        self.started: list[Proc] = []

    def start(self, name: str, command: list[str]) -> Proc:
        log = self.tmp_path / f"{len(self.started):02d}-{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "manage.py", *command],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session: teardown can reap its worker processes and pool children too
            )
        proc = Proc(name=name, popen=popen, log=log)
        self.started.append(proc)
        return proc

    def worker(
        self,
        *,
        concurrency: int = 1,
        pool: str = "threads",
        grace: float = 2.0,
        ready: bool = True,
        processes: int = 1,
        extra: Sequence[str] = (),
    ) -> Proc:
        """Start ``run_workers``; with ``ready``, wait until its worker processes have registered."""
        proc = self.start(
            f"worker-{pool}",
            [
                "run_workers",
                f"--processes={processes}",
                f"--concurrency={concurrency}",
                f"--pool={pool}",
                f"--grace-seconds={grace}",
                *extra,
            ],
        )
        proc.processes = processes
        if ready:
            self.wait_ready(proc)
        return proc

    def scheduler(self) -> Proc:
        """Start ``run_scheduler`` with a short tick."""
        return self.start("scheduler", ["run_scheduler", "--tick-seconds=0.1"])

    def wait_ready(self, *procs: Proc) -> None:
        """Wait until the worker processes of each ``run_workers`` in ``procs`` have registered."""
        pids = [p.pid for p in procs]
        expected = sum(p.processes for p in procs)

        def registered() -> bool:
            for proc in procs:
                if proc.popen.poll() is not None:
                    raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.output()}")
            return live_workers(pids).count() == expected

        wait_until(registered, what=f"{expected} worker processes registered", timeout=READY_WAIT)

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.popen.poll() is None:
                proc.send(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        for proc in self.started:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                dump_stacks(proc.pid)  # wedged: its processes' stacks go to the log the report shows
            signal_session(proc.pid, signal.SIGKILL)  # the session of a process we started: leftovers only
            proc.popen.wait(timeout=STOP_WAIT)

    def report(self) -> str:
        parts = []
        for proc in self.started:
            text = proc.output()
            parts.append(f"----- {proc.name} pid {proc.pid} exit {proc.popen.returncode} -----\n{text[-LOG_TAIL:]}")
        return "\n".join(parts)


@pytest.fixture
def procs(transactional_db: None, tmp_path: Path) -> Iterator[Processes]:
    """Start commands with ``procs.worker()``/``procs.scheduler()``; all are stopped before the DB is flushed."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.stop_all()
        sys.stderr.write(processes.report() + "\n")


@pytest.fixture
def fast_backoff(settings) -> None:
    """In-test maintenance (the promoter) uses the same short backoff as the processes (``FAST``)."""
    settings.SCHEDULER = {**settings.SCHEDULER, "BACKOFF_BASE_SECONDS": 0.1, "BACKOFF_MAX_SECONDS": 0.2}


def wait_until(
    predicate: Callable[[], T],
    *,
    what: str,
    timeout: float = WAIT,
    each: Callable[[], Any] | None = None,
) -> T:
    """Poll ``predicate`` (after calling ``each``, if given) until it is truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if each is not None:
            each()
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            jobs = list(Job.objects.values_list("type", "status", "attempts", "last_error"))
            raise AssertionError(f"not within {timeout} s: {what}; jobs (type, status, attempts, error): {jobs}")
        time.sleep(0.05)


def status_is(job: Job, expected: JobStatus) -> Callable[[], bool]:
    return lambda: status(job) == expected


def live_workers(supervisor_pids: Sequence[int]) -> Any:
    """The registered, running (non-isolation) worker processes of these ``run_workers`` supervisors."""
    return WorkerNode.objects.filter(supervisor_pid__in=supervisor_pids, isolation=False, stopped_at__isnull=True)


def worker_of(proc: Proc) -> str:
    """The worker id of the one running worker process of ``run_workers`` ``proc``."""
    return live_workers([proc.pid]).values_list("id", flat=True).get()


def worker_pid(proc: Proc) -> int:
    """The pid of the one running worker process of ``run_workers`` ``proc``."""
    return live_workers([proc.pid]).values_list("pid", flat=True).get()


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, process group, session) of ``pid`` from /proc, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def process_group(pid: int) -> int | None:
    """The process group of ``pid``, or None once it is gone."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in {"Z", "X"} else stat[2]


def _live_processes() -> Iterator[tuple[int, int, int, bytes]]:
    """(pid, parent pid, session, command line) of every live process, by pid."""
    for pid in sorted(int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
        stat = _stat(pid)
        if stat is None or stat[0] in {"Z", "X"}:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        yield pid, stat[1], stat[3], cmdline


def pool_children(pid: int) -> set[int]:
    """Pids of the live multiprocessing pool children of process ``pid``."""
    return {child for child, parent, _, cmdline in _live_processes() if parent == pid and b"spawn_main" in cmdline}


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts as exited)."""
    stat = _stat(pid)
    return stat is None or stat[0] in {"Z", "X"}


def dump_stacks(sid: int) -> list[int]:
    """Make each Stint process of session ``sid`` write its threads' stacks to its log; return their pids.

    One SIGUSR1 at a time (``core.stop_signals.install_stack_dump``), ``DUMP_WAIT`` apart, so the
    dumps of processes sharing a log do not interleave. multiprocessing's resource tracker, which
    has no handler and would die of the signal, is left alone.
    """
    dumped = []
    for pid, _, session, cmdline in _live_processes():
        if session != sid or b"resource_tracker" in cmdline:
            continue
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            continue
        dumped.append(pid)
        time.sleep(DUMP_WAIT)
    return dumped
