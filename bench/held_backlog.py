"""`python bench/held_backlog.py`: what a backlog held back by a flow limit costs every other claim.

Usage: python -m devstack run -- python bench/held_backlog.py [--held N,N,...] [--claims N]

For each backlog size, in a fresh database (``stint_held_bench`` next to DATABASE_URL's): a
concurrency limit of 1 on the REPORT type, that many QUEUED REPORT jobs at priority 50 (held back:
the limit admits one). First, claims until the limited phases have marked the whole backlog
held (``Job.flow_held``, a window of ``flow.claim.MARK_WINDOW`` jobs per phase; timed). Then
``--claims`` times: enqueue one DEMO_TASK job (priority 0, no limit) and time
``flow.claim.claim_jobs(limit=1)`` in this process, which claims it. Before held jobs were marked
(Stint before 0019) the unlimited claim walked the claim index past every held job ahead of it,
so its cost grew with the backlog; now it reads only the index's unheld part. Prints one line per
size and a JSON summary (p50/p95/p99 in ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "stint_held_bench"
INSERT_BATCH = 5000  # jobs per bulk insert of the backlog


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", default="0,20000,100000", help="backlog sizes, comma-separated")
    parser.add_argument("--claims", type=int, default=300, help="claims timed per size")
    return parser.parse_args()


def _measure(held: int, claims: int) -> dict[str, float]:
    """Seed ``held`` held-back jobs, then time ``claims`` claims of one unlimited job each (ms)."""
    from django.db import connection
    from django.utils import timezone

    from scheduler.enqueuing import enqueue
    from scheduler.flow import limits as flow_limits
    from scheduler.flow.claim import claim_jobs
    from scheduler.ids import new_job_id
    from scheduler.models import Job

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE stint_job CASCADE")
    flow_limits.limit_set(scope="type", name="REPORT", data={"concurrency": 1})
    now = timezone.now()
    for start in range(0, held, INSERT_BATCH):
        size = min(INSERT_BATCH, held - start)
        Job.objects.bulk_create(
            Job(id=new_job_id(), type="REPORT", payload={}, priority=50, status="QUEUED", scheduled_at=now)
            for _ in range(size)
        )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE stint_job")
    flow_limits.forget_cache()
    claim_jobs(worker_id="bench", limit=1, queues=None)  # admits the one REPORT job the limit allows
    # Each limited phase that leaves REPORT jobs waiting marks them held, a window at a time: claim
    # (nothing unlimited waits, so every claim runs the limited phase) until the whole backlog is.
    t0, marking_claims = time.perf_counter(), 0
    while Job.objects.filter(status="QUEUED", type="REPORT", flow_held=False).exists():
        claim_jobs(worker_id="bench", limit=1, queues=None)
        marking_claims += 1
    marked_in = time.perf_counter() - t0
    with connection.cursor() as cursor:
        # As autovacuum's ANALYZE does soon after so many rows changed: with the statistics of the
        # unmarked backlog the planner believes the unheld part holds every job of the table.
        cursor.execute("ANALYZE stint_job")
    times = []
    for n in range(claims):
        enqueue("DEMO_TASK", {"result": n})
        t0 = time.perf_counter()
        claimed = claim_jobs(worker_id="bench", limit=1, queues=None)
        times.append((time.perf_counter() - t0) * 1000)
        if [job.type for job in claimed] != ["DEMO_TASK"]:
            raise SystemExit(f"claim {n} took {[job.type for job in claimed]}, not the DEMO_TASK job")
    times.sort()
    return {
        "held": held,
        "marked_in_s": round(marked_in, 2),
        "marking_claims": marking_claims,
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(len(times) * 0.95)], 2),
        "p99_ms": round(times[int(len(times) * 0.99)], 2),
    }


def main() -> int:
    """Run each backlog size once and print the figures; 2 when DATABASE_URL is missing."""
    args = _args()
    sys.path.insert(0, str(ROOT))
    from bench.event_stack import bench_environment, setup_django

    env = bench_environment(BENCH_DB, run_with="python -m devstack run -- python bench/held_backlog.py")
    if env is None:
        return 2
    setup_django(env)  # environment, django.setup(), migrate
    results = []
    for held in (int(part) for part in args.held.split(",")):
        figures = _measure(held, args.claims)
        print(
            f"held back {held:>7,}: marked held in {figures['marked_in_s']} s ({figures['marking_claims']} claims);"
            f" then one unlimited claim p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms,"
            f" p99 {figures['p99_ms']} ms",
            flush=True,
        )
        results.append(figures)
    print(json.dumps({"claims_per_size": args.claims, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
