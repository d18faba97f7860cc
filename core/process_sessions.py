"""Signal a whole session of processes: a command started with ``start_new_session`` and everything under it.

``run_workers``' worker processes and pool children each lead a process group of their own (so a
handler's ``os.killpg(os.getpgrp(), ...)`` reaches only its own process), so "the command's process
group" is its supervisor alone. They stay in the session the command leads, as do processes
re-parented after their parent died: ``killpg`` of the command's pid is ``signal_session`` now.
Linux only (``/proc``); standard library only, so the test harnesses, the chaos runner and the
benchmarks import it without Django.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

MAX_WALKS = 20  # walks of /proc at most, for processes forked while the others were being signalled


def stat_fields(text: bytes) -> list[bytes]:
    """Split the text of a ``/proc/<pid>/stat`` into its fields after the parenthesized command name.

    proc(5): state, ppid, pgrp, session, ... (index 0, 1, 2, 3); the command name may hold spaces
    and ")" itself, hence the last ")". Empty for a text without one.
    """
    return text[text.rfind(b")") + 1 :].split()


def proc_stats(proc: Path = Path("/proc")) -> Iterator[tuple[int, list[bytes]]]:
    """Yield (pid, ``stat_fields``) of each process under ``proc``; one that exits during the walk is skipped."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_bytes()
        except OSError:  # exited meanwhile
            continue
        yield int(entry.name), stat_fields(text)


def session_pids(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """Return the pids of the live processes of session ``sid`` (its leader included), by pid.

    Read from the session field of each ``proc``/<pid>/stat (``proc_stats``); zombies are left out.
    """
    return sorted(
        pid
        for pid, fields in proc_stats(proc)
        if len(fields) > 3 and fields[0] not in (b"Z", b"X") and int(fields[3]) == sid
    )


def signal_session(sid: int, sig: int) -> list[int]:
    """Send ``sig`` to every process of session ``sid``, its leader first; return the pids signalled.

    The leader goes first so that, for SIGSTOP or SIGKILL, it starts nothing more meanwhile; the
    others are then signalled until a walk of ``/proc`` finds none not signalled yet (one forked
    just before its parent stopped is caught by the next walk), at most ``MAX_WALKS`` walks. A
    process that is gone meanwhile, or that we may not signal (another user's), is skipped.
    ``sid``: the pid of a process started with ``start_new_session=True`` (``setsid``).
    """
    signalled: list[int] = []
    seen: set[int] = set()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(sid, sig)
        signalled.append(sid)
    seen.add(sid)
    for _ in range(MAX_WALKS):
        fresh = [pid for pid in session_pids(sid) if pid not in seen]
        if not fresh:
            break
        for pid in fresh:
            seen.add(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                signalled.append(pid)
    return signalled
