"""SIGUSR1 stack dumps (core.stop_signals.install_stack_dump), in a process of their own."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ROOT

DUMP_ONESELF = """
import os, signal, sys
{setup}
from core.stop_signals import install_stack_dump
installed = install_stack_dump()
os.kill(os.getpid(), signal.SIGUSR1)
print("still running", installed, file=sys.__stdout__)
"""


def run(setup: str) -> subprocess.CompletedProcess[str]:
    code = DUMP_ONESELF.format(setup=setup)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_sigusr1_writes_the_stacks_to_stderr_and_the_process_goes_on() -> None:
    done = run("")

    assert done.returncode == 0
    assert done.stdout == "still running True\n"
    assert "Current thread" in done.stderr and 'File "<string>", line 6 in <module>' in done.stderr


def test_without_a_stderr_file_the_dump_is_off_and_the_process_starts_all_the_same() -> None:
    for setup in ("import io; sys.stderr = io.StringIO()", "sys.stderr = None"):
        done = run(setup + "; signal.signal(signal.SIGUSR1, signal.SIG_IGN)")

        assert done.returncode == 0, done.stderr
        assert done.stdout == "still running False\n"
