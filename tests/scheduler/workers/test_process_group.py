"""Tests for scheduler/workers/process_group.py: stop signals held while a process starts up."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from multiprocessing.connection import Connection

from scheduler.workers.process_group import STOP_SIGNALS, ignore_stop_signals, stop_signals_held

WAIT = 20.0  # seconds


def _start_up_then_ignore(go: Connection, done: Connection) -> None:
    """A child that is still "starting up" (waiting for ``go``) when its group is signalled."""
    go.recv()
    ignore_stop_signals()
    done.send("alive")


def test_a_stop_signal_that_reaches_a_process_still_starting_up_is_dropped_not_its_death() -> None:
    # Under honcho, a stack stopped a second after start sent SIGTERM to the supervisor's group while
    # its worker processes were still importing Django: each died of it, logged at ERROR.
    ctx = multiprocessing.get_context("spawn")
    go_parent, go_child = ctx.Pipe()
    done_parent, done_child = ctx.Pipe()
    process = ctx.Process(target=_start_up_then_ignore, args=(go_child, done_child), daemon=True)
    with stop_signals_held():
        process.start()
    go_child.close()
    done_child.close()

    for signum in STOP_SIGNALS:
        os.kill(process.pid, signum)
    go_parent.send("go")

    assert done_parent.poll(WAIT) and done_parent.recv() == "alive"
    process.join(WAIT)
    assert process.exitcode == 0


def test_a_stop_signal_to_the_starting_process_itself_is_delivered_after_the_block() -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, _frame: received.append(signum))
    try:
        with stop_signals_held():
            signal.pthread_kill(threading.get_ident(), signal.SIGHUP)  # to this thread, which holds it
            assert received == []
        assert received == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert signal.SIGHUP not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
