"""The nemesis: set up the hosts, servers and Stint cluster, run each scenario (load + seeded faults), check, report.

``python -m chaos [--profile short|soak] [--seed N] [--scenario NAME ...] [--one-host]`` (``make chaos``).
For each scenario: bring the cluster back to health, register the scenario's user over the
API, start the load, inject the faults at their offsets and heal them, wait until the backlog
drained (every job finished, every event published and audited), read the rows, run the
invariants, print one table row and one JSON line. Namespaces, servers and processes are
removed on exit, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import faulthandler
import json
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import requests

from chaos import plan
from chaos.cluster import Cluster, faketime_available, skew_env
from chaos.hosts import Hosts, HostsError, namespaces_possible
from chaos.invariants import ScheduleRow, Verdict, verdict
from chaos.kafka_scan import TopicScanner
from chaos.load import Load
from chaos.plan import Fault, Profile, Scenario
from chaos.servers import Broker, Postgres, Redis

logger = logging.getLogger("chaos")

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stint_chaos"
TOPIC = "chaos-lifecycle-events"
PARTITIONS = 6
WORKER_SLOTS = 12
PROGRESS_SECONDS = 2.0
READY_POLL_SECONDS = 0.1  # how often the waits for a ready cluster look again (each look is one query or GET)
VICTIM_WAIT_SECONDS = 3.0  # how long a worker fault waits for a worker process that holds a job
MID_JOB_MARGIN_SECONDS = 0.2  # a victim's job must have at least this long still to run (its payload's sleep)
RELEASE_CHECK_BEFORE_HEAL_SECONDS = 3.0  # partition-h3-long: when the check of what h3 held runs
HOLDER_JOBS = 20  # partition-h3-long: jobs chaos.holder locks on h3 before the cut
TOPIC_WATCH_SECONDS = 3.0  # after a broker restart: how long the lost topic must stay missing (no re-creation)
NETEM_DELAY_MS = 100
LOG_EXCERPT_LINES = 8
DOCS = ROOT / "docs" / "reliability.md"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(slots=True, kw_only=True)
class Injected:
    """A fault as it happened: the planned fault and the wall-clock times it began and ended."""

    fault: Fault
    started: dt.datetime | None = None
    healed: dt.datetime | None = None
    detail: str = ""
    state: dict[str, Any] = field(default_factory=dict)


class Run:
    """One chaos run: its hosts, servers, cluster and the rows of its report."""

    def __init__(self, *, profile: Profile, seed: int, one_host: bool, extra_env: dict[str, str], keep: bool) -> None:
        self.profile = profile
        self.seed = seed
        self.one_host = one_host
        self.extra_env = extra_env
        self.keep = keep
        self.tag = f"{os.getpid() % 65536:04x}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"stint-chaos-{self.tag}-"))
        self.failpoints = self.workdir / "failpoints"
        self.failpoints.mkdir()
        self.hosts: Hosts | None = None
        self.pg: Postgres | None = None
        self.redis: Redis | None = None
        self.broker: Broker | None = None
        self._holder: subprocess.Popen | None = None  # chaos.holder of partition-h3-long
        self._owner_id = 0  # the current scenario's user
        self.cluster: Cluster | None = None
        self.scanner: TopicScanner | None = None
        self._control: psycopg.Connection | None = None
        self._proxy: subprocess.Popen[bytes] | None = None
        self.restart_before_next = False  # set when a scenario failed
        self.db_url = ""

    # -- set-up and tear-down ----------------------------------------------------------------

    def setup(self) -> None:
        """Make the hosts, start the servers, migrate a fresh database, start the cluster and wait until it works."""
        ok, why = namespaces_possible()
        if self.one_host:
            ok, why = False, "--one-host"
        if ok:
            try:
                self.hosts = Hosts.create(self.tag)
            except HostsError as exc:
                self.hosts = Hosts.single(self.tag, f"namespaces failed: {exc}")
        else:
            self.hosts = Hosts.single(self.tag, why)
        say(self.hosts.describe())
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.pg = Postgres(self.hosts, self.workdir)
        self.pg.prepare()
        self.pg.start()
        self.redis = Redis(self.hosts, self.workdir)
        self.redis.start()
        self.broker = Broker(self.hosts, self.workdir)
        self.broker.start()
        with psycopg.connect(self.pg.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {DB_NAME}")
        self.db_url = self.pg.url.rsplit("/", 1)[0] + f"/{DB_NAME}"
        base = {
            "DATABASE_URL": self.db_url,
            "REDIS_URL": self.redis.url,
            "KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap,
            "KAFKA_TOPIC": TOPIC,
            "KAFKA_TOPIC_PARTITIONS": str(PARTITIONS),
            "KAFKA_AUDIT_GROUP": "chaos-audit",
            "STINT_EXTRA_APPS": "chaos",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "STINT_LEASE_SECONDS": str(plan.LEASE_SECONDS),
            "STINT_HEARTBEAT_SECONDS": str(plan.HEARTBEAT_SECONDS),
            "STINT_SHUTDOWN_GRACE_SECONDS": str(plan.GRACE_SECONDS),
            "STINT_POLL_SECONDS": "0.5",
            "STINT_OUTBOX_LOCK_HOLD_SECONDS": str(plan.OUTBOX_LOCK_HOLD_SECONDS),
            "STINT_AUDIT_RECONCILE_AFTER_SECONDS": str(plan.RECONCILE_AFTER_SECONDS),
            "STINT_RATE_LIMIT_USER": "1000000/min",
            "STINT_RATE_LIMIT_AUTH": "100000/min",
            "JWT_ACCESS_LIFETIME_SECONDS": "86400",
            "DEBUG": "false",
            "ALLOWED_HOSTS": "*",
            "LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update(base)
        os.environ.update(self.extra_env)
        import django

        django.setup()
        logging.getLogger().setLevel(logging.WARNING)  # LOG_LEVEL=INFO is for the cluster's processes
        from django.core.management import call_command

        from chaos.jobs import EFFECT_TABLE_DDL
        from chaos.snapshot import INSTRUMENTATION_DDL

        call_command("migrate", verbosity=0)
        conn = self.control()
        conn.execute(EFFECT_TABLE_DDL)
        conn.execute(INSTRUMENTATION_DDL)
        # Provisioned as a deployment does (`manage.py create_topics`): no Stint process creates it.
        call_command("create_topics", verbosity=0)
        env = {**os.environ, **base, **self.extra_env, "STINT_CHAOS_FAILPOINTS": str(self.failpoints)}
        self.cluster = Cluster(
            hosts=self.hosts,
            env=env,
            workdir=self.workdir,
            worker_slots=WORKER_SLOTS,
            worker_processes=self.profile.worker_processes,
            web_workers=self.profile.web_workers,
        )
        self.cluster.start()
        self.scanner = TopicScanner(bootstrap=self.broker.bootstrap, topic=TOPIC, partitions=PARTITIONS)
        self.scanner.start()
        self.wait_ready(timeout=120)
        say(f"cluster up: web {self.cluster.web_url}, logs in {self.workdir / 'logs'}")

    def wait_ready(self, timeout: float) -> None:
        """Wait until the web answers, two workers heartbeat and a warm-up job's events reached the audit table."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.cluster.web_url}/api/health", timeout=5).status_code < 600:
                    break
            except requests.RequestException:
                time.sleep(READY_POLL_SECONDS)
        from scheduler.enqueuing import enqueue

        while time.monotonic() < deadline:
            workers = self.scalar(
                "SELECT count(*) FROM stint_worker_node WHERE stopped_at IS NULL"
                " AND last_heartbeat_at > now() - interval '5 seconds'"
            )
            if workers and workers >= 2:
                break
            time.sleep(READY_POLL_SECONDS)
        job = enqueue("CHAOS", {"mode": "ok"}, name="warm-up")
        while time.monotonic() < deadline:
            events = self.scalar(
                "SELECT count(*) FROM stint_audit_event WHERE job_id = %s AND event_type = 'JOB_COMPLETED'", [job.id]
            )
            if events:
                return
            time.sleep(READY_POLL_SECONDS)
        raise RuntimeError(f"the cluster did not become ready within {timeout:.0f} s; see {self.workdir / 'logs'}")

    def teardown(self) -> None:
        """Stop everything this run started and delete its namespaces (always; best effort)."""
        for step in (
            lambda: self._proxy and self._proxy.kill(),
            self._stop_holder,
            lambda: self.scanner and self.scanner.stop(),
            lambda: self.cluster and self.cluster.stop(),
            lambda: self._control and self._control.close(),
            lambda: self.broker and self.broker.stop(),
            lambda: self.redis and self.redis.stop(),
            lambda: self.pg and self.pg.stop(),
            lambda: self.hosts and self.hosts.close(),
        ):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - tear-down goes on whatever failed before
                say(f"tear-down: {exc!r}")

    def discard_workdir(self) -> None:
        """Delete the work dir (data and logs)."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the control connection --------------------------------------------------------------

    def control(self) -> psycopg.Connection:
        """The runner's own autocommit connection (application_name chaos-control), opened if needed."""
        if self._control is None or self._control.closed or self._control.broken:
            self._control = psycopg.connect(
                self.db_url, autocommit=True, application_name="chaos-control", connect_timeout=5
            )
        return self._control

    def sql(self, fn: Any, *, tries: int = 120) -> Any:
        """Return ``fn(connection)``, reconnecting and retrying (each 0.5 s, ``tries`` times) while it is away."""
        for attempt in range(tries):
            try:
                return fn(self.control())
            except psycopg.OperationalError:
                with contextlib.suppress(Exception):
                    self._control.close()
                self._control = None
                if attempt == tries - 1:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def scalar(self, sql: str, params: list[Any] | None = None) -> Any:
        """First column of the first row of ``sql`` (None when there is no row)."""
        row = self.sql(lambda conn: conn.execute(sql, params or []).fetchone())
        return row[0] if row else None

    # -- one scenario ------------------------------------------------------------------------

    def run_scenario(self, scenario: Scenario) -> dict[str, Any]:
        """Run ``scenario`` and return its report row (also printed as a JSON line)."""
        from chaos.snapshot import backlog, collect

        faults = plan.fault_schedule(scenario.name, self.profile, self.seed)
        skip = self._cannot_run(scenario)
        if skip:
            return {"scenario": scenario.name, "summary": scenario.summary, "status": "not run", "reason": skip}
        self.ensure_healthy()
        owner_id, token = self.make_user(scenario.name)
        self._owner_id = owner_id
        window = max([self.profile.load_seconds, *(f.healed_at + 3.0 for f in faults)])
        storm = scenario.mix == "storm"
        rate = self.profile.storm_rate if storm else self.profile.enqueue_rate + self.profile.api_rate
        jobs = plan.job_mix(
            scenario.mix,
            int(rate * window),
            plan.rng_for(self.seed, "load", scenario.name, self.profile.name),
            api_share=0.0 if storm else self.profile.api_rate / rate,
        )
        schedules = self.create_schedules(owner_id, scenario.schedules)
        offsets = self.cluster.log_offsets()
        exits_before = self.cluster.unexpected_exits()
        repaired_before = self._repaired_total()
        load = Load(jobs=jobs, seconds=window, web_url=self.cluster.web_url, token=token, owner_id=owner_id)
        say(f"[{scenario.name}] {scenario.summary}: {len(jobs)} jobs over {window:.0f} s, {len(faults)} faults")
        injected = [Injected(fault=f) for f in faults]
        load.start()
        next_progress = time.monotonic()
        errors: list[str] = []
        while True:
            elapsed = time.monotonic() - load.t0
            for item in injected:
                if item.started is None and elapsed >= item.fault.at and self._may_inject(item, elapsed - window):
                    self._inject(item, errors)
                if (
                    scenario.released_while_cut
                    and item.started is not None
                    and item.healed is None
                    and "released" not in item.state
                    and elapsed >= item.fault.healed_at - RELEASE_CHECK_BEFORE_HEAL_SECONDS
                ):
                    item.state["released"] = self._released_while_cut(item, owner_id, errors)
                if item.started is not None and item.healed is None and elapsed >= item.fault.healed_at:
                    self._heal(item, errors)
            if time.monotonic() >= next_progress:
                next_progress += PROGRESS_SECONDS
                self._progress(scenario, load, injected, owner_id, elapsed)
            if elapsed >= window and all(i.healed is not None for i in injected):
                break
            time.sleep(0.05)
        load.join()
        if schedules:
            self._await_leader(scenario, injected)
        load_end = _now()
        disabled_at = self.disable_schedules(schedules)
        last_heal = max([load_end, *(i.healed for i in injected if i.healed)])
        bound = plan.recovery_bound(scenario.name, self.profile)
        recovery = self._settle(scenario, owner_id, last_heal, bound)
        repaired = self._repaired_total() - repaired_before
        errors += self._failpoint_errors(scenario, injected)
        self.scanner.catch_up(timeout=30)
        windows, dead = self._windows(injected)
        rows = [
            ScheduleRow(
                id=s_id,
                interval_seconds=plan.CRON_INTERVAL_SECONDS,
                policy=policy,
                first_fire=first,
                last_required=disabled_at - dt.timedelta(seconds=1),
            )
            for s_id, policy, first in schedules
        ]

        def read(conn: psycopg.Connection) -> Any:
            return collect(
                conn,
                owner_id=owner_id,
                created=set(load.created),
                kafka=self.scanner.snapshot(),
                schedules=rows,
                outage_windows=windows,
                dead_windows=dead,
                recovery_seconds=recovery,
                recovery_bound=bound,
                rescued_at_once=scenario.rescued_at_once,
                worker_kills=sum(
                    1
                    for i in injected
                    if i.fault.action == "sigkill"
                    and i.fault.target.startswith("worker@")
                    and i.detail.startswith("SIGKILL")
                ),
            )

        snap = self.sql(read)
        final_backlog = self.sql(lambda conn: backlog(conn, owner_id))
        snap.anomalies = list(load.anomalies)
        result = verdict(snap)
        exits = {
            name: n - exits_before.get(name, 0)
            for name, n in self.cluster.unexpected_exits().items()
            if n > exits_before.get(name, 0)
        }
        row = self._row(scenario, load, injected, snap, result, errors, recovery, final_backlog, offsets, window, exits)
        # Events the reconciler published again during the scenario (F5: lost by the broker after its ack).
        row["repaired_by_reconciler"] = repaired
        self.restart_before_next = row["status"] != "pass"
        return row

    def _start_holder(self, host: str) -> dict[str, str]:
        """Start ``chaos.holder`` on ``host`` for the current scenario's jobs; return job id -> row version locked."""
        env = dict(self.cluster.procs[f"scheduler@{host}"].env)
        self._holder = subprocess.Popen(  # noqa: S603 - our own module
            [*self.hosts.prefix(host), sys.executable, "-m", "chaos.holder", str(self._owner_id), str(HOLDER_JOBS)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=(self.workdir / "logs" / f"holder@{host}.log").open("ab"),
            start_new_session=True,
        )
        line = self._holder.stdout.readline() if self._holder.stdout else b""
        if not line:
            raise RuntimeError(f"chaos.holder on {host} locked nothing (exit {self._holder.poll()})")
        return json.loads(line)["locked"]

    def _stop_holder(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)

    def _released_while_cut(self, item: Injected, owner_id: int, errors: list[str]) -> dict[str, int]:
        """While host ``item.fault.target`` is still cut off, check that it holds nothing (finding F6).

        After ``plan.RELEASE_BOUND_SECONDS`` the server must have ended every transaction the host
        had open at the cut (keepalives, ``tcp_user_timeout``; config.db_session), releasing its
        row locks, so no job of the scenario may be due that long and unpromoted, nor RUNNING with
        a lease expired that long ago. Appends a violation to ``errors``; returns the counts.
        """
        bound = plan.RELEASE_BOUND_SECONDS
        locked = item.state.get("locked", {})
        row = self.sql(
            lambda conn: conn.execute(
                """
                SELECT
                  (SELECT count(*) FROM pg_stat_activity WHERE client_addr = %(host)s::inet
                     AND xact_start < now() - make_interval(secs => %(bound)s)),
                  (SELECT count(*) FROM stint_job WHERE owner_id = %(o)s AND status IN ('SCHEDULED', 'RETRYING')
                     AND scheduled_at < now() - make_interval(secs => %(bound)s)),
                  (SELECT count(*) FROM stint_job WHERE owner_id = %(o)s AND status = 'RUNNING'
                     AND lease_expires_at < now() - make_interval(secs => %(bound)s)),
                  (SELECT count(*) FROM stint_job j JOIN unnest(%(ids)s::uuid[], %(versions)s::text[]) l(id, version)
                     ON j.id = l.id WHERE j.xmin::text = l.version)
                """,
                {
                    "host": self.hosts.addresses[item.fault.target],
                    "bound": bound,
                    "o": owner_id,
                    "ids": list(locked),
                    "versions": list(locked.values()),
                },
            ).fetchone()
        )
        counts = {
            "open_transactions": row[0],
            "due_unpromoted": row[1],
            "expired_unrescued": row[2],
            "locked_jobs_unmoved": row[3],
        }
        say(f"  {item.fault.target} still cut off: held for over {bound:.0f} s: {counts}")
        if any(counts.values()):
            errors.append(f"{item.fault.target} cut off, yet after {bound:.0f} s still holding (F6): {counts}")
        return counts

    def _repaired_total(self) -> int:
        """Events the audit reconciler has marked for re-publication, in all (its checkpoint row's counter)."""
        value = self.scalar("SELECT coalesce(sum(repaired_total), 0) FROM stint_outbox_reconcile")
        return int(value or 0)

    def _await_leader(self, scenario: Scenario, injected: list[Injected]) -> None:
        """Keep the schedules running until a leader term began after the last fault and fired twice more.

        A failover takes up to the leadership TTL: disabling the schedules before it would hide
        whether the new leader fires what the misfire policy requires.
        """
        from chaos.snapshot import term_starts

        last = max((i.started for i in injected if i.started), default=None)
        if last is None:
            return
        deadline = time.monotonic() + plan.LEADER_TTL_SECONDS + 20
        while time.monotonic() < deadline:
            if any(at > last for at, _, _ in self.sql(term_starts)) or self.leader():
                break
            time.sleep(0.25)
        else:
            say(f"[{scenario.name}] no leader term began within {plan.LEADER_TTL_SECONDS + 20:.0f} s of the last fault")
        time.sleep(2 * plan.CRON_INTERVAL_SECONDS + 1)

    def _cannot_run(self, scenario: Scenario) -> str:
        if scenario.name == "partition-h3":
            return self.hosts.can_partition()
        if scenario.name == "latency":
            return self.hosts.can_delay()
        if scenario.skew and not faketime_available():
            return "libfaketime is not installed (apt-get install libfaketime)"
        return ""

    def ensure_healthy(self) -> None:
        """Heal links, resume or restart servers, run every process, clear failpoints; wait for two live workers."""
        from django.db import connection

        connection.close()  # the runner's Django connection may have died with a fault of the last scenario
        if self.restart_before_next:
            # The last scenario failed: a wedged process (e.g. a worker whose outcome flusher is stuck)
            # would carry its failure into this one. Start from fresh processes so each row is its own.
            say("  restarting every Stint process after a failed scenario")
            self.cluster.restart_all()
            self.restart_before_next = False
        self.hosts.heal()
        for server in (self.pg, self.redis, self.broker):
            server.resume()
            if not server.alive():
                server.start()
                if server is self.broker:  # memory storage: the topic went with it; provision it again
                    from scheduler.kafka import ensure_topic

                    ensure_topic(
                        bootstrap_servers=self.broker.bootstrap, topic=TOPIC, partitions=PARTITIONS, timeout=10
                    )
                    self.scanner.restart()
        for name in self.cluster.procs:
            self.cluster.hold(name, True)
        for path in self.failpoints.iterdir():
            path.unlink()
        self.cluster.wait_alive(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = self.scalar(
                "SELECT count(*) FROM stint_worker_node WHERE stopped_at IS NULL"
                " AND last_heartbeat_at > now() - interval '3 seconds'"
            )
            if live and live >= 2:
                return
            time.sleep(READY_POLL_SECONDS)
        say("warning: fewer than two live workers before the scenario")

    def make_user(self, name: str) -> tuple[int, str]:
        """Register the scenario's user over the API, log in, make it an ADMIN; return (id, access token).

        ADMIN, because USER schedules may get a minimum interval and the cron scenarios fire every 2 s.
        """
        from accounts.models import Role, User

        username = f"chaos-{name}-{self.seed}"
        password = secrets.token_urlsafe(18)
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.post(
                    f"{self.cluster.web_url}/api/auth/register",
                    json={"username": username, "password": password},
                    timeout=10,
                )
                if r.status_code in (200, 201):
                    r = requests.post(
                        f"{self.cluster.web_url}/api/auth/login",
                        json={"username": username, "password": password},
                        timeout=10,
                    )
                    if r.status_code == 200:
                        token = r.json()["access"]
                        break
                if r.status_code == 400 and User.objects.filter(username=username).exists():
                    User.objects.filter(username=username).delete()  # left by an interrupted scenario
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not register {username} through the API")
            time.sleep(1)
        user = User.objects.get(username=username)
        User.objects.filter(pk=user.pk).update(role=Role.ADMIN)
        return user.pk, token

    def create_schedules(self, owner_id: int, policies: tuple[str, ...]) -> list[tuple[int, str, dt.datetime]]:
        """Create one interval schedule per misfire policy; return (id, policy, first fire time)."""
        from scheduler.schedules import schedule_create

        made = []
        for policy in policies:
            s = schedule_create(
                owner=owner_id,
                name=f"chaos {policy}",
                interval_seconds=plan.CRON_INTERVAL_SECONDS,
                misfire_policy=policy,
                job={"type": plan.JOB_TYPE, "payload": {"mode": "ok", "cron": policy}, "max_retries": 3},
            )
            made.append((s.id, policy, s.next_fire_at))
        return made

    def disable_schedules(self, schedules: list[tuple[int, str, dt.datetime]]) -> dt.datetime:
        """Disable the scenario's schedules (no fire after this); return when."""
        from scheduler.schedules import schedule_update

        at = _now()
        for s_id, _, _ in schedules:
            for _ in range(60):
                try:
                    schedule_update(schedule_id=s_id, changes={"enabled": False})
                    break
                except Exception:  # noqa: BLE001 - the database may still be recovering from the fault
                    from django.db import connection

                    connection.close()
                    time.sleep(0.5)
        return at

    def _progress(
        self, scenario: Scenario, load: Load, injected: list[Injected], owner_id: int, elapsed: float
    ) -> None:
        from chaos.snapshot import backlog

        if self.pg.paused:  # a query would wait for the heal, and so would this loop, which heals
            shown = "database frozen"
        else:
            try:
                b = self.sql(lambda conn: backlog(conn, owner_id), tries=1)
                shown = f"unfinished={b['unfinished']} unpublished={b['unpublished']} unaudited={b['unaudited']}"
            except psycopg.Error:
                shown = "database unreachable"
        faults = sum(1 for i in injected if i.started is not None)
        say(
            f"[{scenario.name}] t={elapsed:5.1f}s offered={load.offered} created={len(load.created)} "
            f"faults={faults}/{len(injected)} backlog {shown}"
        )

    def _settle(self, scenario: Scenario, owner_id: int, last_heal: dt.datetime, bound: float) -> float | None:
        """Wait until the backlog drained (bounded by ``bound`` s after the last heal); return the seconds it took."""
        from chaos.snapshot import backlog

        limit = time.monotonic() + bound + 5
        next_progress = time.monotonic() + PROGRESS_SECONDS
        while time.monotonic() < limit:
            try:
                b = self.sql(lambda conn: backlog(conn, owner_id), tries=1)
            except psycopg.Error:
                b = {"unfinished": -1}
            if not any(b.values()):
                return round((_now() - last_heal).total_seconds(), 1)
            if time.monotonic() >= next_progress:
                next_progress += PROGRESS_SECONDS
                say(f"[{scenario.name}] settling: {b}")
            time.sleep(0.25)
        return None

    # -- faults ------------------------------------------------------------------------------

    def _victim(self, name: str) -> tuple[int, str]:
        """The worker process of supervisor ``name`` to hit: one that holds leases of RUNNING jobs ("mid-job").

        Chosen with the run's seed among the supervisor's worker processes (``Proc.worker_children``),
        preferring those whose id (``hostname:pid:token``) holds the most RUNNING leases of jobs that
        will still be running in ``MID_JOB_MARGIN_SECONDS`` (by their payload's ``sleep``): a lease of
        a quick job, read a moment before the kill, was often over by then, and the kill hit no job
        (a smoke run in CI had no LOST attempt). Raises RuntimeError when the supervisor has no
        worker process.
        """
        proc = self.cluster.procs[name]
        children = proc.worker_children()
        if not children:
            raise RuntimeError(f"{name} (pid {proc.pid}) has no worker process")
        deadline = time.monotonic() + VICTIM_WAIT_SECONDS
        while True:  # "mid-job": wait a moment for one of them to hold a job
            held = dict(
                self.sql(
                    lambda conn: conn.execute(
                        "SELECT split_part(lease_owner, ':', 2)::int, count(*) FROM stint_job"
                        " WHERE status = 'RUNNING' AND lease_owner <> ''"
                        "   AND started_at + make_interval(secs => coalesce((payload->>'sleep')::float, 0))"
                        "       > clock_timestamp() + make_interval(secs => %s)"
                        " GROUP BY 1",
                        [MID_JOB_MARGIN_SECONDS],
                    ).fetchall()
                )
            )
            most = max(held.get(c.pid, 0) for c in children)
            if most or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
            children = proc.worker_children() or children
        pool = [c for c in children if held.get(c.pid, 0) == most]
        pick = random.Random(self.seed + len(proc.exits) + proc.starts).choice(pool)  # noqa: S311
        return pick.pid, f"{name} worker process {pick.pid} ({most} jobs mid-run)"

    def leader(self) -> str:
        """The name of the scheduler process that holds cron leadership (by the fence's holder), or ""."""
        holder = self.scalar("SELECT holder FROM stint_leader_fence WHERE role = 'cron'") or ""
        parts = holder.rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit():
            proc = self.cluster.by_pid(int(parts[1]))
            if proc is not None and proc.name.startswith("scheduler@") and proc.alive():
                return proc.name
        return ""

    def _inject(self, item: Injected, errors: list[str]) -> None:
        f = item.fault
        item.started = _now()
        try:
            item.detail = self._do_inject(item)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected fails the scenario
            errors.append(f"could not inject {f.action} {f.target}: {exc!r}")
            item.detail = f"FAILED: {exc!r}"
        say(f"  fault at {f.at:.1f}s: {item.detail}")
        if f.hold == 0 and item.healed is None:
            item.healed = _now()

    def _may_inject(self, item: Injected, past_window: float) -> bool:
        """False while ``item`` is a failpoint whose earlier arming no process has reached yet.

        Arming is a file (``chaos.failpoints``): arming it again before a process took it would
        leave one file for two faults, reported as "armed 2 times, reached 1 times" (seen when the
        restarted audit consumer waited for its group's session timeout past both armings). So a
        second arming waits for the first to be taken, at most until the recovery bound has
        passed after the load window (``past_window``: seconds since the window ended, negative
        inside it); then it is armed anyway, and a failpoint never reached fails the scenario.
        """
        if item.fault.action != "failpoint" or not (self.failpoints / item.fault.target).exists():
            return True
        return past_window >= self.profile.recovery_bound_seconds

    def _do_inject(self, item: Injected) -> str:
        f, c = item.fault, self.cluster
        if f.target.startswith("worker@"):
            proc = c.procs[f.target]
            if f.action == "sigkill":
                pid, who = self._victim(f.target)
                os.kill(pid, signal.SIGKILL)  # its supervisor replaces it and rescues its jobs at once
                return f"SIGKILL {who}"
            if f.action == "sigstop":
                # The host's whole run_workers (supervisor, worker processes, pool children: its
                # session, as their process groups are their own), as a paused VM or
                # container: their leases expire, another host's rescuer acts, and what they report
                # after SIGCONT is fenced off. A worker process stopped alone is killed by its live
                # supervisor after a lease (Supervisor._kill_frozen, tests/e2e/test_supervisor.py).
                _, who = self._victim(f.target)  # wait for one of them to hold a job (mid-job)
                proc.signal_session(signal.SIGSTOP)
                item.state["group"] = f.target
                return f"SIGSTOP every process of {f.target} (supervisor pid {proc.pid}; {who}) for {f.hold:.0f} s"
            if f.action == "sigterm":
                proc.signal(signal.SIGTERM)  # the supervisor drains its processes, then hands back
                return f"SIGTERM supervisor {f.target} pid {proc.pid}"
            if f.action == "sigterm-group":
                # A process manager stopping the unit signals the whole group, twice when impatient:
                # the workers ignore it, the supervisor drains on the first and hands back on the second.
                proc.signal_session(signal.SIGTERM)
                time.sleep(0.5)
                proc.signal_session(signal.SIGTERM)
                return f"SIGTERM x2 to every process of {f.target} (supervisor pid {proc.pid})"
        if f.target == "scheduler@leader":
            name = self.leader()
            if not name:
                raise RuntimeError("no live scheduler holds the leader fence")
            proc = c.procs[name]
            if f.action == "sigkill":
                proc.signal(signal.SIGKILL)
                return f"SIGKILL leader {name} pid {proc.pid}"
            item.state["pid"] = proc.pid
            os.kill(proc.pid, signal.SIGSTOP)
            return f"SIGSTOP leader {name} pid {proc.pid} for {f.hold:.0f} s"
        if f.target == "scheduler@all":
            for name in ("scheduler@h2", "scheduler@h3"):
                c.hold(name, False)
                c.procs[name].signal(signal.SIGTERM)
            for name in ("scheduler@h2", "scheduler@h3"):
                with contextlib.suppress(Exception):
                    c.procs[name].popen.wait(timeout=30)
            return f"every scheduler stopped (SIGTERM) for {f.hold:.0f} s"
        if f.target == "postgres" and f.action == "restart":
            started = time.monotonic()
            self.pg.restart_immediate()
            return f"PostgreSQL immediate stop + start (down {time.monotonic() - started:.1f} s)"
        if f.target == "postgres" and f.action == "sigstop":
            self.pg.pause()
            return f"PostgreSQL postmaster and every backend SIGSTOPped for {f.hold:.0f} s"
        if f.target == "postgres":
            n = self.scalar(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE backend_type = 'client backend'"
                " AND pid <> pg_backend_pid() AND application_name <> 'chaos-control'"
            )
            return f"pg_terminate_backend of {n} client connections"
        if f.target == "redis" and f.action == "down":
            self.redis.kill()
            return f"Redis SIGKILL, down {f.hold:.0f} s"
        if f.target == "redis":
            self.redis.flushall()
            return "Redis FLUSHALL"
        if f.target == "broker" and f.action == "sigstop":
            self.broker.pause()
            return f"broker SIGSTOP for {f.hold:.0f} s"
        if f.target == "broker":
            self.broker.kill()
            return f"broker SIGKILL, restarted after {f.hold:.0f} s"
        if f.action == "failpoint":
            (self.failpoints / f.target).touch()
            item.state["armed"] = f.target
            return f"failpoint {f.target} armed"
        if f.action == "partition-held":
            item.state["locked"] = self._start_holder(f.target)
            self.hosts.partition(f.target)
            how = f"{self.hosts.iptables} DROP" if self.hosts.iptables else "netem 100% loss"
            return (
                f"{f.target} cut off from the db host ({how}, both ways) for {f.hold:.0f} s while a process there"
                f" holds {len(item.state['locked'])} jobs locked in an open transaction"
            )
        if f.action == "partition":
            self.hosts.partition(f.target)
            how = f"{self.hosts.iptables} DROP" if self.hosts.iptables else "netem 100% loss"
            return f"{f.target} cut off from the db host ({how}, both ways) for {f.hold:.0f} s"
        if f.action == "netem-delay" and self.hosts.netem:
            self.hosts.delay_all(NETEM_DELAY_MS)
            return f"netem delay {NETEM_DELAY_MS} ms on every host for {f.hold:.0f} s"
        if f.action == "netem-delay":
            self._start_link_proxy()
            return (
                f"{NETEM_DELAY_MS} ms each way on every process's PostgreSQL and Redis link (link proxy: this"
                f" kernel has no sch_netem) for {f.hold:.0f} s"
            )
        if f.action == "skew":
            c.restart("scheduler@h3", extra_env=skew_env("+5m"))
            c.restart("worker@h3", extra_env=skew_env("-5m"))
            return "h3 scheduler at +5 min, h3 worker at -5 min"
        raise ValueError(f"unknown fault {f.action} {f.target}")

    def _heal(self, item: Injected, errors: list[str]) -> None:
        f, c = item.fault, self.cluster
        try:
            if f.action == "sigstop" and "group" in item.state:
                c.procs[item.state["group"]].signal_session(signal.SIGCONT)
            elif f.action == "sigstop" and "pid" in item.state:
                os.kill(item.state["pid"], signal.SIGCONT)
            elif f.target == "scheduler@all":
                for name in ("scheduler@h2", "scheduler@h3"):
                    c.hold(name, True)
            elif f.target == "redis" and f.action == "down":
                self.redis.start()
            elif f.target == "broker" and f.action == "sigstop":
                self.broker.resume()
            elif f.target == "postgres" and f.action == "sigstop":
                self.pg.resume()
            elif f.target == "broker" and f.action == "restart":
                self.broker.start()
                self._provision_lost_topic(errors)
            elif f.action == "netem-delay" and self._proxy is not None:
                self._stop_link_proxy()
            elif f.action in ("partition", "partition-held", "netem-delay"):
                self.hosts.heal()
                self._stop_holder()
            elif f.action == "skew":
                c.restart("scheduler@h3", extra_env={})
                c.restart("worker@h3", extra_env={})
        except Exception as exc:  # noqa: BLE001
            errors.append(f"could not heal {f.action} {f.target}: {exc!r}")
        item.healed = _now()
        if f.hold:
            say(f"  healed at {f.healed_at:.1f}s: {f.action} {f.target}")

    def _provision_lost_topic(self, errors: list[str]) -> None:
        """After a broker that lost its log came back: check that nobody re-created the topic, then provision it.

        The in-memory broker lost the topic. Stint must never re-create a lost topic by itself
        (finding F7): the relays keep probing meanwhile, so after ``TOPIC_WATCH_SECONDS`` the topic
        must still be missing. Then the harness does what an operator does once the loss is
        understood: ``manage.py create_topics``' ``ensure_topic``. The running audit consumer is
        not restarted: it must get the provisioned topic's partitions by itself (finding F8).
        """
        from confluent_kafka.admin import AdminClient

        from scheduler.kafka import ensure_topic, topic_exists

        time.sleep(TOPIC_WATCH_SECONDS)
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        if topic_exists(admin, TOPIC, timeout=10):
            errors.append(f"topic {TOPIC} was re-created by a Stint process after the broker lost it (F7)")
        ensure_topic(bootstrap_servers=self.broker.bootstrap, topic=TOPIC, partitions=PARTITIONS, timeout=10)
        self.scanner.restart()
        say(f"  topic {TOPIC} provisioned again after {TOPIC_WATCH_SECONDS:.0f} s (the audit consumer keeps running)")

    def _start_link_proxy(self) -> None:
        """Route every Stint process's PostgreSQL and Redis traffic through a proxy that delays each byte.

        The proxy listens on the bridge (reachable from h2 and h3) and forwards to the db host;
        each process restarts with URLs that point at it. Kafka is not delayed: its clients
        connect to the address the broker advertises, which is the broker's own.
        """
        bridge = self.hosts.bridge_address
        routes = [
            f"{bridge}:15432={self.pg.address}:{self.pg.port}",
            f"{bridge}:16379={self.redis.address}:{self.redis.port}",
        ]
        log = (self.workdir / "logs" / "linkproxy.log").open("ab")
        self._proxy = subprocess.Popen(
            [sys.executable, "-m", "chaos.linkproxy", "--delay-ms", str(NETEM_DELAY_MS), *routes],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        self._proxy.stdout.readline()  # "ready"
        via = {
            "DATABASE_URL": f"postgres://postgres@{bridge}:15432/{DB_NAME}",
            "REDIS_URL": f"redis://{bridge}:16379/0",
        }
        for name in self.cluster.procs:
            self.cluster.restart(name, extra_env=via)

    def _stop_link_proxy(self) -> None:
        """Restart every process on the direct links, then stop the proxy."""
        for name in self.cluster.procs:
            self.cluster.restart(name, extra_env={})
        proxy, self._proxy = self._proxy, None
        proxy.terminate()
        proxy.wait(timeout=10)

    def _failpoint_errors(self, scenario: Scenario, injected: list[Injected]) -> list[str]:
        """A failpoint that was missing or never reached means the scenario did not test what it says."""
        errors = []
        for path in self.failpoints.glob("missing-*"):
            errors.append(f"failpoint {path.name[8:]} could not be installed: {path.read_text().strip()}")
        armed = [i for i in injected if "armed" in i.state]
        taken = list(self.failpoints.glob(f"{scenario.failpoint}.taken.*")) if scenario.failpoint else []
        for i in armed:
            i.state["fired"] = False
        for i, _ in zip(armed, taken, strict=False):
            i.state["fired"] = True
        if armed and len(taken) < len(armed):
            errors.append(f"failpoint {scenario.failpoint} armed {len(armed)} times, reached {len(taken)} times")
        return errors

    def _windows(self, injected: list[Injected]) -> tuple[list, list]:
        """Outage windows (a fault to the first leadership term after it) and dead windows (no scheduler at all)."""
        from chaos.snapshot import term_starts

        terms = self.sql(term_starts)
        windows, dead = [], []
        for item in injected:
            if item.started is None:
                continue
            healed = item.healed or item.started
            after = [at for at, _, _ in terms if at > item.started]
            end = max(healed, after[0]) if after else healed
            windows.append((item.started, end))
            if item.fault.target == "scheduler@all":
                dead.append((item.started, next((at for at in after if at >= healed), healed)))
        return windows, dead

    # -- reporting ---------------------------------------------------------------------------

    def _row(
        self, scenario, load, injected, snap, result: Verdict, errors, recovery, final_backlog, offsets, window, exits
    ):
        from collections import Counter

        states = Counter(j.status for j in snap.jobs.values())
        attempt_states = Counter(a.status for a in snap.attempts)
        kafka_copies = Counter(snap.kafka.values())
        passed = result.passed and not errors
        row = {
            "scenario": scenario.name,
            "summary": scenario.summary,
            "status": "pass" if passed else "FAIL",
            "seed": self.seed,
            "profile": self.profile.name,
            "hosts": "3 namespaces" if self.hosts.isolated else "one host",
            "load_seconds": round(window, 1),
            "offered": load.stats["offered"],
            "created": len(load.created),
            "jobs_in_db": len(snap.jobs),
            "load_stats": dict(sorted(load.stats.items())),
            "faults": [
                {
                    "at": i.fault.at,
                    "action": i.fault.action,
                    "target": i.fault.target,
                    "hold": i.fault.hold,
                    "detail": i.detail,
                    **({"fired": i.state["fired"]} if "fired" in i.state else {}),
                    **({"held_after_bound": i.state["released"]} if "released" in i.state else {}),
                }
                for i in injected
            ],
            "faults_injected": sum(
                1 for i in injected if i.started and not i.detail.startswith("FAILED") and i.state.get("fired", True)
            ),
            "lost": result.lost,
            "duplicates": result.duplicates,
            "audit_gaps": result.audit_gaps,
            "duplicate_fires": result.duplicate_fires,
            "recovery_s": recovery,
            "recovery_bound_s": snap.recovery_bound,
            "final_states": dict(sorted(states.items())),
            "attempts": dict(sorted(attempt_states.items())),
            "kafka_copies_per_event": {str(k): v for k, v in sorted(kafka_copies.items())},
            "cron_fires": sum(1 for j in snap.jobs.values() if j.schedule_id is not None),
            # Jobs whose own plan says SUCCESS that ended DEAD: their budget went to attempts lost to
            # faults (the crash policy counts a LOST attempt; I3 checks each ended as the policy says).
            "dead_by_lost_attempts": sum(
                1
                for j in snap.jobs.values()
                if j.status == "DEAD" and plan.expected_status(j.payload, j.max_retries) == "SUCCESS"
            ),
            "final_backlog": final_backlog,
            # Exits the runner did not cause with a signal (a failpoint's SIGKILL counts here too).
            "process_exits_not_by_runner": exits,
            "failed_invariants": result.failed,
            "violations": result.violations,
            "errors": errors,
        }
        if not passed:
            row["log_excerpts"] = self.log_excerpts(offsets)
        return row

    def log_excerpts(self, offsets: dict[str, int]) -> dict[str, list[str]]:
        """Warning, error and traceback lines each process logged during the scenario (a few per process)."""
        out = {}
        for name, proc in self.cluster.procs.items():
            try:
                with proc.log_path.open("rb") as fh:
                    fh.seek(offsets.get(name, 0))
                    lines = fh.read().decode(errors="replace").splitlines()
            except OSError:
                continue
            picked = [
                line[:300]
                for line in lines
                if any(k in line for k in (" ERROR ", " WARNING ", "Traceback", "Error:", "--- chaos"))
            ]
            if picked:
                out[name] = picked[:LOG_EXCERPT_LINES] + (
                    [f"... {len(picked) - LOG_EXCERPT_LINES} more"] if len(picked) > LOG_EXCERPT_LINES else []
                )
        return out


def say(text: str) -> None:
    """Progress on stderr (stdout holds the table and the JSON lines)."""
    print(text, file=sys.stderr, flush=True)


def fault_label(row: dict[str, Any]) -> str:
    """The table's "faults injected" cell: count and a short description."""
    faults = row.get("faults", [])
    if not faults:
        return "load only"
    kinds = sorted({f"{f['action']} {f['target']}" for f in faults})
    return f"{row['faults_injected']}: " + ", ".join(kinds)


def table(rows: list[dict[str, Any]]) -> str:
    """The report table (Markdown)."""
    head = (
        "| scenario | load | faults injected | lost | duplicates | audit gaps | duplicate fires | recovery | result |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        if r["status"] == "not run":
            lines.append(f"| {r['scenario']} | | | | | | | | not run: {r['reason']} |")
            continue
        recovery = f"{r['recovery_s']} s" if r["recovery_s"] is not None else f"> {r['recovery_bound_s']:.0f} s"
        if r.get("repaired_by_reconciler"):
            recovery += f" ({r['repaired_by_reconciler']} repaired)"
        failed = ", ".join(r["failed_invariants"] + (["fault"] if r["errors"] else []))
        lines.append(
            f"| {r['scenario']} | {r['created']} jobs / {r['load_seconds']:.0f} s | {fault_label(r)} | {r['lost']} | "
            f"{r['duplicates']} | {r['audit_gaps']} | {r['duplicate_fires']} | {recovery} | "
            f"{'pass' if r['status'] == 'pass' else 'FAIL ' + failed} |"
        )
    return "\n".join(lines)


NOTES = """Load is the jobs created (2xx from the API, or returned by `enqueue_many`) over the load window;
faults injected counts the faults that took effect. Recovery is from the later of the last heal and
the end of the load to the moment every job of the scenario was finished and every one of its events
published and in the audit table (bound: 60 s in the short profile; in `broker-restart` at least the
reconciler's grace plus 30 s, `chaos.plan.recovery_bound`); "repaired" counts the events the audit
reconciler published again meanwhile. Where the kernel has no
`sch_netem` (this machine), the partition uses iptables DROP rules and the latency scenario a link
proxy (`chaos/linkproxy.py`) for PostgreSQL and Redis traffic. After a failed scenario every Stint
process is restarted, so each row stands on its own. JSON lines with every figure, the violations
and log excerpts are printed on stdout with the table."""


def write_docs(path: Path, rows: list[dict[str, Any]], *, command: str, hosts: str, started: dt.datetime) -> None:
    """Write the table, what each scenario does and the command that produced it to ``path``."""
    body = [
        "# Reliability: `make chaos`",
        "",
        "The fault-injection suite (`chaos/`) starts a real Stint cluster, drives load through the REST API and",
        "`scheduler.enqueue_many`, injects faults with a fixed seed, lets the system settle and checks the",
        "invariants I1-I8 (see `chaos/invariants.py`) with SQL and a scan of the Kafka topic. Findings and their",
        "evidence: [chaos-findings.md](chaos-findings.md).",
        "",
        f"Run of {started:%Y-%m-%d %H:%M} UTC ({(_now() - started).total_seconds() / 60:.0f} minutes) on {hosts}.",
        "The machine has 2 cores shared with other work: recovery times are noisy.",
        "",
        table(rows),
        "",
        NOTES,
        "",
        "| scenario | what it does |",
        "|---|---|",
        *(f"| {s.name} | {s.summary} |" for s in plan.SCENARIOS),
        "",
        "Produced by:",
        "",
        "```sh",
        command,
        "```",
        "",
    ]
    path.write_text("\n".join(body))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of ``python -m chaos``."""
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=sorted(plan.PROFILES), default="short")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault schedule and the job mix (default 1)")
    p.add_argument("--scenario", action="append", default=[], help="run only this scenario (repeatable)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--one-host", action="store_true", help="do not make network namespaces")
    p.add_argument("--keep", action="store_true", help="keep the work dir (data, logs) even when every scenario passed")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra setting for every process")
    p.add_argument(
        "--docs", type=Path, default=None, help=f"write the table here (default {DOCS.relative_to(ROOT)} on a full run)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the selected scenarios; print the table and one JSON line each; return 0 when all passed."""
    args = parse_args(argv)
    if args.list:
        for s in plan.SCENARIOS:
            print(f"{s.name:26} {s.summary}")
        return 0
    try:
        selected = [plan.scenario(n) for n in args.scenario] or list(plan.SCENARIOS)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    extra = dict(item.split("=", 1) for item in args.env if "=" in item)
    logging.basicConfig(level=logging.WARNING, format="chaos: %(message)s", stream=sys.stderr)
    run = Run(
        profile=plan.PROFILES[args.profile], seed=args.seed, one_host=args.one_host, extra_env=extra, keep=args.keep
    )

    def interrupted(signum: int, _frame: Any) -> None:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=False)
        raise KeyboardInterrupt(f"signal {signum}")

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    signal.signal(signal.SIGTERM, interrupted)
    started = _now()
    rows: list[dict[str, Any]] = []
    code = 0
    try:
        run.setup()
        for s in selected:
            row = run.run_scenario(s)
            rows.append(row)
            print(json.dumps(row, default=str, sort_keys=True), flush=True)
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
        code = 130
    except Exception:
        logger.exception("the run failed")
        code = 1
    finally:
        run.teardown()
    if rows:
        print(f"{run.profile.name} profile, seed {run.seed}, {run.hosts.describe()}", flush=True)
        print(table(rows), flush=True)
    failed = [r for r in rows if r["status"] == "FAIL"]
    if failed or code or args.keep:
        say(f"work dir kept (data and logs): {run.workdir}")
    else:
        run.discard_workdir()
    command = "make chaos" + (
        f' ARGS="{" ".join(argv if argv is not None else sys.argv[1:])}"' if (argv or sys.argv[1:]) else ""
    )
    docs = args.docs or (DOCS if not args.scenario and code == 0 else None)
    if docs is not None and rows:
        write_docs(docs, rows, command=command, hosts=run.hosts.describe() if run.hosts else "?", started=started)
        say(f"table written to {docs}")
    if code:
        return code
    return 1 if failed else 0
