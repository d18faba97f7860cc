"""The scenarios of `make bench`: each measures one thing for one system and returns its figures.

A scenario is a function ``(ctx, system, rep) -> dict`` registered with ``@scenario(...)``; the
harness runs every registered scenario for every system it applies to, interleaved by repetition
(rep 1 of every system, then rep 2...). To add a row or a figure (e.g. `@task` jobs next to
native ones, flow-control limits, the admin list at a million jobs), write a function here and
register it; ``side_by_side.py`` and the tables pick it up from ``SCENARIOS`` and ``FIGURES``.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.client import HTTPConnection
from typing import Any

import psycopg

from bench import harness, stats
from bench.event_stack import AUDIT_MISSING_SQL, free_port, provision_topic
from bench.harness import ROOT, Ctx, Group, Starts
from bench.peers.systems import System, stint_env


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One number a scenario reports: its JSON key, column title, unit and how to print it."""

    key: str
    title: str
    unit: str = ""
    digits: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A registered measurement."""

    name: str
    title: str
    run: Callable[[Ctx, System, int], dict[str, Any]]
    figures: tuple[Figure, ...]
    applies: Callable[[System], bool] = lambda system: True
    quick: bool = True  # part of --quick
    stint_only: bool = False
    notes: str = ""


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str, title: str, figures: tuple[Figure, ...], *, stint_only: bool = False, quick: bool = True, notes: str = ""
) -> Callable[[Callable[[Ctx, System, int], dict[str, Any]]], Callable[[Ctx, System, int], dict[str, Any]]]:
    """Register ``fn`` as scenario ``name`` (stint_only: only for systems tagged ``stint``)."""

    def register(fn: Callable[[Ctx, System, int], dict[str, Any]]) -> Callable[[Ctx, System, int], dict[str, Any]]:
        SCENARIOS[name] = Scenario(
            name=name,
            title=title,
            run=fn,
            figures=figures,
            applies=(lambda s: "stint" in s.tags) if stint_only else (lambda s: True),
            quick=quick,
            stint_only=stint_only,
            notes=notes,
        )
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# Sizes (full run / --quick).


def size(ctx: Ctx, full: float, quick: float) -> float:
    """The full-run value, or the --quick one."""
    return quick if ctx.quick else full


# ---------------------------------------------------------------------------------------------
# Shared steps.


@dataclass(slots=True, kw_only=True)
class Run:
    """One system's fresh database, environment and probe directory for one scenario repetition."""

    system: System
    name: str  # "<scenario>-<system>-<rep>", used for logs and the probe directory
    database: str
    url: str
    env: dict[str, str]
    starts: Starts
    observer_polls: int = 0
    extra: list[Group] = field(default_factory=list)

    def agent(self, ctx: Ctx, *args: str, timeout: float = 900) -> str:
        """Run the system's agent with ``args`` (setup, seed, produce...); return its stdout."""
        return harness.run_checked(
            ctx, f"{self.name}-agent", self.system.agent_argv(ctx, *args), self.env, timeout=timeout
        )

    def workers(self, ctx: Ctx) -> Group:
        """Start the system's worker processes."""
        commands = self.system.worker_commands(ctx, str(ctx.python(self.system.venv)))
        return Group(ctx, f"{self.name}-workers", commands, self.env)

    def remaining(self, conn: psycopg.Connection | None, jobs: int) -> int:
        """Jobs not finished by the system's own record (started-count when it keeps none)."""
        if self.system.remaining_sql is None or conn is None:
            return jobs - self.starts.poll()
        self.observer_polls += 1
        return int(conn.execute(self.system.remaining_sql).fetchone()[0])


def template_name(system: System) -> str:
    """The database each run of ``system`` is copied from (schema installed once)."""
    return "bench_tmpl_" + system.key.replace("-", "_")


def database_name(system: System) -> str:
    """The database a run of ``system`` works in (a fresh copy of ``template_name`` per run)."""
    return "bench_" + system.key.replace("-", "_")


def clean_up(ctx: Ctx, system: System) -> None:
    """Drop the database of ``system``'s last run, once its figures are taken.

    A run leaves tables full of dead rows; left in place, autovacuum may clean them up during
    the next system's measurement, on the same two cores (docs/benchmarks.md). ``DROP DATABASE
    ... WITH (FORCE)`` ends such an autovacuum and any backend the run left over.
    """
    if system.uses_postgres:
        harness.drop(ctx, database_name(system))


def prepare(ctx: Ctx, system: System) -> None:
    """Install the system's schema into its template database (once per `make bench`)."""
    if not system.uses_postgres:
        return
    url = harness.recreate(ctx, template_name(system))
    env = {**os.environ, **system.env(ctx, url)}
    harness.run_checked(ctx, f"setup-{system.key}", system.agent_argv(ctx, "setup"), env)
    with harness.admin(ctx) as conn:  # a template must have no connections when copied
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [template_name(system)]
        )


def fresh(ctx: Ctx, system: System, scenario_name: str, rep: int, *, env: dict[str, str] | None = None) -> Run:
    """A fresh copy of the system's template database, its environment and an empty probe directory."""
    name = f"{scenario_name}-{system.key}-{rep}"
    database = database_name(system)
    url = harness.recreate(ctx, database, template=template_name(system)) if system.uses_postgres else ""
    probe_dir = ctx.run_dir / "probe" / name
    full_env = {**os.environ, **system.env(ctx, url), **harness.probe_env(probe_dir), **(env or {})}
    run = Run(system=system, name=name, database=database, url=url, env=full_env, starts=Starts(probe_dir))
    if not system.uses_postgres:
        run.agent(ctx, "setup")  # e.g. Celery: empty the broker's database
    return run


def warm(ctx: Ctx, run: Run, group: Group, *, timeout: float = 120.0) -> None:
    """Enqueue a few jobs (negative seqs) and wait until they ran: the workers are up and connected.

    Raises RuntimeError when they do not run within ``timeout`` seconds (see the workers' log).
    """
    count = 4 * ctx.processes
    run.agent(ctx, "seed", f"count={count}", f"first={-10_000}")
    if not run.starts.wait_for(count, timeout=timeout, alive=group.alive):
        raise RuntimeError(f"{run.name}: the workers did not run the warm-up jobs; see {ctx.logfile(group.name)}")
    time.sleep(0.5)


def server_pids(ctx: Ctx, run: Run) -> Callable[[], list[int]]:
    """The server processes working for this system: its PostgreSQL backends (and Redis for a broker)."""

    def pids() -> list[int]:
        found = harness.backend_pids(ctx, run.database) if run.system.uses_postgres else []
        redis = ctx.servers.redis_pid()
        if run.system.uses_redis_broker and redis:
            found.append(redis)
        return found

    return pids


def stop_all(run: Run, *groups: Group) -> None:
    """Stop ``groups`` and the run's extra processes."""
    for group in (*groups, *run.extra):
        group.stop()


# ---------------------------------------------------------------------------------------------
# Side-by-side scenarios (every system).


def _drain(ctx: Ctx, run: Run, jobs: int) -> dict[str, Any]:
    """Seed ``jobs``, start the workers, and measure until the system's record says all are done."""
    run.agent(ctx, "seed", f"count={jobs}")
    harness.checkpoint(ctx)
    conn = harness.observer(ctx, run.database) if run.system.uses_postgres else None
    before = harness.counters(ctx, run.database, exclude_user=harness.OBSERVER) if conn else None
    vacuums = harness.autovacuum_runs(conn) if conn else None
    group = run.workers(ctx)
    try:
        with harness.cpu_window(ctx, lambda: group.pids, server_pids(ctx, run)) as cpu:
            if not run.starts.wait_for(jobs, timeout=size(ctx, 600, 180), alive=group.alive):
                raise RuntimeError(f"{run.name}: {run.starts.poll()} of {jobs} jobs started; see the workers' log")
            while run.remaining(conn, jobs) > 0:
                if time.time() - max(run.starts.by_seq.values()) > 120:
                    raise RuntimeError(f"{run.name}: jobs started but were never recorded as finished")
                time.sleep(harness.POLL_SECONDS)
            end = time.time()
        fast = harness.counters(ctx, run.database, exclude_user=harness.OBSERVER) if conn else None
        if conn is not None:
            vacuums = harness.autovacuum_runs(conn) - vacuums
    finally:
        if conn is not None:
            conn.close()
        stop_all(run, group)
    rate, opened = stats.drain_rate(run.starts.by_pid, jobs=jobs, end=end)
    out: dict[str, Any] = {
        "jobs": jobs,
        "drain_jobs_per_s": rate,
        "drain_seconds": round(end - opened, 3),
        "repeated_starts": run.starts.repeated,
        # Autovacuum/autoanalyze runs that finished on the system's tables during the drain (None
        # without PostgreSQL): chance decides whether one lands in a ~1-s drain (harness.autovacuum_runs).
        "autovacuum_runs": vacuums,
        **cpu,
    }
    if before is not None and fast is not None:
        # Commits are read after the workers stopped: a backend reports its counts at exit at the latest.
        slow = harness.counters(ctx, run.database, exclude_user=harness.OBSERVER)
        after = harness.Counters(commits=slow.commits, statements=fast.statements, wal_lsn=fast.wal_lsn)
        out.update(harness.per_job(before, after, jobs, own_commits=run.observer_polls))
        # The drain's WAL range, for `pg_waldump --stats=record -s/-e` on .bench/pg (a breakdown by record kind).
        out["wal_lsn_range"] = [before.wal_lsn, after.wal_lsn]
    return out


@scenario(
    "drain",
    "Drain of pre-enqueued no-op jobs",
    (
        Figure(key="drain_jobs_per_s", title="drain jobs/s"),
        Figure(key="commits_per_job", title="commits/job", digits=3),
        Figure(key="statements_per_job", title="statements/job", digits=3),
        Figure(key="wal_bytes_per_job", title="WAL B/job"),
    ),
)
def drain(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """20,000 no-op jobs (2,000 with --quick) enqueued in bulk with workers stopped, then drained."""
    run = fresh(ctx, system, "drain", rep)
    return _drain(ctx, run, int(size(ctx, 20_000, 2_000)))


@scenario(
    "enqueue",
    "Single-call enqueue, one producer process",
    (
        Figure(key="enqueue_jobs_per_s", title="enqueue jobs/s"),
        Figure(key="enqueue_statements_per_job", title="statements/enqueue", digits=1),
    ),
)
def enqueue(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """One process calls the system's normal enqueue API once per job, as fast as it can, no workers running."""
    run = fresh(ctx, system, "enqueue", rep)
    out_file = run.starts.directory / "produced.txt"
    seconds = size(ctx, 10, 3)
    before = harness.counters(ctx, run.database) if system.uses_postgres else None
    run.agent(ctx, "produce", f"out={out_file}", f"seconds={seconds}")
    produced = stats.parse_produced(out_file.read_text())
    times = sorted(produced.values())
    rate = round((len(times) - 1) / (times[-1] - times[0]), 1) if len(times) > 1 else None
    out: dict[str, Any] = {"enqueued": len(times), "enqueue_jobs_per_s": rate}
    if before is not None:
        # The producer has exited, so its commits are reported; its connection set-up is included.
        after = harness.counters(ctx, run.database)
        figures = harness.per_job(before, after, len(times))
        out["enqueue_statements_per_job"] = figures["statements_per_job"]
        out["enqueue_commits_per_job"] = figures["commits_per_job"]
        out["enqueue_wal_bytes_per_job"] = figures["wal_bytes_per_job"]
    return out


def _lag(ctx: Ctx, system: System, rep: int, rate: float, name: str) -> dict[str, Any]:
    run = fresh(ctx, system, name, rep)
    group = run.workers(ctx)
    warmup = 1.0  # seconds of jobs left out of the figures
    seconds = size(ctx, 15, 3)
    try:
        warm(ctx, run, group)
        out_file = run.starts.directory / "produced.txt"
        producer = Group(
            ctx,
            f"{run.name}-producer",
            [run.system.agent_argv(ctx, "produce", f"out={out_file}", f"rate={rate}", f"seconds={warmup + seconds}")],
            run.env,
        )
        time.sleep(warmup)
        with harness.cpu_window(ctx, lambda: group.pids, server_pids(ctx, run)) as cpu:
            while producer.procs[0].poll() is None:
                time.sleep(0.05)
        if producer.procs[0].returncode != 0:
            raise RuntimeError(f"{run.name}: the producer failed; see {ctx.logfile(producer.name)}")
        producer.stop()
        produced = stats.parse_produced(out_file.read_text())
        run.starts.wait_for(len(produced) + 4 * ctx.processes, timeout=size(ctx, 30, 10), alive=group.alive)
    finally:
        stop_all(run, group)
    figures = stats.lag_figures(produced, run.starts.by_seq, offered=rate, warmup_seconds=warmup)
    return {**figures.as_dict(), "repeated_starts": run.starts.repeated, **cpu}


LAG_FIGURES = (
    Figure(key="p50_ms", title="p50", unit=" ms", digits=1),
    Figure(key="p95_ms", title="p95", unit=" ms", digits=1),
    Figure(key="p99_ms", title="p99", unit=" ms", digits=1),
    Figure(key="achieved_jobs_per_s", title="producer jobs/s"),
    Figure(key="machine_busy_percent", title="CPU busy", unit="%"),
    Figure(key="workers_cpu_percent", title="workers CPU", unit="%"),
    Figure(key="server_cpu_percent", title="server CPU", unit="%"),
)


@scenario("lag200", "Pickup lag at 200 jobs/s offered", LAG_FIGURES)
def lag200(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """One producer process at 200 jobs/s for 15 s (4 s with --quick); lag = handler start - commit."""
    return _lag(ctx, system, rep, 200.0, "lag200")


@scenario("lag500", "Pickup lag at 500 jobs/s offered", LAG_FIGURES, quick=False)
def lag500(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """As lag200, at 500 jobs/s."""
    return _lag(ctx, system, rep, 500.0, "lag500")


@scenario(
    "idle",
    "Idle: CPU of the workers with nothing to do",
    (
        Figure(key="workers_cpu_percent_each", title="idle CPU per worker process", unit="%", digits=1),
        Figure(key="scheduler_cpu_percent", title="idle CPU of run_scheduler", unit="%", digits=1),
    ),
    quick=False,
)
def idle(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """The workers (and, for Stint, one ``run_scheduler``) up and warm, then 20 s of nothing."""
    run = fresh(ctx, system, "idle", rep)
    group = run.workers(ctx)
    scheduler = _manage(ctx, run, "scheduler", "run_scheduler") if "stint" in system.tags else None
    try:
        warm(ctx, run, group)
        time.sleep(2.0)  # let the warm-up's outcomes and flushes settle
        seconds = size(ctx, 20, 5)
        with harness.cpu_window(ctx, lambda: group.pids, lambda: scheduler.pids if scheduler else []) as cpu:
            time.sleep(seconds)
    finally:
        stop_all(run, group)
    # Per process: a Celery worker's consumer parent and its pool children count as its processes.
    return {
        "workers_cpu_percent": cpu["workers_cpu_percent"],
        "workers_cpu_percent_each": round(cpu["workers_cpu_percent"] / ctx.processes, 2),
        "scheduler_cpu_percent": cpu["server_cpu_percent"] if scheduler else None,
    }


# ---------------------------------------------------------------------------------------------
# Stint-only scenarios.


def _manage(ctx: Ctx, run: Run, name: str, *argv: str, env: dict[str, str] | None = None) -> Group:
    command = [str(ctx.python(None)), str(ROOT / "manage.py"), *argv, "-v", "0"]
    group = Group(ctx, f"{run.name}-{name}", [command], {**run.env, **(env or {})})
    run.extra.append(group)
    return group


def _stint_json(ctx: Ctx, run: Run, *args: str) -> dict[str, Any]:
    return json.loads(run.agent(ctx, *args).strip().splitlines()[-1])


@scenario(
    "relay",
    "Stint drain with the outbox relay and the audit consumer running",
    (
        Figure(key="drain_jobs_per_s", title="drain jobs/s"),
        Figure(key="relay_events_per_s", title="relay events/s"),
        Figure(key="audit_behind_s", title="audit trail behind at drain end", unit=" s", digits=2),
        Figure(key="commit_to_audit_p50_ms", title="commit→audit p50", unit=" ms"),
        Figure(key="commit_to_audit_p99_ms", title="commit→audit p99", unit=" ms"),
        Figure(key="wal_bytes_per_job", title="WAL B/job"),
    ),
    stint_only=True,
)
def relay(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """The drain with ``run_scheduler`` (its relay) and ``run_audit_consumer``, on a fresh topic and group.

    The relay and the consumer start before the workers and publish the seeded jobs' creation
    events first (not measured); then the drain is measured as in ``drain``, and afterwards how
    long the audit table took to hold every event.
    """
    tag = f"bench-{int(time.time())}-{secrets.token_hex(3)}"
    run = fresh(ctx, system, "relay", rep, env={"KAFKA_TOPIC": tag, "KAFKA_AUDIT_GROUP": tag})
    jobs = int(size(ctx, 20_000, 2_000))
    run.agent(ctx, "seed", f"count={jobs}")
    provision_topic(run.env)  # as `manage.py create_topics` would: neither the relay nor the consumer creates it
    _manage(ctx, run, "scheduler", "run_scheduler")
    _manage(ctx, run, "audit", "run_audit_consumer")
    conn = harness.observer(ctx, run.database)

    def audit_missing() -> int:
        return int(conn.execute(AUDIT_MISSING_SQL).fetchone()[0])

    deadline = time.monotonic() + 180
    while audit_missing():
        if time.monotonic() > deadline:
            conn.close()
            stop_all(run)
            raise RuntimeError(f"{run.name}: the seeded jobs' events never reached the audit table")
        time.sleep(0.2)
    since = time.time()
    before = harness.counters(ctx, run.database, exclude_user=harness.OBSERVER)
    group = run.workers(ctx)
    try:
        if not run.starts.wait_for(jobs, timeout=size(ctx, 600, 180), alive=group.alive):
            raise RuntimeError(f"{run.name}: not every job started")
        while run.remaining(conn, jobs) > 0:
            time.sleep(harness.POLL_SECONDS)
        end = time.time()
        fast = harness.counters(ctx, run.database, exclude_user=harness.OBSERVER)
        backlog_at_end = audit_missing()
        caught_up = None
        while caught_up is None and time.time() - end < 300:
            if audit_missing() == 0:
                caught_up = time.time()
            else:
                time.sleep(0.05)
        rate, opened = stats.drain_rate(run.starts.by_pid, jobs=jobs, end=end)
        # The relay's pace over its busy span: the drain's events from the first to the last publication.
        published, span = conn.execute(
            "SELECT coalesce(sum(event_count), 0), extract(epoch FROM max(published_at) - min(published_at))"
            " FROM stint_outbox"
            " WHERE occurred_at >= to_timestamp(%s) AND published_at IS NOT NULL",
            [since],
        ).fetchone()
    finally:
        conn.close()
        stop_all(run, group)
    events = _stint_json(ctx, run, "events", f"since={since}")
    per = harness.per_job(before, fast, jobs)
    return {
        "jobs": jobs,
        "drain_jobs_per_s": rate,
        "relay_events_per_s": round(published / float(span), 1) if span else None,
        "relay_events": published,
        "audit_behind_s": round(caught_up - end, 3) if caught_up else None,
        "audit_missing_at_drain_end": backlog_at_end,
        "commit_to_audit_p50_ms": events["commit_to_audit_ms"]["p50"],
        "commit_to_audit_p99_ms": events["commit_to_audit_ms"]["p99"],
        "wal_bytes_per_job": per["wal_bytes_per_job"],
        "statements_per_job": per["statements_per_job"],
        "lost_events": events["lost_events"],
        "duplicate_events": events["duplicate_events"],
        "jobs_with_gaps": events["jobs_with_gaps"],
    }


@scenario(
    "delayed",
    "10,000 delayed jobs due at one instant (2,000 with --quick)",
    (
        Figure(key="all_started_after_due_s", title="all started after due", unit=" s", digits=2),
        Figure(key="p50_started_after_due_s", title="p50 started after due", unit=" s", digits=2),
    ),
    stint_only=True,
)
def delayed(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """10,000 jobs scheduled for one instant T, ``run_scheduler`` (default tick; relay idle) and the workers up.

    The figure is the last handler start minus T (both this host's clock; Stint compares
    ``scheduled_at`` with the database's, which is the same clock here).
    """
    run = fresh(ctx, system, "delayed", rep)
    group = run.workers(ctx)
    jobs = int(size(ctx, 10_000, 2_000))
    try:
        warm(ctx, run, group)
        _manage(ctx, run, "scheduler", "run_scheduler", env={"STINT_OUTBOX_RELAY_INTERVAL_SECONDS": "3600"})
        due = time.time() + size(ctx, 12.0, 6.0)
        run.agent(ctx, "seed", f"count={jobs}", f"at={due}")
        if time.time() > due - 1:
            raise RuntimeError(f"{run.name}: seeding took longer than the lead; raise it")
        base = run.starts.poll()
        run.starts.wait_for(base + jobs, timeout=120, alive=group.alive)
    finally:
        stop_all(run, group)
    late = sorted(t - due for seq, t in run.starts.by_seq.items() if seq >= 0)
    return {
        "jobs": jobs,
        "started": len(late),
        "all_started_after_due_s": round(late[-1], 3) if len(late) == jobs else None,
        "p50_started_after_due_s": round(stats.percentile(late, 0.5), 3) if late else None,
    }


@scenario(
    "cron",
    "10,000 cron schedules due in one minute",
    (Figure(key="all_materialized_after_due_s", title="all materialized after due", unit=" s", digits=2),),
    stint_only=True,
    quick=False,
    notes="bench/cron_bench.py (one run_scheduler, the leader)",
)
def cron(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """``bench/cron_bench.py`` against the benchmark PostgreSQL (it waits for the next whole minute)."""
    env = {**os.environ, **stint_env(ctx, ctx.servers.url("postgres")), "STINT_EXTRA_APPS": ""}
    argv = [str(ctx.python(None)), str(ROOT / "bench" / "cron_bench.py"), "--schedules", "10000", "--lead", "5"]
    result = json.loads(harness.run_checked(ctx, f"cron-{rep}", argv, env).strip().splitlines()[-1])
    return {
        "all_materialized_after_due_s": result.get("all_materialized_after_due_s"),
        "jobs": result.get("jobs"),
        "duplicates": result.get("duplicates"),
    }


API_THREADS = 4  # client threads, one keep-alive connection each


@scenario(
    "api",
    "REST API job creation through gunicorn",
    (
        Figure(key="created_per_s", title="POST /api/jobs per s"),
        Figure(key="p50_ms", title="p50", unit=" ms", digits=1),
        Figure(key="p99_ms", title="p99", unit=" ms", digits=1),
    ),
    stint_only=True,
)
def api(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """gunicorn (N gthread workers x 4 threads, keep-alive), JWT bearer auth, rate limit raised; no workers.

    API_THREADS client threads in the harness process each hold one keep-alive connection and
    POST a no-op job in a loop for 10 s (3 s with --quick).
    """
    port = free_port()
    env = {
        "STINT_RATE_LIMIT_USER": "100000000/min",
        "STINT_RATE_LIMIT_AUTH": "100000/min",
        "JWT_ACCESS_LIFETIME_SECONDS": "3600",
    }
    run = fresh(ctx, system, "api", rep, env=env)
    password = secrets.token_urlsafe(16)
    run.agent(ctx, "user", "username=bench", f"password={password}")
    gunicorn = str(ctx.python(None).parent / "gunicorn")
    server = Group(
        ctx,
        f"{run.name}-gunicorn",
        [
            [
                gunicorn,
                "config.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(ctx.processes),
                "--worker-class",
                "gthread",
                "--threads",
                "4",
                "--keep-alive",
                "30",
                "--log-level",
                "warning",
            ]
        ],
        run.env,
    )
    seconds = size(ctx, 10, 3)
    latencies: list[float] = []
    codes: dict[int, int] = {}
    lock = threading.Lock()
    try:
        token = _login(port, password, server)
        body = json.dumps({"name": "bench", "type": "BENCH_NOOP", "payload": {"i": 0}})
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        stop_at = time.monotonic() + seconds

        def client() -> None:
            conn = HTTPConnection("127.0.0.1", port, timeout=30)
            mine: list[float] = []
            seen: dict[int, int] = {}
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                conn.request("POST", "/api/jobs", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                mine.append((time.perf_counter() - t0) * 1000)
                seen[response.status] = seen.get(response.status, 0) + 1
            conn.close()
            with lock:
                latencies.extend(mine)
                for code, n in seen.items():
                    codes[code] = codes.get(code, 0) + n

        started = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(API_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    finally:
        stop_all(run, server)
    created = codes.get(201, 0)
    return {
        "created_per_s": round(created / elapsed, 1),
        "p50_ms": round(stats.percentile(latencies, 0.5) or 0, 2),
        "p99_ms": round(stats.percentile(latencies, 0.99) or 0, 2),
        "status_codes": {str(k): v for k, v in sorted(codes.items())},
    }


def _login(port: int, password: str, server: Group, timeout: float = 60) -> str:
    """Wait for gunicorn to answer, then log in; return the access token."""
    deadline = time.monotonic() + timeout
    body = json.dumps({"username": "bench", "password": password})
    while True:
        try:
            conn = HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/api/auth/login", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            conn.close()
            if response.status == 200:
                return json.loads(data)["access"]
            raise RuntimeError(f"login answered {response.status}: {data[:200]!r}")
        except OSError:
            if time.monotonic() > deadline or not server.alive():
                raise
            time.sleep(0.2)


@scenario(
    "events500",
    "Lifecycle events at 500 jobs/s: commit to audit table",
    (
        Figure(key="commit_to_audit_p50_ms", title="commit→audit p50", unit=" ms"),
        Figure(key="commit_to_audit_p99_ms", title="commit→audit p99", unit=" ms"),
    ),
    stint_only=True,
    quick=False,
    notes="bench/event_latency.py --rate 500 --workers 2",
)
def events500(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """``bench/event_latency.py`` at 500 jobs/s with 2 worker processes, relay and audit consumer."""
    env = {**os.environ, **stint_env(ctx, ctx.servers.url("postgres")), "STINT_EXTRA_APPS": ""}
    seconds = size(ctx, 15, 4)
    argv = [
        str(ctx.python(None)),
        str(ROOT / "bench" / "event_latency.py"),
        "--rate",
        "500",
        "--seconds",
        str(seconds),
        "--workers",
        str(ctx.processes),
    ]
    result = json.loads(harness.run_checked(ctx, f"events500-{rep}", argv, env).strip().splitlines()[-1])
    return {
        "commit_to_audit_p50_ms": result["commit_to_audit_ms"]["p50"],
        "commit_to_audit_p99_ms": result["commit_to_audit_ms"]["p99"],
        "lost_events": result.get("lost_events"),
        "duplicate_events": result.get("duplicate_events"),
        "achieved_jobs_per_s": result.get("achieved_rate_jobs_per_s"),
    }


FLOOR_PATHS = {  # bench/pickup_floor.py's paths: what each one is
    "redis": "Redis LPUSH→BRPOP",
    "notify": "PostgreSQL commit→NOTIFY",
    "claim": "NOTIFY + durable claim",
    "claim-async": "NOTIFY + claim, synchronous_commit off",
}
# (path, offered jobs/s, percentile) of each figure: pickup_floor.py's default rates
FLOOR_CELLS = tuple((path, rate, q) for path in FLOOR_PATHS for rate in (200, 500) for q in ("p50", "p99"))


@scenario(
    "floor",
    "Pickup floor (transports alone, no queue system)",
    tuple(
        Figure(key=f"{path}_{rate}_{q}_ms", title=f"{FLOOR_PATHS[path]} @{rate}/s {q}", unit=" ms", digits=2)
        for path, rate, q in FLOOR_CELLS
    ),
    stint_only=True,
    quick=False,
    notes="bench/pickup_floor.py --reps 1 (one consumer process, one producer)",
)
def floor(ctx: Ctx, system: System, rep: int) -> dict[str, Any]:
    """``bench/pickup_floor.py``: the least lag each transport allows, on this run's PostgreSQL and Redis.

    Beside the systems' lag it shows what is left to win: a queue that leases a job durably
    before running it cannot pick it up faster than the ``claim`` path.
    """
    env = {**os.environ, "DATABASE_URL": ctx.servers.url("postgres"), "REDIS_URL": ctx.servers.redis_url}
    argv = [str(ctx.python(None)), str(ROOT / "bench" / "pickup_floor.py"), "--reps", "1"]
    argv += ["--seconds", str(size(ctx, 10, 3))]
    summary = json.loads(harness.run_checked(ctx, f"floor-{rep}", argv, env).strip().splitlines()[-1])["summary"]
    return {f"{path}_{rate}_{q}_ms": summary[f"{path}@{rate}"][f"{q}_ms"] for path, rate, q in FLOOR_CELLS}


def redacted(url: str) -> str:
    """``url`` without a password (for the results file)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    return urllib.parse.urlunsplit(parts)
