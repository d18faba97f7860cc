"""`python bench/job_list_bench.py`: the job lists and the retention pruner at a million jobs; prints JSON.

Usage: python bench/job_list_bench.py [--jobs N] [--repeat N] [--keep]

Creates the database ``stint_bench_jobs`` next to DATABASE_URL's (dropping an old one unless
``--keep`` finds it seeded), seeds ``--jobs`` jobs (default 1,000,000) with one attempt, one
published outbox event and its audit row per finished job, in a few ``INSERT ... SELECT
generate_series`` statements (100 owners, 30 days of history, 90% SUCCESS and the rest FAILED,
DEAD, CANCELLED and SCHEDULED), ANALYZEs, then times in this
process (Django's test client, the real views and database):

- the operator console's job list (``/admin/scheduler/job/``): first page, page 100, the
  FAILED filter, and the dashboard (``/admin/``);
- ``GET /api/admin/jobs``: the first page and the page its ``next`` link names;
- ``GET /api/jobs`` for one owner (about 1% of the jobs);
- one statement of the retention pruner (500 SUCCESS jobs past 7 days, with their attempts,
  outbox events and audit rows), rolled back after each timed run;
- the console's live queues-and-workers page and its ``data.json`` (``scheduler.ops_figures``),
  and ``GET /api/jobs?search=`` for one owner.

Each figure is the median of ``--repeat`` timed runs after one warm-up, in milliseconds. The
machine is shared: compare figures from the same run, not across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.event_stack import fresh_database  # noqa: E402 - after the path is set

BENCH_DB = "stint_bench_jobs"
OWNERS = 100
HISTORY_SECONDS = 30 * 86400  # seconds of history the seeded jobs are spread over

_SEED_JOBS = """
    INSERT INTO stint_job (
        id, owner_id, name, type, payload, status, priority, queue, scheduled_at, attempts, attempts_base,
        max_retries, timeout_seconds, cancel_requested, event_sequence, created_at, updated_at, started_at,
        finished_at, last_error)
    SELECT gen_random_uuid(), (%(owners)s)[1 + i %% %(n_owners)s], 'bench ' || i, 'DEMO_TASK', '{}'::jsonb,
           s.status, i %% 3, 'default', t.at, 1, 0, 3, 300, false, 4, t.at, t.at, t.at,
           CASE WHEN s.status = 'SCHEDULED' THEN NULL ELSE t.at + interval '1 second' END,
           CASE WHEN s.status IN ('FAILED', 'DEAD') THEN 'boom' ELSE '' END
    FROM generate_series(1, %(jobs)s) AS i
    CROSS JOIN LATERAL (
        SELECT now() - make_interval(secs => (%(jobs)s - i) * %(spacing)s::float8) AS at
    ) AS t
    CROSS JOIN LATERAL (
        SELECT CASE WHEN i %% 100 < 90 THEN 'SUCCESS' WHEN i %% 100 < 93 THEN 'FAILED'
                    WHEN i %% 100 < 95 THEN 'DEAD' WHEN i %% 100 < 97 THEN 'CANCELLED'
                    ELSE 'SCHEDULED' END AS status
    ) AS s
"""
_SEED_ATTEMPTS = """
    INSERT INTO stint_job_attempt (job_id, attempt_number, status, worker, started_at, finished_at, error, traceback)
    SELECT id, 1, CASE WHEN status = 'SUCCESS' THEN 'SUCCEEDED' ELSE 'FAILED' END, 'bench', started_at,
           finished_at, '', ''
    FROM stint_job WHERE status <> 'SCHEDULED'
"""
# One published outbox event (a row of one) and its audit row per finished job (the pruner deletes the audit row).
_SEED_EVENTS = """
    INSERT INTO stint_outbox (schema_version, occurred_at, published_at, event_count, events)
    SELECT 1, finished_at, finished_at, 1, jsonb_build_array(jsonb_build_object(
        'event_id', gen_random_uuid(), 'event_type', 'JOB_COMPLETED', 'job_id', id, 'owner_id', owner_id,
        'sequence', 4, 'attempt', 1, 'from_status', 'RUNNING', 'to_status', status, 'payload', '{}'::jsonb))
    FROM stint_job WHERE status <> 'SCHEDULED'
"""
_SEED_AUDIT = """
    INSERT INTO stint_audit_event (event_id, job_id, event_type, owner_id, sequence, attempt, from_status,
                                   to_status, schema_version, payload, occurred_at, received_at)
    SELECT event_id, job_id, event_type, owner_id, sequence, attempt, from_status, to_status, 1, '{}'::jsonb,
           occurred_at, occurred_at
    FROM stint_outbox_event
"""


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs to seed")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per figure (median reported)")
    parser.add_argument("--keep", action="store_true", help="reuse stint_bench_jobs if it holds --jobs jobs")
    return parser.parse_args()


def _database(base: str, *, jobs: int, keep: bool) -> tuple[str, bool]:
    """Return the benchmark database's URL and whether it must be seeded."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    url = urlunsplit(urlsplit(base)._replace(path=f"/{BENCH_DB}"))
    if keep:
        try:
            with psycopg.connect(url) as conn:
                if conn.execute("SELECT count(*) FROM stint_job").fetchone()[0] == jobs:
                    return url, False
        except psycopg.Error:
            pass
    return fresh_database(base, BENCH_DB), True


def _seed(jobs: int) -> float:
    from django.db import connection

    from accounts.models import Role, User

    started = time.monotonic()
    users = User.objects.bulk_create(
        [User(username=f"owner{i}", password="!", role=Role.USER) for i in range(OWNERS)]  # noqa: S106 - unusable
    )
    User.objects.create(username="operator", password="!", role=Role.ADMIN, is_staff=True, is_superuser=True)  # noqa: S106
    with connection.cursor() as cursor:
        cursor.execute(
            _SEED_JOBS,
            {"owners": [u.pk for u in users], "n_owners": OWNERS, "jobs": jobs, "spacing": HISTORY_SECONDS / jobs},
        )
        cursor.execute(_SEED_ATTEMPTS)
        cursor.execute(_SEED_EVENTS)
        cursor.execute(_SEED_AUDIT)
        for table in ("stint_job", "stint_job_attempt", "stint_outbox", "stint_audit_event"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return time.monotonic() - started


def _median_ms(call: Callable[[], object], repeat: int) -> float:
    call()  # warm-up: connections, templates, plans
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


def _get(client: object, url: str) -> Callable[[], object]:
    def call() -> object:
        response = client.get(url)  # type: ignore[attr-defined]
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code}")
        return response

    return call


def main() -> None:
    args = _args()
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/stint")
    url, must_seed = _database(base, jobs=args.jobs, keep=args.keep)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    seed_s = _seed(args.jobs) if must_seed else None

    from django.conf import settings
    from django.db import connection, transaction
    from django.test import Client
    from rest_framework.test import APIClient
    from rest_framework_simplejwt.tokens import RefreshToken

    from accounts.models import User
    from scheduler.maintenance.pruner import jobs_prune

    settings.ALLOWED_HOSTS = ["*"]
    settings.STINT_RATE_LIMITS = {"user": None, "auth": None}
    operator = User.objects.get(username="operator")
    owner = User.objects.get(username="owner7")
    console = Client()
    console.force_login(operator)
    admin_api = APIClient()
    admin_api.credentials(HTTP_AUTHORIZATION=f"Bearer {RefreshToken.for_user(operator).access_token}")
    owner_api = APIClient()
    owner_api.credentials(HTTP_AUTHORIZATION=f"Bearer {RefreshToken.for_user(owner).access_token}")
    next_url = admin_api.get("/api/admin/jobs").json()["next"]

    def prune_batch() -> int:
        # Timed inside a transaction that is rolled back, so every run deletes the same 500 jobs.
        with transaction.atomic():
            deleted = jobs_prune(status="SUCCESS", days=7)
            transaction.set_rollback(True)
        return deleted

    figures = {
        "console_job_list_first_page_ms": _median_ms(_get(console, "/admin/scheduler/job/"), args.repeat),
        "console_job_list_page_100_ms": _median_ms(_get(console, "/admin/scheduler/job/?p=100"), args.repeat),
        "console_job_list_failed_ms": _median_ms(
            _get(console, "/admin/scheduler/job/?status__exact=FAILED"), args.repeat
        ),
        "console_dashboard_ms": _median_ms(_get(console, "/admin/"), args.repeat),
        "api_admin_jobs_first_page_ms": _median_ms(_get(admin_api, "/api/admin/jobs"), args.repeat),
        "api_admin_jobs_next_page_ms": _median_ms(_get(admin_api, next_url), args.repeat),
        "api_jobs_one_owner_first_page_ms": _median_ms(_get(owner_api, "/api/jobs"), args.repeat),
        "pruner_batch_of_500_ms": _median_ms(prune_batch, args.repeat),
        "console_queues_page_ms": _median_ms(_get(console, "/admin/stint/queues/"), args.repeat),
        "console_queues_data_json_ms": _median_ms(_get(console, "/admin/stint/queues/data.json"), args.repeat),
        "api_jobs_search_one_owner_ms": _median_ms(_get(owner_api, "/api/jobs?search=bench%2012"), args.repeat),
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM stint_job")
        total = cursor.fetchone()[0]
    print(  # noqa: T201 - the benchmark's output
        json.dumps(
            {
                "bench": "job_lists",
                "jobs": total,
                "seeded_in_s": round(seed_s, 1) if seed_s is not None else None,
                "repeat": args.repeat,
                **figures,
            }
        )
    )


if __name__ == "__main__":
    main()
