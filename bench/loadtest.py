"""`make loadtest`: run real worker processes against a fresh database and print one JSON line of results.

Usage: python bench/loadtest.py [--jobs N] [--slots N] [--worker-processes N] [--rate JOBS_PER_S]
                                [--noop] [--chaos] [--pg-terminate N] [--timeout SECONDS]

It creates the database ``stint_bench`` next to DATABASE_URL's (dropping an old one), starts
``--worker-processes`` ``run_workers`` processes sharing ``--slots`` thread slots and one
``run_scheduler``, waits until they have registered, submits the jobs (in batches of one
transaction and one NOTIFY each, paced to ``--rate`` if given), waits until every job is
finished or ``--timeout`` passes, stops everything with SIGTERM and reports. Every figure comes
from the database (its clock) or from the kernel's accounting of the worker processes.
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
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "stint_bench"
CHAOS_INTERVAL = 2.0  # seconds between SIGKILLs in --chaos
# --pg-terminate spares the connections of this process (the producer), named stint-loadtest; the
# cluster's processes name theirs stint-<role> (core.db_role).
SELF_ROLE = "loadtest"
SELF_APPLICATION_NAME = f"stint-{SELF_ROLE}"
TERMINAL = ("SUCCESS", "DEAD", "FAILED", "CANCELLED")


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=100)
    parser.add_argument("--worker-processes", type=int, default=4)
    parser.add_argument("--rate", type=float, default=0.0, help="offered jobs/s (0: as fast as possible)")
    parser.add_argument("--noop", action="store_true", help="only immediate no-op jobs")
    parser.add_argument(
        "--chaos", action="store_true", help="SIGKILL a random worker process every 2 s (its supervisor replaces it)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument("--batch", type=int, default=500, help="jobs per enqueue transaction")
    parser.add_argument(
        "--producers", type=int, default=2, help="threads enqueuing concurrently (1 when --rate is given)"
    )
    parser.add_argument("--no-audit", action="store_true", help="skip the audit consumer and trail check")
    parser.add_argument(
        "--pg-terminate",
        type=int,
        default=0,
        metavar="N",
        help="terminate every client connection of the cluster's processes N times, evenly spread over the"
        " submission (needs --rate)",
    )
    return parser.parse_args()


def _mix(n: int, noop: bool, start: dt.datetime) -> list[dict]:
    if noop:
        return [{"type": "LOADTEST", "payload": {"record": False}, "priority": "MEDIUM"} for _ in range(n)]
    rng = random.Random(42)  # noqa: S311 - a reproducible mix, not security
    delayed_at = start + dt.timedelta(seconds=5)
    jobs = []
    for i in range(n):
        roll = i % 10
        priority = "HIGH" if rng.random() < 0.5 else "LOW"
        if roll < 6:
            jobs.append({"type": "LOADTEST", "payload": {"mode": "ok"}, "priority": priority})
        elif roll < 8:
            jobs.append(
                {
                    "type": "LOADTEST",
                    "payload": {"mode": "ok", "delayed": True},
                    "priority": priority,
                    "scheduled_at": delayed_at,
                }
            )
        elif roll < 9:
            jobs.append({"type": "LOADTEST", "payload": {"mode": "fail_once"}, "priority": priority})
        else:
            jobs.append(
                {"type": "LOADTEST", "payload": {"mode": "always_fail"}, "priority": priority, "max_retries": 2}
            )
    rng.shuffle(jobs)
    return jobs


class Cluster:
    """The worker and scheduler processes of one run, with their kernel CPU and memory accounting."""

    def __init__(self, env: dict[str, str], processes: int, slots: int, audit: bool) -> None:
        self.env = env
        self.slots_each = max(1, slots // processes)
        self.workers: list[subprocess.Popen] = []
        self.cpu_seconds = 0.0
        self.peak_rss_kb = 0
        self.killed = 0
        for _ in range(processes):
            self.start_worker()
        self.scheduler = self._spawn(["run_scheduler", "--tick-seconds", "0.1"])
        # -v 1: the consumer's INFO lines (partitions assigned and revoked) are rare and telling.
        self.audit = self._spawn(["run_audit_consumer"], verbosity=1) if audit else None

    def _spawn(self, argv: list[str], verbosity: int = 0) -> subprocess.Popen:
        return subprocess.Popen(  # noqa: S603 - our own manage.py
            [sys.executable, str(ROOT / "manage.py"), *argv, "-v", str(verbosity)], env=self.env, cwd=ROOT
        )

    def start_worker(self) -> None:
        self.workers.append(
            self._spawn(["run_workers", "--processes", "1", "--concurrency", str(self.slots_each), "--pool", "threads"])
        )

    def _reap(self, proc: subprocess.Popen) -> None:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_seconds += usage.ru_utime + usage.ru_stime
        self.peak_rss_kb = max(self.peak_rss_kb, usage.ru_maxrss)

    def kill_random(self, rng: random.Random, connection: Any) -> None:
        """SIGKILL the worker process of a random ``run_workers``: its supervisor replaces it and rescues its jobs."""
        supervisor = rng.choice(self.workers)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM stint_worker_node WHERE supervisor_pid = %s AND stopped_at IS NULL AND NOT isolation",
                [supervisor.pid],
            )
            pids = [row[0] for row in cursor.fetchall()]
        for pid in pids[:1]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it died meanwhile
                continue
            self.killed += 1

    def stop(self) -> dict[str, int]:
        codes = {}
        for proc in [*self.workers, self.scheduler]:
            proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            self._reap(proc)
            codes[str(proc.pid)] = proc.returncode
        self.scheduler.wait(timeout=60)
        return codes

    def stop_audit(self) -> None:
        if self.audit is not None:
            self.audit.send_signal(signal.SIGTERM)
            self.audit.wait(timeout=60)


def _terminate_cluster_connections(connection) -> int:
    """``pg_terminate_backend`` every client connection of the cluster's processes; return how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'stint-%%'"
            " AND application_name <> %s AND pid <> pg_backend_pid()",
            [SELF_APPLICATION_NAME],
        )
        return cursor.fetchone()[0]


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    values = sorted(values)

    def pick(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 2)

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99)}


def main() -> int:
    args = _args()
    sys.path.insert(0, str(ROOT))
    from bench.event_stack import bench_environment

    env = bench_environment(
        BENCH_DB,
        run_with="run through `make loadtest`",
        # A topic and consumer group of this run's own, so the audit trail holds only its events.
        KAFKA_TOPIC=f"loadtest-{os.getpid()}-{int(time.time())}",
        KAFKA_AUDIT_GROUP=f"loadtest-{os.getpid()}-{int(time.time())}",
    )
    if env is None:
        return 2
    if args.chaos:
        env.update({"STINT_LEASE_SECONDS": "4", "STINT_HEARTBEAT_SECONDS": "1"})
    os.environ.update(env)
    os.environ["STINT_DB_ROLE"] = SELF_ROLE  # core.db_role; the cluster's processes name their own
    if args.pg_terminate and not args.rate:
        print("--pg-terminate needs --rate", file=sys.stderr)
        return 2
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench.jobs import SIDE_TABLE_DDL
    from scheduler.enqueuing import enqueue_many

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(SIDE_TABLE_DDL)
        cursor.execute("SELECT now()")
        db_start = cursor.fetchone()[0]
    connection.close()

    from bench.event_stack import provision_topic

    provision_topic(env)  # as `manage.py create_topics` would: neither the relay nor the consumer creates it
    cluster = Cluster(env, args.worker_processes, args.slots, audit=not args.no_audit)
    rng = random.Random(7)  # noqa: S311
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM stint_worker_node WHERE stopped_at IS NULL")
                if cursor.fetchone()[0] >= args.worker_processes:
                    break
            time.sleep(0.1)
        jobs = _mix(args.jobs, args.noop, db_start + dt.timedelta(seconds=5))
        batch = args.batch
        interval = 0.0
        if args.rate > 0:
            batch = max(1, min(batch, int(args.rate / 100) or 1))  # about 100 batches a second
            interval = batch / args.rate
        t0 = time.monotonic()
        next_chaos = t0 + CHAOS_INTERVAL
        terminations = (
            [t0 + (k + 1) * (len(jobs) / args.rate) / (args.pg_terminate + 1) for k in range(args.pg_terminate)]
            if args.pg_terminate
            else []
        )
        terminated: list[int] = []
        batches = [jobs[i : i + batch] for i in range(0, len(jobs), batch)]
        producers = 1 if interval else max(1, args.producers)

        def produce(mine: list[list[dict]]) -> None:
            for chunk in mine:
                enqueue_many(chunk)
            connection.close()

        if producers > 1:
            # Several producers, as many web processes would be: one producer alone cannot offer
            # jobs as fast as the workers drain them on this machine.
            threads = [threading.Thread(target=produce, args=(batches[k::producers],)) for k in range(producers)]
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads):
                if args.chaos and time.monotonic() >= next_chaos:
                    cluster.kill_random(rng, connection)
                    next_chaos += CHAOS_INTERVAL
                time.sleep(0.05)
        else:
            for n, chunk in enumerate(batches):
                if interval:
                    target = t0 + n * interval
                    while (now := time.monotonic()) < target:
                        time.sleep(min(target - now, 0.005))
                enqueue_many(chunk)
                if terminations and time.monotonic() >= terminations[0]:
                    terminations.pop(0)
                    terminated.append(_terminate_cluster_connections(connection))
                if args.chaos and time.monotonic() >= next_chaos:
                    cluster.kill_random(rng, connection)
                    next_chaos += CHAOS_INTERVAL
        submit_seconds = time.monotonic() - t0
        give_up = t0 + args.timeout
        while time.monotonic() < give_up:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM stint_job WHERE status <> ALL(%s)", [list(TERMINAL)])
                if cursor.fetchone()[0] == 0:
                    break
            if args.chaos and time.monotonic() >= next_chaos:
                cluster.kill_random(rng, connection)
                next_chaos += CHAOS_INTERVAL
            time.sleep(0.05)
    finally:
        exit_codes = cluster.stop()

    report = _report(connection, args, cluster, submit_seconds, exit_codes)
    report["pg_terminated_connections"] = terminated
    if not args.no_audit:
        from bench.event_stack import audit_complete, event_figures, wait_until

        # The relay stopped with the scheduler: run one more to publish what is left, then wait for the trail.
        relay = cluster._spawn(["run_scheduler", "--tick-seconds", "0.1"])
        report["audit_complete"] = wait_until(audit_complete, timeout=300)
        relay.send_signal(signal.SIGTERM)
        relay.wait(timeout=60)
        cluster.stop_audit()
        report["audit"] = event_figures(since=db_start)
    print(json.dumps(report, sort_keys=True))
    return 0


def _report(connection, args, cluster: Cluster, submit_seconds: float, exit_codes: dict) -> dict:
    from scheduler.maintenance.rescuer import UNRUN_ERROR

    with connection.cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM stint_job GROUP BY status")
        final_states = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM stint_job WHERE status <> ALL(%s)", [list(TERMINAL)])
        lost = cursor.fetchone()[0]
        cursor.execute("SELECT coalesce(sum(executions - 1), 0) FROM stint_bench_execution WHERE executions > 1")
        duplicates = cursor.fetchone()[0]
        # LOST attempts: those of killed processes, and those handed back unrun (no attempt spent).
        cursor.execute(
            "SELECT count(*) FILTER (WHERE error <> %s), count(*) FILTER (WHERE error = %s)"
            " FROM stint_job_attempt WHERE status = 'LOST'",
            [UNRUN_ERROR, UNRUN_ERROR],
        )
        killed_attempts, handed_back_unrun = cursor.fetchone()
        # Executions the side table saw beyond the attempts of the database's record.
        cursor.execute(
            """
            SELECT count(*) FROM stint_attempt a
            LEFT JOIN stint_bench_execution e ON e.job_id = a.job_id AND e.attempt = a.attempt_number
            WHERE e.job_id IS NULL AND a.status NOT IN ('LOST') AND (SELECT payload->>'record' FROM stint_job
                  WHERE id = a.job_id) IS DISTINCT FROM 'false'
            """
        )
        unrecorded = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FROM stint_job
            WHERE NOT (
                (status = 'SUCCESS' AND payload->>'mode' IS DISTINCT FROM 'always_fail')
                OR (status = 'DEAD' AND payload->>'mode' = 'always_fail'
                    AND attempts - attempts_base = 1 + max_retries)
            )
            """
        )
        wrong_end = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT extract(epoch FROM max(finished_at) - min(created_at)) FROM stint_job
            """
        )
        span = float(cursor.fetchone()[0] or 0)
        cursor.execute(
            """
            SELECT extract(epoch FROM a.started_at - j.created_at) * 1000
            FROM stint_job j JOIN stint_attempt a ON a.job_id = j.id AND a.attempt_number = 1
            WHERE j.scheduled_at <= j.created_at + interval '1 millisecond'
            """
        )
        lags = [float(r[0]) for r in cursor.fetchall()]
        cursor.execute("SELECT coalesce(sum(event_count), 0) FROM stint_outbox")
        events = cursor.fetchone()[0]
    jobs = sum(final_states.values())
    return {
        "jobs": jobs,
        "submitted_in_s": round(submit_seconds, 2),
        "final_states": final_states,
        "lost": lost,
        "duplicate_executions": duplicates,
        "unrecorded_attempts": unrecorded,
        "wrong_final_state": wrong_end,
        "killed_attempts": killed_attempts,
        "handed_back_unrun": handed_back_unrun,
        "killed_workers": cluster.killed,
        "throughput_jobs_per_s": round(jobs / span, 1) if span else None,
        "lag_ms": _percentiles(lags),
        "cpu_s_per_job": round(cluster.cpu_seconds / jobs, 6) if jobs else None,
        "peak_rss_mb": round(cluster.peak_rss_kb / 1024, 1),
        "events": events,
        "worker_exit_codes": sorted(set(exit_codes.values())),
        "options": {
            "slots": args.slots,
            "worker_processes": args.worker_processes,
            "rate": args.rate or "max",
            "noop": args.noop,
            "chaos": args.chaos,
            "producers": 1 if args.rate else args.producers,
        },
    }


if __name__ == "__main__":
    sys.exit(main())
