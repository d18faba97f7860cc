"""The job path's statements run prepared on Django's connection, or unprepared when turned off."""

from __future__ import annotations

import pytest
from django.db import connection

import scheduler
from scheduler import leasing
from scheduler.models import Job

pytestmark = pytest.mark.django_db


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_enqueue_claim_and_outcome_statements_are_prepared_once_per_connection() -> None:
    before = len(prepared_statements())
    for _ in range(3):
        scheduler.enqueue("DEMO_TASK")
    statements = prepared_statements()
    assert len(statements) == before + 1  # three enqueues, one prepared statement
    assert any("INSERT INTO stint_job " in s for s in statements)

    scheduler.enqueue("DEMO_TASK")
    first, second = leasing.claim_jobs(worker_id="w", limit=2, queues=None)
    for claimed in (first, second):  # two outcome batches of the same shape
        leasing.record_batch([leasing.Report(job=claimed, outcome=leasing.Outcome.SUCCEEDED, result=None)])
    statements = prepared_statements()
    assert any("UPDATE stint_job j" in s and "lease_token = gen_random_uuid()" in s for s in statements)
    # The outcome too: its rows travel as one jsonb document, so one plan fits every batch size.
    assert sum("ROWS FROM" in s and "result_status = v.ast" in s for s in statements) == 1
    assert all(Job.objects.get(id=c.id).stored_result is not None for c in (first, second))


@pytest.mark.django_db(transaction=True)
def test_with_prepared_statements_off_nothing_is_prepared(settings) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "PREPARED_STATEMENTS": False}  # behind PgBouncer < 1.21
    connection.close()  # a fresh connection: none prepared yet
    for _ in range(3):
        scheduler.enqueue("DEMO_TASK")
    (claimed,) = leasing.claim_jobs(worker_id="w", limit=1, queues=None)
    leasing.record_batch([leasing.Report(job=claimed, outcome=leasing.Outcome.SUCCEEDED, result=None)])
    assert prepared_statements() == []


def test_a_prepared_cursor_loads_timestamps_as_the_same_aware_instants_as_django() -> None:
    from scheduler import prepared

    timestamptz = 1184  # its type OID

    sql = (
        "SELECT now(), timestamptz '2026-03-29 01:30:00+01', timestamptz '1999-12-31 23:59:59.999999-08',"
        " NULL::timestamptz"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        by_django = cursor.fetchone()
    with prepared.cursor() as cursor:
        cursor.execute(sql, {})
        ours = cursor.fetchone()

    assert ours == by_django  # same instants (now() is the transaction's: one transaction here)
    assert all(value.utcoffset() is not None for value in ours[:3])  # aware, as Django's
    assert ours[3] is None
    with prepared.cursor() as cursor:  # psycopg's C loader, where Django's connection has its Python one
        assert cursor._cursor.adapters.get_loader(timestamptz, 0).__module__ == "psycopg_binary._psycopg"
    assert connection.connection.adapters.get_loader(timestamptz, 0).__module__.startswith("django.")


def test_statements_in_turn_on_one_connection_each_return_their_own_rows() -> None:
    from scheduler import prepared

    # One cursor per connection serves every statement (prepared._reused_cursor): nothing of
    # one result may show in the next.
    assert prepared.fetchall("SELECT generate_series(1, %s)", [3]) == [(1,), (2,), (3,)]
    assert prepared.fetchall("SET LOCAL statement_timeout = 0", []) == []  # no result set
    assert prepared.execute("SELECT 1 WHERE false", []) == 0
    assert prepared.fetchall("SELECT %s::text", ["x"]) == [("x",)]
    with prepared.cursor() as cursor:  # a PreparedCursor keeps its own cursor
        cursor.execute("SELECT 2", [])
        assert prepared.fetchall("SELECT 3", []) == [(3,)]
        assert cursor.fetchall() == [(2,)]


@pytest.mark.django_db(transaction=True)
def test_after_a_reconnect_statements_run_on_the_new_connection() -> None:
    from scheduler import prepared

    prepared.fetchall("SELECT 1", [])
    old = connection.connection
    connection.close()
    (pid,) = prepared.fetchall("SELECT pg_backend_pid()", [])
    assert connection.connection is not old
    assert pid == (connection.connection.info.backend_pid,)
