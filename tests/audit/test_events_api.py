"""GET /api/jobs/{id}/events: the audit trail, owner or admin only, in sequence order, paginated."""

from __future__ import annotations

import datetime as dt
import uuid

import factory
import pytest

from audit.models import AuditEvent
from scheduler.enqueuing import enqueue
from scheduler.job_actions import job_cancel
from scheduler.maintenance.relay import OutboxRelay
from scheduler.models import Job
from tests.support.factories import JobFactory
from tests.support.kafka import consume_all

pytestmark = pytest.mark.django_db

FIELDS = {"event_id", "event_type", "sequence", "attempt", "from_status", "to_status", "occurred_at"}


class AuditEventFactory(factory.django.DjangoModelFactory):
    """A stored audit event of ``job``; pass ``job`` or ``job_id`` and ``owner_id``."""

    class Meta:
        model = AuditEvent
        exclude = ["job"]

    job = None
    event_id = factory.LazyFunction(uuid.uuid4)
    job_id = factory.LazyAttribute(lambda o: o.job.id)
    owner_id = factory.LazyAttribute(lambda o: o.job.owner_id)
    event_type = "JOB_QUEUED"
    sequence = factory.Sequence(lambda n: n + 1)
    from_status = "CREATED"
    to_status = "QUEUED"
    occurred_at = factory.LazyFunction(lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


def url(job_id) -> str:
    return f"/api/jobs/{job_id}/events"


def test_owner_reads_the_trail_in_sequence_order_in_the_documented_shape(user, user_api):
    job = JobFactory(owner=user)
    for sequence in (3, 1, 2):
        AuditEventFactory(job=job, sequence=sequence)
    AuditEventFactory(job=JobFactory(owner=user))  # another job's event

    response = user_api.get(url(job.id))

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == 3
    assert [e["sequence"] for e in body["results"]] == [1, 2, 3]
    assert all(set(e) == FIELDS for e in body["results"])
    assert body["results"][0]["occurred_at"] == "2026-01-01T00:00:00Z"


def test_created_event_reads_with_a_null_from_status(user, user_api):
    job = JobFactory(owner=user)
    AuditEventFactory(job=job, sequence=1, event_type="JOB_CREATED", from_status="", to_status="CREATED")

    event = user_api.get(url(job.id)).json()["results"][0]

    assert (event["event_type"], event["from_status"], event["to_status"]) == ("JOB_CREATED", None, "CREATED")


def test_someone_elses_or_an_unknown_job_is_not_found(user, other_api, user_api):
    job = JobFactory(owner=user)
    AuditEventFactory(job=job)

    for client, job_id in ((other_api, job.id), (user_api, uuid.uuid4())):
        response = client.get(url(job_id))
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_admin_reads_any_trail(user, admin_api):
    job = JobFactory(owner=user)
    AuditEventFactory(job=job)

    response = admin_api.get(url(job.id))

    assert response.status_code == 200 and response.json()["count"] == 1


def test_anonymous_caller_is_unauthenticated(api, user):
    job = JobFactory(owner=user)

    response = api.get(url(job.id))

    assert response.status_code == 401
    assert "error" in response.json()


def test_a_job_without_events_yet_has_an_empty_trail(user, user_api):
    job = JobFactory(owner=user)

    body = user_api.get(url(job.id)).json()

    assert (body["count"], body["results"]) == (0, [])


def test_the_trail_outlives_its_deleted_job_for_its_owner_only(user, user_api, other_api):
    job = JobFactory(owner=user)
    AuditEventFactory(job=job)
    job_id = job.id
    Job.objects.filter(id=job_id).delete()

    assert user_api.get(url(job_id)).json()["count"] == 1
    assert other_api.get(url(job_id)).status_code == 404


def test_trail_is_paginated(user, user_api):
    job = JobFactory(owner=user)
    for sequence in range(1, 8):
        AuditEventFactory(job=job, sequence=sequence)

    first = user_api.get(url(job.id), {"page_size": 5}).json()
    second = user_api.get(first["next"]).json()

    assert first["count"] == 7 and first["previous"] is None
    assert [e["sequence"] for e in first["results"] + second["results"]] == list(range(1, 8))
    assert second["next"] is None


def test_events_flow_from_a_transition_through_kafka_to_the_api(user, user_api, kafka_topic, audit_pool):
    job = enqueue("DEMO_TASK", owner=user)
    job_cancel(job_id=job.id)
    assert OutboxRelay().run_once() == 3

    consume_all(audit_pool.consumer, kafka_topic)

    events = user_api.get(url(job.id)).json()["results"]
    assert [(e["sequence"], e["event_type"], e["from_status"], e["to_status"], e["attempt"]) for e in events] == [
        (1, "JOB_CREATED", None, "CREATED", 0),
        (2, "JOB_QUEUED", "CREATED", "QUEUED", 0),
        (3, "JOB_CANCELLED", "QUEUED", "CANCELLED", 0),
    ]
