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


PAUSE_LIMITS = {
    "none": [],
    # Governed by a limit: claimed by the flow path's limited phase (its own candidate read and claim).
    "limited queue": [{"scope": "queue", "name": "reports", "concurrency": 10}],
    # A limit elsewhere: the flow path's unlimited phase claims the paused queue's jobs.
    "limit elsewhere": [{"scope": "queue", "name": "elsewhere", "concurrency": 10}],
}


@pytest.mark.parametrize("limits", list(PAUSE_LIMITS))
def test_no_claim_made_after_a_pause_committed_takes_its_jobs_whatever_the_worker_last_read(user, settings, limits):
    # A worker re-reads the paused queues every poll interval; its claims used to skip only the
    # queues of that list, so a job started about 90 ms after the pause API had answered. The claim
    # statement reads the flag itself: a claim already in flight may still finish, no later one starts.
    from scheduler.flow import limits as flow_limits

    settings.SCHEDULER = {**settings.SCHEDULER, "FLOW_LIMITS": PAUSE_LIMITS[limits]}
    flow_limits.forget_cache()
    try:
        held = [enqueue("DEMO_TASK", {}, queue="reports", owner=user, priority="HIGH") for _ in range(2)]
        other = enqueue("DEMO_TASK", {}, queue="default", owner=user)
        stale = _paused()  # read before the pause, as a worker's last poll was
        queues.queue_pause(name="reports")

        claimed = leasing.claim_jobs(worker_id="w1", limit=10, queues=None, paused=stale)

        assert [c.id for c in claimed] == [other.id]
        assert {
            status for status in Job.objects.filter(id__in=[j.id for j in held]).values_list("status", flat=True)
        } == {JobStatus.QUEUED}
        assert leasing.claim_jobs(worker_id="w1", limit=10, queues=["reports"], paused=stale) == []
    finally:
        flow_limits.forget_cache()


def test_a_resumed_queue_is_claimed_by_the_next_claim(user):
    queues.queue_pause(name="reports")
    waiting = enqueue("DEMO_TASK", {}, queue="reports", owner=user)
    queues.queue_resume(name="reports")

    assert [c.id for c in leasing.claim_jobs(worker_id="w1", limit=10, queues=None, paused=_paused())] == [waiting.id]


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
