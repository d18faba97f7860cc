"""The due promoter (scheduler.maintenance.promoter): due SCHEDULED and RETRYING jobs become QUEUED.

Driven through ``run_once(now)`` with an explicit ``now``; the concurrency test runs several
promoters at once on threads, each with its own connection.
"""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from scheduler import leasing
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.job_actions import job_cancel
from scheduler.leasing import Outcome, Report
from scheduler.maintenance.promoter import DuePromoter
from scheduler.models import Job, OutboxEvent
from scheduler.states import EventType, JobStatus
from tests.support.jobs import (
    claim,
    events,
    later,
    run_on_threads,
    running_job,
    status,
)
from tests.support.notify import listener, notifications  # noqa: F401 - a fixture and its reader

pytestmark = pytest.mark.usefixtures("maintenance_settings")


# -- DuePromoter -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_promoter_moves_only_due_scheduled_and_retrying_jobs() -> None:
    retrying, claimed = running_job()
    leasing.record_outcomes([Report(job=claimed, outcome=Outcome.RETRYABLE, error="boom")])  # due in 1 s
    scheduled = enqueue("DEMO_TASK", {}, scheduled_at=later(10))
    not_due = enqueue("DEMO_TASK", {}, scheduled_at=later(100))
    cancelled = enqueue("DEMO_TASK", {}, scheduled_at=later(5))
    job_cancel(job_id=cancelled.id)
    queued = enqueue("DEMO_TASK", {})
    running = enqueue("DEMO_TASK", {}, priority="HIGH")
    claim()
    before = {j.id: status(j) for j in (retrying, scheduled, not_due, cancelled, queued, running)}
    assert before == {
        retrying.id: "RETRYING",
        scheduled.id: "SCHEDULED",
        not_due.id: "SCHEDULED",
        cancelled.id: "CANCELLED",
        queued.id: "QUEUED",
        running.id: "RUNNING",
    }

    assert DuePromoter().run_once(now=later(0.5)) == 0
    assert DuePromoter().run_once(now=later(5)) == 1
    assert status(retrying) == JobStatus.QUEUED
    assert DuePromoter().run_once(now=later(10)) == 1  # due exactly now counts
    assert status(scheduled) == JobStatus.QUEUED
    assert DuePromoter().run_once(now=later(10)) == 0

    assert [status(j) for j in (not_due, cancelled, queued, running)] == ["SCHEDULED", "CANCELLED", "QUEUED", "RUNNING"]
    assert events(scheduled) == ["JOB_CREATED", "JOB_SCHEDULED", "JOB_QUEUED"]
    assert events(retrying)[-2:] == ["JOB_RETRIED", "JOB_QUEUED"]
    promoted = OutboxEvent.objects.get(job_id=scheduled.id, event_type=EventType.JOB_QUEUED)
    assert (promoted.from_status, promoted.to_status) == ("SCHEDULED", "QUEUED")


@pytest.mark.django_db
def test_an_idle_promoter_reports_when_the_next_delayed_job_falls_due() -> None:
    promoter = DuePromoter()
    assert promoter.run_once() == 0
    assert promoter.next_due_seconds is None  # nothing waits

    enqueue("DEMO_TASK", {}, scheduled_at=later(30))
    assert promoter.run_once() == 0
    assert promoter.next_due_seconds is not None and 20 < promoter.next_due_seconds <= 30

    assert promoter.run_once(now=later(31)) == 1
    assert promoter.next_due_seconds is None  # it promoted: the loop runs it again at its interval


@pytest.mark.django_db
def test_promoter_works_through_every_batch() -> None:
    enqueue_many([{"type": "DEMO_TASK", "scheduled_at": later(60)} for _ in range(10)])

    assert DuePromoter(batch=3).run_once(now=later(61)) == 10
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 10


@pytest.mark.django_db(transaction=True)
def test_promoter_notifies_once_per_batch_naming_the_queues(listener: psycopg.Connection) -> None:  # noqa: F811
    due = later(60)
    enqueue_many([{"type": "DEMO_TASK", "queue": q, "scheduled_at": due} for q in ["b", "a", "b", "a", "b"]])
    assert notifications(listener) == []  # SCHEDULED jobs wake nobody

    assert DuePromoter().run_once(now=later(61)) == 5
    assert notifications(listener) == ["a,b"]

    assert DuePromoter().run_once(now=later(61)) == 0
    assert notifications(listener) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_promoters_never_promote_a_job_twice() -> None:
    due = later(60)
    ids = enqueue_many([{"type": "DEMO_TASK", "scheduled_at": due} for _ in range(300)])
    at = later(61)

    counts = run_on_threads([lambda: DuePromoter(batch=20).run_once(now=at) for _ in range(4)])

    assert sum(counts) == 300
    assert Job.objects.filter(id__in=ids, status=JobStatus.QUEUED).count() == 300
    per_job = Counter(
        OutboxEvent.objects.filter(job_id__in=ids, event_type=EventType.JOB_QUEUED).values_list("job_id", flat=True)
    )
    assert set(per_job.values()) == {1}
    assert len(per_job) == 300
