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
from typing import Any


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
