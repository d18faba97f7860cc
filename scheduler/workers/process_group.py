"""Process groups of ``run_workers``: each process that runs handlers leads its own, and what a crash leaves in it dies.

A worker process and a pool child each call ``lead_own_group()`` first thing. A handler that signals
its process group (``os.killpg(os.getpgrp(), SIGKILL)``, ``os.kill(0, SIGTERM)``) then reaches
its own process and whatever it forked, not the supervisor and the other worker processes
(whose jobs would all have lost their attempt, and ``run_workers`` itself would have been gone).
The group also holds what the handlers of that process forked: when the process dies or is
killed, ``kill_group``/``kill_leftovers`` end those too (systemd's ``KillMode=control-group``
does the same for a unit), so a fork never runs on beside the retry of the attempt it belonged
to. A process that stops gracefully leaves its group alone (README, Operations / crashes).

Only the standard library is imported: worker processes import this before Django is set up.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from multiprocessing import resource_tracker
from typing import Any

# The signals process managers send to every process of a unit (honcho, systemd's
# KillMode=control-group): a worker process and a pool child ignore them, their parent decides.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Block ``STOP_SIGNALS`` in this thread for the block; start worker processes and pool children inside it.

    A process started inside (``multiprocessing``'s spawn: fork and exec keep the signal mask)
    starts with them blocked until its ``ignore_stop_signals()``, so a process manager's SIGTERM to
    the group while it is still starting up is dropped instead of killing it: under ``make run`` a
    stack stopped a second after start logged "worker process ... died (signal 15: SIGTERM)" at
    ERROR for each one. A signal this process receives meanwhile stays pending and is delivered at
    the end of the block (or at once to another thread), never lost. CPython guards its resource
    tracker the same way (bpo-33613), and unblocks SIGINT and SIGTERM when it starts that tracker:
    so it is started first, outside the block.
    """
    resource_tracker.ensure_running()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def ignore_stop_signals() -> None:
    """Ignore ``STOP_SIGNALS``, then unblock them: one that arrived while they were blocked is dropped.

    Call first thing in a process started inside ``stop_signals_held()``. POSIX: setting a
    pending signal's action to SIG_IGN discards it.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def lead_own_group() -> bool:
    """Make this process the leader of a new process group; return False if the system refused.

    Also ignores SIGTTIN and SIGTTOU: out of the terminal's foreground group, a process that read
    the terminal, or wrote to it under ``stty tostop``, would be stopped by them (and its
    supervisor would kill it after a lease as a frozen process); ignored, the read fails (EIO)
    and the write goes through. Call from the process itself (its parent cannot once it has
    exec'd: multiprocessing's spawn does).
    """
    for signum in (signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(signum, signal.SIG_IGN)
    try:
        os.setpgid(0, 0)
    except OSError:  # EPERM: a session leader (never a process multiprocessing started)
        return False
    return True


def kill_group(process: Any) -> None:
    """SIGKILL ``process`` (a ``multiprocessing`` process not reaped yet) and every process of the group it leads.

    A process that does not lead a group (it died, or is killed, before ``lead_own_group``) is
    killed alone. While the process is not reaped its pid names it, so its group is its own.
    """
    pid = process.pid
    try:
        leads = process.exitcode is None and os.getpgid(pid) == pid
    except ProcessLookupError:
        leads = False
    if leads:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    else:
        process.kill()


def kill_leftovers(pid: int) -> bool:
    """SIGKILL what is left in the process group of ``pid``, a process of ours that has exited (reaped).

    Returns True if any process was left (a handler's fork), False if the group is empty or was
    never made. The group keeps its id while a member lives, and a pid is reused only after the
    kernel has gone through every other free one, so the group is the one ``pid`` led.
    """
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True
