"""The job table's indexes serve the reads that need them (plans read with sequential scans off)."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from scheduler import lifecycle
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.selectors import _OWNERS_WITH_JOBS
from tests.support.factories import JobFactory, UserFactory

pytestmark = pytest.mark.django_db


def plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE stint_job")  # statistics of this test's rows, whatever ran before
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_job_owner_recent_holds_only_jobs_with_an_owner_and_serves_every_read_by_owner() -> None:
    owner = UserFactory()
    JobFactory(owner=owner)
    enqueue("DEMO_TASK")  # enqueued by code: no owner
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_owner_recent'")
        assert cursor.fetchone()[0].endswith("WHERE (owner_id IS NOT NULL)")
        cursor.execute("SELECT count(*) FROM stint_job WHERE owner_id IS NOT NULL")
        assert cursor.fetchone()[0] == 1

    # A user's jobs (the planner picks between this index and job_recent by the table's statistics
    # when it also sorts; the lookup itself must be able to use this partial index).
    assert "Index Cond: (owner_id = " in plan("SELECT count(*) FROM stint_job WHERE owner_id = %s", [owner.pk])
    assert "job_owner_recent" in plan("SELECT count(*) FROM stint_job WHERE owner_id = %s", [owner.pk])
    assert "job_owner_recent" in plan(_OWNERS_WITH_JOBS, [10])  # the console's owner filter (loose scan)
    assert "job_owner_recent" in plan("DELETE FROM stint_job WHERE owner_id = %s", [owner.pk])  # a user deleted


def test_the_claim_scan_is_planned_on_the_claim_index_once_statistics_show_one_busy_queue() -> None:
    """With fresh statistics of a backlog in one queue, the claim's candidates read the claim index in order.

    The in-statement pause check (``lifecycle.NOT_PAUSED``) compares ``queue`` with the paused queues,
    which the planner cannot know: written as ``queue <> ALL(ARRAY(...))`` it estimated that no job
    passes when every job is in one queue (one distinct value), and planned each claim as a scan of the
    whole table and a sort (seen in a 20,000-job drain: 10-50 ms per claim instead of about 1).
    Planned as is (sequential scans allowed): the estimate is what is tested.
    """
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(2000)])
    where = lifecycle._candidates_where(None, [], isolated=False, include_held=False)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE stint_job")
        cursor.execute(
            f"EXPLAIN (FORMAT JSON) SELECT id FROM stint_job WHERE {where}",  # noqa: S608 - constants
            {"queues": [], "paused": []},
        )
        candidates = _json_plan(cursor.fetchone()[0])
        cursor.execute(
            f"EXPLAIN SELECT id FROM stint_job WHERE {where} ORDER BY {lifecycle.CLAIM_ORDER} LIMIT 100",  # noqa: S608
            {"queues": [], "paused": []},
        )
        claim_plan = "\n".join(row[0] for row in cursor.fetchall())
    assert candidates["Plan Rows"] >= 200  # of 2,000 due: not "none"
    assert "job_claim_scan_desc" in claim_plan
    assert "Sort" not in claim_plan


def _json_plan(value: object) -> dict:
    return (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]


def test_the_claim_scan_of_a_worker_that_saw_a_queue_paused_is_planned_on_the_claim_index() -> None:
    """The worker's own paused list is a parameter of a prepared claim: its generic plan must not read the whole table.

    A generic plan knows nothing of the list, and ``NOT (queue = ANY(list))`` was estimated from the
    column's few distinct values to pass almost no job: a scan of the table and a sort again.
    """
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(2000)])
    enqueue_many([{"type": "DEMO_TASK", "queue": "other"} for _ in range(20)])
    where = lifecycle._candidates_where(None, ["other"], isolated=False, include_held=False)
    sql = f"SELECT id FROM stint_job WHERE {where} ORDER BY {lifecycle.CLAIM_ORDER} LIMIT 100"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE stint_job")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(
            "PREPARE claim_scan(text[], text[]) AS " + sql.replace("%(queues)s", "$1").replace("%(paused)s", "$2")
        )
        cursor.execute("EXPLAIN EXECUTE claim_scan('{}', '{other}')")
        claim_plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE claim_scan")
    assert "job_claim_scan_desc" in claim_plan
    assert "Sort" not in claim_plan


def test_analyze_leaves_out_the_documents_and_keeps_the_columns_plans_read() -> None:
    """ANALYZE builds no statistics for the jsonb documents (sorting distinct payloads was most of
    autoanalyze's cost in a drain: migration 0022) and still builds them for what plans filter on."""
    enqueue_many([{"type": "DEMO_TASK", "payload": {"i": i}} for i in range(200)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE stint_job, stint_outbox, stint_audit_event")
        cursor.execute(
            "SELECT tablename || '.' || attname FROM pg_stats"
            " WHERE tablename IN ('stint_job', 'stint_outbox', 'stint_audit_event')"
        )
        analyzed = {row[0] for row in cursor.fetchall()}
    documents = {"stint_job.payload", "stint_job.result", "stint_job.progress", "stint_job.trace_context"}
    documents |= {"stint_outbox.events", "stint_outbox.packed_events", "stint_audit_event.payload"}
    assert not analyzed & documents
    assert {"stint_job.status", "stint_job.queue", "stint_job.type", "stint_job.scheduled_at"} <= analyzed
