"""Idempotency-Key on POST /api/jobs and POST /api/schedules: replays, conflicts, scope per owner, expiry,
pruning, malformed keys, and concurrent first requests (threads, and real connections to a live server)."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler import enqueuing, idempotency, schedules
from scheduler.exceptions import IdempotencyConflict
from scheduler.maintenance.pruner import Pruner
from scheduler.models import CronSchedule, IdempotencyRecord, Job, OutboxEvent
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


# --- schedules --------------------------------------------------------------------------------

SCHEDULES = "/api/schedules"
SCHEDULE = {"name": "hourly", "cron": "0 * * * *", "job": {"type": "DEMO_TASK", "payload": {"result": "once"}}}
SCHEDULE_THREADS = 20
# Header values no key may be: empty, far too long, control characters, lone surrogates (which no
# UTF-8 can carry), and text beyond ASCII. Each is a 400, never a 500.
MALFORMED_KEYS = ["", "k" * 256, "k" * 10_240, "a\x00b", "tab\there", "\ud800", "a\udfffb", "ключ", "é", "k\x7f"]


def _post_schedule(api, body, key):
    return api.post(SCHEDULES, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.django_db
def test_same_key_and_schedule_body_replays_the_original_schedule(user_api, user):
    first = _post_schedule(user_api, SCHEDULE, "nightly")
    again = _post_schedule(user_api, SCHEDULE, "nightly")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert CronSchedule.objects.filter(owner=user).count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.schedule_id, record.job_id) == (first.json()["id"], None)


@pytest.mark.django_db
def test_a_schedule_replay_shows_the_schedule_as_it_is_now(user_api):
    first = _post_schedule(user_api, SCHEDULE, "k").json()
    user_api.patch(f"{SCHEDULES}/{first['id']}", {"enabled": False}, format="json")
    again = _post_schedule(user_api, SCHEDULE, "k")
    assert (again.status_code, again.json()["enabled"], again.json()["next_fire_at"]) == (200, False, None)


@pytest.mark.django_db
def test_same_key_with_a_different_schedule_body_is_409(user_api):
    _post_schedule(user_api, SCHEDULE, "k")
    job = SCHEDULE["job"]
    for changed in (
        {**SCHEDULE, "name": "renamed"},
        {**SCHEDULE, "cron": "5 * * * *"},
        {"name": "hourly", "interval_seconds": 3600, "job": job},
        {**SCHEDULE, "timezone": "Europe/London"},
        {**SCHEDULE, "enabled": False},
        {**SCHEDULE, "misfire_policy": "catch_up"},
        {**SCHEDULE, "overlap_policy": "skip"},
        {**SCHEDULE, "job": {**job, "type": "REPORT", "payload": {}}},
        {**SCHEDULE, "job": {**job, "payload": {"result": "twice"}}},
        {**SCHEDULE, "job": {**job, "priority": "HIGH"}},
        {**SCHEDULE, "job": {**job, "queue": "other"}},
        {**SCHEDULE, "job": {**job, "max_retries": 7}},
        {**SCHEDULE, "job": {**job, "timeout_seconds": 7}},
    ):
        resp = _post_schedule(user_api, changed, "k")
        assert resp.status_code == 409, changed
        error = resp.json()["error"]
        assert (error["code"], error["details"]) == ("idempotency_conflict", {"idempotency_key": ["k"]}), changed
    assert CronSchedule.objects.count() == 1


@pytest.mark.django_db
def test_the_same_schedule_request_written_differently_is_still_a_replay(user_api):
    first = _post_schedule(user_api, SCHEDULE, "k")
    shown = first.json()
    # Every default written out (as the first create read back), keys in another order.
    explicit = {
        "job": {**shown["job"], "priority": "MEDIUM"},
        "overlap_policy": "allow",
        "misfire_policy": "skip",
        "enabled": True,
        "timezone": "UTC",
        "interval_seconds": None,
        "cron": "0 * * * *",
        "name": "hourly",
    }
    again = _post_schedule(user_api, explicit, "k")
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["id"] == shown["id"]


@pytest.mark.django_db
def test_schedule_keys_are_per_owner(user_api, other_api):
    mine = _post_schedule(user_api, SCHEDULE, "shared")
    theirs = _post_schedule(other_api, SCHEDULE, "shared")
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


@pytest.mark.django_db
def test_a_key_names_one_job_or_one_schedule_never_both(user_api):
    job = _post(user_api, BODY, "job-key")
    reused = _post_schedule(user_api, SCHEDULE, "job-key")
    assert reused.status_code == 409
    assert reused.json()["error"]["code"] == "idempotency_conflict"
    assert "POST /api/jobs" in reused.json()["error"]["message"]

    schedule = _post_schedule(user_api, SCHEDULE, "schedule-key")
    reused = _post(user_api, BODY, "schedule-key")
    assert reused.status_code == 409
    assert "POST /api/schedules" in reused.json()["error"]["message"]

    # Both keys still replay what they made.
    assert _post(user_api, BODY, "job-key").json()["id"] == job.json()["id"]
    assert _post_schedule(user_api, SCHEDULE, "schedule-key").json()["id"] == schedule.json()["id"]
    assert (Job.objects.count(), CronSchedule.objects.count()) == (1, 1)


@pytest.mark.django_db
@pytest.mark.parametrize("key", MALFORMED_KEYS, ids=range(len(MALFORMED_KEYS)))
@pytest.mark.parametrize("path", [JOBS, SCHEDULES])
def test_a_malformed_key_is_400_on_either_create(user_api, path, key):
    body = BODY if path == JOBS else SCHEDULE
    resp = user_api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert (error["code"], error["details"]) == (
        "validation_error",
        {"idempotency_key": ["1-255 printable ASCII characters."]},
    )
    assert not (Job.objects.exists() or CronSchedule.objects.exists() or IdempotencyRecord.objects.exists())


@pytest.mark.django_db
def test_an_invalid_schedule_body_does_not_use_up_the_key(user_api, settings):
    assert _post_schedule(user_api, {**SCHEDULE, "cron": "61 * * * *"}, "k").status_code == 400
    assert _post_schedule(user_api, {**SCHEDULE, "timezone": "Mars/Olympus"}, "k").status_code == 400
    assert (
        _post_schedule(user_api, {**SCHEDULE, "job": {"type": "DEMO_TASK", "payload": "a" * 20_000}}, "k").status_code
        == 413
    )
    # Refused inside the create's transaction (the quota is counted under the owner's row lock).
    settings.SCHEDULER = {**settings.SCHEDULER, "MAX_SCHEDULES_PER_USER": 1}
    assert _post_schedule(user_api, {**SCHEDULE, "name": "first"}, None).status_code == 201
    assert _post_schedule(user_api, SCHEDULE, "k").status_code == 400
    assert not IdempotencyRecord.objects.exists()
    settings.SCHEDULER = {**settings.SCHEDULER, "MAX_SCHEDULES_PER_USER": 2}
    assert _post_schedule(user_api, SCHEDULE, "k").status_code == 201


@pytest.mark.django_db
def test_a_replay_of_a_deleted_schedule_is_404_until_the_key_expires(user_api, user):
    # A late retry of the create must not bring back a schedule its owner deleted (it would fire
    # again): the key stays used, and answers 404, for as long as it lives.
    first = _post_schedule(user_api, SCHEDULE, "k").json()
    assert user_api.delete(f"{SCHEDULES}/{first['id']}").status_code == 204

    again = _post_schedule(user_api, SCHEDULE, "k")
    assert again.status_code == 404, again.content
    error = again.json()["error"]
    assert error["code"] == "not_found"
    assert "deleted" in error["message"]
    assert "Idempotent-Replayed" not in again.headers
    assert _post_schedule(user_api, {**SCHEDULE, "name": "other"}, "k").status_code == 409
    assert not CronSchedule.objects.exists()

    IdempotencyRecord.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    fresh = _post_schedule(user_api, SCHEDULE, "k")
    assert fresh.status_code == 201
    assert IdempotencyRecord.objects.get().schedule_id == fresh.json()["id"] == CronSchedule.objects.get().id


@pytest.mark.django_db
def test_an_expired_schedule_key_creates_a_new_schedule(user_api):
    first = _post_schedule(user_api, SCHEDULE, "k").json()["id"]
    IdempotencyRecord.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))

    again = _post_schedule(user_api, {**SCHEDULE, "name": "new"}, "k")

    assert again.status_code == 201
    assert again.json()["id"] != first
    assert IdempotencyRecord.objects.get().schedule_id == again.json()["id"]
    assert CronSchedule.objects.count() == 2


@pytest.mark.django_db
def test_schedule_keys_live_for_the_ttl_and_the_pruner_deletes_them_then(user_api, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "IDEMPOTENCY_TTL_SECONDS": 600}
    made = _post_schedule(user_api, SCHEDULE, "k").json()["id"]
    record = IdempotencyRecord.objects.get()
    assert record.expires_at - record.created_at == dt.timedelta(seconds=600)

    assert Pruner().run_once(now=record.expires_at - dt.timedelta(seconds=1)) == 0
    assert Pruner().run_once(now=record.expires_at) == 1
    assert not IdempotencyRecord.objects.exists()
    assert CronSchedule.objects.filter(id=made).exists()  # the schedule is not the key's to delete


@pytest.mark.django_db
def test_the_schedule_service_says_whether_it_replayed(user):
    fields = {"name": "hourly", "cron": "0 * * * *", "job": {"type": "DEMO_TASK"}}
    first = schedules.schedule_create_request(owner=user, idempotency_key="k", **fields)
    again = schedules.schedule_create_request(owner=user, idempotency_key="k", **fields)
    plain = schedules.schedule_create_request(owner=user, **fields)
    assert (first.replayed, again.replayed, again.schedule.id) == (False, True, first.schedule.id)
    assert (plain.replayed, CronSchedule.objects.count()) == (False, 2)
    with pytest.raises(IdempotencyConflict):
        schedules.schedule_create_request(owner=user, idempotency_key="k", **{**fields, "name": "x"})


# --- schedules: concurrent first requests over real connections -------------------------------


def _http_post(server_url: str, token: str, path: str, body: dict, key: bytes | str | None) -> tuple[int, dict, dict]:
    """POST ``body`` as JSON on a connection of its own; return (status, JSON body, headers).

    ``key`` goes on the wire as given: a str as Latin-1 (http.client's rule), bytes as they are.
    """
    url = urlsplit(server_url)
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Authorization", token)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(data)))
        if key is not None:
            conn.putheader("Idempotency-Key", key)
        conn.endheaders(data)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), dict(resp.headers)
    finally:
        conn.close()


def _post_over_http_all_at_once(live_server, user, requests: list[tuple[str, dict]], key: str):
    """POST each (path, body) on its own connection to the live server, released together."""
    token = bearer(user)
    start = threading.Barrier(len(requests))

    def post(request: tuple[str, dict]) -> tuple[int, dict, dict]:
        start.wait(timeout=60)
        return _http_post(live_server.url, token, *request, key)

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(post, requests))


def _wait_for(predicate, *, what: str, timeout: float = 60.0) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` if it never is (not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what}")
        time.sleep(0.02)


def _a_backend_waits_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_of_one_key_and_schedule_body_create_exactly_one_schedule(live_server, user):
    results = _post_over_http_all_at_once(live_server, user, [(SCHEDULES, SCHEDULE)] * SCHEDULE_THREADS, "race")

    schedule = CronSchedule.objects.get()
    assert sorted(code for code, _, _ in results) == [200] * (SCHEDULE_THREADS - 1) + [201]
    assert {body["id"] for _, body, _ in results} == {schedule.id}
    assert sorted(h.get("Idempotent-Replayed", "") for _, _, h in results) == [""] + ["true"] * (SCHEDULE_THREADS - 1)
    assert IdempotencyRecord.objects.get().schedule_id == schedule.id
    assert LogEntry.objects.filter(object_id=str(schedule.id)).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_of_one_key_and_different_schedule_bodies_give_one_201_and_409s(live_server, user):
    bodies = [(SCHEDULES, {**SCHEDULE, "name": f"s{i}"}) for i in range(SCHEDULE_THREADS)]
    results = _post_over_http_all_at_once(live_server, user, bodies, "race")

    schedule = CronSchedule.objects.get()
    winners = [body for code, body, _ in results if code == 201]
    assert [w["id"] for w in winners] == [schedule.id]
    assert winners[0]["name"] == schedule.name  # the winner's body is the one stored
    assert sorted(code for code, _, _ in results) == [201] + [409] * (SCHEDULE_THREADS - 1)
    assert {body["error"]["code"] for code, body, _ in results if code == 409} == {"idempotency_conflict"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_job_and_schedule_creates_of_one_key_make_one_of_them(live_server, user):
    half = SCHEDULE_THREADS // 2
    requests = [(JOBS, BODY)] * half + [(SCHEDULES, SCHEDULE)] * half
    results = _post_over_http_all_at_once(live_server, user, requests, "race")

    assert Job.objects.count() + CronSchedule.objects.count() == 1
    won = JOBS if Job.objects.exists() else SCHEDULES
    codes = [(path, code) for (path, _), (code, _, _) in zip(requests, results, strict=True)]
    assert sorted(code for path, code in codes if path == won) == [200] * (half - 1) + [201]
    assert {code for path, code in codes if path != won} == {409}


class _RollbackError(Exception):
    """The first request's transaction is rolled back on purpose."""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_a_second_request_waits_for_the_uncommitted_first_of_its_key(live_server, user, first_commits):
    # The interleaving the race tests hope for, forced: the first request has inserted its key and
    # schedule but not committed; the second blocks on the key's unique index, then replays the
    # first's schedule, or, when the first rolls back, makes its own.
    inside, release = threading.Event(), threading.Event()
    token = bearer(user)

    def first() -> int | None:
        try:
            with transaction.atomic():
                made = schedules.schedule_create_request(owner=user, actor=user, idempotency_key="k", **SCHEDULE)
                inside.set()
                release.wait(timeout=120)
                if not first_commits:
                    raise _RollbackError
            return made.schedule.id
        except _RollbackError:
            return None
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        made = pool.submit(first)
        _wait_for(inside.is_set, what="the first request inside its transaction")
        second = pool.submit(_http_post, live_server.url, token, SCHEDULES, SCHEDULE, "k")
        try:
            _wait_for(_a_backend_waits_on_a_lock, what="the second request waiting on the key")
        finally:
            release.set()
        status, body, headers = second.result(timeout=120)
        first_id = made.result(timeout=120)

    schedule = CronSchedule.objects.get()
    if first_commits:
        assert (status, body["id"], headers.get("Idempotent-Replayed")) == (200, first_id, "true")
    else:
        assert (status, first_id, headers.get("Idempotent-Replayed")) == (201, None, None)
    assert body["id"] == schedule.id == IdempotencyRecord.objects.get().schedule_id


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "key",
    [b"", b"k" * 10_240, b"a\x00b", b"\xed\xa0\x80", "ключ".encode(), b"\xff\xfe", b"k\x7f"],
    ids=["empty", "10kB", "nul", "surrogate-utf8", "cyrillic-utf8", "latin1-bytes", "del"],
)
def test_a_malformed_key_off_the_wire_is_400(live_server, user, key):
    status, body, _ = _http_post(live_server.url, bearer(user), SCHEDULES, SCHEDULE, key)
    assert status == 400, body
    assert body["error"]["details"] == {"idempotency_key": ["1-255 printable ASCII characters."]}
    assert not CronSchedule.objects.exists()
