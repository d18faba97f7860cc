"""No starvation (scheduler.flow.aging): the reprioritizer and the oldest-waiting figures."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from scheduler import leasing
from scheduler.enqueuing import enqueue
from scheduler.flow.aging import OldestWaitingCollector, Reprioritizer, oldest_waiting
from scheduler.models import Job
from scheduler.states import PRIORITY_MAX, PRIORITY_MIN, Priority

pytestmark = pytest.mark.django_db


def _db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_aging_is_off_by_default():
    enqueue("DEMO_TASK", priority="LOW")
    assert Reprioritizer().run_once(now=_db_now() + dt.timedelta(days=30)) == 0


def test_a_low_job_that_waited_past_the_age_is_claimed_before_newer_medium_ones(settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "AGING_SECONDS": 600}
    now = _db_now()
    old = enqueue("DEMO_TASK", priority="LOW")
    Job.objects.filter(id=old.id).update(scheduled_at=now - dt.timedelta(seconds=700))
    Job.objects.filter(id=old.id).update(updated_at=now - dt.timedelta(seconds=700))  # auto_now: set apart
    for _ in range(3):
        enqueue("DEMO_TASK", priority="MEDIUM")
    assert Reprioritizer().run_once(now=now) == 1
    assert Job.objects.get(id=old.id).priority == Priority.MEDIUM
    assert Reprioritizer().run_once(now=now) == 0  # raised once per age, not every run
    (first,) = leasing.claim_jobs(worker_id="w", limit=1, queues=None)
    assert first.id == old.id  # MEDIUM now, and the oldest of its priority
    assert Reprioritizer().run_once(now=now + dt.timedelta(seconds=601)) == 3  # the others aged too


def test_aging_stops_at_the_cap(settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "AGING_SECONDS": 1, "AGING_MAX_PRIORITY": 0}
    job = enqueue("DEMO_TASK", priority="LOW")
    Reprioritizer().run_once(now=_db_now() + dt.timedelta(seconds=10))
    Reprioritizer().run_once(now=_db_now() + dt.timedelta(seconds=100))
    assert Job.objects.get(id=job.id).priority == 0


def test_oldest_waiting_per_priority_and_its_metric():
    enqueue("DEMO_TASK", priority="LOW")
    enqueue("DEMO_TASK", priority="HIGH")
    enqueue("DEMO_TASK", priority=7)
    assert [label for label, _ in oldest_waiting()] == ["HIGH", "7", "LOW"]
    (family,) = OldestWaitingCollector(close_connection=False).collect()
    assert {s.labels["priority"] for s in family.samples} == {"HIGH", "7", "LOW"}
    assert all(s.value >= 0 for s in family.samples)


def test_a_step_and_cap_past_the_priority_range_raise_to_the_range_and_never_fail(settings):
    """STEP 100 and MAX_PRIORITY 500 (refused at start-up since) used to raise IntegrityError job_priority_range.

    One job going past 100 failed the whole statement on every run, so aging stopped for every
    job; the reprioritizer now clamps to the column's range, -100..100.
    """
    settings.SCHEDULER = {**settings.SCHEDULER, "AGING_SECONDS": 1, "AGING_STEP": 100, "AGING_MAX_PRIORITY": 500}
    high = enqueue("DEMO_TASK", priority="HIGH")
    low = enqueue("DEMO_TASK", priority="LOW")
    assert Reprioritizer().run_once(now=_db_now() + dt.timedelta(seconds=10)) == 2
    assert Job.objects.get(id=high.id).priority == PRIORITY_MAX  # 50 + 100, clamped
    assert Job.objects.get(id=low.id).priority == 50
    assert Reprioritizer().run_once(now=_db_now() + dt.timedelta(seconds=100)) == 1  # only LOW's raise is left
    assert Job.objects.get(id=low.id).priority == PRIORITY_MAX


@pytest.mark.parametrize(
    ("step", "cap"),
    [(30_000, 100), (1, -500), (0, 100), (-50, 100)],
)
def test_out_of_range_settings_change_nothing_they_cannot(settings, step, cap):
    """A step past smallint, a cap below the range, a step that raises nothing: no error, no job out of range."""
    settings.SCHEDULER = {**settings.SCHEDULER, "AGING_SECONDS": 1, "AGING_STEP": step, "AGING_MAX_PRIORITY": cap}
    job = enqueue("DEMO_TASK", priority="LOW")
    Reprioritizer().run_once(now=_db_now() + dt.timedelta(seconds=10))
    assert PRIORITY_MIN <= Job.objects.get(id=job.id).priority <= PRIORITY_MAX
    assert Job.objects.get(id=job.id).priority >= Priority.LOW
