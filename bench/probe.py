"""The clocks of `make bench`: what a no-op handler and a producer record, the same way for every system.

Standard library only: this module is imported by Stint's handler and by the peers' handlers and
producers, each in its own virtual environment (their agents put the project root on sys.path).

- A handler calls ``started(seq)`` first thing. It appends ``"<seq> <time.time()>\\n"`` to an
  in-memory list (under a lock) that a daemon thread writes to ``$BENCH_PROBE_DIR/starts-<pid>.txt`` every
  ``FLUSH_SECONDS`` (one ``write`` per flush, not per job, so the probe costs every system the same
  microsecond or so per job and no system call).
- A producer calls ``produce(enqueue_one, ...)`` (or ``produce_async``): one call of the system's own
  enqueue API per job, paced to an absolute schedule ``t0 + i / rate`` (a late producer catches up
  without sleeping; how far it fell behind shows in the achieved rate). It writes one line per job
  ``"<seq> <commit time> <call start> <call end>"`` to ``out`` at the end (nothing during the run).

``time.time()`` is one clock for every process on this host, so a handler's start minus the job's
commit time is the pickup lag. The commit time is when the enqueue call returned, unless the caller
passes ``commit_clock``: a function returning the time of the last commit it saw (Django producers
hook the connection's ``commit`` so that Stint's read-back after its commit is not counted as lag).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

FLUSH_SECONDS = 0.02  # how often a handler process writes its start records
PROBE_DIR_ENV = "BENCH_PROBE_DIR"

_lock = threading.Lock()
_pending: list[str] = []
_owner_pid = 0  # the process that started the flusher (a forked child starts its own)
_path: Path | None = None


def _flush() -> None:
    global _pending
    with _lock:
        lines, _pending = _pending, []
    if lines and _path is not None:
        with open(_path, "a", encoding="ascii") as out:
            out.write("".join(lines))


def _flush_loop() -> None:
    while True:
        time.sleep(FLUSH_SECONDS)
        _flush()


def _start_flusher() -> None:
    global _owner_pid, _path, _pending
    directory = os.environ.get(PROBE_DIR_ENV)
    _owner_pid = os.getpid()
    _pending = []
    _path = Path(directory) / f"starts-{_owner_pid}.txt" if directory else None
    threading.Thread(target=_flush_loop, name="bench-probe", daemon=True).start()


def started(seq: int) -> None:
    """Record that the handler of job ``seq`` (an int the producer chose) starts now.

    Cheap and thread-safe; records reach the file within FLUSH_SECONDS. Without
    ``$BENCH_PROBE_DIR`` it records nothing.
    """
    now = time.time()
    if _owner_pid != os.getpid():
        with _lock:
            if _owner_pid != os.getpid():
                _start_flusher()
    line = f"{seq} {now:.6f}\n"
    with _lock:
        _pending.append(line)


class Pacer:
    """The producer's schedule: job ``i`` is due at ``t0 + i / rate`` (rate 0: as fast as possible)."""

    def __init__(self, *, rate: float, seconds: float, count: int) -> None:
        self.rate = rate
        self.count = count if count > 0 else (int(rate * seconds) if rate > 0 else 0)
        self.deadline = seconds  # seconds; for rate 0 with no count, stop after this long
        self.t0 = time.time()

    def wait_seconds(self, i: int) -> float:
        """Return how long to sleep before job ``i`` is due (0 if due or late)."""
        if self.rate <= 0:
            return 0.0
        return max(0.0, self.t0 + i / self.rate - time.time())

    def more(self, i: int) -> bool:
        """Return whether job ``i`` should be produced: within the count and (if given) the seconds.

        A producer slower than its rate stops on time with fewer jobs rather than running late.
        """
        if self.count and i >= self.count:
            return False
        return self.deadline <= 0 or time.time() - self.t0 < self.deadline


def _write(out: Path, rows: list[tuple[int, float, float, float]]) -> None:
    with open(out, "w", encoding="ascii") as handle:
        handle.writelines(f"{s} {c:.6f} {a:.6f} {b:.6f}\n" for s, c, a, b in rows)


def produce(
    enqueue_one: Callable[[int], object],
    *,
    out: Path,
    rate: float = 0.0,
    seconds: float = 0.0,
    count: int = 0,
    first_seq: int = 0,
    commit_clock: Callable[[], float] | None = None,
) -> int:
    """Call ``enqueue_one(seq)`` once per job on the Pacer's schedule; write the records; return the count.

    ``rate`` jobs/s (0: as fast as possible), for ``count`` jobs or ``seconds`` seconds.
    """
    pacer = Pacer(rate=rate, seconds=seconds, count=count)
    rows: list[tuple[int, float, float, float]] = []
    i = 0
    while pacer.more(i):
        pause = pacer.wait_seconds(i)
        if pause > 0:
            time.sleep(pause)
        seq = first_seq + i
        before = time.time()
        enqueue_one(seq)
        after = time.time()
        committed = commit_clock() if commit_clock is not None else 0.0
        rows.append((seq, committed if before <= committed <= after else after, before, after))
        i += 1
    _write(out, rows)
    return i


async def produce_async(
    enqueue_one: Callable[[int], Awaitable[object]],
    *,
    out: Path,
    rate: float = 0.0,
    seconds: float = 0.0,
    count: int = 0,
    first_seq: int = 0,
) -> int:
    """``produce`` for an asyncio API: ``await enqueue_one(seq)`` once per job, one at a time."""
    import asyncio

    pacer = Pacer(rate=rate, seconds=seconds, count=count)
    rows: list[tuple[int, float, float, float]] = []
    i = 0
    while pacer.more(i):
        pause = pacer.wait_seconds(i)
        if pause > 0:
            await asyncio.sleep(pause)
        seq = first_seq + i
        before = time.time()
        await enqueue_one(seq)
        after = time.time()
        rows.append((seq, after, before, after))
        i += 1
    _write(out, rows)
    return i


def django_commit_clock() -> Callable[[], float]:
    """Hook Django's default connection so the returned function gives the time of its last commit.

    ``transaction.atomic`` commits through ``DatabaseWrapper.commit``; an autocommit statement does
    not, and then ``produce`` falls back to the time the enqueue call returned.
    """
    from django.db import connections

    wrapper = connections["default"]
    seen = [0.0]
    original = wrapper.commit

    def commit() -> None:
        original()
        seen[0] = time.time()

    wrapper.commit = commit
    return lambda: seen[0]


def agent_args(argv: list[str]) -> dict[str, str]:
    """Parse an agent's ``key=value`` arguments (after the sub-command) into a dict."""
    return dict(item.split("=", 1) for item in argv)
