"""Idempotency-Key: replays, conflicts, scope per owner, expiry and pruning, and concurrent first requests."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler import enqueuing, idempotency
from scheduler.exceptions import IdempotencyConflict
from scheduler.models import IdempotencyRecord, Job, OutboxEvent
from tests.conftest import bearer

JOBS = "/api/jobs"
THREADS = 50
BODY = {"type": "DEMO_TASK", "payload": {"result": "once"}}


def _post(api, body, key):
    return api.post(JOBS, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


# --- over HTTP --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_same_key_and_body_replays_the_original_job(user_api):
    first = _post(user_api, BODY, "order-1")
    again = _post(user_api, BODY, "order-1")

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1
    assert OutboxEvent.objects.count() == 2  # the replay wrote nothing


@pytest.mark.django_db
def test_a_replay_shows_the_job_as_it_is_now(user_api):
    first = _post(user_api, BODY, "k").json()
    user_api.post(f"{JOBS}/{first['id']}/cancel")
    again = _post(user_api, BODY, "k")
    assert (again.status_code, again.json()["status"]) == (200, "CANCELLED")


@pytest.mark.django_db
def test_same_key_with_a_different_body_is_409(user_api):
    _post(user_api, BODY, "order-1")
    for changed in (
        {**BODY, "payload": {"result": "twice"}},
        {**BODY, "priority": "HIGH"},
        {**BODY, "queue": "other"},
        {**BODY, "max_retries": 5},
        {**BODY, "name": "renamed"},
        {**BODY, "type": "REPORT"},
        {**BODY, "scheduled_at": "2099-01-01T00:00:00Z"},
    ):
        resp = _post(user_api, changed, "order-1")
        assert resp.status_code == 409, changed
        error = resp.json()["error"]
        assert error["code"] == "idempotency_conflict"
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_the_same_request_written_differently_is_still_a_replay(user_api):
    explicit = {
        **BODY,
        "name": "",
        "priority": "MEDIUM",
        "queue": "default",
        "max_retries": 3,
        "timeout_seconds": 300,
        "scheduled_at": "2099-01-01T02:00:00+02:00",
    }
    first = _post(user_api, explicit, "k")
    # Defaults left out, keys reordered, the same instant in another offset.
    again = _post(
        user_api, {"scheduled_at": "2099-01-01T00:00:00Z", "payload": {"result": "once"}, "type": "DEMO_TASK"}, "k"
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]


@pytest.mark.django_db
def test_keys_are_per_owner(user_api, other_api):
    mine = _post(user_api, BODY, "shared")
    theirs = _post(other_api, BODY, "shared")
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


@pytest.mark.django_db
def test_without_a_key_every_post_is_a_new_job(user_api):
    ids = {user_api.post(JOBS, BODY, format="json").json()["id"] for _ in range(3)}
    assert len(ids) == 3


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "k" * 256, "tab\there", "ключ"])
def test_a_malformed_key_is_400(user_api, key):
    resp = _post(user_api, BODY, key)
    assert resp.status_code == 400
    assert "idempotency_key" in resp.json()["error"]["details"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_key_of_255_printable_characters_is_fine(user_api):
    key = "".join(chr(c) for c in range(0x20, 0x7F)) * 3
    assert _post(user_api, BODY, key[:255]).status_code == 201


@pytest.mark.django_db
def test_an_invalid_body_does_not_use_up_the_key(user_api):
    assert _post(user_api, {**BODY, "max_retries": 0}, "k").status_code == 400
    assert _post(user_api, {**BODY, "payload": {"x": "a" * 20_000}}, "k").status_code == 413
    assert not IdempotencyRecord.objects.exists()
    assert _post(user_api, BODY, "k").status_code == 201


# --- expiry and pruning -----------------------------------------------------------------------


@pytest.mark.django_db
def test_an_expired_key_creates_a_new_job(user_api):
    first = _post(user_api, BODY, "k").json()["id"]
    IdempotencyRecord.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))

    again = _post(user_api, {**BODY, "payload": {"new": True}}, "k")

    assert again.status_code == 201
    assert again.json()["id"] != first
    assert IdempotencyRecord.objects.get().job_id == Job.objects.get(id=again.json()["id"]).id


@pytest.mark.django_db
def test_keys_live_for_the_configured_ttl(user, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "IDEMPOTENCY_TTL_SECONDS": 600}
    enqueuing.enqueue("DEMO_TASK", owner=user, idempotency_key="k")
    record = IdempotencyRecord.objects.get()
    assert record.expires_at - record.created_at == dt.timedelta(seconds=600)


@pytest.mark.django_db
def test_prune_deletes_only_expired_keys_and_keeps_their_jobs(user):
    old = enqueuing.enqueue("DEMO_TASK", owner=user, idempotency_key="old")
    enqueuing.enqueue("DEMO_TASK", owner=user, idempotency_key="fresh")
    IdempotencyRecord.objects.filter(key="old").update(expires_at=timezone.now() - dt.timedelta(hours=1))

    assert idempotency.idempotency_prune() == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["fresh"]
    assert Job.objects.filter(id=old.id).exists()
    assert idempotency.idempotency_prune(now=timezone.now() + dt.timedelta(days=2)) == 1
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_prune_is_bounded_per_call(user):
    for i in range(5):
        enqueuing.enqueue("DEMO_TASK", owner=user, idempotency_key=f"k{i}")
    later = timezone.now() + dt.timedelta(days=2)
    assert idempotency.idempotency_prune(now=later, limit=2) == 2
    assert IdempotencyRecord.objects.count() == 3


@pytest.mark.django_db
def test_the_service_says_whether_it_replayed(user):
    first = enqueuing.enqueue_request("DEMO_TASK", {"a": 1}, owner=user, idempotency_key="k")
    again = enqueuing.enqueue_request("DEMO_TASK", {"a": 1}, owner=user, idempotency_key="k")
    assert (first.replayed, again.replayed, again.job.id) == (False, True, first.job.id)
    with pytest.raises(IdempotencyConflict):
        enqueuing.enqueue_request("DEMO_TASK", {"a": 2}, owner=user, idempotency_key="k")


# --- concurrent first requests ----------------------------------------------------------------


def _post_all_at_once(user, bodies: list[dict], key: str) -> list[tuple[int, dict, str | None]]:
    """POST each body from its own thread and client, released together; return (status, json, replayed)."""
    token = bearer(user)  # made once: every thread is the same user
    start = threading.Barrier(len(bodies))

    def post(body: dict) -> tuple[int, dict, str | None]:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=token)
        try:
            start.wait(timeout=30)
            resp = client.post(JOBS, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
            return resp.status_code, resp.json(), resp.headers.get("Idempotent-Replayed")
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(post, bodies))


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_posts_of_one_key_and_body_create_exactly_one_job(user):
    results = _post_all_at_once(user, [BODY] * THREADS, "race")

    job = Job.objects.get()
    codes = sorted(code for code, _, _ in results)
    assert codes == [200] * (THREADS - 1) + [201]
    assert {body["id"] for _, body, _ in results} == {str(job.id)}
    assert sorted(replayed or "" for code, _, replayed in results) == [""] + ["true"] * (THREADS - 1)
    assert IdempotencyRecord.objects.get().job_id == job.id
    assert OutboxEvent.objects.filter(job_id=job.id).count() == 2


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_posts_of_one_key_and_different_bodies_give_one_201_and_409s(user):
    bodies = [{**BODY, "payload": {"result": i}} for i in range(THREADS)]
    results = _post_all_at_once(user, bodies, "race")

    job = Job.objects.get()
    winners = [body for code, body, _ in results if code == 201]
    assert len(winners) == 1
    assert winners[0]["id"] == str(job.id)
    assert sorted(code for code, _, _ in results) == [201] + [409] * (THREADS - 1)
    assert {body["error"]["code"] for code, body, _ in results if code == 409} == {"idempotency_conflict"}
    # The winner's body is the one stored.
    assert job.payload == bodies[winners[0]["payload"]["result"]]["payload"]
