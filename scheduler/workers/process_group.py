"""Process groups of ``run_workers``: each process that runs handlers leads its own.

A worker process and a pool child each call ``lead_own_group()`` first thing. A handler that signals
its process group (``os.killpg(os.getpgrp(), SIGKILL)``, ``os.kill(0, SIGTERM)``) then reaches
its own process and whatever it forked, not the supervisor and the other worker processes
(whose jobs would all have lost their attempt, and ``run_workers`` itself would have been gone).

Only the standard library is imported: worker processes import this before Django is set up.
"""

from __future__ import annotations

import os
import signal


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
