"""Cron failover with real processes: three ``manage.py run_scheduler`` while the leader is SIGKILLed.

Two 1-second interval schedules fire all along: ``catch_up`` (every fire time must exist exactly
once, failovers included) and ``skip`` (at most one catch-up fire per failover). Every
``KILL_EVERY`` seconds the test reads the leader's pid from the database fence, kills it with
SIGKILL and starts a replacement, so three processes always run. The fence row is polled to
record each term's token and start (its ``updated_at`` is the database time of the claim).

The schedulers run with ``--leader-ttl-seconds 3`` (the default is 10 s), so a failover takes
about 3 s and the suite runs about 18 s (``STINT_CRON_FAILOVER_SECONDS``, default 18: two kills);
the issue's full scenario is ``STINT_CRON_FAILOVER_SECONDS=180 STINT_CRON_FAILOVER_KILL_EVERY=15
pytest tests/e2e/test_cron_failover.py -s``.
Durations (failover times against TTL + tick) are measured and printed as JSON, not asserted.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.db import connection
from django_redis import get_redis_connection

from scheduler import schedules
from scheduler.leadership import lock_key, token_key
from scheduler.models import Job
from tests.support.factories import UserFactory
from tests.support.subprocess_env import database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
DURATION = float(os.environ.get("STINT_CRON_FAILOVER_SECONDS", "18"))  # seconds of steady state and kills
KILL_EVERY = float(os.environ.get("STINT_CRON_FAILOVER_KILL_EVERY", "7"))  # seconds
PROCESSES = 3
FIRST_KILL = 4.0  # seconds after the first leader appears
TICK = 0.2  # seconds, run_scheduler --tick-seconds
TTL = 3.0  # seconds, run_scheduler --leader-ttl-seconds
READY_WAIT = 60.0  # seconds for the first leader (process start-up on a busy machine)
POLL = 0.1  # seconds between fence reads
ENV = {
    "LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
    # No Kafka here: keep the outbox relay from probing the broker (2 s) on every retry.
    "STINT_OUTBOX_RELAY_INTERVAL_SECONDS": "3600",
}


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def fence() -> tuple[int, str, dt.datetime] | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT token, holder, updated_at FROM stint_leader_fence WHERE role = 'cron'")
        return cursor.fetchone()


@dataclass
class Schedulers:
    """The run_scheduler processes of one test; all are stopped (and their group killed) at the end."""

    tmp_path: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def start(self) -> subprocess.Popen:
        log = self.tmp_path / f"scheduler-{len(self.procs):02d}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "run_scheduler", f"--tick-seconds={TICK}", f"--leader-ttl-seconds={TTL}"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def stop_all(self) -> None:
        for proc in self.running():
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # a group we started: leftovers only
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=10)

    def report(self) -> str:
        return "\n".join(
            f"----- {log.name} pid {proc.pid} exit {proc.returncode} -----\n{log.read_text(errors='replace')[-4000:]}"
            for proc, log in zip(self.procs, self.logs, strict=True)
        )


@pytest.fixture
def schedulers(transactional_db: None, tmp_path: Path) -> Iterator[Schedulers]:
    redis = get_redis_connection("default")
    redis.delete(lock_key("cron"), token_key("cron"))  # a clean election in our Redis database
    group = Schedulers(tmp_path=tmp_path, env={**os.environ, **ENV, "DATABASE_URL": database_url()})
    try:
        yield group
    finally:
        group.stop_all()
        sys.stderr.write(group.report() + "\n")
        redis.delete(lock_key("cron"), token_key("cron"))


def test_every_fire_time_exists_exactly_once_while_leaders_are_killed(schedulers):
    user = UserFactory(admin=True)  # an ADMIN's schedule may fire every second (a USER's once a minute)
    job = {"type": "DEMO_TASK", "payload": {}}
    every = schedules.schedule_create(
        owner=user, name="catch-up", interval_seconds=1, misfire_policy="catch_up", job=job
    )
    skip = schedules.schedule_create(owner=user, name="skip", interval_seconds=1, misfire_policy="skip", job=job)
    for _ in range(PROCESSES):
        schedulers.start()

    terms: dict[int, dt.datetime] = {}  # token -> database time its term was claimed
    kills: list[dict[str, object]] = []

    def poll(until: float) -> None:
        while time.monotonic() < until:
            row = fence()
            if row is not None and row[0] not in terms:
                terms[row[0]] = row[2]
            time.sleep(POLL)

    deadline = time.monotonic() + READY_WAIT
    while not terms and time.monotonic() < deadline:
        poll(time.monotonic() + 0.5)
    assert terms, "no scheduler became leader\n" + schedulers.report()

    # Kill at FIRST_KILL, then every KILL_EVERY, as long as the failover completes within DURATION.
    started = time.monotonic()
    offsets = [FIRST_KILL + k * KILL_EVERY for k in range(int(DURATION // KILL_EVERY) + 1)]
    for offset in [o for o in offsets if o + TTL + 2 <= DURATION]:
        poll(started + offset)
        token, holder, _ = fence()
        pid = int(holder.split(":")[1])
        assert pid in [p.pid for p in schedulers.running()], f"leader {holder} is not one of ours"
        os.kill(pid, signal.SIGKILL)
        kills.append({"token": token, "pid": pid, "at": db_now()})
        schedulers.start()
    poll(started + DURATION)
    schedulers.stop_all()

    rows = list(
        Job.objects.filter(schedule_id__in=[every.id, skip.id])
        .order_by("fire_time")
        .values_list("schedule_id", "fire_time", "created_at")
    )
    catch_up_fires = [f for s, f, _ in rows if s == every.id]
    skip_rows = [(f, c) for s, f, c in rows if s == skip.id]

    # No fire time twice (the unique key), and with catch_up none missing from first to last.
    assert not [f for f, n in Counter(catch_up_fires).items() if n > 1]
    assert not [f for f, n in Counter(f for f, _ in skip_rows).items() if n > 1]
    span = int((catch_up_fires[-1] - catch_up_fires[0]).total_seconds()) + 1
    expected = [catch_up_fires[0] + dt.timedelta(seconds=k) for k in range(span)]
    assert catch_up_fires == expected, f"missing: {sorted(set(expected) - set(catch_up_fires))}"
    assert len(kills) >= 2
    assert len(terms) >= len(kills) + 1

    # skip: a fire due before the term that created it began is a catch-up; at most one per term.
    starts = sorted(terms.values())

    def term_of(created: dt.datetime) -> dt.datetime:
        return max(s for s in starts if s <= created)

    catch_ups = Counter(term_of(c) for f, c in skip_rows if f < term_of(c))
    assert all(n <= 1 for n in catch_ups.values()), catch_ups
    first_after_kill = [min(s for s in starts if s > k["at"]) for k in kills]
    assert all(catch_ups[s] == 1 for s in first_after_kill), "each failover fires its latest missed time once"

    failovers = [(s - k["at"]).total_seconds() for s, k in zip(first_after_kill, kills, strict=True)]
    summary = {
        "duration_s": DURATION,
        "kills": len(kills),
        "terms": len(terms),
        "catch_up_fires": len(catch_up_fires),
        "skip_fires": len(skip_rows),
        "skip_catch_up_fires_per_failover": [catch_ups[s] for s in first_after_kill],
        "failover_s": [round(x, 3) for x in failovers],
        "failover_max_s": round(max(failovers), 3),
        "bound_s": TTL + TICK,
    }
    print("cron failover:", json.dumps(summary))  # noqa: T201 - shown with -s: the measurement
