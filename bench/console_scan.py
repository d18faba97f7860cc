"""`python bench/console_scan.py`: what the console's dashboard and job search cost on a large table.

Usage: python -m devstack run -- python bench/console_scan.py [--jobs N] [--failed-attempts N] [--runs N]

In a fresh database (``stint_console_bench`` next to DATABASE_URL's): ``--jobs`` finished jobs
(90% SUCCESS with their attempt kept in the job row, 10% DEAD with a failed attempt row each),
spread over the last 30 days, ``--failed-attempts`` more failed attempt rows among them, then
``VACUUM ANALYZE``. Times ``--runs`` times each: the dashboard's whole read
(``admin_dashboard.dashboard_data``), its failures-by-error read alone (``error_groups``), and
the job list's ``args.<key>:<value>`` and ``error:<text>`` searches (first page and count).
Prints one line per read (median and max, ms) and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "stint_console_bench"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="finished jobs in the table")
    parser.add_argument(
        "--failed-attempts", type=int, default=200_000, help="failed attempt rows beyond one per DEAD job"
    )
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each read")
    return parser.parse_args()


def _seed(jobs: int, failed_attempts: int) -> None:
    from django.db import connection
    from django.utils import timezone

    from scheduler.models import Job

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE stint_job CASCADE")
    now = timezone.now()
    template = Job.objects.create(type="EMAIL", payload={}, status="SUCCESS", scheduled_at=now, finished_at=now)
    # Every other column is copied from the template row (its defaults), these are made per row.
    made = {
        "id": "gen_random_uuid()",
        "type": "CASE WHEN i %% 10 = 0 THEN 'INVOICE' ELSE 'EMAIL' END",
        "payload": "jsonb_build_object('customer', i %% 5000, 'n', i)",
        "status": "CASE WHEN i %% 10 = 0 THEN 'DEAD' ELSE 'SUCCESS' END",
        "attempts": "1",
        "scheduled_at": "now() - (i %% 43200) * interval '1 minute'",
        "created_at": "now() - (i %% 43200) * interval '1 minute'",
        "started_at": "now() - (i %% 43200) * interval '1 minute'",
        "finished_at": "now() - (i %% 43200) * interval '1 minute' + interval '1 second'",
        "last_error": "CASE WHEN i %% 10 = 0 THEN 'RetryableError: upstream ' || (i %% 7) || ' timed out' ELSE '' END",
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM stint_job LIMIT 0")
        columns = [c.name for c in cursor.description]
        select = ", ".join(made.get(c, f"t.{c}") for c in columns)
        cursor.execute(
            f"INSERT INTO stint_job ({', '.join(columns)}) SELECT {select}"  # noqa: S608 - our own column names
            " FROM generate_series(1, %s) AS i, (SELECT * FROM stint_job WHERE id = %s) AS t",
            [jobs, template.id],
        )
        cursor.execute("DELETE FROM stint_job WHERE id = %s", [template.id])
        cursor.execute("SELECT * FROM stint_job_attempt LIMIT 0")
        attempt_columns = [c.name for c in cursor.description if c.name != "id"]
        per_dead = max(1, -(-failed_attempts // max(1, jobs // 10)))
        values = {
            "job_id": "j.id",
            "attempt_number": "g.n",
            "status": "'FAILED'",
            "worker": "'bench'",
            "lease_token": "NULL",
            "started_at": "j.started_at",
            "finished_at": "j.finished_at",
            "error": "j.last_error",
            "traceback": "''",
        }
        cursor.execute(
            f"INSERT INTO stint_job_attempt ({', '.join(attempt_columns)})"  # noqa: S608 - our own column names
            f" SELECT {', '.join(values[c] for c in attempt_columns)}"
            " FROM stint_job j, generate_series(1, %s) AS g(n) WHERE j.status = 'DEAD'",
            [1 + per_dead],
        )
    connection.ensure_connection()
    raw = connection.connection
    old = raw.autocommit
    raw.autocommit = True
    with raw.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE stint_job")
        cursor.execute("VACUUM ANALYZE stint_job_attempt")
        cursor.execute("SELECT count(*) FROM stint_job_attempt")
        print(f"seeded {jobs:,} jobs and {cursor.fetchone()[0]:,} failed attempt rows", flush=True)
    raw.autocommit = old


def _time(name: str, read, runs: int) -> dict:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        read()
        times.append((time.perf_counter() - t0) * 1000)
    figures = {"read": name, "median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
    print(f"{name:<40} median {figures['median_ms']:>8} ms   max {figures['max_ms']:>8} ms", flush=True)
    return figures


def main() -> int:
    """Seed, time each read ``--runs`` times, print; 2 when DATABASE_URL is missing."""
    args = _args()
    sys.path.insert(0, str(ROOT))
    from bench.event_stack import bench_environment, setup_django

    env = bench_environment(BENCH_DB, run_with="python -m devstack run -- python bench/console_scan.py")
    if env is None:
        return 2
    setup_django(env)
    from scheduler import admin_dashboard
    from scheduler.job_search import job_search_parse, jobs_filter_by_search
    from scheduler.models import Job

    _seed(args.jobs, args.failed_attempts)

    def search(text: str):
        def read():
            qs = jobs_filter_by_search(Job.objects.all(), job_search_parse(text)).order_by("-created_at", "-id")
            list(qs[:100])
            qs.count()

        return read

    now = admin_dashboard.db_now()
    results = [
        _time("dashboard_data()", admin_dashboard.dashboard_data, args.runs),
        _time("error_groups() (failures by error)", lambda: admin_dashboard.error_groups(now=now), args.runs),
        _time("search args.customer:42 (page + count)", search("args.customer:42"), args.runs),
        _time("search error:timed (page + count)", search("error:timed"), args.runs),
    ]
    print(json.dumps({"jobs": args.jobs, "failed_attempts": args.failed_attempts, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
