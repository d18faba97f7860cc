"""Unique jobs (scheduler.flow.unique): a live duplicate is returned, race-free under concurrent enqueues."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from scheduler import leasing
from scheduler.enqueuing import enqueue_request
from scheduler.exceptions import InvalidUnique
from scheduler.job_actions import job_cancel
from scheduler.models import Job
from scheduler.states import JobStatus

UNIQUE = {"keys": ["customer"]}


@pytest.mark.django_db
def test_a_live_duplicate_is_returned_and_other_content_is_not():
    first = enqueue_request("DEMO_TASK", {"customer": 1, "n": 1}, unique=UNIQUE)
    again = enqueue_request("DEMO_TASK", {"customer": 1, "n": 2}, unique=UNIQUE)
    other = enqueue_request("DEMO_TASK", {"customer": 2}, unique=UNIQUE)
    assert (first.duplicate, again.duplicate, other.duplicate) == (False, True, False)
    assert again.job.id == first.job.id
    assert other.job.id != first.job.id
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_a_finished_job_no_longer_blocks_unless_its_state_is_listed():
    first = enqueue_request("DEMO_TASK", {"customer": 1}, unique=UNIQUE).job
    job_cancel(job_id=first.id)
    assert not enqueue_request("DEMO_TASK", {"customer": 1}, unique=UNIQUE).duplicate
    kept = {"keys": ["customer"], "states": ["SCHEDULED", "QUEUED", "RUNNING", "RETRYING", "CANCELLED"]}
    second = enqueue_request("DEMO_TASK", {"customer": 9}, unique=kept).job
    job_cancel(job_id=second.id)
    assert enqueue_request("DEMO_TASK", {"customer": 9}, unique=kept).job.id == second.id


@pytest.mark.django_db
def test_the_states_that_block_are_the_existing_jobs_not_the_new_enqueues():
    kept = {"keys": ["customer"], "states": ["SCHEDULED", "QUEUED", "RUNNING", "RETRYING", "CANCELLED"]}
    first = enqueue_request("DEMO_TASK", {"customer": 3}, unique=kept).job
    job_cancel(job_id=first.id)
    # The new enqueue names only the live states; the cancelled job still holds the key with its own.
    again = enqueue_request("DEMO_TASK", {"customer": 3}, unique=UNIQUE)
    assert (again.duplicate, again.job.id) == (True, first.id)
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_a_running_job_blocks_and_the_owner_is_part_of_the_key(user, other_user):
    mine = enqueue_request("DEMO_TASK", {"customer": 1}, unique=UNIQUE, owner=user).job
    leasing.claim_jobs(worker_id="w", limit=5, queues=None)
    assert Job.objects.get(id=mine.id).status == JobStatus.RUNNING
    assert enqueue_request("DEMO_TASK", {"customer": 1}, unique=UNIQUE, owner=user).job.id == mine.id
    assert not enqueue_request("DEMO_TASK", {"customer": 1}, unique=UNIQUE, owner=other_user).duplicate


@pytest.mark.django_db
def test_a_period_bucket_is_part_of_the_key():
    first = enqueue_request("DEMO_TASK", {"customer": 1}, unique={"keys": ["customer"], "period": 3600}).job
    assert enqueue_request("DEMO_TASK", {"customer": 1}, unique={"keys": ["customer"], "period": 3600}).duplicate
    # A different period is a different key: the 60 s job does not block on the hour's.
    assert not enqueue_request("DEMO_TASK", {"customer": 1}, unique={"keys": ["customer"], "period": 60}).duplicate
    assert Job.objects.filter(id=first.id).exists()


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"keys": []},
        {"keys": "customer"},
        {"keys": ["a b"]},
        {"keys": [1]},
        {"period": 0},
        {"period": 1.5},
        {"period": True},
        {"states": ["QUEUED"]},
        {"states": ["SCHEDULED", "QUEUED", "RUNNING", "RETRYING", "BOGUS"]},
        {"other": 1},
    ],
)
@pytest.mark.django_db
def test_invalid_unique_options_are_refused(raw):
    with pytest.raises(InvalidUnique):
        enqueue_request("DEMO_TASK", {}, unique=raw)


@pytest.mark.django_db(transaction=True)
def test_50_concurrent_unique_enqueues_give_one_job():
    barrier = threading.Barrier(50)
    results: list = []
    errors: list = []

    def enqueue_one() -> None:
        try:
            barrier.wait()
            results.append(enqueue_request("DEMO_TASK", {"customer": 7}, unique=UNIQUE))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=enqueue_one) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Job.objects.filter(type="DEMO_TASK").count() == 1
    assert len({r.job.id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1


@pytest.mark.django_db
def test_the_api_returns_the_duplicate_with_200_and_says_so(user_api):
    body = {"type": "DEMO_TASK", "payload": {"customer": 3}, "unique": {"keys": ["customer"]}}
    created = user_api.post("/api/jobs", body, format="json")
    again = user_api.post("/api/jobs", body, format="json")
    assert (created.status_code, again.status_code) == (201, 200)
    assert again["Unique-Duplicate"] == "true"
    assert again.json()["id"] == created.json()["id"]
    bad = user_api.post("/api/jobs", {**body, "unique": {"period": "soon"}}, format="json")
    assert bad.status_code == 400
    assert bad.json()["error"]["details"]["unique.period"]
    both = user_api.post("/api/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert both.status_code == 400


@pytest.mark.django_db
def test_retrying_a_failed_unique_job_while_its_duplicate_is_live_is_a_409(user, user_api, client):
    first = enqueue_request("DEMO_TASK", {"customer": 5}, unique=UNIQUE, owner=user).job
    (claimed,) = leasing.claim_jobs(worker_id="w", limit=1, queues=None)
    leasing.record_outcomes([leasing.Report(job=claimed, outcome=leasing.Outcome.PERMANENT, error="no")])
    second = enqueue_request("DEMO_TASK", {"customer": 5}, unique=UNIQUE, owner=user)
    assert not second.duplicate  # FAILED is not among the states: a new job
    response = user_api.post(f"/api/jobs/{first.id}/retry")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "unique_conflict"
    client.force_login(user)
    page = client.post(f"/jobs/{first.id}/retry/")
    assert page.status_code == 409
    assert Job.objects.get(id=first.id).status == JobStatus.FAILED


@pytest.mark.parametrize("payload", ["x", 5, [1, 2], True])
def test_unique_keys_on_a_payload_that_is_not_an_object_are_a_400(user_api, payload):
    body = {"type": "DEMO_TASK", "payload": payload, "unique": {"keys": ["customer"]}}
    response = user_api.post("/api/jobs", body, format="json")
    assert response.status_code == 400, response.content
    assert "unique.keys" in response.json()["error"]["details"]
