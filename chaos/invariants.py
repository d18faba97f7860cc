"""Pure invariant checks over a snapshot of one scenario's rows (taken by ``chaos.snapshot``).

Each ``check_*`` function takes the ``Snapshot`` and returns a list of violations (short
strings naming the job, event or schedule). ``verdict`` runs them all and sums the figures the
table prints. The invariants are those of the chaos issue:

- I1 every job whose creation returned 2xx exists and is finished (or legitimately pending);
- I2 no handler side effect applied twice, except on an attempt lost to a fault;
- I3 attempts never exceed 1 + max_retries; DEAD only after the last attempt; a job no fault
  touched ends as its payload says;
- I4 no write from a stale lease or a stale leader was accepted;
- I5 every transition has exactly one outbox event entry (an outbox row holds the entries of one
  statement; the reconciler's copy of a lost event shares its event id), one Kafka message per
  event id after dedup and one audit row, and every job's sequence is gapless;
- I6 no (schedule, fire_time) twice and no fire missing that the misfire policy requires;
- I7 no RUNNING job past its lease once faults stop;
- I8 recovery time (fault healed to backlog drained) measured and within its bound.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

FINISHED = frozenset({"SUCCESS", "FAILED", "DEAD", "CANCELLED"})
FAULT_ATTEMPTS = frozenset({"LOST", "TIMED_OUT"})  # attempts that a fault (not the handler) ended
# The error of an attempt its supervisor rescued at once because its worker process died
# (scheduler.workers.pool.died_while_running); the lease rescuer's says "lease expired".
CRASH_ERROR_PREFIX = "worker process died ("
# The error of an attempt its supervisor handed back unrun at once: the dead process had claimed
# the job but no slot had begun it (scheduler.maintenance.rescuer.UNRUN_ERROR; no attempt spent).
UNRUN_ERROR = "its worker process died before a slot began it, so it was handed back unrun"
MAX_LISTED = 20  # violations listed per invariant (the count is always exact)
SLACK = dt.timedelta(seconds=1)  # how late a fire may be around a window edge


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRow:
    """A job as the database holds it after settling."""

    id: str
    status: str
    attempts: int
    attempts_base: int
    max_retries: int
    event_sequence: int
    payload: dict[str, Any]
    lease_expired: bool = False  # RUNNING with lease_expires_at < now() (database clock)
    due_later: bool = False  # SCHEDULED or RETRYING and not yet due: legitimately pending
    schedule_id: int | None = None
    fire_time: dt.datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRow:
    """One attempt of the view ``stint_attempt`` (``scheduler.models.Attempt``)."""

    job_id: str
    number: int
    status: str
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRow:
    """One outbox event entry, read through ``stint_outbox_event`` (``published``: its row was marked by the relay)."""

    job_id: str
    event_id: str
    sequence: int
    attempt: int
    from_status: str
    to_status: str
    published: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """An interval schedule the scenario created: its grid starts at ``first_fire``."""

    id: int
    interval_seconds: int
    policy: str
    first_fire: dt.datetime
    last_required: dt.datetime  # the latest grid time a living leader must have fired (disable time - slack)


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceRow:
    """A write the database accepted to ``stint_leader_fence`` (logged by a trigger), in lock order."""

    seq: int
    txid: int
    token: int


@dataclass(slots=True, kw_only=True)
class Snapshot:
    """Everything the checks read, restricted to one scenario's jobs (``kafka``: copies per event id)."""

    created: set[str]  # ids whose creation returned 2xx (API) or returned (enqueue)
    jobs: dict[str, JobRow]
    attempts: list[AttemptRow] = field(default_factory=list)
    results: dict[str, tuple[int, str]] = field(default_factory=dict)  # job id -> (attempt, status)
    effects: list[tuple[str, int, int]] = field(default_factory=list)  # (job id, attempt, executions)
    outbox: list[EventRow] = field(default_factory=list)
    audit: list[tuple[str, str, int]] = field(default_factory=list)  # (job id, event id, sequence)
    kafka: dict[str, int] = field(default_factory=dict)  # event id -> messages seen in the topic
    schedules: list[ScheduleRow] = field(default_factory=list)
    fence_log: list[FenceRow] = field(default_factory=list)
    cron_txids: dict[str, int] = field(default_factory=dict)  # cron job id -> inserting transaction
    # Spans in which leadership may have changed hands (fault start to the first term after it):
    # skip/none schedules may legitimately miss the fires inside them.
    outage_windows: list[tuple[dt.datetime, dt.datetime]] = field(default_factory=list)
    # Spans in which no scheduler ran at all: the misfire policy decides exactly what fires.
    dead_windows: list[tuple[dt.datetime, dt.datetime]] = field(default_factory=list)
    running_past_lease: list[str] = field(default_factory=list)  # any owner: RUNNING with an expired lease
    anomalies: list[str] = field(default_factory=list)  # answers the load found wrong (e.g. an idempotent replay)
    recovery_seconds: float | None = None
    recovery_bound: float = 60.0
    # Worker processes the harness killed (SIGKILL) in the scenario: each may cost the jobs it ran
    # one LOST attempt beyond what the crash policy allows a poison neighbour to cost.
    worker_kills: int = 0
    # Every LOST attempt must have been rescued at once by its supervisor (the crash error), none
    # by the lease rescuer after expiry: set for scenarios whose only faults are worker crashes.
    rescued_at_once: bool = False


def _listed(items: list[str]) -> list[str]:
    return items[:MAX_LISTED] + ([f"... and {len(items) - MAX_LISTED} more"] if len(items) > MAX_LISTED else [])


def _attempts_by_job(snap: Snapshot) -> dict[str, dict[int, str]]:
    by_job: dict[str, dict[int, str]] = defaultdict(dict)
    for a in snap.attempts:
        by_job[a.job_id][a.number] = a.status
    return by_job


def check_i1(snap: Snapshot) -> list[str]:
    """I1: every created job exists and is finished or legitimately pending; no wrong answer to the load."""
    out = list(snap.anomalies)
    for job_id in sorted(snap.created):
        job = snap.jobs.get(job_id)
        if job is None:
            out.append(f"{job_id}: created (2xx) but not in the database")
        elif job.status not in FINISHED and not job.due_later:
            out.append(f"{job_id}: stuck {job.status} after {job.attempts} attempts")
    return out


def check_i2(snap: Snapshot) -> list[str]:
    """I2: no side effect twice for one (job, attempt); at most one on a SUCCEEDED attempt per job;

    none on an attempt the database never recorded. Effects of FAILED attempts (the handler
    raised after its effect, by design) and of LOST or TIMED_OUT attempts (a fault) are allowed.
    """
    out = []
    attempts = _attempts_by_job(snap)
    succeeded_effects: Counter[str] = Counter()
    for job_id, attempt, executions in snap.effects:
        if executions > 1:
            out.append(f"{job_id} attempt {attempt}: side effect applied {executions} times")
        status = attempts.get(job_id, {}).get(attempt)
        if status is None:
            out.append(f"{job_id} attempt {attempt}: side effect of an attempt the database never recorded")
        elif status == "SUCCEEDED":
            succeeded_effects[job_id] += 1
    for job_id, n in succeeded_effects.items():
        if n > 1:
            out.append(f"{job_id}: side effects of {n} SUCCEEDED attempts")
    return out


def duplicate_count(snap: Snapshot) -> int:
    """Executions beyond the first for one (job, attempt), plus extra SUCCEEDED attempts with an effect."""
    attempts = _attempts_by_job(snap)
    extra = sum(e - 1 for _, _, e in snap.effects if e > 1)
    succeeded: Counter[str] = Counter(j for j, a, _ in snap.effects if attempts.get(j, {}).get(a) == "SUCCEEDED")
    return extra + sum(n - 1 for n in succeeded.values() if n > 1)


def replay_status(payload: dict[str, Any], max_retries: int, attempts: dict[int, str]) -> str:
    """The final status a CHAOS job must reach given which of its attempts a fault ended ("" when no fixed answer).

    ``attempts`` maps attempt number to status. The crash policy (README, Operations /
    crashes) counts an attempt LOST to a crash or an expired lease, or TIMED_OUT, against the
    budget of ``1 + max_retries`` like a failure; every other attempt ends as the payload
    plans (``expected_status``). So the job is SUCCESS when some attempt of the budget was
    neither lost nor planned to fail, DEAD otherwise. Poison payloads have no fixed answer.
    """
    if payload.get("mode", "ok") != "ok":
        return ""
    fails = set(payload.get("fail", ()))
    for number in range(1, 2 + max_retries):
        if attempts.get(number) in FAULT_ATTEMPTS or number in fails:
            continue
        return "SUCCESS"
    return "DEAD"


def check_i3(snap: Snapshot) -> list[str]:
    """I3: the attempt budget holds, DEAD comes only after the last attempt, every job ends as the crash policy says.

    - attempts used never exceed ``1 + max_retries``; a DEAD job used them all; one attempt row
      per attempt counted;
    - a finished job (not recovered by hand) ends as ``replay_status`` says: the payload's plan,
      with the attempts a fault ended counted against its budget (LOST attempts, whether its
      supervisor rescued them at once after a crash or the lease rescuer after expiry);
    - an innocent job (a payload that never kills its process) loses at most one attempt to the
      crash of a process it shared with a poison job: after it, it runs isolated, in a process
      of its own (README, Operations / crashes); each worker process the harness killed may
      cost it one more (``Snapshot.worker_kills``);
    - where only worker processes crashed (``Snapshot.rescued_at_once``), every LOST attempt
      was handed to rescue (or, unbegun, handed back) at once by its supervisor, none left to
      expire its lease.
    """
    out = []
    attempts = _attempts_by_job(snap)
    crashes: Counter[str] = Counter(
        a.job_id for a in snap.attempts if a.status == "LOST" and a.error.startswith(CRASH_ERROR_PREFIX)
    )
    if snap.rescued_at_once:
        for a in snap.attempts:
            if a.status == "LOST" and not (a.error.startswith(CRASH_ERROR_PREFIX) or a.error == UNRUN_ERROR):
                out.append(f"{a.job_id} attempt {a.number}: LOST ({a.error!r}), not rescued at once by its supervisor")
    for job in snap.jobs.values():
        used = job.attempts - job.attempts_base
        budget = 1 + job.max_retries
        if used > budget:
            out.append(f"{job.id}: {used} attempts used of a budget of {budget}")
        if job.status == "DEAD" and used != budget:
            out.append(f"{job.id}: DEAD after {used} of {budget} attempts")
        rows = attempts.get(job.id, {})
        if len(rows) != job.attempts:
            out.append(f"{job.id}: {job.attempts} attempts counted but {len(rows)} attempt rows")
        if job.status in FINISHED and job.attempts_base == 0:
            want = replay_status(job.payload, job.max_retries, rows)
            if want and job.status != want:
                lost = sorted(n for n, st in rows.items() if st in FAULT_ATTEMPTS)
                out.append(f"{job.id}: ended {job.status}, its payload and lost attempts {lost} say {want}")
        innocent = job.payload.get("mode", "ok") == "ok"
        if innocent and crashes[job.id] > 1 + snap.worker_kills:
            out.append(
                f"{job.id}: {crashes[job.id]} attempts lost to worker process crashes it did not cause"
                f" ({snap.worker_kills} worker processes killed by the harness)"
            )
    return out


def check_i4(snap: Snapshot) -> list[str]:
    """I4: no stale write accepted.

    Leases: at most one SUCCEEDED attempt per job and it is the last; a stored result belongs to
    the last attempt; along a job's events each starts where the previous ended and attempts
    never go back. Leaders: the fence tokens the database accepted never decrease (in lock
    order), and every cron fire was inserted in a transaction that passed the fence.
    """
    out = []
    attempts = _attempts_by_job(snap)
    for job in snap.jobs.values():
        rows = attempts.get(job.id, {})
        won = sorted(n for n, s in rows.items() if s == "SUCCEEDED")
        if len(won) > 1:
            out.append(f"{job.id}: attempts {won} all SUCCEEDED")
        if won and won[-1] != job.attempts:
            out.append(f"{job.id}: attempt {won[-1]} SUCCEEDED but the job is at attempt {job.attempts}")
        if job.status == "SUCCESS" and not won:
            out.append(f"{job.id}: SUCCESS without a SUCCEEDED attempt")
        result = snap.results.get(job.id)
        if result is not None and result[0] != job.attempts:
            out.append(f"{job.id}: result of attempt {result[0]} stored, the job is at attempt {job.attempts}")
    events: dict[str, list[EventRow]] = defaultdict(list)
    seen: set[str] = set()
    for e in snap.outbox:
        if e.event_id not in seen:  # the reconciler's copy of a lost event is the same event
            seen.add(e.event_id)
            events[e.job_id].append(e)
    for job_id, rows in events.items():
        rows.sort(key=lambda e: e.sequence)
        for prev, cur in zip(rows, rows[1:], strict=False):
            if cur.from_status != prev.to_status:
                out.append(
                    f"{job_id}: event {cur.sequence} leaves {cur.from_status} but event {prev.sequence} "
                    f"entered {prev.to_status}"
                )
            if cur.attempt < prev.attempt:
                out.append(f"{job_id}: event {cur.sequence} is of attempt {cur.attempt} after attempt {prev.attempt}")
        job = snap.jobs.get(job_id)
        if job is not None and rows and rows[-1].to_status != job.status:
            out.append(f"{job_id}: last event enters {rows[-1].to_status} but the job is {job.status}")
    highest = 0
    for row in sorted(snap.fence_log, key=lambda r: r.seq):
        if row.token < highest:
            out.append(f"leader fence: token {row.token} accepted after token {highest} (txid {row.txid})")
        highest = max(highest, row.token)
    fenced_txids = {r.txid for r in snap.fence_log}
    for job_id, txid in sorted(snap.cron_txids.items()):
        if txid not in fenced_txids:
            out.append(f"{job_id}: cron fire inserted without a fence check in its transaction (txid {txid})")
    return out


def check_i5(snap: Snapshot) -> list[str]:
    """I5: one outbox event entry per transition with a gapless sequence, published, in Kafka, and audited once.

    Entries sharing an event id are one event (the reconciler's copy of a lost one): published if
    any copy is.
    """
    out = []
    events: dict[str, EventRow] = {}
    for e in snap.outbox:
        first = events.setdefault(e.event_id, e)
        if e.published and not first.published:
            events[e.event_id] = e
    by_job: dict[str, list[EventRow]] = defaultdict(list)
    for e in events.values():
        by_job[e.job_id].append(e)
    audit_by_event = Counter(event_id for _, event_id, _ in snap.audit)
    audit_by_job: dict[str, list[int]] = defaultdict(list)
    for job_id, _, seq in snap.audit:
        audit_by_job[job_id].append(seq)
    outbox_ids = set(events)
    for job in snap.jobs.values():
        seqs = sorted(e.sequence for e in by_job.get(job.id, []))
        if seqs != list(range(1, job.event_sequence + 1)):
            out.append(f"{job.id}: outbox sequences {_compress(seqs)}, expected 1..{job.event_sequence}")
        audit_seqs = sorted(audit_by_job.get(job.id, []))
        if audit_seqs != list(range(1, job.event_sequence + 1)):
            out.append(f"{job.id}: audit sequences {_compress(audit_seqs)}, expected 1..{job.event_sequence}")
    for e in events.values():
        if not e.published:
            out.append(f"{e.job_id}: event {e.sequence} ({e.event_id}) never published")
        if snap.kafka.get(e.event_id, 0) == 0 and audit_by_event[e.event_id] == 0:
            out.append(f"{e.job_id}: event {e.sequence} ({e.event_id}) published but in neither Kafka nor audit")
        if audit_by_event[e.event_id] > 1:
            out.append(f"{e.job_id}: event {e.event_id} stored {audit_by_event[e.event_id]} times")
    for job_id, event_id, seq in snap.audit:
        if event_id not in outbox_ids:
            out.append(f"{job_id}: audit event {seq} ({event_id}) has no outbox row")
    return out


def audit_gap_count(snap: Snapshot) -> int:
    """Jobs whose audit trail is not exactly sequences 1..event_sequence (a gap, a duplicate or missing)."""
    audit_by_job: dict[str, list[int]] = defaultdict(list)
    for job_id, _, seq in snap.audit:
        audit_by_job[job_id].append(seq)
    return sum(
        1
        for job in snap.jobs.values()
        if sorted(audit_by_job.get(job.id, [])) != list(range(1, job.event_sequence + 1))
    )


def _compress(seqs: list[int]) -> str:
    if len(seqs) <= 12:
        return str(seqs)
    return f"[{seqs[0]}..{seqs[-1]}] ({len(seqs)} values)"


def _inside(t: dt.datetime, windows: list[tuple[dt.datetime, dt.datetime]], slack: dt.timedelta) -> bool:
    return any(start - slack <= t <= end + slack for start, end in windows)


def grid(schedule: ScheduleRow) -> list[dt.datetime]:
    """The schedule's fire times from ``first_fire`` up to ``last_required``, inclusive."""
    step = dt.timedelta(seconds=schedule.interval_seconds)
    times, t = [], schedule.first_fire
    while t <= schedule.last_required:
        times.append(t)
        t += step
    return times


def check_i6(snap: Snapshot) -> list[str]:
    """I6: no fire twice, every fire on its grid, and the fires the misfire policy requires are there.

    ``catch_up`` must fire every grid time; ``skip`` and ``none`` every time outside the outage
    windows. Inside a dead window (no scheduler running) the policy decides exactly: ``catch_up``
    fires every time, ``skip`` exactly one (the latest missed), ``none`` none.
    """
    out = []
    fires: dict[int, list[dt.datetime]] = defaultdict(list)
    for job in snap.jobs.values():
        if job.schedule_id is not None and job.fire_time is not None:
            fires[job.schedule_id].append(job.fire_time)
    for schedule in snap.schedules:
        got = fires.get(schedule.id, [])
        counts = Counter(got)
        for t, n in sorted(counts.items()):
            if n > 1:
                out.append(f"schedule {schedule.id}: fire {t.isoformat()} {n} times")
        step = schedule.interval_seconds
        for t in sorted(counts):
            offset = (t - schedule.first_fire).total_seconds()
            if offset < 0 or abs(offset / step - round(offset / step)) > 1e-6:
                out.append(f"schedule {schedule.id}: fire {t.isoformat()} is off its {step} s grid")
        fired = set(counts)
        for t in grid(schedule):
            if t in fired:
                continue
            if schedule.policy == "catch_up" or not _inside(t, snap.outage_windows + snap.dead_windows, SLACK):
                out.append(f"schedule {schedule.id} ({schedule.policy}): fire {t.isoformat()} missing")
        for start, end in snap.dead_windows:
            # Grid times after the last scheduler stopped (with slack: it may have fired one on its way
            # out) and before the new leader's term began (``end``, the database's own record of
            # it, so no slack) were missed by every scheduler.
            missed = [t for t in grid(schedule) if start + SLACK < t < end]
            if not missed:
                continue
            fired_missed = [t for t in missed if t in fired]
            if schedule.policy == "skip" and len(fired_missed) != 1:
                out.append(
                    f"schedule {schedule.id} (skip): {len(fired_missed)} of {len(missed)} missed fires fired,"
                    " expected 1"
                )
            if schedule.policy == "skip" and fired_missed and fired_missed[-1] != missed[-1]:
                out.append(
                    f"schedule {schedule.id} (skip): fired {fired_missed[-1].isoformat()}, not the latest missed"
                )
            if schedule.policy == "none" and fired_missed:
                out.append(f"schedule {schedule.id} (none): {len(fired_missed)} missed fires fired, expected 0")
    return out


def duplicate_fire_count(snap: Snapshot) -> int:
    """Fires beyond the first for one (schedule, fire_time)."""
    counts = Counter(
        (j.schedule_id, j.fire_time) for j in snap.jobs.values() if j.schedule_id is not None and j.fire_time
    )
    return sum(n - 1 for n in counts.values() if n > 1)


def check_i7(snap: Snapshot) -> list[str]:
    """I7: no RUNNING job past its lease once the faults stopped (any owner)."""
    return [f"{job_id}: RUNNING past its lease" for job_id in snap.running_past_lease]


def check_i8(snap: Snapshot) -> list[str]:
    """I8: the backlog drained after the last fault healed, within ``recovery_bound`` seconds."""
    if snap.recovery_seconds is None:
        return [f"backlog not drained within {snap.recovery_bound:.0f} s of the last heal"]
    if snap.recovery_seconds > snap.recovery_bound:
        return [f"recovery took {snap.recovery_seconds:.1f} s, bound {snap.recovery_bound:.0f} s"]
    return []


CHECKS = {
    "I1": check_i1,
    "I2": check_i2,
    "I3": check_i3,
    "I4": check_i4,
    "I5": check_i5,
    "I6": check_i6,
    "I7": check_i7,
    "I8": check_i8,
}


@dataclass(slots=True, kw_only=True)
class Verdict:
    """The result of every check on one snapshot, with the table's figures."""

    violations: dict[str, list[str]]  # invariant -> violations (listed up to MAX_LISTED)
    counts: dict[str, int]  # invariant -> number of violations
    lost: int  # I1 violations
    duplicates: int
    audit_gaps: int
    duplicate_fires: int

    @property
    def passed(self) -> bool:
        """True when no invariant was violated."""
        return not any(self.counts.values())

    @property
    def failed(self) -> list[str]:
        """The names of the violated invariants, in order."""
        return [name for name, n in self.counts.items() if n]


def verdict(snap: Snapshot) -> Verdict:
    """Run every check on ``snap``; return the violations and the table's figures."""
    found = {name: check(snap) for name, check in CHECKS.items()}
    return Verdict(
        violations={name: _listed(v) for name, v in found.items() if v},
        counts={name: len(v) for name, v in found.items()},
        lost=len(found["I1"]),
        duplicates=duplicate_count(snap),
        audit_gaps=audit_gap_count(snap),
        duplicate_fires=duplicate_fire_count(snap),
    )
