"""Queues: pause/resume services, the ADMIN API, and paused jobs waiting QUEUED without loss."""

from __future__ import annotations

import pytest

from scheduler import leasing, queues
from scheduler.enqueuing import enqueue
from scheduler.exceptions import InvalidQueue
from scheduler.models import Job, Queue
from scheduler.states import JobStatus

pytestmark = pytest.mark.django_db


def _paused() -> list[str]:
    # What the worker reads every poll interval (scheduler.workers.runner.Worker._poll_control).
    return list(Queue.objects.filter(paused=True).values_list("name", flat=True))


def test_pause_creates_the_queue_on_first_use_and_is_idempotent():
    assert not Queue.objects.filter(name="reports").exists()

    first = queues.queue_pause(name="reports")
    again = queues.queue_pause(name="reports")

    assert first.paused and again.paused
    assert Queue.objects.filter(name="reports", paused=True).count() == 1


def test_resume_clears_the_flag_and_is_idempotent():
    queues.queue_pause(name="reports")

    assert queues.queue_resume(name="reports").paused is False
    assert queues.queue_resume(name="reports").paused is False
    assert queues.queue_resume(name="never-used").paused is False


@pytest.mark.parametrize("name", ["", "has space", "x" * 101, "slash/y", "é"])
def test_a_name_no_job_could_carry_is_refused(name):
    with pytest.raises(InvalidQueue) as raised:
        queues.queue_pause(name=name)

    assert raised.value.http_status == 400
    assert not Queue.objects.filter(name=name).exists()


def test_paused_jobs_wait_queued_and_run_after_resume(user):
    queues.queue_pause(name="reports")
    waiting = [enqueue("DEMO_TASK", {}, queue="reports", owner=user) for _ in range(3)]
    other = enqueue("DEMO_TASK", {}, queue="default", owner=user)

    claimed = leasing.claim_jobs(worker_id="w1", limit=10, queues=None, paused=_paused())

    assert [c.id for c in claimed] == [other.id]
    assert set(Job.objects.filter(queue="reports").values_list("status", flat=True)) == {JobStatus.QUEUED}

    queues.queue_resume(name="reports")
    claimed = leasing.claim_jobs(worker_id="w1", limit=10, queues=None, paused=_paused())

    assert {c.id for c in claimed} == {j.id for j in waiting}


class TestQueueApi:
    def test_admin_pauses_and_resumes(self, admin_api):
        response = admin_api.post("/api/admin/queues/reports/pause")

        assert response.status_code == 200
        assert response.json()["name"] == "reports"
        assert response.json()["paused"] is True
        assert Queue.objects.get(name="reports").paused

        response = admin_api.post("/api/admin/queues/reports/resume")

        assert response.status_code == 200
        assert response.json()["paused"] is False
        assert not Queue.objects.get(name="reports").paused

    def test_a_user_is_forbidden(self, user_api):
        response = user_api.post("/api/admin/queues/reports/pause")

        assert response.status_code == 403
        assert response.json()["error"]["code"] == "permission_denied"
        assert not Queue.objects.filter(name="reports", paused=True).exists()

    def test_anonymous_is_unauthenticated(self, api):
        assert api.post("/api/admin/queues/reports/resume").status_code == 401

    def test_a_bad_name_is_a_400_in_the_error_envelope(self, admin_api):
        response = admin_api.post("/api/admin/queues/bad*name/pause")

        assert response.status_code == 400
        assert response.json()["error"]["code"] == "validation_error"

    def test_get_is_not_allowed(self, admin_api):
        assert admin_api.get("/api/admin/queues/reports/pause").status_code == 405
