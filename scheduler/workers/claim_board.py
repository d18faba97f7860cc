"""One claim per NOTIFY among a supervisor's worker processes: the claim board and the NOTIFY log.

Every worker process LISTENs, so one NOTIFY wakes all of a supervisor's processes, and each used
to claim: with two processes, every job enqueued at a low rate cost a claim that found it and a
claim that found nothing, run at the same instant on the same cores (the empty one delaying the
other). The processes of one ``run_workers`` now publish their claims on a ``ClaimBoard`` (shared
memory made by the supervisor), and a process woken only by a NOTIFY skips its claim when a
sibling's finished claim is known to have seen the notified jobs and to have taken every job it
found (it asked for more than it got).

A claim *covers* a NOTIFY when the claim's statement began after the notifying transaction
committed: PostgreSQL delivers a NOTIFY only after its transaction commits, so a claim that a
process started after it had received the NOTIFY, or after any sibling had, sees those jobs.
Two rules prove it without comparing clocks of events the processes cannot see:

- time: the sibling's claim started after this process received the NOTIFY;
- order: the sibling published the token of the last NOTIFY it had received before its claim
  (``covered_token``), and this process received that token at or after this NOTIFY. Every
  listener receives the notifications in one order (PostgreSQL's commit-ordered notification
  queue), so "at or after" read in this process's own log holds in the sibling's too.

Tokens are the notifying transactions' ids, sent first in the payload (``#<xid>,queue,...``;
``scheduler.notify``). A NOTIFY without a token, or anything the board cannot prove (a sibling
that is not publishing, a claim running for more than ``RUNNING_TRUST_NS``), means: claim, as
before. So a wrong answer can only cost a duplicate claim, never a job left waiting: a skip
needs a finished sibling claim that covered the NOTIFY and came back short.

A process reads the board and publishes its claim's start in one turn of the board's lock, so
that of two processes woken by one NOTIFY the second sees the first's claim. The turn is a few
microseconds; a process that cannot get the lock within ``TURN_SECONDS`` claims without the
board, and after ``TURN_MISSES_TO_GIVE_UP`` such misses in a row (a sibling was killed holding
the lock) it stops using the board. Each row has one writer (its process) and a sequence counter
(odd while being written; a reader retries a torn read), so a row a killed process left half
written proves nothing instead of misleading.
"""

from __future__ import annotations

import collections
import ctypes
import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

FIELDS = 4  # per process: write sequence, state, covered token, claim start (monotonic ns)
_SEQ, _STATE, _TOKEN, _STARTED = range(FIELDS)
LOG_SIZE = 4096  # NOTIFY tokens a process remembers (about 8 s of NOTIFYs at 500 jobs/s)
RUNNING_TRUST_NS = 50_000_000  # a sibling claim running longer than 50 ms is not waited for
READ_TRIES = 4  # torn reads retried before a row counts as unknown
TURN_SECONDS = 0.0002  # longest wait for the board's lock before claiming without it
TURN_MISSES_TO_GIVE_UP = 20  # lock waits in a row that timed out before the board is given up


class State(enum.IntEnum):
    """A row's claim state."""

    NONE = 0  # no claim yet (a new or restarted process)
    RUNNING = 1
    SHORT = 2  # finished and got fewer jobs than it asked for: it took every job it saw
    FULL = 3  # finished with every slot it asked for filled (more may wait), or failed


class Verdict(enum.Enum):
    """What a process woken only by a NOTIFY should do."""

    CLAIM = "claim"
    SKIP = "skip"  # a sibling's finished claim saw the notified jobs and took all it found
    WAIT = "wait"  # a sibling's running claim saw them: look again when it has finished


@dataclass(frozen=True, slots=True)
class Note:
    """The latest NOTIFY a process received: its token (None: none, or a NOTIFY without one),
    its position in the process's log (1, 2, ...) and when it arrived (``time.monotonic_ns``)."""

    token: int | None
    position: int
    received_ns: int


def parse_payload(payload: str) -> tuple[int | None, list[str]]:
    """Split a ``stint_jobs`` payload into (token, queue names).

    ``"#7042,a,b"`` -> (7042, ["a", "b"]); ``"a,b"`` (a sender without a token) -> (None, ["a", "b"]);
    a malformed token (``"#x,a"``) -> (None, ["a"]). Queue names never start with ``#``
    (``jobspec.QUEUE_NAME``), so an older worker reading a tokened payload still finds its queues.
    """
    names = payload.split(",") if payload else []
    if names and names[0].startswith("#"):
        head = names.pop(0)[1:]
        if head.isascii() and head.isdigit() and len(head) <= 19:
            return int(head), names
    return None, names


class NoteLog:
    """The NOTIFYs a process received, in arrival order: the listener thread appends, the claim loop reads.

    ``latest`` is the newest ``Note``; ``position_of(token)`` its arrival position, or None once it
    fell out of the last ``LOG_SIZE`` (or was never received). Appending is the listener thread's
    alone; readers need no lock (a dict lookup and an attribute read are atomic in CPython).
    """

    def __init__(self, size: int = LOG_SIZE) -> None:
        self._size = size
        self._positions: dict[int, int] = {}
        self._order: collections.deque[int] = collections.deque()
        self._count = 0
        self.latest = Note(None, 0, 0)

    def append(self, token: int | None, received_ns: int) -> None:
        """Record one NOTIFY (``token`` None: a NOTIFY without token, or a reconnect that may have missed some)."""
        self._count += 1
        if token is not None:
            if token not in self._positions:
                self._order.append(token)
            self._positions[token] = self._count
            while len(self._order) > self._size:
                self._positions.pop(self._order.popleft(), None)
        self.latest = Note(token, self._count, received_ns)

    def position_of(self, token: int) -> int | None:
        """The arrival position of ``token``'s NOTIFY here, or None."""
        return self._positions.get(token)


class ClaimBoard:
    """Shared memory with one row per worker process of a supervisor (``rows``), made before they start.

    Its ``array`` and ``lock`` are passed to each ``multiprocessing`` process the supervisor
    starts (shared memory and a semaphore); ``view(row)`` makes that process's ``BoardView``.
    """

    def __init__(self, rows: int, ctx: Any) -> None:
        """``ctx``: the supervisor's ``multiprocessing`` context."""
        self.rows = rows
        self.array = ctx.RawArray(ctypes.c_int64, rows * FIELDS)
        self.lock = ctx.Lock()

    def view(self, row: int) -> BoardView:
        """The view of the process in ``row`` (0 .. rows - 1), its own row reset to ``State.NONE``."""
        return BoardView(self.array, self.lock, row, self.rows)


class BoardView:
    """One process's access to a ``ClaimBoard``: publish its own claims, judge its NOTIFYs."""

    def __init__(self, array: Sequence[int] | Any, lock: Any, row: int, rows: int) -> None:
        """``array``/``lock``: a ``ClaimBoard``'s; ``row``: this process's (ValueError outside 0 .. rows - 1)."""
        if not 0 <= row < rows:
            raise ValueError(f"row {row} is not on a board of {rows}")
        self._array = array
        self._lock = lock
        self._misses = 0  # lock waits in a row that timed out
        self.given_up = False
        self._row = row
        self._rows = rows
        self._base = row * FIELDS
        self._write(State.NONE, 0, 0)

    def _write(self, state: State, token: int, started_ns: int) -> None:
        # Only this process's claim loop writes its row. Odd while writing, whatever a writer
        # killed in the middle left behind (a restarted process starts with this write).
        a, base = self._array, self._base
        seq = a[base + _SEQ] | 1
        a[base + _SEQ] = seq
        a[base + _STATE] = int(state)
        a[base + _TOKEN] = token
        a[base + _STARTED] = started_ns
        a[base + _SEQ] = seq + 1

    def begin_claim(self, note: Note, log: NoteLog, *, notified_only: bool) -> Verdict:
        """Decide about a claim and, when it is to be made, publish it as running: one turn of the lock.

        ``note``/``log``: this process's latest NOTIFY and its log; ``notified_only``: nothing but
        that NOTIFY asks for the claim (no poll, no backlog). Returns SKIP or WAIT (see ``verdict``)
        without publishing anything, or CLAIM after publishing this claim's start: the caller
        then makes it and calls ``claim_finished``.
        """
        if self.given_up:
            self.claim_started(note, time.monotonic_ns())
            return Verdict.CLAIM
        got = self._lock.acquire(timeout=TURN_SECONDS)
        try:
            if not got:
                self._miss()
            else:
                self._misses = 0
                if notified_only:
                    verdict = self.verdict(note, log, time.monotonic_ns())
                    if verdict is not Verdict.CLAIM:
                        return verdict
            self.claim_started(note, time.monotonic_ns())
            return Verdict.CLAIM
        finally:
            if got:
                self._lock.release()

    def _miss(self) -> None:
        self._misses += 1
        if self._misses >= TURN_MISSES_TO_GIVE_UP:
            self.given_up = True
            logger.warning(
                "claim board: its lock was not free for %d claims in a row (a sibling process killed while"
                " holding it?); this process now claims on every NOTIFY until it restarts",
                self._misses,
            )

    def claim_started(self, note: Note, started_ns: int) -> None:
        """Publish that this process's claim statement starts now (``started_ns``, monotonic, taken before
        it is sent) having received ``note`` and every NOTIFY before it."""
        self._write(State.RUNNING, note.token or 0, started_ns)

    def claim_finished(self, *, short: bool) -> None:
        """Publish the claim's end: ``short`` (it got fewer jobs than it asked for) or not (full, or it failed)."""
        a, base = self._array, self._base
        self._write(State.SHORT if short else State.FULL, a[base + _TOKEN], a[base + _STARTED])

    def _read(self, row: int) -> tuple[State, int, int] | None:
        a, base = self._array, row * FIELDS
        for _ in range(READ_TRIES):
            seq = a[base + _SEQ]
            state, token, started = a[base + _STATE], a[base + _TOKEN], a[base + _STARTED]
            if seq % 2 == 0 and a[base + _SEQ] == seq:
                try:
                    return State(state), token, started
                except ValueError:  # not a row we wrote
                    return None
        return None

    def verdict(self, note: Note, log: NoteLog, now_ns: int) -> Verdict:
        """What to do about ``note`` (this process's latest NOTIFY, read from ``log``) at ``now_ns``.

        SKIP when a sibling's finished claim covered it and came back short; WAIT when a sibling's
        claim that covered it is still running (for less than ``RUNNING_TRUST_NS``) and none
        finished short; else CLAIM. See the module docstring for "covered".
        """
        if note.token is None:
            return Verdict.CLAIM
        verdict = Verdict.CLAIM
        for row in range(self._rows):
            if row == self._row:
                continue
            seen = self._read(row)
            if seen is None:
                continue
            state, token, started = seen
            if state is State.NONE:
                continue
            covered = started > note.received_ns
            if not covered and token:
                position = log.position_of(token)
                covered = position is not None and position >= note.position
            if not covered:
                continue
            if state is State.SHORT:
                return Verdict.SKIP
            if state is State.RUNNING and now_ns - started < RUNNING_TRUST_NS:
                verdict = Verdict.WAIT
        return verdict


def monotonic_ns() -> int:
    """``time.monotonic_ns()``: one clock for every process of the host (CLOCK_MONOTONIC on Linux)."""
    return time.monotonic_ns()
