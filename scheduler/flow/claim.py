"""The claim under flow limits: unlimited jobs as usual, limited ones only while their limits have room.

How a limit holds across any number of workers and hosts: every claim of a job that a limit
governs happens inside a transaction holding that limit's advisory transaction lock
(``pg_advisory_xact_lock``, taken in key order). Under the lock, a *later statement* counts
the RUNNING jobs and the rate window's admissions: in READ COMMITTED each statement takes a new snapshot, so
it sees every claim committed by the lock's previous holder (a count inside the locking
statement would not). Only a claim makes a job RUNNING, so the count can only be too high
between our statements (a job finishing), never too low. A rescued or finished job frees its
unit by leaving RUNNING; no counter has to be kept in step.

Rate limits are a sliding window: ``stint_flow_admission`` logs each claim a rate limit
admitted; at most ``rate_limit`` rows are younger than ``rate_period_seconds``. So that the
window's count is not claimed in one burst (and then, a period later, in the next), claims are
also paced: GCRA (the generic cell rate algorithm) spaces them ``period / rate_limit`` apart,
with a catch-up of ``burst()`` claims after a late poll; its state is one timestamp per limit
(``stint_flow_pace``). A job held back waits QUEUED: no attempt, no retry budget spent.

Ordering: the unlimited jobs are claimed first (their statement only gains a filter that
leaves limited jobs out), then the limited ones with the slots left. So that a saturated
unlimited backlog cannot starve limited jobs, the limited phase goes first when it last
left admissible jobs behind, and at least every ``LIMITED_FIRST_EVERY`` seconds; going first, it
takes only the slots its admitted jobs earn in claim order against the unlimited jobs waiting
(``lifecycle.claim_keys_ahead``), so an admissible limited backlog cannot starve unlimited jobs
of a higher priority either.

Held jobs: a limited phase that leaves an unheld governed job waiting marks ``flow_held`` the jobs
of that limit among the first ``MARK_WINDOW`` unheld ones in claim order (in a transaction of its
own after the claim). The claim index keys on the flag first, so the unlimited phase (and every
claim while no limit applies) reads only unheld jobs and no longer walks past a held-back backlog
that comes first in claim order; the limited phase reads the held and the unheld part, merged in
claim order (the held part limit by limit, through the held jobs' indexes by type and by queue, so
that one full limit's held backlog hides nothing of another's). The flag is a shortcut, never a rule:
the unlimited phase still leaves out every governed job, held or not, so a stale flag can delay a
job but never let a limit be exceeded. A claim or any transition clears it; ``release_held``
clears it on QUEUED jobs no limit governs any more (each worker process every
``RELEASE_EVERY`` seconds, and at once when its limits change), so a deleted limit strands nothing.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connection, transaction

from scheduler import lifecycle
from scheduler.conf import conf
from scheduler.flow.limits import Limit, effective_limits
from scheduler.lifecycle import Claimed

logger = logging.getLogger(__name__)

LIMITED_FIRST_EVERY = 1.0  # seconds: the limited phase runs before the unlimited one at least this often
# Seconds a worker trusts "no limited job waits" before looking again after an unfilled claim: a limited
# job enqueued meanwhile waits at most this long more (or until LIMITED_FIRST_EVERY comes round).
EMPTY_MEMO_SECONDS = 0.1
SCAN_FACTOR = 8  # candidates read per free slot (partition limits may skip many)
SCAN_MIN = 100  # candidates read at least
CATCH_UP_SECONDS = 2.0  # a rate limit's pacing lets this many seconds' worth of claims through at once
MARK_WINDOW = 5000  # unheld jobs (front of the claim order) a limited phase that left some waiting marks in
# Seconds between a worker process's releases of held jobs no limit governs, besides the release
# at once when its limits change: with 100,000 jobs held and all governed, a release read them all
# in about 60 ms (a loaded 2-core machine), so every 30 s costs a worker process 0.2% of a core.
RELEASE_EVERY = 30.0
RELEASE_BATCH = 5000  # held jobs one release statement clears at most


def burst(limit: Limit) -> int:
    """Claims a rate limit admits at once after a pause: ``CATCH_UP_SECONDS`` worth, at least 2."""
    return max(2, math.ceil(CATCH_UP_SECONDS * limit.rate_limit / limit.rate_period_seconds))


def pace_start(limit: Limit, tat_in: float | None) -> float:
    """The arrival time pacing under ``limit`` starts from, in seconds from now (>= 0).

    ``tat_in``: seconds from now (database clock) to the stored theoretical arrival time, None
    when there is none yet. Claims under this limit push it at most ``burst(limit)`` emission
    intervals ahead; one further ahead was set under an earlier, slower limit of the same key
    (1 per day, then 10 per second), and would hold the new limit's jobs back for the rest of
    the old one's interval: it counts as the tolerance, so one claim starts now and the next
    follow at the new pace. Pure.
    """
    interval = limit.rate_period_seconds / limit.rate_limit
    start = max(tat_in if tat_in is not None else 0.0, 0.0)
    if start > burst(limit) * interval + 1e-9:
        return (burst(limit) - 1) * interval
    return start


def paced_allowance(limit: Limit, tat_in: float | None) -> tuple[int, float]:
    """GCRA: how many claims may start now, and the arrival time they start from.

    ``tat_in``: seconds from now (database clock) to the limit's theoretical arrival time, None
    when it has none yet. Returns (allowance, start) where ``start`` (seconds from now,
    ``pace_start``) plus one emission interval per claim is the new arrival time. Pure; source:
    GCRA as in ITU-T I.371.
    """
    interval = limit.rate_period_seconds / limit.rate_limit
    start = pace_start(limit, tat_in)
    tolerance = (burst(limit) - 1) * interval
    if start > tolerance + 1e-9:
        return 0, start
    return int((tolerance - start) / interval + 1e-9) + 1, start


@dataclass(slots=True)
class _PhaseState:
    """Per process: whether the limited phase should go first next time, and when it found nothing."""

    pending: bool = False
    last_first: float = 0.0
    empty_until: float = 0.0  # monotonic: no limited job was waiting at the last look
    released_at: float | None = None  # monotonic: the last release_held (None: not yet in this process)
    released_keys: frozenset[str] = frozenset()  # the limit keys in effect at that release
    # The last claim_jobs refused a candidate for a full concurrency limit only (no rate limit held it
    # back too): a unit that a finished job frees may admit it, so the worker claims again then.
    held_for_units: bool = False


_state = _PhaseState()


def reset_state() -> None:
    """Forget this process's phase state (tests that claim many times within a second)."""
    global _state
    _state = _PhaseState()


def _names_by_scope(limits: Iterable[Limit]) -> tuple[list[str], list[str]]:
    """The distinct names of ``limits``' type limits and of their queue limits, each sorted. Pure."""
    limits = list(limits)
    return (
        sorted({lim.name for lim in limits if lim.scope == "type"}),
        sorted({lim.name for lim in limits if lim.scope == "queue"}),
    )


def held_for_units() -> bool:
    """Whether this process's last ``claim_jobs`` left a job waiting that only a full concurrency limit refused.

    A concurrency (or partition concurrency) limit that had no room held back a candidate that no
    rate limit refused too: a job of that limit leaving RUNNING frees a unit that may admit it.
    Jobs held back for want of slots, by a rate limit, or not looked at, do not count.
    """
    return _state.held_for_units


def limits_apply() -> bool:
    """True when any flow limit is in effect (handlers, settings or database; cached about a second)."""
    return bool(effective_limits())


def release_due() -> None:
    """Run ``release_held`` when this process last did ``RELEASE_EVERY`` seconds ago or its limits changed.

    Called by every non-isolated claim (``leasing.claim_jobs``) before it claims. With nothing held
    a release is one probe of the claim index's empty held part. Raises what the database raises.
    """
    keys = frozenset(effective_limits())
    now = time.monotonic()
    if _state.released_at is not None and now - _state.released_at < RELEASE_EVERY and keys == _state.released_keys:
        return
    _state.released_at, _state.released_keys = now, keys
    release_held()


def release_held(*, batch: int = RELEASE_BATCH) -> int:
    """Clear ``flow_held`` on QUEUED jobs that no flow limit in effect here governs; return how many.

    ``batch``: jobs cleared per statement (each its own transaction, rows another session holds
    locked are skipped and left for the next release). Statements repeat until one clears fewer
    than ``batch``. A job some limit still governs keeps its flag. "In effect here" is this
    process's view (``effective_limits``): a process whose settings or handlers declare fewer
    limits than another's releases what the other holds, and the other marks it again; the flag
    only decides which part of the claim index a job sits in, never whether a limit admits it.
    Raises what the database raises.
    """
    types, queues = _names_by_scope(effective_limits().values())
    params = {"types": types, "queues": queues, "batch": batch}
    released = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE stint_job j SET flow_held = false
                FROM (
                    SELECT id FROM stint_job
                    WHERE status = 'QUEUED' AND flow_held
                      AND NOT (type = ANY(%(types)s::text[]) OR queue = ANY(%(queues)s::text[]))
                    LIMIT %(batch)s
                    FOR UPDATE SKIP LOCKED
                ) free
                WHERE j.id = free.id
                """,
                params,
            )
            n = cursor.rowcount
        released += n
        if n < batch:
            return released


def _mark_held(refusing: Sequence[Limit]) -> int:
    """Mark held the jobs ``refusing`` govern in the first ``MARK_WINDOW`` unheld QUEUED ones; return how many.

    The window is the front of the claim index's unheld part (non-isolated jobs in claim order):
    the part an unlimited claim walks, so the governed jobs there are the ones that slow it. Its
    own transaction, after the claim's; rows another session holds locked are skipped. A database
    error is logged and returns 0, never raised: the jobs just claimed must still run, and a later
    phase marks these.
    """
    if not refusing:
        return 0
    types, queues = _names_by_scope(refusing)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"""
            WITH front AS (
                SELECT id, type, queue FROM stint_job
                WHERE status = 'QUEUED' AND NOT isolated AND NOT flow_held
                ORDER BY {lifecycle.CLAIM_ORDER}
                LIMIT %(window)s
            ), governed AS (
                SELECT s.id FROM front f JOIN stint_job s ON s.id = f.id
                WHERE (f.type = ANY(%(types)s::text[]) OR f.queue = ANY(%(queues)s::text[]))
                  AND s.status = 'QUEUED' AND NOT s.flow_held
                FOR UPDATE OF s SKIP LOCKED
            )
            UPDATE stint_job j SET flow_held = true FROM governed WHERE j.id = governed.id
            """,  # noqa: S608 - a constant
                {"types": types, "queues": queues, "window": MARK_WINDOW},
            )
            return cursor.rowcount
    except DatabaseError:
        logger.warning("flow limits: marking held-back jobs failed; a later claim retries", exc_info=True)
        return 0


def claim_jobs(
    *, worker_id: str, limit: int, queues: Sequence[str] | None, paused: Sequence[str] = (), isolated: bool = False
) -> list[Claimed]:
    """Claim up to ``limit`` jobs as ``leasing.claim_jobs`` does, honouring every effective flow limit.

    Returns the claimed jobs (unlimited ones first unless the limited phase went first). Each
    phase is its own short transaction. Raises what the database raises.
    """
    limits = effective_limits()
    types, queue_names = _names_by_scope(limits.values())
    unlimited_filter = (
        "AND NOT (type = ANY(%(flow_types)s::text[]) OR queue = ANY(%(flow_queues)s::text[]))",
        {"flow_types": types, "flow_queues": queue_names},
    )
    relevant = [lim for lim in limits.values() if lim.scope == "type" or not queues or lim.name in queues]
    now = time.monotonic()
    _state.held_for_units = False
    first = bool(relevant) and (_state.pending or now - _state.last_first >= LIMITED_FIRST_EVERY)
    claimed: list[Claimed] = []
    if first:
        _state.last_first = now
        # Going first, the limited phase takes only the slots its jobs earn in claim order against
        # the unlimited jobs waiting (read without locks), so neither phase jumps the other's queue.
        ahead = lifecycle.claim_keys_ahead(
            limit=limit, queues=queues, paused=paused, isolated=isolated, flow=unlimited_filter
        )
        admitted, refusing = _claim_limited(
            worker_id=worker_id,
            slots=limit,
            limits=limits,
            relevant=relevant,
            queues=queues,
            paused=paused,
            isolated=isolated,
            ahead=ahead,
        )
        claimed += admitted
        _mark_held(refusing)
    if limit - len(claimed) > 0:
        with transaction.atomic():
            claimed += lifecycle.claim(
                worker_id=worker_id,
                limit=limit - len(claimed),
                lease_seconds=conf().lease_seconds,
                queues=queues,
                paused=paused,
                isolated=isolated,
                flow=unlimited_filter,
            )
    if not first and relevant and limit - len(claimed) > 0 and time.monotonic() >= _state.empty_until:
        admitted, refusing = _claim_limited(
            worker_id=worker_id,
            slots=limit - len(claimed),
            limits=limits,
            relevant=relevant,
            queues=queues,
            paused=paused,
            isolated=isolated,
        )
        claimed += admitted
        _mark_held(refusing)
    return claimed


@dataclass(slots=True)
class _Room:
    """What one locked limit still admits in this claim."""

    limit: Limit
    running: int = 0
    by_partition: dict[str | None, int] = field(default_factory=dict)
    admitted: int = 0  # in the current rate window
    paced: int = 0  # claims the pacing still allows now
    pace_start: float = 0.0  # seconds from now of the pacing's arrival time before this claim
    taken: int = 0

    def admits(self, partition: str | None) -> bool:
        lim = self.limit
        if lim.concurrency is not None and self.running >= lim.concurrency:
            return False
        if lim.partition_key and self.by_partition.get(partition, 0) >= (lim.partition_concurrency or 1):
            return False
        return not self.rate_refuses()

    def rate_refuses(self) -> bool:
        """Whether this limit's rate window or pacing has no room left for one more claim now."""
        lim = self.limit
        return lim.rate_limit is not None and (self.admitted >= lim.rate_limit or self.taken >= self.paced)

    def take(self, partition: str | None) -> None:
        self.running += 1
        self.admitted += 1
        self.taken += 1
        if self.limit.partition_key:
            self.by_partition[partition] = self.by_partition.get(partition, 0) + 1


def _candidates_sql(*, isolated: bool, partitions: int, filters: str, held_types: int, held_queues: int) -> str:
    """The limited phase's read of its candidates: governed QUEUED jobs in claim order.

    Rows: id, type, queue, flow_held, priority, scheduled_at, created_at, then the value of each
    of ``partitions`` partition keys (``%(pk0)s``...). Isolated jobs are never held and have their
    own small index: one read of ``%(scan)s`` rows (``held_types`` and ``held_queues`` unused).
    Otherwise the claim index's unheld part is read in claim order, up to ``%(scan)s`` rows, and
    so is the held part of each limit on its own
    (``held_types`` type names ``%(ht0)s``..., ``held_queues`` queue names ``%(hq0)s``..., through
    the held jobs' indexes by type and by queue): one full limit's held backlog cannot hide the
    held jobs of another limit with room behind it. The parts are merged in claim order; a job
    that two reads return (its type's limit and its queue's) comes twice (``_claim_limited`` keeps
    its first row: UNION would drop it here but scramble ties in claim order).
    """
    governed = "(j.type = ANY(%(types)s::text[]) OR j.queue = ANY(%(queues)s::text[]))"
    partition_columns = "".join(f", j.payload ->> %(pk{i})s AS p{i}" for i in range(partitions))
    columns = f"j.id, j.type, j.queue, j.flow_held, j.priority, j.scheduled_at, j.created_at {partition_columns}"
    if isolated:
        return f"""
            SELECT {columns} FROM stint_job j
            WHERE j.status = 'QUEUED' AND j.isolated AND {governed} {filters}
            ORDER BY {lifecycle.CLAIM_ORDER}
            LIMIT %(scan)s
        """  # noqa: S608 - only constant filters and placeholders are interpolated

    def part(which: str) -> str:
        return f"""(
            SELECT {columns} FROM stint_job j
            WHERE j.status = 'QUEUED' AND NOT j.isolated AND {which} {filters}
            ORDER BY {lifecycle.CLAIM_ORDER}
            LIMIT %(scan)s
        )"""  # noqa: S608 - only constant filters and placeholders are interpolated

    parts = [
        part(f"j.flow_held = false AND {governed}"),
        *(part(f"j.flow_held AND j.type = %(ht{i})s") for i in range(held_types)),
        *(part(f"j.flow_held AND j.queue = %(hq{i})s") for i in range(held_queues)),
    ]
    partition_values = "".join(f", c.p{i}" for i in range(partitions))
    return f"""
        SELECT c.id, c.type, c.queue, c.flow_held, c.priority, c.scheduled_at, c.created_at {partition_values}
        FROM ({" UNION ALL ".join(parts)}) c
        ORDER BY {lifecycle.CLAIM_ORDER}
    """  # noqa: S608 - only constant SQL is interpolated


def _claim_limited(
    *,
    worker_id: str,
    slots: int,
    limits: dict[str, Limit],
    relevant: list[Limit],
    queues: Sequence[str] | None,
    paused: Sequence[str],
    isolated: bool,
    ahead: Sequence[tuple[int, Any, Any]] | None = None,
) -> tuple[list[Claimed], list[Limit]]:
    """Claim up to ``slots`` flow-limited jobs in one transaction under their limits' locks.

    Returns the claimed jobs and the limits whose jobs the caller marks held (``_mark_held``,
    after this transaction): those that held back a candidate while unheld jobs of theirs were
    left waiting. ``ahead``: the claim keys (priority, scheduled_at, created_at) of the unlimited
    jobs the unlimited phase would take next (``lifecycle.claim_keys_ahead``), or None when it has
    run already; the admitted jobs are then cut to those among the first ``slots`` of both in
    claim order.
    """
    refusing: list[Limit] = []
    partition_keys = sorted({lim.partition_key for lim in relevant if lim.partition_key})
    part_cols = "".join(f", j.payload ->> %(pk{i})s" for i in range(len(partition_keys)))
    part_params = {f"pk{i}": k for i, k in enumerate(partition_keys)}
    with transaction.atomic(), connection.cursor() as cursor:
        # The candidates first, without any lock: when no limited job waits (a limit on a type with
        # nothing queued) the claim costs this one read. Read before the lock they may be stale; the
        # claim below re-checks each under FOR UPDATE SKIP LOCKED, and the counts are read after it.
        queue_filter = "AND j.queue = ANY(%(wq)s::text[])" if queues else ""
        paused_filter = "AND NOT (j.queue = ANY(%(paused)s::text[]))" if paused else ""
        # Read in the statement, as the claim below does (lifecycle.NOT_PAUSED): a job of a queue
        # paused since the worker's last poll takes no slot of this round.
        paused_filter += f" AND {lifecycle.NOT_PAUSED.format(column='j.queue')}"
        scan = max(SCAN_MIN, SCAN_FACTOR * slots)
        relevant_types, relevant_queues = _names_by_scope(relevant)
        cursor.execute(
            _candidates_sql(
                isolated=isolated,
                partitions=len(partition_keys),
                filters=f"{queue_filter} {paused_filter}",
                held_types=len(relevant_types),
                held_queues=len(relevant_queues),
            ),
            {
                "types": relevant_types,
                "queues": relevant_queues,
                "wq": list(queues or []),
                "paused": list(paused),
                "scan": scan,
                **{f"ht{i}": name for i, name in enumerate(relevant_types)},
                **{f"hq{i}": name for i, name in enumerate(relevant_queues)},
                **part_params,
            },
        )
        # Every row of every part is a candidate (up to ``scan`` each), in claim order: cut to the
        # first ``scan``, a held backlog of one full limit would hide the unheld jobs of another
        # limit with room behind it.
        first_rows: dict[uuid.UUID, tuple] = {}
        for row in cursor.fetchall():  # a job its type's and its queue's held reads both returned: once
            first_rows.setdefault(row[0], row)
        candidates = list(first_rows.values())
        if not candidates:
            _state.pending = False
            _state.empty_until = time.monotonic() + EMPTY_MEMO_SECONDS
            return [], []
        # Every claimer takes the locks in the same (sorted) order and holds no row lock yet, and a
        # holder never waits on anything while holding them (its claim is SKIP LOCKED): no deadlock,
        # and the wait is one short claim transaction. (A try-lock left the loser idle until its next
        # poll: measured 40% less throughput on a limited type.) Only the limits over the candidates.
        keys = sorted({k for row in candidates for k in (f"type:{row[1]}", f"queue:{row[2]}") if k in limits})
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(hashtextextended('stint.flow:' || k, 0)))"
            " FROM (SELECT k FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n) AS ordered",
            [keys],
        )
        locked = set(keys)
        rooms = {key: _Room(limits[key]) for key in locked}
        locked_types, locked_queues = _names_by_scope(r.limit for r in rooms.values())
        # A new statement, so a new snapshot: it sees every claim the lock's previous holder committed.
        cursor.execute(
            f"""
            SELECT j.type, j.queue {part_cols}, count(*) FROM stint_job j
            WHERE j.status = 'RUNNING' AND (j.type = ANY(%(types)s::text[]) OR j.queue = ANY(%(queues)s::text[]))
            GROUP BY 1, 2 {"".join(f", {i + 3}" for i in range(len(partition_keys)))}
            """,  # noqa: S608 - only placeholders are interpolated
            {"types": locked_types, "queues": locked_queues, **part_params},
        )
        for row in cursor.fetchall():
            job_type, job_queue, parts, n = row[0], row[1], row[2:-1], row[-1]
            for room in _rooms_for(rooms, job_type, job_queue):
                room.running += n
                if room.limit.partition_key:
                    value = parts[partition_keys.index(room.limit.partition_key)]
                    room.by_partition[value] = room.by_partition.get(value, 0) + n
        rated = [r.limit for r in rooms.values() if r.limit.rate_limit is not None]
        # The rate window's times are each statement's own (statement_timestamp()), not now(): now()
        # is this transaction's start, before its wait for the locks above, and admissions stamped
        # with it would leave the window early by that wait (more than the limit in a real window).
        if rated:
            cursor.execute(
                """
                DELETE FROM stint_flow_admission a USING unnest(%s::text[], %s::float8[]) AS v(k, p)
                WHERE a.key = v.k AND a.admitted_at <= statement_timestamp() - make_interval(secs => v.p)
                """,
                [[lim.key for lim in rated], [lim.rate_period_seconds for lim in rated]],
            )
            cursor.execute(
                "SELECT key, count(*) FROM stint_flow_admission WHERE key = ANY(%s::text[]) GROUP BY key",
                [[lim.key for lim in rated]],
            )
            for key, n in cursor.fetchall():
                rooms[key].admitted = n
            cursor.execute(
                "SELECT key, extract(epoch FROM tat - statement_timestamp())::float8 FROM stint_flow_pace"
                " WHERE key = ANY(%s::text[])",
                [[lim.key for lim in rated]],
            )
            tats = dict(cursor.fetchall())
            for lim in rated:
                rooms[lim.key].paced, rooms[lim.key].pace_start = paced_allowance(lim, tats.get(lim.key))
        chosen: list[uuid.UUID] = []
        left_behind = False
        refused_keys: set[str] = set()  # the limits that held back a candidate
        chosen_keys: list[tuple[int, Any, Any]] = []  # sort keys of ``chosen``: (-priority, scheduled_at, created_at)
        for row in candidates:
            job_id, job_type, job_queue, parts = row[0], row[1], row[2], row[7:]
            governing = [k for k in (f"type:{job_type}", f"queue:{job_queue}") if k in limits]
            if any(k not in locked for k in governing):
                continue  # another worker holds one of its limits this round
            job_rooms = [rooms[k] for k in governing]
            values = [
                parts[partition_keys.index(r.limit.partition_key)] if r.limit.partition_key else None for r in job_rooms
            ]
            refused = [r for r, v in zip(job_rooms, values, strict=True) if not r.admits(v)]
            if refused:
                refused_keys.update(r.limit.key for r in refused)
                if not any(r.rate_refuses() for r in job_rooms):
                    _state.held_for_units = True  # a unit freed may admit it (``held_for_units``)
                continue
            if len(chosen) >= slots:
                left_behind = True
                break
            for r, v in zip(job_rooms, values, strict=True):
                r.take(v)
            chosen.append(job_id)
            chosen_keys.append((-row[4], row[5], row[6]))
        if ahead is not None:
            earned = _earned_slots(chosen_keys, [(-p, s, c) for p, s, c in ahead], slots)
            left_behind = left_behind or earned < len(chosen)
            chosen = chosen[:earned]
        _state.pending = left_behind
        if refused_keys and not isolated:
            # Unheld jobs left waiting (refused or left for want of slots) under a limit that held
            # a candidate back: that limit's jobs get marked held.
            taken = set(chosen)
            left = [row for row in candidates if not row[3] and row[0] not in taken]
            marking = {k for row in left for k in (f"type:{row[1]}", f"queue:{row[2]}") if k in refused_keys}
            refusing = [limits[k] for k in sorted(marking)]
        if not chosen:
            return [], refusing
        claimed = lifecycle.claim(
            worker_id=worker_id,
            limit=len(chosen),
            lease_seconds=conf().lease_seconds,
            queues=None,
            paused=(),
            isolated=isolated,
            flow=("AND id = ANY(%(flow_ids)s::uuid[])", {"flow_ids": chosen}),
            include_held=True,
        )
        admitted = [
            key
            for job in claimed
            for key in (f"type:{job.type}", f"queue:{job.queue}")
            if key in rooms and rooms[key].limit.rate_limit is not None
        ]
        if admitted:
            cursor.execute(
                "INSERT INTO stint_flow_admission (key, admitted_at)"
                " SELECT k, statement_timestamp() FROM unnest(%s::text[]) AS k",
                [admitted],
            )
            counts = {k: admitted.count(k) for k in set(admitted)}
            keys = sorted(counts)
            tats = [
                rooms[k].pace_start + counts[k] * rooms[k].limit.rate_period_seconds / rooms[k].limit.rate_limit
                for k in keys
            ]
            cursor.execute(
                """
                INSERT INTO stint_flow_pace (key, tat)
                SELECT k, statement_timestamp() + make_interval(secs => t)
                FROM unnest(%s::text[], %s::float8[]) AS v(k, t)
                ON CONFLICT (key) DO UPDATE SET tat = EXCLUDED.tat
                """,
                [keys, tats],
            )
        return claimed, refusing


def _earned_slots(limited: Sequence[tuple], unlimited: Sequence[tuple], slots: int) -> int:
    """How many of ``limited`` are among the first ``slots`` jobs of both lists merged in claim order.

    Each list holds ascending sort keys (-priority, scheduled_at, created_at); a tie goes to the
    limited job. Pure.
    """
    taken = unlimited_taken = 0
    while taken + unlimited_taken < slots and taken < len(limited):
        if unlimited_taken < len(unlimited) and unlimited[unlimited_taken] < limited[taken]:
            unlimited_taken += 1
        else:
            taken += 1
    return taken


def _rooms_for(rooms: dict[str, _Room], job_type: str, job_queue: str) -> list[_Room]:
    return [rooms[k] for k in (f"type:{job_type}", f"queue:{job_queue}") if k in rooms]
