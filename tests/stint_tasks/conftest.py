"""Real ``run_workers`` processes for the backend's end-to-end tests, stopped and reported in teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from core.process_sessions import signal_session
from scheduler.models import WorkerNode
from tests.support.subprocess_env import database_url

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0  # seconds any one awaited condition may take (two busy cores)
STOP_WAIT = 10.0  # seconds a worker gets to exit after SIGTERM
FAST = {
    "STINT_LEASE_SECONDS": "3",
    "STINT_HEARTBEAT_SECONDS": "0.5",
    "STINT_POLL_SECONDS": "0.2",
    "STINT_BACKOFF_BASE_SECONDS": "0.1",
    "STINT_BACKOFF_MAX_SECONDS": "0.2",
    "STINT_TASK_MODULES": "tests.stint_tasks.tasks",
    "LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}
T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], *, what: str, timeout: float = WAIT, each: Callable[[], object] | None = None
) -> T:
    """Poll ``predicate`` (after ``each``) every 50 ms until truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if each is not None:
            each()
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


class Workers:
    """Starts ``run_workers`` processes for one test; all are stopped (and their logs printed) afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, *, concurrency: int = 2, pool: str = "threads", env: dict[str, str] | None = None) -> int:
        """Start a worker, wait until it registered, return its pid."""
        log = self.tmp_path / f"worker-{len(self.started)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "run_workers",
                    "--processes=1",
                    f"--concurrency={concurrency}",
                    f"--pool={pool}",
                ],
                cwd=ROOT,
                env={**os.environ, **FAST, "DATABASE_URL": database_url(), **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append((popen, log))

        def registered() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"worker exited with {popen.returncode}:\n{log.read_text(errors='replace')}")
            # run_workers supervises its worker processes: each registers with the supervisor's pid.
            return WorkerNode.objects.filter(supervisor_pid=popen.pid, stopped_at__isnull=True).exists()

        wait_until(registered, what="the worker registered", timeout=60.0)
        return popen.pid

    def stop_all(self) -> None:
        for popen, _ in self.started:
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
        for popen, log in self.started:
            try:
                popen.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                signal_session(popen.pid, signal.SIGKILL)  # the session of a process we started
                popen.wait(timeout=STOP_WAIT)
            sys.stderr.write(f"----- worker {popen.pid} exit {popen.returncode} -----\n")
            sys.stderr.write(log.read_text(errors="replace")[-6000:] + "\n")


@pytest.fixture
def workers(transactional_db: None, tmp_path: Path) -> Iterator[Workers]:
    """``workers.start()`` runs a real ``run_workers``; every one is stopped before the database is flushed."""
    started = Workers(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()
