"""The database's clock, the one time source for due times, leases and ages (DESIGN.md: hosts drift)."""

from __future__ import annotations

import datetime as dt

from django.db import connection


def db_now() -> dt.datetime:
    """Return the database's clock now (``clock_timestamp()``: aware UTC, not frozen at the transaction's start).

    One round trip on the default connection; raises only database errors.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def age_seconds(now: dt.datetime, then: dt.datetime | None) -> float | None:
    """Return the seconds from ``then`` to ``now`` (at least 0), or None when ``then`` is None.

    Both aware datetimes; ``now`` is normally ``db_now()``, so ages shown to people are measured
    against the clock that wrote ``then``.
    """
    return None if then is None else max(0.0, (now - then).total_seconds())
