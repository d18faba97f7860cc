"""The Stint processes of a chaos run, placed on hosts h2 and h3, with an always-restart policy.

Host h2 runs the web server (gunicorn), a scheduler, a worker and the audit consumer; host h3 a
scheduler and a worker. Like systemd's ``Restart=always`` or a container orchestrator, the
``Cluster`` monitor restarts any process that exits while it is wanted: a process the runner
killed comes back, and one that died by itself (a poison job) is counted as an unexpected exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from chaos.hosts import Hosts
from core.process_sessions import signal_session

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RESTART_DELAY = 0.5  # seconds between an exit and the restart
WEB_PORT_ISOLATED = 8000
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


@dataclass(slots=True, kw_only=True)
class Exit:
    """One exit of a process: when (monotonic), its code, and whether the runner caused it."""

    at: float
    code: int | None
    expected: bool


@dataclass(slots=True, kw_only=True)
class Proc:
    """One Stint process; ``want`` says whether the monitor keeps it running."""

    name: str  # e.g. "worker@h2"
    host: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    want: bool = True
    popen: subprocess.Popen[bytes] | None = None
    expect_exit: bool = False
    exits: list[Exit] = field(default_factory=list)
    starts: int = 0

    @property
    def pid(self) -> int | None:
        """The process id (also its pid as seen by Stint: `ip netns exec` execs in place)."""
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        """True while the process runs (a stopped process is alive)."""
        return self.popen is not None and self.popen.poll() is None

    def children(self) -> list[psutil.Process]:
        """Its child processes (a supervised worker's workers), oldest first."""
        if not self.alive():
            return []
        try:
            return sorted(psutil.Process(self.pid).children(), key=lambda p: p.create_time())
        except psutil.Error:
            return []

    def worker_children(self) -> list[psutil.Process]:
        """The worker processes a ``run_workers`` supervisor started (isolation slot included), oldest first.

        Other children (multiprocessing's resource tracker, a forkserver) run no job and are left
        out: a fault meant for a worker must hit a process that holds leases.
        """
        out = []
        for child in self.children():
            try:
                cmdline = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if is_worker_cmdline(cmdline):
                out.append(child)
        return out

    def signal_session(self, sig: int, *, expected: bool = True) -> None:
        """Send ``sig`` to every process the process started, as a process manager stopping a unit does.

        Its session (``start_new_session``), not its process group: each worker process of a
        ``run_workers`` leads a group of its own (``scheduler.workers.process_group``), so SIGSTOP
        to the group would stop the supervisor alone. The process goes first, so that it starts
        nothing meanwhile (``core.process_sessions.signal_session``).
        """
        if not self.alive():
            return
        if expected and sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self.expect_exit = True
        signal_session(self.pid, sig)

    def signal(self, sig: int, *, expected: bool = True) -> None:
        """Send ``sig`` to the process; ``expected`` marks the exit it may cause as the runner's."""
        if not self.alive():
            return
        if expected and sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self.expect_exit = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)


class Cluster:
    """Start, watch and stop the Stint processes of one run."""

    def __init__(
        self,
        *,
        hosts: Hosts,
        env: dict[str, str],
        workdir: Path,
        worker_slots: int,
        worker_processes: int = 2,
        web_workers: int = 2,
    ) -> None:
        self.hosts = hosts
        self.workdir = workdir
        self.web_port = WEB_PORT_ISOLATED if hosts.isolated else _free_port()
        self.web_url = f"http://{hosts.addresses['h2']}:{self.web_port}"
        python = sys.executable
        manage = [python, str(ROOT / "manage.py")]
        worker = [*manage, "run_workers", "--concurrency", str(worker_slots), "--pool", "threads", "-v", "1"]
        if supports_processes():
            worker += ["--processes", str(worker_processes)]
        scheduler = [*manage, "run_scheduler", "--tick-seconds", "0.2", "-v", "1"]
        gunicorn = str(Path(python).parent / "gunicorn")
        web = [
            gunicorn,
            "config.wsgi:application",
            "--bind",
            f"{hosts.addresses['h2']}:{self.web_port}",
            "--worker-class",
            "gthread",
            "--workers",
            str(web_workers),
            "--threads",
            "4",
            "--timeout",
            "60",
            "--graceful-timeout",
            "5",
        ]
        specs = [
            ("web@h2", "h2", web),
            ("scheduler@h2", "h2", scheduler),
            ("scheduler@h3", "h3", scheduler),
            ("worker@h2", "h2", worker),
            ("worker@h3", "h3", worker),
            ("audit@h2", "h2", [*manage, "run_audit_consumer", "-v", "1"]),
        ]
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.procs = {
            name: Proc(name=name, host=host, argv=argv, env=env, log_path=workdir / "logs" / f"{name}.log")
            for name, host, argv in specs
        }
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._monitor = threading.Thread(target=self._watch, name="chaos-monitor", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start every process and the monitor that restarts them."""
        for proc in self.procs.values():
            self._spawn(proc)
        self._monitor.start()

    def _spawn(self, proc: Proc) -> None:
        env = {**proc.env, **proc.extra_env}
        with proc.log_path.open("ab") as log:
            log.write(f"--- chaos: starting {proc.name} at {time.ctime()} {proc.extra_env or ''}\n".encode())
            log.flush()
            proc.popen = subprocess.Popen(  # noqa: S603 - our own commands
                [*self.hosts.prefix(proc.host), *proc.argv],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session, as a unit under a process manager
            )
        proc.starts += 1

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                for proc in self.procs.values():
                    self._step(proc)

    def _step(self, proc: Proc) -> None:
        popen = proc.popen
        if popen is not None and popen.poll() is not None and not getattr(popen, "_chaos_reaped", False):
            popen._chaos_reaped = True  # type: ignore[attr-defined]
            proc.exits.append(Exit(at=time.monotonic(), code=popen.returncode, expected=proc.expect_exit))
            proc.expect_exit = False
            if not proc.exits[-1].expected:
                logger.warning("%s exited by itself with %s", proc.name, popen.returncode)
        if proc.want and (popen is None or popen.poll() is not None):
            last = proc.exits[-1].at if proc.exits else 0.0
            if time.monotonic() - last >= RESTART_DELAY:
                self._spawn(proc)

    def stop(self) -> None:
        """Stop the monitor, then kill every process with every process it started (SIGKILL); servers stay up.

        The run is over and its invariants checked: nothing is gained by a graceful stop, and the
        drains (worker grace, gunicorn's graceful timeout) would cost seconds of every run.
        """
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join(timeout=5)
        for proc in self.procs.values():
            proc.want = False
            if proc.alive():
                proc.signal_session(signal.SIGKILL)
        for proc in self.procs.values():
            if proc.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=10)

    # -- control used by the faults ----------------------------------------------------------

    def hold(self, name: str, want: bool) -> None:
        """Keep ``name`` down (``want`` False) or let the monitor run it again (True)."""
        with self._lock:
            self.procs[name].want = want

    def wait_alive(self, timeout: float = 30.0) -> bool:
        """Wait until every wanted process runs; return whether they all do."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(p.alive() for p in self.procs.values() if p.want):
                return True
            time.sleep(0.1)
        return False

    def restart(self, name: str, *, extra_env: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        """Stop ``name`` gracefully (SIGTERM, SIGKILL after ``timeout``) and start it with ``extra_env``."""
        proc = self.procs[name]
        with self._lock:
            proc.want = False
            proc.extra_env = dict(extra_env or {})
        if proc.alive():
            proc.signal(signal.SIGTERM)
            try:
                proc.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.signal(signal.SIGKILL)
                proc.popen.wait()
        with self._lock:
            self._step(proc)
            proc.want = True
            self._spawn(proc)

    def restart_all(self, timeout: float = 15.0) -> None:
        """Stop every process at once (SIGTERM, SIGKILL after ``timeout`` s) and start them again."""
        with self._lock:
            for proc in self.procs.values():
                proc.want = False
        for proc in self.procs.values():
            proc.signal_session(signal.SIGCONT, expected=False)  # a run_workers stopped whole by a fault
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.signal(signal.SIGKILL)
                proc.popen.wait()
        with self._lock:
            for proc in self.procs.values():
                self._step(proc)
                proc.want = True
                proc.extra_env = {}
                self._spawn(proc)

    def by_pid(self, pid: int) -> Proc | None:
        """The process with ``pid`` (or whose child has it), if it is one of ours."""
        for proc in self.procs.values():
            if proc.pid == pid or any(c.pid == pid for c in proc.children()):
                return proc
        return None

    def unexpected_exits(self) -> dict[str, int]:
        """Exits the runner did not cause, per process name."""
        return {p.name: n for p in self.procs.values() if (n := sum(1 for e in p.exits if not e.expected))}

    def log_offsets(self) -> dict[str, int]:
        """Current size of each process log (where a scenario's lines begin)."""
        return {p.name: (p.log_path.stat().st_size if p.log_path.exists() else 0) for p in self.procs.values()}


def is_worker_cmdline(cmdline: str) -> bool:
    """True for the command line of a worker process that ``run_workers`` started (multiprocessing spawn).

    The supervisor starts them with multiprocessing's spawn context, whose children run
    ``... -c 'from multiprocessing.spawn import spawn_main; spawn_main(...)' --multiprocessing-fork``;
    its resource tracker runs ``multiprocessing.resource_tracker`` instead and holds no job.
    """
    return "spawn_main" in cmdline and "--multiprocessing-fork" in cmdline and "resource_tracker" not in cmdline


def skew_env(offset: str) -> dict[str, str]:
    """Environment that runs a process with its clocks moved by ``offset`` (libfaketime, e.g. "+5m").

    The monotonic clock moves by the same constant, which changes no interval. It is not left
    alone (``FAKETIME_DONT_FAKE_MONOTONIC``): with that, libfaketime 0.9.10 makes every absolute
    ``clock_nanosleep`` fail with EINVAL, so each ``time.sleep`` of Python 3.11 raised OSError
    (measured) and a worker died in its claim loop: the harness's fault, not a skewed clock's.
    """
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": offset, "FAKETIME_NO_CACHE": "1"}


def faketime_available() -> bool:
    """True when Debian's libfaketime is installed."""
    return Path(FAKETIME_LIB).exists()


def supports_processes() -> bool:
    """True when ``run_workers`` has ``--processes`` (the supervised worker), read from its argument parser.

    Read in this process (Django is set up by then): a ``manage.py run_workers --help``
    subprocess started a whole Django, about 1 s of every run before the cluster could start.
    """
    from scheduler.management.commands.run_workers import Command

    parser = Command().create_parser("manage.py", "run_workers")
    return any("--processes" in action.option_strings for action in parser._actions)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
