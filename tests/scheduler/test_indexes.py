"""The job table's indexes serve the reads that need them (plans read with sequential scans off)."""

from __future__ import annotations

import pytest
from django.db import connection

from scheduler.enqueuing import enqueue
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
