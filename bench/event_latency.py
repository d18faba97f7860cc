"""`python bench/event_latency.py`: commit-to-audit-table latency of lifecycle events at an enqueue rate; prints JSON.

Usage: python bench/event_latency.py [--rate JOBS_PER_S] [--seconds S] [--threads N] [--workers N] [--timeout S]

Creates the database ``stint_bench_events`` next to DATABASE_URL's (dropping an old one), starts
``run_scheduler`` (whose outbox relay publishes to a fresh topic) and ``run_audit_consumer`` (a
fresh consumer group) against KAFKA_BOOTSTRAP_SERVERS, plus ``--workers`` ``run_workers``
processes (0: jobs stay QUEUED and write two events each), waits until one warm-up job's events
have reached the audit table, then enqueues ``--rate`` jobs a second for ``--seconds`` (in
transactions of rate/100 jobs, one every 10 ms or so, from ``--threads`` threads), waits until
every event is in the audit table, stops everything with SIGTERM and prints one JSON line:
p50/p90/p99/max of ``received_at - occurred_at`` per event, the relay's share, and integrity
counts (lost, duplicate, gapped or incomplete trails). Every figure comes from the database's clock.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_stack import (  # noqa: E402 - after the path fix
    Processes,
    audit_complete,
    bench_env,
    event_figures,
    fresh_database,
    scalar,
    setup_django,
    wait_until,
    warm_up,
)

BENCH_DB = "stint_bench_events"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=500.0, help="jobs enqueued per second (default 500)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to enqueue (default 20)")
    parser.add_argument("--threads", type=int, default=4, help="enqueueing threads (default 4)")
    parser.add_argument("--workers", type=int, default=0, help="run_workers processes (default 0)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up waiting for the audit table")
    parser.add_argument("--log", type=Path, default=None, help="append the processes' output here")
    return parser.parse_args()


def main() -> int:
    args = _args()
    base_url, bootstrap = os.environ.get("DATABASE_URL"), os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not base_url or not bootstrap:
        print("DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS must be set (make bench sets them)", file=sys.stderr)
        return 2
    env = bench_env(database_url=fresh_database(base_url, BENCH_DB), bootstrap_servers=bootstrap, tag="latency")
    setup_django(env)
    from django.db import connection

    from scheduler.enqueuing import enqueue_many

    processes = Processes(env, workers=args.workers, log=args.log)
    try:
        if not warm_up():
            print("the warm-up job's events never reached the audit table", file=sys.stderr)
            return 1
        since = scalar("SELECT now()")
        batch = max(1, round(args.rate / 100))
        interval = batch / args.rate
        total = int(args.rate * args.seconds)
        starts = list(range(0, total, batch))
        t0 = time.monotonic() + 0.1

        def enqueuer(first: int) -> None:
            # Transaction i is due at t0 + i * interval; the threads take every --threads-th one.
            try:
                for i in range(first, len(starts), args.threads):
                    while (now := time.monotonic()) < t0 + i * interval:
                        time.sleep(min(t0 + i * interval - now, 0.002))
                    size = min(batch, total - starts[i])
                    enqueue_many([{"type": "DEMO_TASK", "payload": {}} for _ in range(size)])
            finally:
                connection.close()

        threads = [threading.Thread(target=enqueuer, args=(k,)) for k in range(args.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        enqueue_seconds = time.monotonic() - t0
        if args.workers:
            wait_until(lambda: scalar("SELECT count(*) FROM stint_job WHERE status <> 'SUCCESS'") == 0, timeout=300)
        drained = wait_until(audit_complete, timeout=args.timeout)
    finally:
        exit_codes = processes.stop()
    report = {
        "benchmark": "event_latency",
        "jobs": total,
        "offered_rate_jobs_per_s": args.rate,
        "achieved_rate_jobs_per_s": round(total / enqueue_seconds, 1),
        "jobs_per_transaction": batch,
        "workers": args.workers,
        "drained": drained,
        **event_figures(since=since),
        "exit_codes": exit_codes,
    }
    connection.close()
    print(json.dumps(report, sort_keys=True))
    return 0 if drained and report["lost_events"] == 0 and report["duplicate_events"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
