"""Outbox retention: delete published rows older than ``OUTBOX_RETENTION_DAYS`` (default 7) in bounded batches."""

from __future__ import annotations

import datetime as dt
import logging

from scheduler.kafka import event_stream_conf
from scheduler.maintenance import delete_expired

logger = logging.getLogger(__name__)

PRUNE_BATCH = 10_000  # rows deleted per statement
PRUNE_MAX_BATCHES = 10  # statements per tick
PRUNE_INTERVAL_SECONDS = 60.0


class OutboxPruner:
    """Background service: delete published outbox rows older than ``OUTBOX_RETENTION_DAYS`` (default 7).

    Unpublished rows are never deleted, however old. Several pruners may run: each deletes
    disjoint rows (``SKIP LOCKED``) and the deletes are idempotent.
    """

    name = "outbox_pruner"
    interval_seconds = PRUNE_INTERVAL_SECONDS
    leader_only = False

    def __init__(self, *, retention: dt.timedelta | None = None, batch_size: int = PRUNE_BATCH) -> None:
        days = event_stream_conf().outbox_retention_days
        self.retention = retention if retention is not None else dt.timedelta(days=days)
        self.batch_size = batch_size

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete published rows with ``published_at`` before ``now - retention``; return how many.

        ``now`` defaults to the database clock.
        """
        total = delete_expired(
            table="stint_outbox",
            time_column="published_at",
            where="published_at IS NOT NULL",
            now=now,
            age=self.retention,
            batch=self.batch_size,
            batches=PRUNE_MAX_BATCHES,
        )
        if total:
            logger.info("outbox pruner: deleted %d published outbox rows older than %s", total, self.retention)
        return total
