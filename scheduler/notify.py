"""PostgreSQL LISTEN/NOTIFY wake-ups for workers: one NOTIFY per committed batch, never per row."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

CHANNEL = "stint_jobs"


def notify_queued(queues: Iterable[str]) -> None:
    """Send one NOTIFY on ``stint_jobs`` naming the queues that gained QUEUED jobs.

    Runs inside the caller's transaction, so PostgreSQL delivers it only on commit. The payload
    is the comma-joined, sorted queue names (truncated to PostgreSQL's 8000-byte limit: a worker
    that cannot parse it simply polls).
    """
    names = sorted(set(queues))
    if not names:
        return
    payload = ",".join(names)[:7900]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
