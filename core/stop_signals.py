"""Signals of the long-running commands: SIGTERM/SIGINT/SIGHUP stop gently, a second forces; SIGUSR1 dumps stacks."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

logger = logging.getLogger(__name__)

# The wakeup socket pair of the installed handlers, kept open for the life of the process.
_wakeup: list[socket.socket] = []


# Signals that ask a long-running command to stop. SIGHUP (the terminal or SSH session that
# started it went away) would otherwise end the process at once, leaving its jobs RUNNING until
# their leases expire and its leadership until its lock's TTL.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def install_stop_handlers(stop: Callable[..., None], *, name: str) -> None:
    """On SIGTERM/SIGINT/SIGHUP call ``stop()``; on a second signal call ``stop(force=True)`` if accepted.

    ``stop`` runs on a watcher thread, never inside a signal handler: a Python signal handler runs
    on the main thread between two bytecodes, possibly while that thread holds a non-reentrant
    lock (an ``Event``'s, inside the ``wait``/``clear`` of every run loop), and ``stop`` sets
    Events, so calling it there can deadlock the process for good. The handlers installed here do
    nothing; the interpreter's C-level handler writes each signal's number to a wakeup socket
    (``signal.set_wakeup_fd``), which the watcher reads. Call from the main thread, once.
    """
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    _wakeup[:] = [reader, writer]
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    wanted = {int(s) for s in STOP_SIGNALS}

    def watch() -> None:
        count = 0
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in (s for s in data if s in wanted):
                count += 1
                if count == 1:
                    logger.info("%s: %s received, shutting down gracefully", name, signal.Signals(signum).name)
                    stop()
                    continue
                logger.warning("%s: second signal, forcing shutdown", name)
                try:
                    stop(force=True)
                except TypeError:
                    stop()

    threading.Thread(target=watch, name=f"{name}-signals", daemon=True).start()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _acted_on_by_watcher)
    install_stack_dump()


def install_stack_dump() -> bool:
    """On SIGUSR1, write the Python stack of every thread of this process to stderr, and go on.

    For a process that looks wedged: ``kill -USR1 <pid>`` shows where each thread is, with no
    debugger. Every process of ``run_workers`` installs it (supervisor, worker processes, pool
    children), so signal them one at a time (their dumps share a log) and not as a group:
    multiprocessing's resource tracker, in the same group, has no handler and would die.
    ``faulthandler`` writes from its C-level handler, so it works while the main thread is blocked
    or holds the GIL in C code. Without it SIGUSR1 would terminate the process.

    Returns False, after a warning, where stderr is no file (closed, or replaced by an object
    without a file descriptor): a debugging aid never stops the process from starting.
    """
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (RuntimeError, OSError, ValueError, AttributeError) as exc:  # stderr None, or without fileno()
        logger.warning("SIGUSR1 stack dumps are off: stderr is no file (%s)", exc)
        return False
    return True


def _acted_on_by_watcher(signum: int, frame: Any) -> None:
    """Replace the default action (exit, KeyboardInterrupt); the watcher thread acts on the signal."""


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` now, after flushing its log handlers and standard streams.

    Not through the interpreter's own exit, which joins every non-daemon thread and runs every
    ``atexit`` hook: a handler may have left either behind (a thread that never ends, a hook that
    hangs), and a stopped worker process or pool child would then stay alive until it was killed.
    Whatever must be done before the exit (closing the pool, exporting spans) is done by then.
    """
    for flush in (logging.shutdown, sys.stdout.flush, sys.stderr.flush):
        try:
            flush()
        except Exception:  # noqa: S110 - a stream a handler closed: nothing left to flush to
            pass
    os._exit(code)
