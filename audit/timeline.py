"""A job's event timeline for people: its audit trail, completed from the outbox, in sequence order.

The audit trail (``audit.AuditEvent``) is the record, but it fills in only as the consumer
reads Kafka; the outbox (``OutboxEvent``) has every event from the moment its transition
commits, until the pruner removes published ones. Merging the two by ``event_id`` shows a
complete, current timeline whether Kafka is up, down or behind. Callers check visibility first
(``scheduler.selectors.job_get``); this module only reads.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from audit.models import AuditEvent
from scheduler.models import OutboxEvent

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
    for row in AuditEvent.objects.filter(job_id=job_id).order_by("sequence", "id")[:limit]:
        events[row.event_id] = _event(row, recorded=True)
    for row in OutboxEvent.objects.filter(job_id=job_id).order_by("sequence", "id")[:limit]:
        events.setdefault(row.event_id, _event(row, recorded=False))
    return sorted(events.values(), key=lambda e: (e.sequence, e.occurred_at))[:limit]


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
