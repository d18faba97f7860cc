"""A job's event timeline for people: its audit trail, completed from the outbox, in sequence order.

The audit trail (``audit.AuditEvent``) is the record, but it fills in only as the consumer
reads Kafka; the outbox (``OutboxEvent``, the events of ``OutboxBatch`` rows) has every event
from the moment its transition commits, until the pruner removes published ones. Merging the two
by ``event_id`` shows a complete, current timeline whether Kafka is up, down or behind.

The outbox has no index by job (an outbox row holds the events of a whole statement), so only
the part of it that can hold the job's missing events is read, and only when the audit trail
lacks some of the job's sequences 1..``event_sequence``: unpublished rows, and rows published in
the last ``2 * AUDIT_RECONCILE_AFTER_SECONDS`` (an event published longer ago without its audit
row is copied into a new unpublished row by the reconciler), that occurred after the last event
of the job's audited prefix 1..n (less that window, for transactions that overlapped). Callers check visibility first
(``scheduler.selectors.job_get``); this module only reads.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now

from audit.models import AuditEvent
from scheduler.kafka import event_stream_conf
from scheduler.models import Job, OutboxEvent

MAX_EVENTS = 500  # events shown per job; a job that retried for ever still renders quickly


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineEvent:
    """One lifecycle event; ``recorded`` is True once the audit consumer stored it."""

    event_id: uuid.UUID
    sequence: int
    event_type: str
    from_status: str
    to_status: str
    attempt: int
    occurred_at: dt.datetime
    payload: Any
    recorded: bool


def job_timeline(*, job_id: uuid.UUID, limit: int = MAX_EVENTS) -> list[TimelineEvent]:
    """Return up to ``limit`` events of job ``job_id``, ordered by (sequence, occurred_at).

    An event present in both tables is taken from the audit trail (``recorded=True``).
    """
    events: dict[uuid.UUID, TimelineEvent] = {}
    audited = list(AuditEvent.objects.filter(job_id=job_id).order_by("sequence", "id")[:limit])
    for row in audited:
        events[row.event_id] = _event(row, recorded=True)
    for row in _unrecorded(job_id=job_id, audited=audited, limit=limit):
        events.setdefault(row.event_id, _event(row, recorded=False))
    return sorted(events.values(), key=lambda e: (e.sequence, e.occurred_at))[:limit]


def _unrecorded(*, job_id: uuid.UUID, audited: list[AuditEvent], limit: int) -> list[OutboxEvent]:
    """The job's outbox events that may be missing from ``audited`` (see the module docstring)."""
    job = Job.objects.filter(id=job_id).values_list("event_sequence", "created_at").first()
    if job is None:
        return []
    event_sequence, created_at = job
    by_sequence = {row.sequence: row for row in audited}
    if len(audited) >= limit or all(n in by_sequence for n in range(1, event_sequence + 1)):
        return []
    since, n = created_at, 1
    while n in by_sequence:
        since = min(since, by_sequence[n].occurred_at) if n == 1 else by_sequence[n].occurred_at
        n += 1
    recent = dt.timedelta(seconds=2 * event_stream_conf().audit_reconcile_after_seconds)
    return list(
        OutboxEvent.objects.filter(Q(published_at__isnull=True) | Q(published_at__gte=Now() - recent))
        # A later transition's transaction may have started (its now(), occurred_at) before the
        # previous one committed: the margin covers any transaction shorter than ``recent``.
        .filter(occurred_at__gte=since - recent, job_id=job_id)
        .order_by("sequence", "id")[:limit]
    )


def _event(row: AuditEvent | OutboxEvent, *, recorded: bool) -> TimelineEvent:
    return TimelineEvent(
        event_id=row.event_id,
        sequence=row.sequence,
        event_type=row.event_type,
        from_status=row.from_status,
        to_status=row.to_status,
        attempt=row.attempt,
        occurred_at=row.occurred_at,
        payload=row.payload,
        recorded=recorded,
    )
