"""Run the job path's big statements with server-side binding, prepared once per connection.

Django's psycopg backend binds parameters on the client (``ClientCursor``): every call quotes
each array element into the SQL text, and PostgreSQL parses and plans the whole CTE again.
The enqueue, claim and outcome statements are few, fixed texts run thousands of times a
second, so they go through a plain psycopg ``Cursor`` on Django's own connection (same
transaction, same type adapters): parameters travel separately in the extended protocol, and
the enqueue, claim and transition texts are parsed and planned once per connection.

Their cursors load ``timestamptz`` with psycopg's own (C) loader instead of the Python subclass
Django registers on its connections (which parses in Python, then replaces the tzinfo): a claim
returns two timestamps a job, and the Python parse was a fifth of a worker's CPU in a drain.
Both give an aware datetime of the same instant (Django's in its connection's time zone, UTC
unless ``DATABASES["default"]["TIME_ZONE"]`` says otherwise; psycopg's in the session's, which
Django sets to that same zone).

Behind a pooler in transaction mode (PgBouncer before 1.21, or without
``max_prepared_statements``) named prepared statements break: ``SCHEDULER["PREPARED_STATEMENTS"]``
(``STINT_DB_PREPARED_STATEMENTS``) False keeps server-side binding with unnamed statements,
which every pooler supports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.pq import ExecStatus
from psycopg.types.datetime import TimestamptzLoader

from scheduler.conf import conf

TUPLES_OK = ExecStatus.TUPLES_OK
_local = threading.local()  # _reused_cursor's cursor, one per thread like Django's connections
NEVER_AUTO = 2**31 - 1  # a psycopg prepare_threshold no statement reaches: only prepare=True prepares


def fetchall(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Execute ``sql`` (``%s`` or ``%(name)s`` placeholders) with server-side binding; return its rows.

    Runs on Django's connection, inside whatever transaction the caller holds (autocommit
    outside ``transaction.atomic``: the statement is then its own transaction). A statement that
    returns no rows gives ``[]``. Raises Django's wrapped database errors, as ``connection.cursor()``
    does, so callers catch ``django.db.OperationalError`` and friends as before. Logged in
    ``connection.queries`` when Django logs queries (DEBUG, ``CaptureQueriesContext``).
    """
    rows, _ = _run(sql, params, fetch=True)
    return rows


def execute(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> int:
    """Execute ``sql`` as ``fetchall`` does, for a statement without rows; return its row count."""
    _, count = _run(sql, params, fetch=False)
    return count


def _prepare_flag(raw: psycopg.Connection[Any]) -> bool:
    """Whether to prepare on ``raw``, after making sure psycopg will when asked.

    Django opens its connections with ``prepare_threshold=None`` (unless ``OPTIONS`` names one),
    and with ``None`` psycopg ignores even ``prepare=True``. A threshold psycopg never reaches
    (``NEVER_AUTO``) lets our explicit ``prepare=True`` work while nothing else is prepared
    behind our back: Django's own cursors bind on the client and never prepare anyway.
    """
    if not conf().prepared_statements:
        return False
    if raw.prepare_threshold is None:
        raw.prepare_threshold = NEVER_AUTO
    return True


def _cursor(raw: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A server-side-binding cursor on ``raw``, Django's (open) connection, loading timestamptz in C (see module)."""
    cursor = psycopg.Cursor(raw)
    cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
    return cursor


def _run(sql: str, params: Sequence[Any] | Mapping[str, Any], *, fetch: bool) -> tuple[list[tuple[Any, ...]], int]:
    # The wrapper once: each ``connection.<name>`` is a lookup in an asgiref Local (about 2 us),
    # and a statement needs five of them.
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.ensure_connection()
    cursor = _reused_cursor(wrapper.connection)
    _execute(wrapper, cursor, sql, params)
    result = cursor.pgresult
    rows = cursor.fetchall() if fetch and result is not None and result.status == TUPLES_OK else []
    return rows, cursor.rowcount


def _reused_cursor(raw: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """This thread's one ``_cursor`` on ``raw``, made once per connection for ``_run``.

    ``_run`` reads each result whole before it returns, so one cursor serves every call in turn,
    without a cursor and a loader map made and dropped per statement. Django's connections are
    per thread; a new raw connection (after a reconnect) gets a new cursor.
    """
    cached = getattr(_local, "cursor", None)
    if cached is None or cached.connection is not raw or cached.closed:
        cached = _local.cursor = _cursor(raw)
    return cached


def _execute(
    wrapper: BaseDatabaseWrapper, cursor: psycopg.Cursor[Any], sql: str, params: Sequence[Any] | Mapping[str, Any]
) -> None:
    """Execute on ``cursor`` with ``wrapper``'s error wrapping and query log (see ``PreparedCursor.execute``)."""
    logged = wrapper.queries_logged
    started = time.monotonic() if logged else 0.0
    with wrapper.wrap_database_errors:
        cursor.execute(sql, params, prepare=_prepare_flag(cursor.connection))
    if logged:
        wrapper.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})


class PreparedCursor:
    """A cursor over Django's connection whose ``execute`` binds server-side and prepares (see module).

    Use as ``with prepared.cursor() as cursor: cursor.execute(sql, params); cursor.fetchall()``,
    where code used ``connection.cursor()``.
    """

    def __init__(self) -> None:
        self._wrapper = connections[DEFAULT_DB_ALIAS]
        self._wrapper.ensure_connection()
        self._cursor = _cursor(self._wrapper.connection)

    def __enter__(self) -> PreparedCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> None:
        """Execute ``sql`` with ``params`` (prepared unless ``SCHEDULER["PREPARED_STATEMENTS"]`` is off)."""
        _execute(self._wrapper, self._cursor, sql, params)

    def fetchall(self) -> list[tuple[Any, ...]]:
        """The statement's rows."""
        return self._cursor.fetchall()

    def fetchone(self) -> tuple[Any, ...] | None:
        """The statement's next row, or None."""
        return self._cursor.fetchone()

    @property
    def returns_rows(self) -> bool:
        """Whether the statement returned a result set (``fetchall`` raises when it did not)."""
        result = self._cursor.pgresult
        return result is not None and result.status == TUPLES_OK

    @property
    def rowcount(self) -> int:
        """Rows the statement returned or changed."""
        return self._cursor.rowcount


def cursor() -> PreparedCursor:
    """Return a ``PreparedCursor`` on Django's connection (a context manager)."""
    return PreparedCursor()
