"""Tests for core.process_sessions: every process of a session is found and signalled, whatever its group."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from core.process_sessions import session_pids, signal_session
from scheduler.workers.supervisor import process_state
from tests.support.processes import gone, process_group, wait_until

# A session leader whose child leads a process group of its own, as a run_workers worker process does.
TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setpgid(0, 0); time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_session_pids_reads_the_session_field_and_skips_zombies(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, state, session in ((10, "S", 10), (11, "R", 10), (12, "Z", 10), (20, "S", 20)):
        (proc / str(pid)).mkdir(parents=True)
        # pid (comm) state ppid pgrp session: a command name holding ") " must not shift the fields.
        (proc / str(pid) / "stat").write_text(f"{pid} (a) b) {state} 1 {pid} {session} 0 0\n")
    (proc / "self").mkdir()

    assert session_pids(10, proc=proc) == [10, 11]
    assert session_pids(20, proc=proc) == [20]
    assert session_pids(30, proc=proc) == []


def test_signal_session_reaches_a_child_that_leads_its_own_group() -> None:
    leader = subprocess.Popen(  # noqa: S603 - this interpreter
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        child = int(leader.stdout.readline())
        wait_until(lambda: process_group(child) == child, what="the child leads its own group")

        assert signal_session(leader.pid, signal.SIGSTOP) == [leader.pid, child]
        wait_until(lambda: {process_state(leader.pid), process_state(child)} <= {"T", "t"}, what="both stopped")
        signal_session(leader.pid, signal.SIGCONT)
        wait_until(lambda: {process_state(leader.pid), process_state(child)} <= {"S", "R"}, what="both resumed")
        signal_session(leader.pid, signal.SIGKILL)

        assert leader.wait(timeout=5) == -signal.SIGKILL
        wait_until(lambda: gone(child), timeout=5, what="the child was killed")
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
        leader.stdout.close()
