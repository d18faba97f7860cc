"""PostgreSQL LISTEN/NOTIFY wake-ups for workers: one NOTIFY per committed batch, never per row.

The payload is ``#<token>,<queue>,<queue>...``: the sending transaction's id, then the sorted
names of the queues that gained QUEUED jobs. The token lets the processes of one ``run_workers``
tell one NOTIFY from another, so that only one of them claims for it
(``scheduler.workers.claim_board``); a worker that finds no token claims as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

CHANNEL = "stint_jobs"
# SQL of the payload's head, "#<transaction id>,": unique per transaction, and the transaction
# that notifies has an id already (it wrote the jobs it announces).
PAYLOAD_TOKEN_SQL = "'#' || txid_current() || ','"  # noqa: S105 - SQL, not a secret


def notify_queued(queues: Iterable[str]) -> None:
    """Send one NOTIFY on ``stint_jobs`` naming the queues that gained QUEUED jobs.

    Runs inside the caller's transaction, so PostgreSQL delivers it only on commit. The payload
    is the transaction's token and the comma-joined, sorted queue names (truncated to
    PostgreSQL's 8000-byte limit: a worker that cannot parse it simply polls).
    """
    names = sorted(set(queues))
    if not names:
        return
    payload = ",".join(names)[:7880]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_notify(%s, {PAYLOAD_TOKEN_SQL} || %s)", [CHANNEL, payload])  # noqa: S608 - a constant
