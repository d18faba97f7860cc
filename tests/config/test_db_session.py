"""Every database connection bounds how long a vanished or stuck client can hold a session and its row locks.

Finding F6 of docs/chaos-findings.md: a scheduler cut off from the database host mid-transaction
kept job rows locked (``FOR UPDATE``) in an ``idle in transaction`` session for as long as the
server kept it, i.e. until the OS's TCP keepalive (2 hours) gave up on the client.
"""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config.db_session import session_options

pytestmark = pytest.mark.django_db(transaction=True)


def _libpq_params() -> dict[str, str]:
    return dict(item.split("=", 1) for item in connection.connection.info.dsn.split() if "=" in item)


def test_every_django_connection_has_keepalives_and_an_idle_in_transaction_bound():
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        assert cursor.fetchone()[0] == "1min"
        cursor.execute("SHOW tcp_keepalives_idle")  # 0 on a Unix socket, where there is no TCP
        assert cursor.fetchone()[0] in ("10", "0")
        cursor.execute("SHOW tcp_user_timeout")  # in ms
        assert cursor.fetchone()[0] in ("30000", "0")
    params = _libpq_params()
    assert params["keepalives"] == "1"
    assert params["keepalives_idle"] == "10"
    assert params["tcp_user_timeout"] == "30000"
    assert settings.DATABASES["default"]["OPTIONS"]["application_name"].startswith("stint-")


def test_a_session_left_idle_in_a_transaction_loses_its_row_locks():
    """The holder takes a row lock and goes silent; the server ends its session and a waiter gets the row."""
    url = settings.DATABASES["default"]
    conninfo = {
        "host": url["HOST"],
        "port": url["PORT"] or 5432,
        "user": url["USER"],
        "password": url["PASSWORD"] or None,
        "dbname": url["NAME"],
    }
    with psycopg.connect(**conninfo, autocommit=True) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS db_session_probe (id int PRIMARY KEY)")
        setup.execute("INSERT INTO db_session_probe VALUES (1) ON CONFLICT DO NOTHING")
    holder = psycopg.connect(**conninfo, **session_options(idle_in_transaction_seconds=1))
    try:
        holder.execute("SELECT id FROM db_session_probe WHERE id = 1 FOR UPDATE")  # and never commits
        with psycopg.connect(**conninfo) as waiter:
            waiter.execute("SET lock_timeout = '30s'")
            assert waiter.execute("SELECT id FROM db_session_probe WHERE id = 1 FOR UPDATE").fetchone() == (1,)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            holder.execute("SELECT 1")
    finally:
        holder.close()
