"""`make flow-rate`: a rate limit of 60 per minute over 3 minutes, with several worker processes (issue 17).

Usage: python bench/flow_rate.py [--count 60] [--period 60] [--windows 3] [--worker-processes 4] [--slots 10]

A fresh database (``stint_flow_rate`` next to DATABASE_URL's), a rate limit of ``--count`` per
``--period`` seconds on BENCH_NOOP set as the API sets it, more jobs than the run can admit,
and ``--worker-processes`` ``run_workers`` processes of ``--slots`` slots each. After
``--windows`` periods it stops them and reads every claim's time (the attempt's
``started_at``, the database clock) and prints, as JSON: the admissions in each consecutive
window from the first claim, the most in any sliding window (the guarantee: at most
``--count``), and the fewest in any sliding window that lies wholly inside the run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "stint_flow_rate"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=60, help="admissions allowed per period")
    parser.add_argument("--period", type=float, default=60.0, help="seconds")
    parser.add_argument("--windows", type=int, default=3, help="periods to run")
    parser.add_argument("--worker-processes", type=int, default=4)
    parser.add_argument("--slots", type=int, default=10)
    return parser.parse_args()


def main() -> int:
    args = _args()
    sys.path.insert(0, str(ROOT))
    from bench.event_stack import bench_environment, setup_django

    env = bench_environment(
        BENCH_DB,
        run_with="run through `make flow-rate`",
        KAFKA_TOPIC=f"flow-rate-{os.getpid()}",
    )
    if env is None:
        return 2
    setup_django(env)  # environment, django.setup(), migrate
    from django.db import connection

    from scheduler.enqueuing import enqueue_many
    from scheduler.flow import limits as flow_limits

    flow_limits.limit_set(
        scope="type", name="BENCH_NOOP", data={"rate_limit": args.count, "rate_period_seconds": args.period}
    )
    enqueue_many([{"type": "BENCH_NOOP"} for _ in range(args.count * (args.windows + 2))])
    workers = [
        subprocess.Popen(  # noqa: S603 - our own manage.py
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "run_workers",
                "--processes",
                "1",
                "--concurrency",
                str(args.slots),
                "-v",
                "0",
            ],
            env=env,
            cwd=ROOT,
        )
        for _ in range(args.worker_processes)
    ]
    try:
        time.sleep(args.period * args.windows + 5)
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM a.started_at)::float8 FROM stint_attempt a"
            " JOIN stint_job j ON j.id = a.job_id WHERE j.type = 'BENCH_NOOP' ORDER BY 1"
        )
        starts = [r[0] for r in cursor.fetchall()]
    if not starts:
        print(json.dumps({"error": "no job was admitted"}))
        return 1
    first = starts[0]
    consecutive = [
        sum(1 for s in starts if first + k * args.period <= s < first + (k + 1) * args.period)
        for k in range(args.windows)
    ]
    # Sliding windows (t - period, t] ending at every admission: the most any window held.
    most = max(sum(1 for s in starts if t - args.period < s <= t) for t in starts)
    # Sliding windows [t, t + period) starting at every admission and lying wholly inside the run.
    end = first + args.windows * args.period
    inside = [sum(1 for s in starts if t <= s < t + args.period) for t in starts if t + args.period <= end]
    print(
        json.dumps(
            {
                "limit": f"{args.count} per {args.period:g} s",
                "worker_processes": args.worker_processes,
                "slots_each": args.slots,
                "admitted_total": len(starts),
                "consecutive_windows": consecutive,
                "max_in_any_sliding_window": most,
                "min_in_any_sliding_window_inside_the_run": min(inside) if inside else None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
