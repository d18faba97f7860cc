"""The jobs a worker process holds that no slot has begun, in memory its supervisor reads after it dies.

A thread-pool worker's claimed jobs wait in its pool's queue until a slot begins them; while a
backlog of short jobs lasts it claims up to its slots' count ahead of its free slots
(``runner.CLAIM_AHEAD_MAX_RUN``). When the whole process dies (SIGKILL, a segfault, a handler's
``os._exit``, killed by its supervisor), the supervisor takes its leased jobs at once
(``rescuer.rescue_held_by``). A job that never began never ran a line of its handler: it is
handed back (HANDED_BACK: no attempt spent, not isolated), as the worker itself would have done
on a drain, instead of being rescued LOST with an attempt spent and sent to the isolation slot.

The board is a shared byte array (``multiprocessing`` ``RawArray`` of ``c_char``, 16 bytes per
entry) the supervisor creates before the process starts and keeps after it died. Rule: an entry
holds a job's id from before the job goes to the pool until a slot begins it (cleared before
the handler runs) or the job gets its outcome unrun. So a listed job never began; an unlisted
one may have, and is rescued as before. A process killed mid-write leaves an entry half written
or half cleared: it matches no held job, which counts as begun (the safe side). With every
entry taken (more jobs waiting than the board holds) a job is simply not listed.
"""

from __future__ import annotations

import ctypes
import uuid
from typing import Any

ID_BYTES = 16  # a job id (UUID) per entry
_EMPTY = bytes(ID_BYTES)


def capacity_for(slots: int) -> int:
    """Entries a thread pool of ``slots`` needs: its free slots plus as many claimed ahead (``InFlight.room``)."""
    return 2 * slots


def shared_array(ctx: Any, slots: int) -> Any:
    """A zeroed board for a thread pool of ``slots``, shared with the processes ``ctx`` (multiprocessing) starts."""
    return ctx.RawArray(ctypes.c_char, ID_BYTES * capacity_for(slots))


class WaitingBoard:
    """The writer's side, in the worker process: ``put`` a job as waiting, ``clear`` it when it begins or ends.

    ``array``: a writable buffer of ``ID_BYTES`` per entry, all zero at the start (a
    ``multiprocessing`` ``RawArray(ctypes.c_char, n)`` shared with the supervisor; a ``bytearray``
    in tests). Not thread-safe: its one user (``InFlight``) calls it under its own lock. About
    0.3 us per job for a ``put`` and a ``clear``.
    """

    def __init__(self, array: Any) -> None:
        self._view = memoryview(array).cast("B")  # slice writes through a memoryview: 4x faster than ctypes'
        self._free = list(range(len(self._view) // ID_BYTES - 1, -1, -1))

    def put(self, job_id: uuid.UUID) -> int | None:
        """Write ``job_id`` into a free entry; return the entry's index, or None when every entry is taken."""
        if not self._free:
            return None
        index = self._free.pop()
        start = index * ID_BYTES
        self._view[start : start + ID_BYTES] = job_id.bytes
        return index

    def clear(self, index: int | None) -> None:
        """Clear entry ``index`` (from ``put``; None: nothing) and free it."""
        if index is None:
            return
        start = index * ID_BYTES
        self._view[start : start + ID_BYTES] = _EMPTY
        self._free.append(index)


def read_waiting(array: Any) -> frozenset[uuid.UUID]:
    """The job ids listed in ``array`` (a board's buffer), read by the supervisor once its process died."""
    raw = bytes(array[:])
    ids = set()
    for start in range(0, len(raw) - ID_BYTES + 1, ID_BYTES):
        chunk = raw[start : start + ID_BYTES]
        if chunk != _EMPTY:
            ids.add(uuid.UUID(bytes=chunk))
    return frozenset(ids)
