"""Pure planning of a chaos run: profiles, the scenarios, each one's seeded fault schedule and job mix.

Nothing here touches a process, a socket or the clock: the same (scenario, profile, seed) always
gives the same faults at the same offsets and the same job payloads, so a failing run can be
replayed with ``--seed``. Offsets are seconds from the start of a scenario's load.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

# The cluster's timing under test (the runner passes these to every Stint process).
LEASE_SECONDS = 4  # STINT_LEASE_SECONDS: short, so rescue happens within a scenario
HEARTBEAT_SECONDS = 1.0  # STINT_HEARTBEAT_SECONDS
GRACE_SECONDS = 2.0  # STINT_SHUTDOWN_GRACE_SECONDS: shorter than the long jobs, so SIGTERM hands back
LEADER_TTL_SECONDS = 10.0  # scheduler.leadership.DEFAULT_TTL_SECONDS (not configurable)
CRON_INTERVAL_SECONDS = 2  # interval of the schedules the cron scenarios create
LONG_JOB_SECONDS = 4.0  # a "long" job: outlasts GRACE_SECONDS, so a SIGTERM hands it back
MIN_GAP = 1.5  # seconds between two faults of one scenario (a restarted process needs about this to be back)
# The event-trail reconciler's timing (finding F5: the in-memory broker can lose acknowledged events,
# which only the reconciler repairs). The relay's lock hold exceeds its delivery timeout (5 s) plus
# its flush grace; the grace is the least config/settings.py allows for it (lock hold + 10 s).
# A partition that outlasts every bound of config.db_session: the server notices a vanished client
# within its keepalives (10 s idle + 3 probes 5 s apart) or tcp_user_timeout (30 s), so after
# RELEASE_BOUND_SECONDS nothing of the cut-off host may hold a session, a row lock or a job.
RELEASE_BOUND_SECONDS = 35.0
PARTITION_LONG_SECONDS = 45.0  # the check runs 3 s before the heal
# pg-freeze's hold in the soak (scaled by the profile, at least two leases): past the API's 30 s
# database deadline and the worker reaper's 60 s (STINT_WORKER_DEAD_AFTER_SECONDS, default).
PG_FREEZE_SOAK_SECONDS = 75.0
OUTBOX_LOCK_HOLD_SECONDS = 10  # STINT_OUTBOX_LOCK_HOLD_SECONDS
RECONCILE_AFTER_SECONDS = 20  # STINT_AUDIT_RECONCILE_AFTER_SECONDS

HOSTS = ("h2", "h3")  # the two application hosts; the servers live on "db"
JOB_TYPE = "CHAOS"


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """How long a run takes: load window, fault holds, recovery bound, rates (jobs/s)."""

    name: str
    load_seconds: float  # load offered per scenario (faults happen inside this window)
    scale: float  # multiplies fault holds that the issue gives for the soak (Redis 60 s, broker 30 s)
    enqueue_rate: float  # jobs/s through scheduler.enqueue_many
    api_rate: float  # jobs/s through POST /api/jobs
    storm_rate: float  # jobs/s of the retry storm
    kills: int  # SIGKILLs in the worker-kill scenario
    recovery_bound_seconds: float  # I8: fault healed to backlog drained must be within this
    worker_processes: int = 2  # per run_workers supervisor (--processes)
    web_workers: int = 2  # gunicorn worker processes


PROFILES: dict[str, Profile] = {
    "short": Profile(
        name="short",
        load_seconds=9.0,
        scale=0.2,
        enqueue_rate=30.0,
        api_rate=8.0,
        storm_rate=500.0,
        kills=3,
        recovery_bound_seconds=60.0,
    ),
    # The two-scenario smoke that `make test` runs (tests/chaos/test_smoke.py): one host, a short
    # load, one kill; it proves the harness and the invariants work end to end, not the soak's figures.
    "smoke": Profile(
        name="smoke",
        load_seconds=5.0,
        scale=0.1,
        enqueue_rate=16.0,
        api_rate=4.0,
        storm_rate=100.0,
        kills=1,
        recovery_bound_seconds=30.0,
        worker_processes=1,  # two supervisors of one worker process each: fewer Django starts on a busy CI
        web_workers=1,
    ),
    "soak": Profile(
        name="soak",
        load_seconds=75.0,
        scale=1.0,
        enqueue_rate=40.0,
        api_rate=10.0,
        storm_rate=500.0,
        kills=15,
        recovery_bound_seconds=120.0,
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """One fault: ``action`` on ``target`` at ``at`` seconds into the load, healed after ``hold`` seconds.

    ``hold`` 0 is an instantaneous fault (a SIGKILL, a FLUSHALL); the runner restarts what it killed.
    """

    at: float
    action: str
    target: str
    hold: float = 0.0

    @property
    def healed_at(self) -> float:
        """Seconds into the load at which this fault is over."""
        return self.at + self.hold


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A named fault pattern, run with load; ``mix`` names the job mix, ``schedules`` the cron schedules."""

    name: str
    summary: str
    mix: str = "standard"
    schedules: tuple[str, ...] = ()  # misfire policies of the interval schedules it creates
    skew: bool = False  # host 3's processes run with a skewed clock for the whole scenario
    needs_namespaces: bool = False  # meaningless on one host (netem, partitions)
    failpoint: str = ""  # name of a failpoint armed by the fault (see chaos.failpoints)
    # Its faults kill worker processes under a living supervisor, which rescues their jobs at once:
    # no attempt may wait for its lease to expire (I3).
    rescued_at_once: bool = False
    # Shortly before its fault heals, check that the cut-off host holds no database session, row
    # lock or job any more (finding F6: keepalives and idle-in-transaction bounds, config.db_session).
    released_while_cut: bool = False


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(name="worker-kill", summary="worker SIGKILL mid-job", rescued_at_once=True),
    Scenario(
        name="worker-stop",
        summary="a host's run_workers (supervisor and worker processes) SIGSTOPped past its lease, then SIGCONT"
        " (late results discarded)",
    ),
    Scenario(
        name="worker-term",
        summary="supervisor SIGTERM, and SIGTERM twice to every process of a worker host, with long jobs (hand-back)",
        mix="long",
    ),
    Scenario(name="leader-kill", summary="leader scheduler SIGKILL", schedules=("skip", "catch_up")),
    Scenario(
        name="leader-stop",
        summary="leader scheduler SIGSTOP past its leadership TTL (fencing)",
        schedules=("skip", "catch_up"),
    ),
    Scenario(
        name="schedulers-down",
        summary="every scheduler down across three cron fires, then back (misfire policy)",
        schedules=("skip", "catch_up", "none"),
    ),
    Scenario(name="pg-restart", summary="PostgreSQL restart (immediate stop, crash recovery)"),
    Scenario(name="pg-terminate", summary="pg_terminate_backend of every client connection, twice"),
    Scenario(name="pg-freeze", summary="PostgreSQL postmaster and every backend SIGSTOPped, then SIGCONT"),
    Scenario(name="redis-down", summary="Redis down, then back", schedules=("skip",)),
    Scenario(name="redis-flushall", summary="Redis FLUSHALL (leader lock and counters gone)", schedules=("skip",)),
    Scenario(name="broker-pause", summary="Kafka broker SIGSTOP, then SIGCONT"),
    Scenario(name="broker-restart", summary="Kafka broker SIGKILL and restart (memory storage: its log is lost)"),
    Scenario(name="relay-kill", summary="relay killed between produce and mark", failpoint="relay-after-produce"),
    Scenario(
        name="audit-kill-before-commit",
        summary="audit consumer killed after storing, before its offset commit",
        failpoint="audit-before-commit",
    ),
    Scenario(
        name="audit-kill-after-commit",
        summary="audit consumer killed right after its offset commit",
        failpoint="audit-after-commit",
    ),
    Scenario(
        name="partition-h3",
        summary="host 3 partitioned from the database host for longer than a lease, then healed",
        needs_namespaces=True,
    ),
    Scenario(
        name="partition-h3-long",
        summary="host 3 cut off from the database host past the keepalive bounds: what it held is released meanwhile",
        needs_namespaces=True,
        released_while_cut=True,
    ),
    Scenario(
        name="latency",
        summary="100 ms added each way between the hosts (tc netem, or a link proxy)",
        needs_namespaces=True,
    ),
    Scenario(name="clock-skew", summary="host 3's scheduler at +5 min and worker at -5 min (libfaketime)", skew=True),
    Scenario(name="poison", summary="poison handlers (os._exit, sys.exit, NUL error) in the load", mix="poison"),
    Scenario(name="retry-storm", summary="a handler failing 50% of the time at 500 jobs/s", mix="storm"),
)
SCENARIO_NAMES = tuple(s.name for s in SCENARIOS)


def recovery_bound(name: str, profile: Profile) -> float:
    """Return I8's bound in seconds for scenario ``name``: the profile's, or longer where only a repair can finish.

    ``broker-restart`` may lose events the broker had acknowledged (F5); the reconciler publishes
    them again once they are ``RECONCILE_AFTER_SECONDS`` old, checking every quarter of that, so
    its bound leaves that long plus 30 s for the rest of the recovery.
    """
    if name == "broker-restart":
        return max(profile.recovery_bound_seconds, RECONCILE_AFTER_SECONDS * 1.25 + 30)
    return profile.recovery_bound_seconds


def pg_freeze_hold(profile: Profile) -> float:
    """Return how long pg-freeze keeps PostgreSQL stopped under ``profile``, in seconds.

    Always past two leases (``LEASE_SECONDS``), so that every lease held at the freeze has
    expired by the database's clock when it answers again (the rescuer must not take jobs from
    live workers: ``LeaseRescuer``'s hold-off after a stalled query); otherwise
    ``PG_FREEZE_SOAK_SECONDS`` scaled by the profile. The soak's hold also outlasts the API's
    database deadline (``STINT_REQUEST_DB_TIMEOUT_SECONDS``, 30 s: requests answer 503) and the
    worker reaper's ``WORKER_DEAD_AFTER_SECONDS`` (60 s: every worker is marked gone on the
    resume, and marks itself alive again at its next heartbeat).
    """
    return max(2 * LEASE_SECONDS + 2, round(PG_FREEZE_SOAK_SECONDS * profile.scale, 1))


def scenario(name: str) -> Scenario:
    """Return the scenario called ``name``; raise KeyError listing the names when there is none."""
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"no scenario {name!r}; choose from {', '.join(SCENARIO_NAMES)}")


def rng_for(seed: int, *parts: str) -> random.Random:
    """Return a ``random.Random`` seeded by ``seed`` and ``parts`` (stable across Python runs, unlike hash())."""
    digest = hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))  # noqa: S311 - reproducible chaos, not security


def fault_schedule(name: str, profile: Profile, seed: int) -> list[Fault]:
    """Return the faults of scenario ``name`` under ``profile`` and ``seed``, sorted by ``at``.

    Every fault starts inside the load window; holds meet what the scenario needs to mean
    something: a SIGSTOP or a partition outlasts a lease (``LEASE_SECONDS``), a stopped leader
    outlasts its TTL (``LEADER_TTL_SECONDS``), the schedulers stay down across three fires of
    ``CRON_INTERVAL_SECONDS``, a frozen PostgreSQL outlasts two leases (``pg_freeze_hold``).
    Raises KeyError for an unknown scenario.
    """
    scenario(name)
    rng = rng_for(seed, "faults", name, profile.name)
    load = profile.load_seconds
    host = rng.choice(HOSTS)
    early = round(rng.uniform(0.2, 0.35) * load, 2)  # a fault early enough to heal inside the window

    def spread(count: int) -> list[float]:
        """``count`` offsets in the middle 10-80% of the load window, at least ``MIN_GAP`` seconds apart."""
        span = 0.7 * load - MIN_GAP * (count - 1)
        if span <= 0:
            raise ValueError(f"{count} faults do not fit {MIN_GAP} s apart in {load} s")
        draws = sorted(rng.uniform(0, span) for _ in range(count))
        return [round(0.1 * load + d + MIN_GAP * i, 2) for i, d in enumerate(draws)]

    if name == "worker-kill":
        return [Fault(at=t, action="sigkill", target=f"worker@{rng.choice(HOSTS)}") for t in spread(profile.kills)]
    if name == "worker-stop":
        return [Fault(at=early, action="sigstop", target=f"worker@{host}", hold=2 * LEASE_SECONDS + 1)]
    if name == "worker-term":
        other = "h3" if host == "h2" else "h2"
        return [
            Fault(at=early, action="sigterm", target=f"worker@{host}"),
            Fault(at=round(early + 0.3 * load, 2), action="sigterm-group", target=f"worker@{other}"),
        ]
    if name == "leader-kill":
        return [Fault(at=early, action="sigkill", target="scheduler@leader")]
    if name == "leader-stop":
        return [Fault(at=early, action="sigstop", target="scheduler@leader", hold=LEADER_TTL_SECONDS + 3)]
    if name == "schedulers-down":
        return [Fault(at=early, action="down", target="scheduler@all", hold=3.5 * CRON_INTERVAL_SECONDS + 1)]
    if name == "pg-restart":
        return [Fault(at=early, action="restart", target="postgres")]
    if name == "pg-freeze":
        return [Fault(at=early, action="sigstop", target="postgres", hold=pg_freeze_hold(profile))]
    if name == "pg-terminate":
        first, second = spread(2)
        return [
            Fault(at=first, action="terminate-backends", target="postgres"),
            Fault(at=max(second, first + 1.0), action="terminate-backends", target="postgres"),
        ]
    if name == "redis-down":
        return [Fault(at=early, action="down", target="redis", hold=max(5.0, 60 * profile.scale))]
    if name == "redis-flushall":
        return [Fault(at=early, action="flushall", target="redis")]
    if name == "broker-pause":
        return [Fault(at=early, action="sigstop", target="broker", hold=max(5.0, 30 * profile.scale))]
    if name == "broker-restart":
        return [Fault(at=early, action="restart", target="broker", hold=2.0)]
    if name in ("relay-kill", "audit-kill-before-commit", "audit-kill-after-commit"):
        return [Fault(at=t, action="failpoint", target=scenario(name).failpoint) for t in spread(2)]
    if name == "partition-h3":
        return [Fault(at=early, action="partition", target="h3", hold=max(2 * LEASE_SECONDS + 2, 20 * profile.scale))]
    if name == "partition-h3-long":
        # "partition-held": a process on h3 holds row locks in an open transaction when the cut comes.
        return [Fault(at=early, action="partition-held", target="h3", hold=PARTITION_LONG_SECONDS)]
    if name == "latency":
        return [
            Fault(at=round(0.1 * load, 2), action="netem-delay", target="all", hold=max(20.0, round(0.6 * load, 2)))
        ]
    if name == "clock-skew":
        return [Fault(at=0.0, action="skew", target="h3", hold=load)]
    return []  # poison, retry-storm: the load itself is the fault


# -- the job mix -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One job to offer: its payload for the CHAOS handler and its options; ``via`` api or enqueue."""

    payload: dict[str, Any]
    max_retries: int = 3
    delay_seconds: float = 0.0  # scheduled_at = now + this (0: immediate)
    priority: str = "MEDIUM"
    idempotency_key: str = ""  # only for via="api"
    via: str = "enqueue"
    extra: dict[str, Any] = field(default_factory=dict)


def expected_status(payload: dict[str, Any], max_retries: int) -> str:
    """The final status a CHAOS job reaches when no attempt of it is lost to a fault.

    ``payload["fail"]`` lists the attempt numbers (1-based) on which the handler raises a
    retryable error; the job is DEAD when every attempt of its budget of ``1 + max_retries``
    fails, SUCCESS otherwise. A poison mode has no fixed answer: returns "" (any end is allowed).
    """
    if payload.get("mode", "ok") != "ok":
        return ""
    fails = set(payload.get("fail", ()))
    return "DEAD" if all(a in fails for a in range(1, 2 + max_retries)) else "SUCCESS"


def job_mix(mix: str, count: int, rng: random.Random, *, api_share: float) -> list[JobSpec]:
    """Return ``count`` jobs of ``mix`` ("standard", "long", "poison", "storm") drawn from ``rng``.

    standard: mostly quick jobs, some that sleep up to 1.5 s (so faults find jobs running), some
    that fail once, some that always fail (max_retries 2, so DEAD after 3 attempts), some delayed
    2-4 s. long: 6% of the jobs sleep ``LONG_JOB_SECONDS``, past the shutdown grace, the rest is
    standard. poison: about 1 in 20 is a poison job (os._exit, sys.exit or an error text with
    NUL). storm: every job fails each attempt with probability 1/2 and sleeps nothing.
    ``api_share`` of the jobs go through the REST API, the rest through ``enqueue_many``.
    """
    if mix not in ("standard", "long", "poison", "storm"):
        raise ValueError(f"unknown mix {mix!r}")
    jobs: list[JobSpec] = []
    for i in range(count):
        via = "api" if rng.random() < api_share else "enqueue"
        key = f"chaos-{rng.getrandbits(64):016x}" if via == "api" and rng.random() < 0.3 else ""
        roll = rng.random()
        priority = rng.choice(("HIGH", "MEDIUM", "LOW"))
        if mix == "storm":
            fails = [a for a in range(1, 5) if rng.random() < 0.5]
            jobs.append(JobSpec(payload={"mode": "ok", "fail": fails, "n": i}, via="enqueue", priority=priority))
            continue
        if mix == "poison" and roll < 0.05:
            mode = ("exit", "sysexit", "nul")[i % 3]
            jobs.append(JobSpec(payload={"mode": mode, "n": i}, via=via, idempotency_key=key, max_retries=2))
            continue
        if mix == "long" and roll < 0.06:
            jobs.append(
                JobSpec(payload={"mode": "ok", "sleep": LONG_JOB_SECONDS, "n": i}, via=via, idempotency_key=key)
            )
            continue
        if mix == "long":
            roll = rng.random()  # the rest is the standard mix
        if roll < 0.55:
            spec = JobSpec(payload={"mode": "ok", "sleep": round(rng.uniform(0, 0.05), 3), "n": i})
        elif roll < 0.75:
            spec = JobSpec(payload={"mode": "ok", "sleep": round(rng.uniform(0.3, 1.5), 2), "n": i})
        elif roll < 0.85:
            spec = JobSpec(payload={"mode": "ok", "fail": [1], "n": i})
        elif roll < 0.90:
            spec = JobSpec(payload={"mode": "ok", "fail": [1, 2, 3], "n": i}, max_retries=2)
        else:
            spec = JobSpec(payload={"mode": "ok", "n": i}, delay_seconds=round(rng.uniform(2, 4), 2))
        jobs.append(
            JobSpec(
                payload=spec.payload,
                max_retries=spec.max_retries,
                delay_seconds=spec.delay_seconds,
                priority=priority,
                idempotency_key=key,
                via=via,
            )
        )
    return jobs
