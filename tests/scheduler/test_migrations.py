"""Migration scheduler 0005_integer_priority: stored priorities move to the integer scale and back."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("scheduler", "0004_retention_indexes")
INTEGER = ("scheduler", "0005_integer_priority")


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


def _insert_job(priority: int) -> uuid.UUID:
    job_id = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO stint_job (id, name, type, payload, status, priority, queue, scheduled_at, attempts,
                                   attempts_base, max_retries, timeout_seconds, cancel_requested, event_sequence,
                                   created_at, updated_at, last_error)
            VALUES (%s, '', 'DEMO_TASK', '{}', 'QUEUED', %s, 'default', now(), 0, 0, 3, 300, false, 0, now(), now(), '')
            """,
            [job_id, priority],
        )
    return job_id


def _priorities(ids: list[uuid.UUID]) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, priority FROM stint_job WHERE id = ANY(%s)", [ids])
        found = dict(cursor.fetchall())
    return [found[i] for i in ids]


def test_0005_maps_high_medium_low_to_50_0_minus_50_and_back() -> None:
    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler")
    try:
        _migrate(BEFORE)
        old = [_insert_job(p) for p in (0, 1, 2)]  # HIGH, MEDIUM, LOW in the old numbering

        _migrate(INTEGER)
        assert _priorities(old) == [50, 0, -50]
        between = [_insert_job(p) for p in (37, -5)]

        _migrate(BEFORE)
        assert _priorities(old + between) == [0, 1, 2, 0, 2]  # values between the names fall into bands
    finally:
        _migrate(leaf[0])
