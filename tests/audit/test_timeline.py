"""A job's timeline: its audit trail completed from the outbox rows that can still hold its missing events."""

from __future__ import annotations

import pytest
from django.db.models.functions import Now

from audit.models import AuditEvent
from audit.timeline import job_timeline
from scheduler.enqueuing import enqueue
from scheduler.job_actions import job_cancel
from scheduler.models import OutboxBatch, OutboxEvent

pytestmark = pytest.mark.django_db


def audit(*events: OutboxEvent) -> None:
    """Store ``events`` in the audit table as the consumer would."""
    for e in events:
        AuditEvent.objects.create(
            event_id=e.event_id,
            job_id=e.job_id,
            event_type=e.event_type,
            owner_id=e.owner_id,
            sequence=e.sequence,
            attempt=e.attempt,
            from_status=e.from_status,
            to_status=e.to_status,
            payload=e.payload,
            occurred_at=e.occurred_at,
        )


def trail(job_id) -> list[tuple[int, str, bool]]:
    return [(e.sequence, e.event_type, e.recorded) for e in job_timeline(job_id=job_id)]


def test_while_kafka_is_down_the_timeline_shows_the_unpublished_events_in_sequence_order():
    job = enqueue("DEMO_TASK", {})
    enqueue("DEMO_TASK", {})  # another job's events: not shown
    job_cancel(job_id=job.id)

    assert trail(job.id) == [(1, "JOB_CREATED", False), (2, "JOB_QUEUED", False), (3, "JOB_CANCELLED", False)]


def test_published_events_not_yet_audited_complete_the_audited_prefix():
    job = enqueue("DEMO_TASK", {})
    job_cancel(job_id=job.id)
    OutboxBatch.objects.update(published_at=Now())  # relayed; the consumer has stored only the first two
    audit(*OutboxEvent.objects.filter(job_id=job.id, sequence__lte=2))

    assert trail(job.id) == [(1, "JOB_CREATED", True), (2, "JOB_QUEUED", True), (3, "JOB_CANCELLED", False)]


def test_a_fully_audited_job_reads_no_outbox_row(django_assert_num_queries):
    job = enqueue("DEMO_TASK", {})
    audit(*OutboxEvent.objects.filter(job_id=job.id))

    with django_assert_num_queries(2):  # its audit rows and its event_sequence
        events = trail(job.id)

    assert events == [(1, "JOB_CREATED", True), (2, "JOB_QUEUED", True)]
