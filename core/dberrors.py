"""Tell a database error that the server or the connection caused from one the statement's data caused.

Batch writers (the audit consumer today) retry a batch as a whole only after a *transient* error,
one that says nothing about the rows: the connection was lost or refused, the server is shutting
down or out of resources, or the transaction lost a deadlock or serialization race. Any other
error (a value PostgreSQL refuses, a constraint, a statement limit) would fail again on every
retry: the writer isolates the rows that cause it instead (DESIGN.md, "Rules that keep it correct":
only connection errors are retried as such).

``db_error_summary`` is the one line that every long-running loop (the scheduler's services,
leader election, the audit consumer) and the web's 503 guard (``core.failsafe``) log for such an
error: a lock timeout or a cancelled statement is named as such, not as a database that is down.
"""

from __future__ import annotations

import psycopg
from django.db import InterfaceError, OperationalError

# SQLSTATE classes whose errors are about the server or the session, never the statement's data
# (PostgreSQL manual, Appendix A): 08 connection exception, 40 transaction rollback (deadlock,
# serialization failure), 53 insufficient resources (disk full, out of memory, too many
# connections), 57 operator intervention (admin shutdown, crash shutdown, query canceled),
# 58 system error (I/O error).
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired (or NOWAIT): the server is up, another session holds the lock


def db_error_is_transient(exc: BaseException) -> bool:
    """Return True if ``exc`` is a database error that retrying the same statement may cure.

    ``exc`` is usually a Django ``DatabaseError`` wrapping a psycopg error (``__cause__``) or a
    psycopg error itself. True for ``InterfaceError`` (the client's connection is closed), for an
    error whose SQLSTATE class is in ``TRANSIENT_SQLSTATE_CLASSES``, and for an
    ``OperationalError`` without a SQLSTATE (raised by the client: connection refused, server
    closed the connection unexpectedly). False for everything else, including errors that are not
    database errors at all (a ``UnicodeEncodeError`` from adapting a lone surrogate).
    """
    if isinstance(exc, InterfaceError | psycopg.InterfaceError):
        return True
    sqlstate = db_error_sqlstate(exc)
    if sqlstate:
        return sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES
    return isinstance(exc, OperationalError | psycopg.OperationalError)


def db_error_sqlstate(exc: BaseException) -> str | None:
    """Return the SQLSTATE of ``exc`` (a psycopg error, or a Django one wrapping it), or None if it has none."""
    for candidate in (exc, exc.__cause__):
        sqlstate = getattr(candidate, "sqlstate", None)
        if sqlstate:
            return str(sqlstate)
    return None


QUERY_CANCELED = "57014"  # statement_timeout expired, or a cancel request (pg_cancel_backend)
_SUMMARIES = {
    LOCK_NOT_AVAILABLE: "waiting for a lock timed out (SQLSTATE 55P03 lock_not_available: {})",
    QUERY_CANCELED: "a statement was cancelled (SQLSTATE 57014 query_canceled: {})",
}


def db_error_summary(exc: BaseException) -> str:
    """Return one line for a log that says what an ``OperationalError`` / ``InterfaceError`` means.

    A lock timeout (55P03) and a cancelled statement (57014) come from a server that is up (a
    session holding a lock, a role's ``statement_timeout``): they are named as such, with the
    server's message. Anything else reads "database unavailable (<first line of the error>)".
    SQLSTATEs: PostgreSQL manual, Appendix A.
    """
    first_line = str(exc).strip().partition("\n")[0]  # without the statement excerpt psycopg appends
    template = _SUMMARIES.get(db_error_sqlstate(exc) or "")
    return template.format(first_line) if template else f"database unavailable ({first_line})"
