"""Job ids (``scheduler.ids``): RFC 9562 version 7, increasing, for every way a job is made."""

from __future__ import annotations

import time
import uuid

from django.urls import reverse

from scheduler import schedules
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.ids import new_job_id, short_job_id
from scheduler.models import Job


def _unix_ms(job_id: uuid.UUID) -> int:
    return job_id.int >> 80  # the first 48 bits (RFC 9562, section 5.7)


def test_a_new_job_id_is_a_plain_version_7_uuid_carrying_the_time_in_milliseconds():
    before = time.time_ns() // 1_000_000
    job_id = new_job_id()
    after = time.time_ns() // 1_000_000
    assert type(job_id) is uuid.UUID  # the standard library's type: psycopg, Django and pickle take it as is
    assert job_id.version == 7 and job_id.variant == uuid.RFC_4122
    assert before <= _unix_ms(job_id) <= after


def test_ids_made_one_after_another_increase_and_never_repeat():
    ids = [new_job_id() for _ in range(10_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_jobs_enqueued_one_by_one_in_a_batch_through_the_orm_and_by_a_schedule_get_version_7_ids(db, user):
    single = enqueue("DEMO_TASK", owner=user).id
    batch = enqueue_many([{"type": "DEMO_TASK"} for _ in range(3)], owner=user)
    orm = Job.objects.create(type="DEMO_TASK", scheduled_at="2026-01-01T00:00:00Z").id
    schedule = schedules.schedule_create(owner=user, name="hourly", cron="0 * * * *", job={"type": "DEMO_TASK"})
    fired = schedules.schedule_trigger(schedule_id=schedule.id, actor=user)
    for job_id in [single, *batch, orm, fired.id]:
        assert uuid.UUID(str(job_id)).version == 7
    assert batch == sorted(batch)


def test_the_short_id_the_lists_show_is_the_random_end_and_tells_jobs_made_together_apart(db, client, user):
    ids = enqueue_many([{"type": "DEMO_TASK"} for _ in range(20)], owner=user)
    shorts = {short_job_id(job_id) for job_id in ids}
    assert len(shorts) == 20
    assert short_job_id(ids[0]) == str(ids[0])[-8:]
    client.force_login(user)
    page = client.get(reverse("pages:job-detail", args=[ids[0]])).content.decode()
    assert f"Job {short_job_id(ids[0])}" in page
