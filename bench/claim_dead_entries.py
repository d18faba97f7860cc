"""What a claim costs as finished jobs pile up between two vacuums of ``stint_job``.

Usage: python -m devstack run -- .venv/bin/python bench/claim_dead_entries.py [--steps 0,20000,100000,400000,1000000]

Every claim walks the partial index ``job_claim_scan_desc`` (QUEUED jobs, in claim order) from
its start. A job that leaves QUEUED leaves its entry behind, dead, until a VACUUM of ``stint_job``
removes it: the first scan that meets it marks it dead, and every later scan still reads its
index page. Finished jobs are older than the queued ones, so their entries sit before every live
entry and each claim reads all of them (``scheduler.maintenance.claim_index`` explains when
autovacuum removes them, and VACUUMs when it does not).

This measures it on a fresh database, the claim index upkeep not running: for each step, that
many jobs are queued (one row each, distinct times, as enqueues make them; one ``INSERT ...
SELECT``: the enqueue path is not what is measured), claimed through ``lifecycle.claim`` (the
workers' statement, 1,000 a call), finished and ``ANALYZE``d. Then: the time of a claim that
finds nothing and of a claim of one new job (``lifecycle.claim``, its own transaction, median
and p95 of ``--claims`` calls), the index's size in pages and the table's dead rows. Last, after
``VACUUM (INDEX_CLEANUP ON) stint_job``, the same figures again. Prints one JSON line per step
and a Markdown table.

Autovacuum is turned off for the run's ``stint_job`` (its own fresh database): in a table of
nothing but recent jobs it would come at once, where a production table's days of kept jobs
defer it by hours. The JSON says whether one ran anyway (``autovacuums``). A benchmark, not a
test: its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_stack import bench_environment, setup_django  # noqa: E402 - after the path fix

CLAIM_BATCH = 1000  # jobs per lifecycle.claim call while building the dead entries


def main() -> int:
    """Run the measurement; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="0,20000,100000,400000,1000000", help="finished jobs in total at each step")
    parser.add_argument("--claims", type=int, default=200, help="claims timed per figure")
    args = parser.parse_args()
    env = bench_environment(
        "stint_bench_claim_dead", run_with="python -m devstack run -- .venv/bin/python bench/claim_dead_entries.py"
    )
    if env is None:
        return 2
    setup_django(env)
    from django.db import connection

    with connection.cursor() as cursor:
        # "Between two vacuums" on any server: in this young table of recent jobs only, autovacuum
        # would come at once, where in production a large history of kept jobs defers it by hours.
        cursor.execute("ALTER TABLE stint_job SET (autovacuum_enabled = false)")
    rows = []
    done = 0
    for target in (int(s) for s in args.steps.split(",")):
        _finish_jobs(target - done, first=done)
        done = target
        rows.append({"finished_jobs": done, "vacuumed": False, **_figures(args.claims)})
        print(json.dumps(rows[-1]), flush=True)
    vacuum_seconds = _vacuum()
    rows.append({"finished_jobs": done, "vacuumed": True, "vacuum_seconds": vacuum_seconds, **_figures(args.claims)})
    print(json.dumps(rows[-1]), flush=True)
    print()
    print("| finished jobs since the last VACUUM | index pages | empty claim p50 / p95 | claim of 1 job p50 / p95 |")
    print("|---|---|---|---|")
    for row in rows:
        label = f"{row['finished_jobs']:,}"
        if row["vacuumed"]:
            label += f", then VACUUM ({row['vacuum_seconds']:.2f} s)"
        print(
            f"| {label} | {row['index_pages']:,} | {row['empty_claim_ms']['p50']:.2f} / "
            f"{row['empty_claim_ms']['p95']:.2f} ms | {row['one_job_claim_ms']['p50']:.2f} / "
            f"{row['one_job_claim_ms']['p95']:.2f} ms |"
        )
    return 0


def queue_jobs(count: int, *, first: int = 0) -> None:
    """Insert ``count`` QUEUED no-op jobs in one statement, numbered from ``first + 1``.

    Each gets its own time, a millisecond after the one before and a day in the past, older than
    any job enqueued later: as jobs enqueued one after the other (their claim-index entries are
    distinct keys in enqueue order). Their events are not written: not what is measured.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO stint_job (id, name, type, payload, status, priority, queue, scheduled_at, attempts,
                                   attempts_base, max_retries, timeout_seconds, cancel_requested, event_sequence,
                                   created_at, updated_at, last_error, isolated)
            SELECT gen_random_uuid(), '', 'DEMO_TASK', '{}', 'QUEUED', 0, 'default',
                   now() - interval '1 day' + g * interval '1 ms', 0, 0, 3, 300, false, 2,
                   now() - interval '1 day' + g * interval '1 ms', now(), '', false
            FROM generate_series(%s, %s) AS g
            """,
            [first + 1, first + count],
        )


def _finish_jobs(count: int, *, first: int) -> None:
    """Queue ``count`` jobs (``queue_jobs``), claim them all through ``lifecycle.claim``, mark them SUCCESS."""
    from django.db import connection, transaction

    from scheduler import lifecycle

    if count <= 0:
        return
    queue_jobs(count, first=first)
    while True:
        with transaction.atomic():
            claimed = lifecycle.claim(worker_id="bench", limit=CLAIM_BATCH, lease_seconds=300, queues=None)
        if not claimed:
            break
    with connection.cursor() as cursor:
        cursor.execute("UPDATE stint_job SET status = 'SUCCESS', finished_at = now() WHERE status = 'RUNNING'")
        # Fresh statistics, as autovacuum's ANALYZE keeps them (it runs after a tenth of the rows
        # changed, far more often than its VACUUM): the claim then plans the index scan it uses in
        # production, which reads the dead entries' pages, not their rows.
        cursor.execute("ANALYZE stint_job")


def _figures(claims: int) -> dict[str, Any]:
    """Time empty claims and claims of one new job; read the index size, dead rows and autovacuum count."""
    from django.db import connection

    from scheduler import lifecycle
    from scheduler.enqueuing import enqueue

    def claim() -> float:
        started = time.perf_counter()
        lifecycle.claim(worker_id="bench", limit=50, lease_seconds=300, queues=None)
        return (time.perf_counter() - started) * 1000

    claim()  # the first scan marks the dead entries; later ones only read past them
    empty = [claim() for _ in range(claims)]
    one = []
    for _ in range(claims):
        enqueue("BENCH_NOOP", {})
        one.append(claim())
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT pg_relation_size('job_claim_scan_desc') / current_setting('block_size')::int,
                   n_dead_tup, autovacuum_count
            FROM pg_stat_user_tables WHERE relname = 'stint_job'
            """
        )
        pages, dead, autovacuums = cursor.fetchone()
    return {
        "index_pages": pages,
        "dead_rows": dead,
        "autovacuums": autovacuums,
        "empty_claim_ms": _summary(empty),
        "one_job_claim_ms": _summary(one),
    }


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 3), "p95": round(ordered[int(len(ordered) * 0.95)], 3)}


def _vacuum() -> float:
    """Run ``VACUUM (INDEX_CLEANUP ON) stint_job``; return how long it took, in seconds."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (INDEX_CLEANUP ON) stint_job")
    return round(time.perf_counter() - started, 3)


if __name__ == "__main__":
    sys.exit(main())
