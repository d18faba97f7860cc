"""Claims per job when one NOTIFY wakes every process of a ``run_workers`` (the claim board at work).

Usage: python -m devstack run -- .venv/bin/python bench/notify_claims.py [--processes 2,4] [--rate 200] [--seconds 10]

For each process count: starts ``run_workers --processes N --concurrency 100 --metrics-port P`` on
a fresh database, enqueues ``--rate`` jobs/s (no-op handler, one ``scheduler.enqueue`` per job)
for ``--seconds``, waits until all ran, and reads from the supervisor's metrics how many claims
its processes made and how many they skipped because a sibling's claim had served the NOTIFY
(``scheduler/workers/claim_board.py``), and from PostgreSQL the transactions committed. Each
NOTIFY wakes all N processes: without the board each of them claimed, N claims per job at a rate
this low. Prints one JSON line per process count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_stack import ROOT, bench_environment, free_port, setup_django, wait_until  # noqa: E402

START_SECONDS = 60.0  # at most, for the processes to register
SETTLE_SECONDS = 1.0  # after they registered: their start-up claims are over


def _scrape(port: int) -> dict[str, float]:
    """The supervisor's counters this benchmark reads: claims made and claims skipped (sums)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()  # noqa: S310
    wanted = {"worker_claim_duration_seconds_count": "claims", "worker_claims_skipped_total": "skipped"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


def _commits() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _wait(condition, timeout: float, what: str) -> None:
    if not wait_until(condition, timeout=timeout):
        raise SystemExit(f"timed out waiting for {what}")


def measure(env: dict[str, str], processes: int, rate: float, seconds: float) -> dict[str, float]:
    """Run one process count; return its figures (per job: claims, skipped claims, transactions)."""
    import scheduler
    from scheduler.models import Job, WorkerNode
    from scheduler.states import JobStatus

    Job.objects.all().delete()
    port = free_port()
    argv = [sys.executable, "manage.py", "run_workers", "--processes", str(processes), "--concurrency", "100"]
    workers = subprocess.Popen([*argv, "--metrics-port", str(port), "-v", "0"], cwd=ROOT, env=env)
    try:
        _wait(lambda: WorkerNode.objects.filter(stopped_at=None).count() >= processes, START_SECONDS, "the workers")
        time.sleep(SETTLE_SECONDS)
        before, commits_before = _scrape(port), _commits()
        jobs = int(rate * seconds)
        t0 = time.monotonic()
        for i in range(jobs):
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            scheduler.enqueue("BENCH_NOOP", {"i": i})
        _wait(lambda: Job.objects.filter(status=JobStatus.SUCCESS).count() >= jobs, 120, "the jobs to run")
        time.sleep(0.5)  # the last outcomes' counters
        after, commits_after = _scrape(port), _commits()
    finally:
        workers.terminate()
        workers.wait(60)
        WorkerNode.objects.all().delete()
    return {
        "processes": processes,
        "jobs": jobs,
        "rate": rate,
        "claims_per_job": round((after["claims"] - before["claims"]) / jobs, 3),
        "skipped_claims_per_job": round((after["skipped"] - before["skipped"]) / jobs, 3),
        "transactions_per_job": round((commits_after - commits_before) / jobs, 2),
    }


def main() -> int:
    """Run the measurement for each process count; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", default="2,4")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    env = bench_environment(
        "stint_bench_notify_claims", run_with="python -m devstack run -- .venv/bin/python bench/notify_claims.py"
    )
    if env is None:
        return 2
    setup_django(env)
    for processes in (int(p) for p in args.processes.split(",")):
        print(json.dumps(measure(env, processes, args.rate, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
