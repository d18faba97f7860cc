"""The audit consumer's quarantine: messages it could not parse or store, kept for an operator, then pruned.

``quarantine_store`` writes what ``audit.consumer.AuditConsumer`` sets aside (the raw key and
value as bytes, cut to a bound, with the error); ``QuarantinePruner`` is the ``run_scheduler``
service that deletes entries older than ``AUDIT_QUARANTINE_RETENTION_DAYS`` in bounded batches
(DESIGN.md: every growing table has a retention rule).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection

from audit.models import QuarantineReason
from scheduler.kafka import event_stream_conf
from scheduler.maintenance import delete_expired

logger = logging.getLogger(__name__)

MAX_VALUE_BYTES = 64 * 1024  # bytes of a message value kept (Kafka's default limit is ~1 MB)
MAX_KEY_BYTES = 1024  # bytes of a message key kept
MAX_ERROR_CHARS = 2000  # characters of the error kept
MAX_TOPIC_CHARS = 255  # the column's length

PRUNE_BATCH = 5_000  # rows deleted per statement
PRUNE_MAX_BATCHES = 10  # statements per run
PRUNE_INTERVAL_SECONDS = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class QuarantineEntry:
    """One message set aside: where it was, what it held, and why it could not be stored."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: QuarantineReason
    error: str
    event_id: uuid.UUID | None = None
    job_id: uuid.UUID | None = None


def clean_text(text: str, limit: int) -> str:
    """Return ``text`` as a PostgreSQL ``text`` value can hold it, at most ``limit`` characters.

    NUL becomes the four characters ``\\x00`` and a lone surrogate its ``\\udxxx`` escape.
    """
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:limit]


def quarantine_store(*, entries: Sequence[QuarantineEntry]) -> int:
    """Insert ``entries`` (one statement); return how many were new.

    A message already quarantined (same topic, partition and offset: delivered again after a
    crash) is skipped. ``received_at`` is the database's ``clock_timestamp()``. Values and keys are
    cut to ``MAX_VALUE_BYTES``/``MAX_KEY_BYTES`` and the error to ``MAX_ERROR_CHARS``, so nothing
    in an entry can be refused for its content. Runs in the caller's transaction; raises only
    ``DatabaseError`` (a lost connection).
    """
    if not entries:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO stint_audit_quarantine (topic, partition, "offset", key, value, value_size, reason, error,
                                                event_id, job_id, received_at)
            SELECT v.*, clock_timestamp()
            FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bytea[], %s::bytea[], %s::int[], %s::text[],
                        %s::text[], %s::uuid[], %s::uuid[])
                AS v(topic, partition, "offset", key, value, value_size, reason, error, event_id, job_id)
            ON CONFLICT (topic, partition, "offset") DO NOTHING
            """,
            [
                [clean_text(e.topic, MAX_TOPIC_CHARS) for e in entries],
                [e.partition for e in entries],
                [e.offset for e in entries],
                [None if e.key is None else e.key[:MAX_KEY_BYTES] for e in entries],
                [None if e.value is None else e.value[:MAX_VALUE_BYTES] for e in entries],
                [0 if e.value is None else len(e.value) for e in entries],
                [str(e.reason) for e in entries],
                [clean_text(e.error, MAX_ERROR_CHARS) for e in entries],
                [e.event_id for e in entries],
                [e.job_id for e in entries],
            ],
        )
        return cursor.rowcount


class QuarantinePruner:
    """Background service: delete quarantined messages older than the retention (default 30 days; 0 keeps them)."""

    name = "audit_quarantine_pruner"
    interval_seconds = PRUNE_INTERVAL_SECONDS
    leader_only = False

    def __init__(self, *, retention: dt.timedelta | None = None, batch_size: int = PRUNE_BATCH) -> None:
        days = event_stream_conf().audit_quarantine_retention_days
        self.retention = retention if retention is not None else dt.timedelta(days=days)
        self.batch_size = batch_size

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete entries with ``received_at`` before ``now - retention``; return how many.

        ``now`` defaults to the database clock. At most ``PRUNE_MAX_BATCHES`` statements of
        ``batch_size`` rows per run; several schedulers delete disjoint rows (``SKIP LOCKED``).
        """
        if self.retention <= dt.timedelta(0):
            return 0
        total = delete_expired(
            table="stint_audit_quarantine",
            time_column="received_at",
            where="true",
            now=now,
            age=self.retention,
            batch=self.batch_size,
            batches=PRUNE_MAX_BATCHES,
        )
        if total:
            logger.info("audit quarantine pruner: deleted %d messages quarantined before %s ago", total, self.retention)
        return total
