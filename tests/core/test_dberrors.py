"""Which database errors a batch writer retries as a whole (transient) and which it isolates."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DataError, IntegrityError, InterfaceError, OperationalError, connection, transaction

from core.dberrors import db_error_is_transient, db_error_summary
from core.pg_connect import pg_connect


def error_of(sql: str) -> BaseException:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    except Exception as exc:
        return exc
    raise AssertionError(f"{sql} did not fail")


@pytest.mark.django_db(transaction=True)
def test_a_terminated_connection_is_transient():
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with pg_connect() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])

    terminated = error_of("SELECT 1")
    connection.close()

    assert isinstance(terminated, OperationalError) and db_error_is_transient(terminated)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1/0",
        "SELECT 'x'::int",
        "SELECT '{\"n\": Infinity}'::jsonb",
        "SELECT '\"\\u0000\"'::jsonb",
        "SELECT (2^40)::int",
    ],
)
def test_an_error_of_the_data_is_not_transient(sql):
    exc = error_of(sql)

    assert isinstance(exc, DataError)
    assert not db_error_is_transient(exc)


@pytest.mark.django_db
def test_a_constraint_violation_is_not_transient():
    exc = error_of("CREATE TEMP TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (1)")

    assert isinstance(exc, IntegrityError)
    assert not db_error_is_transient(exc)


def test_deadlocks_shutdowns_and_closed_connections_are_transient_other_exceptions_are_not():
    assert db_error_is_transient(psycopg.errors.DeadlockDetected())  # class 40
    assert db_error_is_transient(psycopg.errors.SerializationFailure())
    assert db_error_is_transient(psycopg.errors.DiskFull())  # class 53
    assert db_error_is_transient(psycopg.errors.AdminShutdown())  # class 57
    assert db_error_is_transient(InterfaceError("connection already closed"))
    assert db_error_is_transient(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert not db_error_is_transient(psycopg.errors.ProgramLimitExceeded())  # an index row too large: the data's
    assert not db_error_is_transient(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    assert not db_error_is_transient(ValueError("not a database error"))


@pytest.mark.django_db(transaction=True)
def test_a_summary_names_a_lock_timeout_and_a_statement_timeout_not_the_database_down():
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '50ms'")
    timed_out = error_of("SELECT pg_sleep(2)")
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 0; SET lock_timeout = '50ms'")
    with pg_connect(autocommit=False) as locker:
        locker.execute("LOCK TABLE stint_job IN ACCESS EXCLUSIVE MODE")
        lock_wait = error_of("SELECT count(*) FROM stint_job")
        locker.rollback()
    connection.close()  # the session's timeouts go with it

    assert db_error_summary(timed_out) == (
        "a statement was cancelled (SQLSTATE 57014 query_canceled: canceling statement due to statement timeout)"
    )
    assert db_error_summary(lock_wait) == (
        "waiting for a lock timed out (SQLSTATE 55P03 lock_not_available: canceling statement due to lock timeout)"
    )


@pytest.mark.django_db(transaction=True)
def test_a_summary_of_a_lost_connection_says_the_database_is_unavailable():
    connection.ensure_connection()
    with pg_connect() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    lost = error_of("SELECT 1")
    connection.close()

    assert db_error_summary(lost).startswith("database unavailable (")
    assert "\n" not in db_error_summary(lost)
