"""`python bench/action_log_bulk.py`: what recording the operator action history costs a bulk cancel.

Usage: python -m devstack run -- python bench/action_log_bulk.py [--jobs N] [--runs N]

In a fresh database (``stint_action_log_bench`` next to DATABASE_URL's): ``--jobs`` QUEUED jobs,
cancelled by ``bulk.job_bulk_apply`` (one short transaction per job, as the console's actions and
"all matching" view do), alternately as a trusted caller (``actor`` None: nothing is recorded,
the cost before the history) and as an ADMIN (one ``LogEntry`` per job, in the job's
transaction). Then the History page's read of one job's entries among them all. Prints one
line per run and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "stint_action_log_bench"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000, help="QUEUED jobs cancelled per run")
    parser.add_argument("--runs", type=int, default=2, help="runs of each kind (without, then with, alternately)")
    return parser.parse_args()


def _seed(jobs: int) -> list:
    from django.db import connection
    from django.utils import timezone

    from scheduler.models import Job

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE stint_job CASCADE")
    template = Job.objects.create(type="DEMO_TASK", payload={}, status="QUEUED", scheduled_at=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM stint_job LIMIT 0")
        columns = [c.name for c in cursor.description]
        select = ", ".join("gen_random_uuid()" if c == "id" else f"t.{c}" for c in columns)
        cursor.execute(
            f"INSERT INTO stint_job ({', '.join(columns)}) SELECT {select}"  # noqa: S608 - our own column names
            " FROM generate_series(1, %s) AS i, (SELECT * FROM stint_job WHERE id = %s) AS t",
            [jobs, template.id],
        )
        cursor.execute("DELETE FROM stint_job WHERE id = %s", [template.id])
        cursor.execute("ANALYZE stint_job")
    return list(Job.objects.order_by("id").values_list("id", flat=True))


def main() -> int:
    """Seed, cancel, time, print; 2 when DATABASE_URL is missing."""
    args = _args()
    sys.path.insert(0, str(ROOT))
    from bench.event_stack import bench_environment, setup_django

    env = bench_environment(BENCH_DB, run_with="python -m devstack run -- python bench/action_log_bulk.py")
    if env is None:
        return 2
    setup_django(env)
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    from accounts.models import Role, User
    from scheduler.bulk import job_bulk_apply
    from scheduler.models import Job

    admin, _ = User.objects.get_or_create(username="bench-admin", defaults={"role": Role.ADMIN, "is_staff": True})
    results: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(args.runs):
        for kind, actor in (("without", None), ("with", admin)):
            ids = _seed(args.jobs)
            t0 = time.perf_counter()
            outcome = job_bulk_apply(action="cancel", job_ids=ids, actor=actor)
            seconds = time.perf_counter() - t0
            results[kind].append(seconds)
            print(
                f"{kind:<8} history: cancelled {outcome.changed:,} in {seconds:.2f} s"
                f" ({seconds / args.jobs * 1000:.3f} ms a job); {LogEntry.objects.count():,} entries",
                flush=True,
            )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_admin_log")
    t0 = time.perf_counter()  # the History page's read (ModelAdmin.history_view)
    list(
        LogEntry.objects.filter(content_type=ContentType.objects.get_for_model(Job), object_id=str(ids[len(ids) // 2]))
    )
    history_ms = (time.perf_counter() - t0) * 1000
    summary = {
        "jobs": args.jobs,
        "without_s": round(statistics.median(results["without"]), 2),
        "with_s": round(statistics.median(results["with"]), 2),
        "history_read_ms": round(history_ms, 1),
        "entries": LogEntry.objects.count(),
    }
    summary["extra_ms_per_job"] = round((summary["with_s"] - summary["without_s"]) / args.jobs * 1000, 3)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
