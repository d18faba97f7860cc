"""`python bench/cron_bench.py`: how late 10,000 schedules due in the same minute become jobs; prints JSON.

Usage: python bench/cron_bench.py [--schedules N] [--mode process|inprocess] [--batch-size N] [--lead S]

Creates the database ``stint_bench_cron`` next to DATABASE_URL's (dropping an old one) and
``--schedules`` enabled schedules (a mix of cron expressions, zones and interval schedules, all
due at the same minute M, at least ``--lead`` seconds away), then waits for them to fire:

- ``process`` (default): one real ``manage.py run_scheduler`` (the leader) fires them;
- ``inprocess``: a ``CronFirer`` in this process runs every 0.5 s like the scheduler's loop
  (``--batch-size`` tunes it).

Prints one JSON line with, from the database clock, ``all_materialized_after_due_s`` (when the
last of the jobs became visible, minus M: the issue's figure, to be under 2 s), the spread of the
jobs' ``created_at`` (firing transactions' start) after M, and integrity counts (jobs per
schedule, duplicates). Redis is the one in REDIS_URL; its ``cron`` lock is cleared first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.event_stack import fresh_database  # noqa: E402 - after the path is set

BENCH_DB = "stint_bench_cron"
GOAL_SECONDS = 2.0  # the bound on due-to-materialized
ZONES = ["UTC", "Europe/London", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Asia/Kathmandu"]


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=10_000, help="schedules due in the same minute")
    parser.add_argument("--mode", choices=["process", "inprocess"], default="process")
    parser.add_argument("--batch-size", type=int, default=None, help="inprocess: schedules per transaction")
    parser.add_argument("--lead", type=float, default=10.0, help="minimum seconds between setup and M")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up this long after M")
    parser.add_argument("--log", type=Path, default=None, help="append run_scheduler's output here")
    return parser.parse_args()


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def scalar(sql: str, params: list | None = None):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def scalar_row(sql: str, params: list | None = None) -> tuple:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()


def seed(count: int, *, lead: float) -> dt.datetime:
    """Create ``count`` enabled schedules all due at the first whole minute ``lead`` s away; return it."""
    from accounts.models import User
    from scheduler.cron import cron_spec
    from scheduler.models import CronSchedule, Queue

    owner = User.objects.create_user(username="cron-bench", password=None)
    Queue.objects.get_or_create(name="default")
    now = scalar("SELECT clock_timestamp()")
    due = (now + dt.timedelta(seconds=lead)).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    rng = random.Random(5)  # noqa: S311 - a reproducible mix, not security
    rows = []
    for i in range(count):
        if i % 10 == 9:
            cron, interval, zone = None, rng.choice([60, 300, 3600]), "UTC"
        else:
            zone = rng.choice(ZONES)
            cron = rng.choice(expressions_due_at(due, zone))
            if cron_spec(cron, zone).next_after(due - dt.timedelta(seconds=1)) != due:
                raise SystemExit(f"{cron} in {zone} is not due at {due}")
            interval = None
        rows.append(
            CronSchedule(
                owner=owner,
                name=f"bench-{i}",
                cron=cron,
                interval_seconds=interval,
                timezone=zone,
                job_type="DEMO_TASK",
                job_payload={"n": i},
                misfire_policy=rng.choice(["skip", "catch_up", "none"]),
                next_fire_at=due,
            )
        )
    CronSchedule.objects.bulk_create(rows, batch_size=2000)
    return due


def expressions_due_at(due: dt.datetime, zone: str) -> list[str]:
    """Return real-time and fixed-time expressions that all fire at ``due`` in ``zone``."""
    from zoneinfo import ZoneInfo

    wall = due.astimezone(ZoneInfo(zone))
    m, h, dow = wall.minute, wall.hour, (wall.weekday() + 1) % 7
    return ["* * * * *", f"{m} * * * *", f"{m},{(m + 30) % 60} * * * *", f"{m} {h} * * *", f"{m} {h} * * {dow}"]


def wait_for_due(due: dt.datetime) -> None:
    remaining = (due - scalar("SELECT clock_timestamp()")).total_seconds()
    if remaining > 0:
        time.sleep(remaining)


def run_process(due: dt.datetime, *, timeout: float, log: Path | None) -> dt.datetime | None:
    """Start run_scheduler, return the database time at which all jobs were visible (None: timed out)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STINT_OUTBOX_RELAY_INTERVAL_SECONDS": "3600"}
    out = (log or Path(os.devnull)).open("ab")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "run_scheduler", "--tick-seconds", "0.2", "-v", "1"],
        env=env,
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        # Wait for leadership well before the minute: the figure is firing latency, not start-up.
        start = time.monotonic()
        while scalar("SELECT count(*) FROM stint_leader_fence WHERE role = 'cron'") == 0:
            if time.monotonic() - start > 60 or proc.poll() is not None:
                raise SystemExit("run_scheduler did not become leader")
            time.sleep(0.1)
        return poll_until_done(due, timeout=timeout)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


def poll_until_done(due: dt.datetime, *, timeout: float) -> dt.datetime | None:
    """Return the database time at which no schedule was still due at M (each advances with its jobs)."""
    wait_for_due(due)
    while True:
        # An index probe (the firer's own partial index), cheap enough to poll every 20 ms.
        pending, now = scalar_row(
            "SELECT count(*), clock_timestamp() FROM stint_schedule WHERE enabled = true AND next_fire_at <= %s",
            [due],
        )
        if pending == 0:
            return now
        if (now - due).total_seconds() > timeout:
            return None
        time.sleep(0.02)


def run_inprocess(due: dt.datetime, count: int, *, batch_size: int | None, timeout: float) -> dict:
    from scheduler.leadership import Leadership
    from scheduler.maintenance.cron_firer import BATCH_SIZE, TICK_SECONDS, CronFirer

    lead = Leadership(role="cron")
    if not lead.acquire_or_renew():
        raise SystemExit("could not lead (another scheduler on this Redis database?)")
    firer = CronFirer(leadership=lead, batch_size=batch_size or BATCH_SIZE)
    runs = []
    try:
        while (remaining := (due - scalar("SELECT clock_timestamp()")).total_seconds()) > 0:
            lead.acquire_or_renew()  # keep the term (and its leading_since) through the wait
            time.sleep(min(TICK_SECONDS, remaining))
        while True:
            lead.acquire_or_renew()
            started = time.perf_counter()
            created = firer.run_once()
            runs.append({"created": created, "seconds": round(time.perf_counter() - started, 3)})
            now = scalar("SELECT clock_timestamp()")
            if created == 0 and scalar("SELECT count(*) FROM stint_job WHERE fire_time = %s", [due]) >= count:
                break
            if (now - due).total_seconds() > timeout:
                break
            time.sleep(TICK_SECONDS)
    finally:
        lead.release()
    done_at = scalar("SELECT max(created_at) FROM stint_job WHERE fire_time = %s", [due])
    return {"runs": [r for r in runs if r["created"]], "batch_size": firer.batch_size, "last_created_at": done_at}


def main() -> None:
    args = _args()
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/stint")
    setup_django(fresh_database(base, BENCH_DB))
    from django_redis import get_redis_connection

    from scheduler.leadership import lock_key, token_key

    get_redis_connection("default").delete(lock_key("cron"), token_key("cron"))
    if args.mode == "process":
        due = seed(args.schedules, lead=args.lead)
        visible_at = run_process(due, timeout=args.timeout, log=args.log)
        extra: dict = {}
    else:
        due = seed(args.schedules, lead=args.lead)
        extra = run_inprocess(due, args.schedules, batch_size=args.batch_size, timeout=args.timeout)
        visible_at = extra.pop("last_created_at")
    jobs = scalar("SELECT count(*) FROM stint_job WHERE fire_time = %s", [due])
    duplicates = scalar(
        "SELECT count(*) FROM (SELECT 1 FROM stint_job GROUP BY schedule_id, fire_time HAVING count(*) > 1) d"
    )
    first, last = (
        scalar("SELECT min(created_at) FROM stint_job WHERE fire_time = %s", [due]),
        scalar("SELECT max(created_at) FROM stint_job WHERE fire_time = %s", [due]),
    )
    late = (visible_at - due).total_seconds() if visible_at else None
    print(  # noqa: T201 - the benchmark's output
        json.dumps(
            {
                "bench": "cron_materialize",
                "mode": args.mode,
                "schedules": args.schedules,
                "jobs": jobs,
                "duplicates": duplicates,
                "due": due.isoformat(),
                "all_materialized_after_due_s": round(late, 3) if late is not None else None,
                "first_batch_started_after_due_s": round((first - due).total_seconds(), 3) if first else None,
                "last_batch_started_after_due_s": round((last - due).total_seconds(), 3) if last else None,
                "goal_s": GOAL_SECONDS,
                "ok": bool(late is not None and late <= GOAL_SECONDS and jobs == args.schedules and not duplicates),
                **extra,
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main()
