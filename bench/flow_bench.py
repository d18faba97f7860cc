"""`make flow-bench`: what flow limits cost the claim, measured as drain throughput with real worker processes.

Usage: python bench/flow_bench.py [--jobs N] [--reps N] [--worker-processes N] [--slots N]

One fresh database (``stint_flow_bench`` next to DATABASE_URL's), one set of ``run_workers``
processes kept for the whole run, and three variants, interleaved in a rotating order each
repetition so that the machine's noise falls on all of them alike:

- ``none``: no flow limit anywhere (the claim path of main);
- ``unrelated``: a concurrency and a rate limit on a job type that has no jobs (every claim
  runs the flow path; the jobs drained are not limited);
- ``limited``: a concurrency limit on the drained type itself, set above the slot count so it
  never binds: the cost of claiming every job under its limit's lock and count.

Each repetition of a variant enqueues ``--jobs`` BENCH_NOOP jobs while the workers are idle and
measures, by the database clock, from the first job's creation to the last one's finish.
Then, with the workers stopped, the same variants drive the claim path alone in this process
(``--claim-loop``): claim 20 jobs, record them SUCCESS, repeat until the backlog is drained, the
way a worker's loop does minus the handlers and threads; less noise, same SQL.
Prints one line per run and a JSON summary (medians and each run's jobs/s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "stint_flow_bench"
VARIANTS = ("none", "unrelated", "limited")
LIMIT_SETTLE_SECONDS = 1.5  # workers re-read the database's limits at most every second


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000, help="jobs drained per run")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each variant")
    parser.add_argument("--worker-processes", type=int, default=2)
    parser.add_argument("--slots", type=int, default=10, help="thread slots per worker process")
    parser.add_argument("--claim-reps", type=int, default=7, help="repetitions of each variant in the claim loop")
    return parser.parse_args()


def _claim_loop(jobs: int) -> tuple[float, float]:
    """Drain ``jobs`` jobs by claim + record in batches of 20 in this process.

    Returns (jobs/s by the wall clock, SQL statements per job): the second does not depend on
    the machine's load.
    """
    from django.db import connection

    from scheduler import leasing
    from scheduler.enqueuing import enqueue_many

    for start in range(0, jobs, 500):
        enqueue_many([{"type": "BENCH_NOOP"} for _ in range(min(500, jobs - start))])
    done = 0
    executed = 0

    def count(execute, sql, params, many, context):  # noqa: ANN001, ANN202 - Django's execute_wrapper protocol
        nonlocal executed
        executed += 1
        return execute(sql, params, many, context)

    t0 = time.perf_counter()
    with connection.execute_wrapper(count):
        while True:
            claimed = leasing.claim_jobs(worker_id="bench", limit=20, queues=None)
            if not claimed:
                break
            leasing.record_batch([leasing.Report(job=j, outcome=leasing.Outcome.SUCCEEDED) for j in claimed])
            done += len(claimed)
    elapsed = time.perf_counter() - t0
    if done != jobs:
        raise RuntimeError(f"claimed {done} of {jobs} jobs")
    return jobs / elapsed, executed / jobs


def _configure(variant: str) -> None:
    from scheduler.flow import limits as flow_limits
    from scheduler.flow.models import FlowLimit

    FlowLimit.objects.all().delete()
    if variant == "unrelated":
        flow_limits.limit_set(
            scope="type", name="UNRELATED", data={"concurrency": 5, "rate_limit": 100, "rate_period_seconds": 60}
        )
    elif variant == "limited":
        flow_limits.limit_set(scope="type", name="BENCH_NOOP", data={"concurrency": 10_000})
    time.sleep(LIMIT_SETTLE_SECONDS)


def _drain(jobs: int) -> float:
    """Enqueue ``jobs`` no-op jobs and wait for all; return jobs/s by the database clock."""
    from django.db import connection

    from scheduler.enqueuing import enqueue_many

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        since = cursor.fetchone()[0]
    for start in range(0, jobs, 500):
        enqueue_many([{"type": "BENCH_NOOP"} for _ in range(min(500, jobs - start))])
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*),"
                " extract(epoch FROM max(finished_at) - min(created_at))"
                " FROM stint_job WHERE created_at >= %s",
                [since],
            )
            done, total, seconds = cursor.fetchone()
        if done == total == jobs:
            return jobs / float(seconds)
        time.sleep(0.05)


def main() -> int:
    args = _args()
    sys.path.insert(0, str(ROOT))
    from bench.event_stack import bench_environment, setup_django

    env = bench_environment(
        BENCH_DB,
        run_with="run through `make flow-bench`",
        KAFKA_TOPIC=f"flow-bench-{os.getpid()}",
    )
    if env is None:
        return 2
    setup_django(env)  # environment, django.setup(), migrate
    from django.db import connection

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
                "--pool",
                "threads",
                "-v",
                "0",
            ],
            env=env,
            cwd=ROOT,
        )
        for _ in range(args.worker_processes)
    ]
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM stint_worker_node WHERE stopped_at IS NULL")
                if cursor.fetchone()[0] >= args.worker_processes:
                    break
            time.sleep(0.1)
        _configure("none")
        _drain(min(500, args.jobs))  # warm-up: connections, caches, the planner
        for rep in range(args.reps):
            order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]
            for variant in order:
                _configure(variant)
                rate = _drain(args.jobs)
                results[variant].append(rate)
                print(f"rep {rep + 1} {variant:9s} {rate:8.1f} jobs/s", flush=True)
                with connection.cursor() as cursor:
                    # Keep every run's tables the same size.
                    cursor.execute("TRUNCATE stint_job, stint_outbox, stint_flow_admission CASCADE")
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
    loop: dict[str, list[float]] = {v: [] for v in VARIANTS}
    statements: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(args.claim_reps):
        order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]
        for variant in order:
            _configure(variant)
            rate, per_job = _claim_loop(args.jobs)
            loop[variant].append(rate)
            statements[variant].append(per_job)
            print(f"claim loop rep {rep + 1} {variant:9s} {rate:8.1f} jobs/s {per_job:.3f} statements/job", flush=True)
            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE stint_job, stint_outbox, stint_flow_admission CASCADE")
    loop_medians = {v: statistics.median(r) for v, r in loop.items()}
    medians = {v: statistics.median(r) for v, r in results.items()}

    def paired(runs: dict[str, list[float]]) -> dict[str, float]:
        # Each repetition's variant against the same repetition's "none" (run next to it), then the
        # median of those ratios: robust to the machine's load drifting over the whole run.
        return {
            v: round(100 * (1 - statistics.median(a / b for a, b in zip(runs[v], runs["none"], strict=True))), 1)
            for v in VARIANTS
            if v != "none"
        }

    summary = {
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
        "jobs_per_run": args.jobs,
        "reps": args.reps,
        "worker_processes": args.worker_processes,
        "slots_each": args.slots,
        "median_jobs_per_s": {v: round(m, 1) for v, m in medians.items()},
        "cost_vs_none_percent": {
            v: round(100 * (1 - medians[v] / medians["none"]), 1) for v in VARIANTS if v != "none"
        },
        "paired_cost_vs_none_percent": paired(results),
        "runs_jobs_per_s": {v: [round(x, 1) for x in r] for v, r in results.items()},
        "claim_loop_paired_cost_vs_none_percent": paired(loop),
        "claim_loop_median_jobs_per_s": {v: round(m, 1) for v, m in loop_medians.items()},
        "claim_loop_cost_vs_none_percent": {
            v: round(100 * (1 - loop_medians[v] / loop_medians["none"]), 1) for v in VARIANTS if v != "none"
        },
        "claim_loop_runs_jobs_per_s": {v: [round(x, 1) for x in r] for v, r in loop.items()},
        "claim_loop_statements_per_job": {v: round(statistics.median(r), 3) for v, r in statements.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
