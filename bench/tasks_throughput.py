"""Per-job cost of Django ``@task`` jobs next to native Stint jobs: enqueue and execution, one JSON line.

Usage (inside the dev stack, e.g. ``.venv/bin/python -m devstack run -- .venv/bin/python
bench/tasks_throughput.py``)::

    python bench/tasks_throughput.py [--enqueues N] [--jobs N] [--rounds R] [--slots S]

It recreates the database ``stint_bench_tasks`` next to ``DATABASE_URL``'s and, ``--rounds``
times, alternately for the two kinds (native no-op ``LOADTEST`` jobs with ``{"record": false}``
and the no-op task ``bench.tasks.noop``):

- enqueue: ``--enqueues`` calls one after another, each its own transaction, as application code
  does (``scheduler.enqueue(...)`` against ``noop.enqueue()``), timed by the process clock;
- execution: ``--jobs`` jobs written while no worker runs, then one ``run_workers`` process of
  ``--slots`` thread slots drains them; the time is the database's, first start to last finish.

Reports the best round of each (the least disturbed by other load), the task path's overhead
per job in percent, and the enqueuing process's CPU time per enqueue (the client-side cost, where
the backend does its extra work, and far steadier than wall time on a busy machine). A noisy,
shared machine moves these figures: compare runs made together.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "stint_bench_tasks"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--enqueues", type=int, default=2000, help="enqueue calls per kind and round")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs drained per kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=20, help="thread slots of the worker")
    parser.add_argument(
        "--no-commit-wait",
        action="store_true",
        help="SET synchronous_commit = off for the enqueuing session: leaves out the disk flush that"
        " dominates one-job transactions, so the Python cost of each path shows",
    )
    return parser.parse_args()


def main() -> int:
    args = _args()
    sys.path.insert(0, str(ROOT))
    from bench.event_stack import bench_environment, setup_django

    env = bench_environment(
        BENCH_DB,
        run_with="run inside the dev stack (python -m devstack run -- ...)",
        LOG_FORMAT="plain",
    )
    if env is None:
        return 2
    setup_django(env)  # environment, django.setup(), migrate
    if args.no_commit_wait:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
    enqueue_rates: dict[str, list[float]] = {"native": [], "task": []}
    drain_rates: dict[str, list[float]] = {"native": [], "task": []}
    for _ in range(args.rounds):
        for kind in ("native", "task"):
            enqueue_rates[kind].append(_enqueue_rate(kind, args.enqueues))
            _reset()
        for kind in ("task", "native"):  # the other order, so neither always runs first
            drain_rates[kind].append(_drain_rate(kind, args.jobs, args.slots, env))
            _reset()
    report = {
        "enqueues_per_round": args.enqueues,
        "jobs_per_round": args.jobs,
        "rounds": args.rounds,
        "commit_wait": not args.no_commit_wait,
    }
    for name, rates in (("enqueue", enqueue_rates), ("execution", drain_rates)):
        native, task = max(rates["native"]), max(rates["task"])
        report[f"{name}_native_jobs_per_s"] = round(native, 1)
        report[f"{name}_task_jobs_per_s"] = round(task, 1)
        # Per-job time is 1/rate: the task path's extra time per job, in percent of the native one.
        report[f"{name}_task_overhead_percent"] = round((native / task - 1) * 100, 1)
        report[f"{name}_all_rounds"] = {k: [round(r, 1) for r in v] for k, v in rates.items()}
    native_cpu, task_cpu = min(_CPU["native"]), min(_CPU["task"])
    report["enqueue_cpu_us_per_job"] = {"native": round(native_cpu), "task": round(task_cpu)}
    report["enqueue_cpu_task_overhead_percent"] = round((task_cpu / native_cpu - 1) * 100, 1)
    print(json.dumps(report))
    return 0


def _reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE stint_job, stint_job_attempt, stint_outbox CASCADE")


def _enqueue_rate(kind: str, n: int) -> float:
    from bench.tasks import noop
    from scheduler.enqueuing import enqueue

    start, cpu = time.perf_counter(), time.process_time()
    if kind == "native":
        for _ in range(n):
            enqueue("LOADTEST", {"record": False})
    else:
        for _ in range(n):
            noop.enqueue()
    _CPU[kind].append((time.process_time() - cpu) / n * 1e6)
    return n / (time.perf_counter() - start)


# Microseconds of this process's CPU per enqueue, per round: the client-side cost, which is where
# the backend adds its work, and which other load on the machine disturbs far less than wall time.
_CPU: dict[str, list[float]] = {"native": [], "task": []}


def _drain_rate(kind: str, n: int, slots: int, env: dict[str, str]) -> float:
    from django.db import connection

    from bench.tasks import noop
    from scheduler.enqueuing import enqueue_many

    if kind == "native":
        for i in range(0, n, 1000):
            enqueue_many([{"type": "LOADTEST", "payload": {"record": False}} for _ in range(min(1000, n - i))])
    else:
        for _ in range(n):
            noop.enqueue()
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "run_workers", f"--concurrency={slots}"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,  # one INFO line per job, for both kinds alike
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM stint_job WHERE status <> 'SUCCESS'")
                if cursor.fetchone()[0] == 0:
                    break
            time.sleep(0.2)
        else:
            raise SystemExit(f"{kind}: the worker did not finish {n} jobs in 300 s")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM stint_job WHERE status = 'SUCCESS'"
            )
            seconds = float(cursor.fetchone()[0])
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            from core.process_sessions import signal_session

            signal_session(worker.pid, signal.SIGKILL)  # the session of the process we started
            worker.wait()
    return n / seconds


if __name__ == "__main__":
    raise SystemExit(main())
