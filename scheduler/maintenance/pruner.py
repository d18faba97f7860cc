"""Pruner: deletes expired idempotency keys and long-gone worker nodes."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import connection

from scheduler.services import idempotency_prune

logger = logging.getLogger(__name__)

WORKER_RETENTION_SECONDS = 7 * 86400  # seconds a stopped worker node is kept for operators


class Pruner:
    """Delete rows that have outlived their purpose, in bounded batches."""

    name = "pruner"
    interval_seconds = 60.0  # seconds
    leader_only = False

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Prune expired idempotency records and old stopped workers; return rows deleted."""
        total = idempotency_prune(now=now)
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM stint_worker_node WHERE stopped_at < coalesce(%s, now()) - make_interval(secs => %s)",
                [now, WORKER_RETENTION_SECONDS],
            )
            total += cursor.rowcount
        if total:
            logger.info("pruned %d rows", total)
        return total
