"""One claim per NOTIFY among a supervisor's worker processes: the claim board and the NOTIFY log.

Every worker process LISTENs, so one NOTIFY wakes all of a supervisor's processes, and each used
to claim: with two processes, every job enqueued at a low rate cost a claim that found it and a
claim that found nothing, run at the same instant on the same cores (the empty one delaying the
other). The processes of one ``run_workers`` now publish their claims on a ``ClaimBoard`` (shared
memory made by the supervisor), and a process woken only by a NOTIFY skips its claim when a
sibling's finished claim is known to have seen the notified jobs and to have taken every job it
could (it asked for more than it got, with the same paused queues as ours).

A claim *covers* a NOTIFY when the claim's statement began after the notifying transaction
committed: PostgreSQL delivers a NOTIFY only once its transaction is no longer in progress, so a
claim that a process started after it had received the NOTIFY, or after any sibling had, sees
those jobs. Two rules prove it without comparing clocks of events the processes cannot see:

- time: the sibling's claim started after this process received the NOTIFY;
- order: the sibling published the token of the last NOTIFY it had received before its claim
  (``covered_token``), and this process first received that token at or after this NOTIFY.
  Every listener receives the notifications in one order (PostgreSQL's notification queue, into
  which notifying transactions commit one at a time), so "at or after" read in this process's
  own log holds in the sibling's too. Only a token's first arrival counts, so a NOTIFY sent by
  hand with an old token proves nothing; and the sibling's claim must have started no earlier
  than ``TOKEN_SKEW_NS`` before this process first saw the token (a token this process forgot and
  saw again much later is not the one the sibling meant).

Tokens are the notifying transactions' ids, sent first in the payload (``#<xid>,queue,...``;
``scheduler.notify``). A NOTIFY without a token, or anything the board cannot prove (a sibling
that is not publishing, a claim running for more than ``RUNNING_TRUST_NS``, a sibling whose
paused queues differ from ours), means: claim, as before. So a wrong answer costs a duplicate
claim, never a job left waiting: a skip needs a finished sibling claim that covered the NOTIFY,
excluded the same paused queues and came back short.

No lock: a process first publishes its claim as running (its intent), then reads its siblings'
rows; of two processes woken by one NOTIFY, the one whose intent is later (start time, then row)
withdraws when the other's running claim covers its NOTIFY, and waits for that claim's end. Both
may miss each other's intent (then both claim, as before). Each row has one writer (its process)
and a sequence counter (odd while being written; a reader retries a torn read), so a row that a
killed process left half written proves nothing instead of misleading.
"""

from __future__ import annotations

import collections
import ctypes
import enum
import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Per process: write sequence, state, covered token, claim start (monotonic ns), paused key.
FIELDS = 5
_SEQ, _STATE, _TOKEN, _STARTED, _PAUSED = range(FIELDS)
LOG_SIZE = 4096  # NOTIFY tokens a process remembers (about 8 s of NOTIFYs at 500 jobs/s)
RUNNING_TRUST_NS = 50_000_000  # a sibling claim running longer than 50 ms is not waited for
TOKEN_SKEW_NS = 1_000_000_000  # how much earlier than us a sibling may plausibly see a NOTIFY
READ_TRIES = 4  # torn reads retried before a row counts as unknown
# Bound at import, like the worker's own (``runner._monotonic_ns``): the notes it compares with come from it.
_monotonic_ns = time.monotonic_ns


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


def paused_key(paused: Iterable[str]) -> int:
    """A 63-bit fingerprint of a set of paused queue names (0: none), the same in every process.

    Two claims that excluded different paused queues did not look for the same jobs.
    """
    names = sorted(set(paused))
    if not names:
        return 0
    digest = hashlib.blake2b("\n".join(names).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1 or 1


def parse_payload(payload: str) -> tuple[int | None, list[str]]:
    """Split a ``stint_jobs`` payload into (token, queue names).

    ``"#7042,a,b"`` -> (7042, ["a", "b"]); ``"a,b"`` (a sender without a token) -> (None, ["a", "b"]);
    a malformed token (``"#x,a"``, or past a signed 64-bit integer, which the board's shared
    memory holds) -> (None, ["a"]). Queue names never start with ``#``
    (``jobspec.QUEUE_NAME``), so an older worker reading a tokened payload still finds its queues.
    """
    names = payload.split(",") if payload else []
    if names and names[0].startswith("#"):
        head = names.pop(0)[1:]
        if head.isascii() and head.isdigit() and len(head) <= 19 and int(head) < 2**63:
            return int(head), names
    return None, names


class NoteLog:
    """The NOTIFYs a process received, in arrival order: its claim loop appends (as it reads them) and reads.

    ``latest`` is the newest ``Note``; ``first(token)`` the (position, monotonic ns) of the token's
    first arrival, or None once it fell out of the last ``LOG_SIZE`` tokens (or never came).
    One thread appends and reads (the claim loop), so there is no lock. A NOTIFY's time is when
    the claim loop read it, no earlier than its arrival: the board's time rule stays safe.
    """

    def __init__(self, size: int = LOG_SIZE) -> None:
        self._size = size
        self._first: dict[int, tuple[int, int]] = {}
        self._order: collections.deque[int] = collections.deque()
        self._count = 0
        self.latest = Note(None, 0, 0)

    def append(self, token: int | None, received_ns: int) -> None:
        """Record one NOTIFY (``token`` None: a NOTIFY without token, or a reconnect that may have missed some)."""
        self._count += 1
        if token is not None and token not in self._first:
            self._first[token] = (self._count, received_ns)
            self._order.append(token)
            while len(self._order) > self._size:
                self._first.pop(self._order.popleft(), None)
        self.latest = Note(token, self._count, received_ns)

    def first(self, token: int) -> tuple[int, int] | None:
        """(position, received ns) of ``token``'s first NOTIFY here, or None."""
        return self._first.get(token)


class ClaimBoard:
    """Shared memory with one row per worker process of a supervisor (``rows``), made before they start.

    Its ``array`` is passed to each ``multiprocessing`` process the supervisor starts (shared
    memory); ``view(row)`` makes that process's ``BoardView``.
    """

    def __init__(self, rows: int, ctx: Any) -> None:
        """``ctx``: the supervisor's ``multiprocessing`` context."""
        self.rows = rows
        self.array = ctx.RawArray(ctypes.c_int64, rows * FIELDS)

    def view(self, row: int) -> BoardView:
        """The view of the process in ``row`` (0 .. rows - 1), its own row reset to ``State.NONE``."""
        return BoardView(self.array, row, self.rows)


class BoardView:
    """One process's access to a ``ClaimBoard``: publish its own claims, judge its NOTIFYs."""

    def __init__(self, array: Sequence[int] | Any, row: int, rows: int) -> None:
        """``array``: a ``ClaimBoard``'s; ``row``: this process's (ValueError outside 0 .. rows - 1)."""
        if not 0 <= row < rows:
            raise ValueError(f"row {row} is not on a board of {rows}")
        self._array = array
        self._row = row
        self._rows = rows
        self._base = row * FIELDS
        self._mine = (State.NONE, 0, 0, 0)  # what this row says, to restore after a withdrawn intent
        self._write(State.NONE, 0, 0, 0)

    def _write(self, state: State, token: int, started_ns: int, paused: int) -> None:
        # Only this process's claim loop writes its row. Odd while writing, whatever a writer
        # killed in the middle left behind (a restarted process starts with this write).
        a, base = self._array, self._base
        seq = a[base + _SEQ] | 1
        a[base + _SEQ] = seq
        a[base + _STATE] = int(state)
        a[base + _TOKEN] = token
        a[base + _STARTED] = started_ns
        a[base + _PAUSED] = paused
        a[base + _SEQ] = seq + 1

    def begin_claim(self, note: Note, log: NoteLog, *, paused: int, notified_only: bool) -> Verdict:
        """Publish a claim as running, then decide whether to make it: CLAIM, or SKIP / WAIT (withdrawn).

        ``note``/``log``: this process's latest NOTIFY and its log (read before the claim's
        statement is sent); ``paused``: ``paused_key`` of the queues the claim leaves out;
        ``notified_only``: nothing but that NOTIFY asks for the claim (no poll, no backlog), so a
        sibling's claim may serve it: SKIP when one that finished did, WAIT while one that will
        is running and began before ours (see ``verdict``). After CLAIM the caller makes the
        claim and calls ``claim_finished``.
        """
        started = _monotonic_ns()
        previous = self._mine
        self._mine = (State.RUNNING, note.token or 0, started, paused)
        self._write(*self._mine)
        if not notified_only:
            return Verdict.CLAIM
        verdict = self.verdict(note, log, paused=paused, now_ns=started, mine=started)
        if verdict is not Verdict.CLAIM:
            self._mine = previous
            self._write(*previous)
        return verdict

    def claim_finished(self, *, short: bool) -> None:
        """Publish the claim's end: ``short`` (it got fewer jobs than it asked for) or not (full, or it failed)."""
        _, token, started, paused = self._mine
        self._mine = (State.SHORT if short else State.FULL, token, started, paused)
        self._write(*self._mine)

    def _read(self, row: int) -> tuple[State, int, int, int] | None:
        a, base = self._array, row * FIELDS
        for _ in range(READ_TRIES):
            seq = a[base + _SEQ]
            state, token, started, paused = a[base + _STATE], a[base + _TOKEN], a[base + _STARTED], a[base + _PAUSED]
            if seq % 2 == 0 and a[base + _SEQ] == seq:
                try:
                    return State(state), token, started, paused
                except ValueError:  # not a row we wrote
                    return None
        return None

    def verdict(self, note: Note, log: NoteLog, *, paused: int, now_ns: int, mine: int | None = None) -> Verdict:
        """What to do about ``note`` (this process's latest NOTIFY, read from ``log``) at ``now_ns``.

        SKIP when a sibling's finished claim covered it, excluded the same paused queues
        (``paused``) and came back short; WAIT when such a claim is still running (for less than
        ``RUNNING_TRUST_NS``) and, if this process has published an intent that started at
        ``mine``, began before it (start time, then row); else CLAIM. "Covered": the module
        docstring.
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
            state, token, started, their_paused = seen
            if state is State.NONE or their_paused != paused or not self._covers(started, token, note, log):
                continue
            if state is State.SHORT:
                return Verdict.SKIP
            if state is State.RUNNING and now_ns - started < RUNNING_TRUST_NS:
                if mine is None or (started, row) < (mine, self._row):
                    verdict = Verdict.WAIT
        return verdict

    @staticmethod
    def _covers(started: int, token: int, note: Note, log: NoteLog) -> bool:
        """Whether a claim that started at ``started`` having seen ``token`` last saw ``note``'s jobs."""
        if started > note.received_ns:
            return True
        first = log.first(token) if token else None
        return first is not None and first[0] >= note.position and started >= first[1] - TOKEN_SKEW_NS
