"""The jobs REST API: create and its validation, lists and filters, actions, ownership (BOLA), schema."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid

import pytest
from django.utils import timezone

from scheduler import enqueuing, leasing, selectors
from scheduler.ids import short_job_id
from scheduler.models import Job, JobAttempt, OutboxEvent
from scheduler.states import AttemptStatus, JobStatus, Priority
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


JOBS = "/api/jobs"
READ_FIELDS = {
    "id",
    "progress",  # ctx.progress (scheduler.flow.progress)
    "waiting",  # why a QUEUED job waits (scheduler.flow.explain)
    "name",
    "type",
    "payload",
    "status",
    "priority",
    "queue",
    "scheduled_at",
    "attempts",
    "max_retries",
    "timeout_seconds",
    "cancel_requested",
    "cancellation",  # what became of a requested cancellation (selectors.job_cancellation)
    "owner",
    "schedule",
    "fire_time",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "last_error",
}
PAYLOAD_LIMIT = 10 * 1024  # bytes


def _post(api, body, **extra):
    return api.post(JOBS, body, format="json", **extra)


def _snapshot(job_id) -> tuple[dict, int]:
    """The job's whole row and its event count: what "nothing changed" compares."""
    return Job.objects.filter(id=job_id).values().get(), OutboxEvent.objects.filter(job_id=job_id).count()


def _detail(api, job) -> dict:
    resp = api.get(f"{JOBS}/{job.id}")
    assert resp.status_code == 200, resp.content
    return resp.json()


def _error(resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    return body["error"]


# --- create -----------------------------------------------------------------------------------


def test_create_answers_201_with_the_job_and_its_location(user_api, user):
    resp = _post(user_api, {"type": "DEMO_TASK"})

    assert resp.status_code == 201, resp.content
    job = resp.json()
    assert set(job) == READ_FIELDS
    assert job["status"] == "QUEUED"
    assert (job["priority"], job["queue"], job["max_retries"], job["timeout_seconds"]) == ("MEDIUM", "default", 3, 300)
    assert (job["owner"], job["payload"], job["name"], job["attempts"]) == (user.pk, {}, "", 0)
    assert resp.headers["Location"] == f"http://testserver/api/jobs/{job['id']}"
    assert "Idempotent-Replayed" not in resp.headers
    events = OutboxEvent.objects.filter(job_id=job["id"]).order_by("sequence")
    assert [(e.event_type, e.to_status) for e in events] == [("JOB_CREATED", "CREATED"), ("JOB_QUEUED", "QUEUED")]


def test_create_with_every_field_and_a_future_offset_time_is_scheduled(user_api):
    body = {
        "name": "nightly",
        "type": "REPORT",
        "payload": {"since": "2024-01-01", "nested": [1, {"a": None}]},
        "priority": "HIGH",
        "queue": "reports.eu-1",
        "scheduled_at": "2099-05-01T09:30:00+02:00",
        "max_retries": 10,
        "timeout_seconds": 3600,
    }
    resp = _post(user_api, body)

    assert resp.status_code == 201, resp.content
    job = resp.json()
    assert job["status"] == "SCHEDULED"
    assert dt.datetime.fromisoformat(job["scheduled_at"]) == dt.datetime(2099, 5, 1, 7, 30, tzinfo=dt.UTC)
    assert {k: job[k] for k in body if k != "scheduled_at"} == {k: v for k, v in body.items() if k != "scheduled_at"}
    assert Job.objects.get(id=job["id"]).priority == Priority.HIGH


def test_create_with_a_past_time_is_queued_now(user_api):
    resp = _post(user_api, {"type": "DEMO_TASK", "scheduled_at": "2001-01-01T00:00:00Z"})
    assert resp.status_code == 201
    assert resp.json()["status"] == "QUEUED"


def test_create_takes_the_lowest_and_null_edges(user_api):
    resp = _post(user_api, {"type": "DEMO_TASK", "max_retries": 1, "timeout_seconds": 1, "payload": None})
    assert resp.status_code == 201, resp.content
    assert (resp.json()["max_retries"], resp.json()["timeout_seconds"], resp.json()["payload"]) == (1, 1, {})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_retries", 0),
        ("max_retries", 11),
        ("max_retries", "many"),
        ("max_retries", 2.5),
        ("max_retries", True),
        ("timeout_seconds", 0),
        ("timeout_seconds", 3601),
        ("timeout_seconds", -5),
        ("priority", "URGENT"),
        ("priority", 0),
        ("priority", "high"),
        ("type", "NO_SUCH_HANDLER"),
        ("type", ""),
        ("type", None),
        ("scheduled_at", "2099-01-01T00:00:00"),
        ("scheduled_at", "2099-01-01"),
        ("scheduled_at", "tomorrow"),
        ("queue", "has spaces"),
        ("queue", ""),
        ("queue", "q" * 101),
        ("name", "n" * 201),
    ],
)
def test_create_rejects_an_invalid_field_with_400(user_api, field, value):
    resp = _post(user_api, {"type": "DEMO_TASK", field: value})

    assert resp.status_code == 400, resp.content
    error = _error(resp)
    assert error["code"] == "validation_error"
    assert field in error["details"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(("value", "shown"), [("URGENT", "URGENT"), ("high", "high"), ("37", "37")])
def test_a_priority_that_is_no_name_is_a_400_that_names_the_ones_to_send(user_api, value, shown):
    # DRF's '"URGENT" is not a valid choice.' did not say which are; the Python API's message does.
    resp = _post(user_api, {"type": "DEMO_TASK", "priority": value})

    assert resp.status_code == 400, resp.content
    assert _error(resp)["details"] == {"priority": [f'"{shown}" is not a priority: send HIGH, MEDIUM or LOW.']}


def test_create_requires_a_type(user_api):
    resp = _post(user_api, {"payload": {}})
    assert resp.status_code == 400
    assert "type" in _error(resp)["details"]


def test_naive_scheduled_at_is_refused_with_a_message_about_the_offset(user_api):
    resp = _post(user_api, {"type": "DEMO_TASK", "scheduled_at": "2099-01-01T12:00:00"})
    assert resp.status_code == 400
    assert "offset" in _error(resp)["details"]["scheduled_at"][0]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "SUCCESS"),
        ("owner", 1),
        ("attempts", 5),
        ("attempts_base", 5),
        ("lease_owner", "me"),
        ("lease_token", "59172bdc-2e72-42bc-9b35-5b02f920585c"),
        ("lease_expires_at", "2099-01-01T00:00:00Z"),
        ("cancel_requested", True),
        ("id", "8eaa1ec7-272b-4a4a-a8da-a665622f4326"),
        ("idempotency_key", "k"),
        ("event_sequence", 9),
        ("created_at", "2001-01-01T00:00:00Z"),
        ("started_at", "2001-01-01T00:00:00Z"),
        ("finished_at", "2001-01-01T00:00:00Z"),
        ("last_error", "x"),
        ("schedule", 1),
        ("fire_time", "2001-01-01T00:00:00Z"),
        ("unheard_of", 1),
    ],
)
def test_create_rejects_unknown_fields_so_nothing_is_mass_assigned(user_api, field, value):
    resp = _post(user_api, {"type": "DEMO_TASK", field: value})

    assert resp.status_code == 400, resp.content
    assert field in _error(resp)["details"]
    assert not Job.objects.exists()


def test_payload_up_to_10kb_is_accepted_and_one_byte_more_is_413(user_api):
    # {"x":"aaa..."} is 8 bytes of JSON around the string.
    exact = _post(user_api, {"type": "DEMO_TASK", "payload": {"x": "a" * (PAYLOAD_LIMIT - 8)}})
    assert exact.status_code == 201, exact.content

    over = _post(user_api, {"type": "DEMO_TASK", "payload": {"x": "a" * (PAYLOAD_LIMIT - 7)}})
    assert over.status_code == 413
    assert _error(over)["code"] == "payload_too_large"
    assert Job.objects.count() == 1


def test_payload_size_counts_utf8_bytes_not_characters(user_api):
    # "é" is 2 bytes in UTF-8: 5200 of them are 10400 bytes, over the limit in fewer characters.
    resp = _post(user_api, {"type": "DEMO_TASK", "payload": {"x": "é" * 5200}})
    assert resp.status_code == 413


def test_a_huge_body_is_413_before_it_is_parsed(user_api):
    # Not even valid JSON: the size check comes first and never reads it all.
    body = b'{"type": "DEMO_TASK", "payload": "' + b"a" * 2_000_000
    resp = user_api.post(JOBS, body, content_type="application/json")

    assert resp.status_code == 413
    error = _error(resp)
    assert error["code"] == "payload_too_large"
    assert "request body" in error["message"]


def test_an_indented_body_with_escapes_under_the_payload_limit_is_not_refused_as_raw(user_api):
    # \u00e9 escapes make the raw body ~3x the compact UTF-8 payload; it must still reach the 10 KB rule.
    payload = {"x": "é" * 4000}  # 8008 bytes compact UTF-8
    body = json.dumps({"type": "DEMO_TASK", "payload": payload}, indent=4, ensure_ascii=True)
    assert len(body) > 24_000
    resp = user_api.post(JOBS, body, content_type="application/json")
    assert resp.status_code == 201, resp.content


@pytest.mark.parametrize("body", [b'{"type": "DEMO_TASK",', b"{'type': 'DEMO_TASK'}", b"NaN", b"\xff\xfe"])
def test_malformed_json_is_400_in_the_error_shape(user_api, body):
    resp = user_api.post(JOBS, body, content_type="application/json")
    assert resp.status_code == 400, resp.content
    assert _error(resp)["code"] == "validation_error"


@pytest.mark.parametrize("body", [[{"type": "DEMO_TASK"}], "DEMO_TASK", 7, None])
def test_a_body_that_is_not_an_object_is_400(user_api, body):
    resp = user_api.post(JOBS, json.dumps(body), content_type="application/json")
    assert resp.status_code == 400
    _error(resp)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain"])
def test_a_non_json_body_is_415_that_says_to_send_json(user_api, content_type):
    # `curl -d '{...}'` without -H 'Content-Type: application/json' sends a form: the message names
    # the type it got and the one to send.
    resp = user_api.post(JOBS, '{"type": "DEMO_TASK"}', content_type=content_type)
    assert resp.status_code == 415
    error = _error(resp)
    assert error["code"] == "unsupported_media_type"
    assert error["message"] == (
        f'Unsupported media type "{content_type}" in request: send the body as JSON, '
        "with the header 'Content-Type: application/json'."
    )
    assert not Job.objects.exists()


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/jobs"),
        ("post", "/api/jobs"),
        ("get", "/api/jobs/{id}"),
        ("post", "/api/jobs/{id}/cancel"),
        ("post", "/api/jobs/{id}/retry"),
        ("post", "/api/jobs/{id}/recover"),
        ("get", "/api/jobs/{id}/attempts"),
        ("get", "/api/jobs/{id}/result"),
        ("get", "/api/admin/jobs"),
    ],
)
def test_every_endpoint_needs_a_token(api, method, path):
    job = JobFactory()
    resp = getattr(api, method)(path.format(id=job.id), {"type": "DEMO_TASK"}, format="json")
    assert resp.status_code == 401
    assert _error(resp)["code"] == "not_authenticated"
    assert Job.objects.count() == 1


# --- list and filters -------------------------------------------------------------------------


def test_list_shows_only_my_jobs_newest_first_in_pages(user_api, user, other_user):
    mine = [enqueuing.enqueue("DEMO_TASK", owner=user).id for _ in range(3)]
    enqueuing.enqueue("DEMO_TASK", owner=other_user)

    resp = user_api.get(JOBS)

    assert resp.status_code == 200
    page = resp.json()
    assert set(page) == {"count", "next", "previous", "results"}
    assert page["count"] == 3
    expected = list(Job.objects.filter(id__in=mine).order_by("-created_at", "-id").values_list("id", flat=True))
    assert [r["id"] for r in page["results"]] == [str(i) for i in expected]


def test_an_admins_own_list_is_still_only_their_jobs(admin_api, admin_user, user):
    enqueuing.enqueue("DEMO_TASK", owner=user)
    own = enqueuing.enqueue("DEMO_TASK", owner=admin_user)
    assert [r["id"] for r in admin_api.get(JOBS).json()["results"]] == [str(own.id)]


def test_pagination_is_stable_across_created_at_ties(user_api, user):
    # One statement inserts them all: they share created_at, so only the id tie-break orders them.
    ids = enqueuing.enqueue_many([{"type": "DEMO_TASK"} for _ in range(7)], owner=user)
    assert Job.objects.filter(id__in=ids).values("created_at").distinct().count() == 1

    seen, url = [], f"{JOBS}?page_size=3"
    while url:
        page = user_api.get(url).json()
        seen += [r["id"] for r in page["results"]]
        url = page["next"]

    assert seen == sorted((str(i) for i in ids), reverse=True)
    assert (
        user_api.get(f"{JOBS}?page_size=3").json()["results"] == user_api.get(f"{JOBS}?page_size=3").json()["results"]
    )


def test_page_size_is_capped_and_a_bad_cursor_is_a_400(user_api, user):
    enqueuing.enqueue_many([{"type": "DEMO_TASK"} for _ in range(3)], owner=user)
    assert len(user_api.get(f"{JOBS}?page_size=100000").json()["results"]) == 3
    assert len(user_api.get(f"{JOBS}?page_size=2").json()["results"]) == 2
    assert [len(user_api.get(f"{JOBS}?page_size={v}").json()["results"]) for v in ("0", "-1", "x", "")] == [3] * 4
    for cursor in ("nonsense", "eyJ2IjpbMV0sInIiOjB9", "eyJ2IjpbIjIwMzAtMDEtMDEiLCJ4Il0sInIiOjB9", "x" * 600):
        resp = user_api.get(f"{JOBS}?cursor={cursor}")
        assert resp.status_code == 400, (cursor, resp.content)
        assert _error(resp)["details"] == {"cursor": ["Invalid cursor."]}


def _walk(client, url: str, *, between_pages=lambda: None) -> list[str]:
    seen = []
    while url:
        page = client.get(url).json()
        seen += [r["id"] for r in page["results"]]
        url = page["next"]
        between_pages()
    return seen


def test_a_walk_while_jobs_arrive_and_leave_sees_each_old_job_exactly_once(user_api, user):
    # Page numbers over a newest-first list shift under inserts: page 2 would repeat page 1's tail.
    before = [str(i) for i in enqueuing.enqueue_many([{"type": "DEMO_TASK"} for _ in range(25)], owner=user)]
    # now() is frozen in a test transaction: date the first jobs back, as a real earlier insert would be.
    Job.objects.filter(id__in=before).update(created_at=timezone.now() - dt.timedelta(minutes=5))
    arrived: list[str] = []

    def meanwhile() -> None:
        arrived.extend(str(enqueuing.enqueue("DEMO_TASK", owner=user).id) for _ in range(4))

    seen = _walk(user_api, f"{JOBS}?page_size=5", between_pages=meanwhile)

    assert len(seen) == len(set(seen))
    assert set(before) <= set(seen)
    assert not set(arrived) & set(seen)  # newer than the walk's start: ahead of the cursor


def test_previous_links_walk_back_to_the_first_page(user_api, user):
    enqueuing.enqueue_many([{"type": "DEMO_TASK"} for _ in range(7)], owner=user)
    first = user_api.get(f"{JOBS}?page_size=3").json()
    second = user_api.get(first["next"]).json()
    third = user_api.get(second["next"]).json()

    assert (first["previous"], third["next"], first["count"], len(third["results"])) == (None, None, 7, 1)
    back = user_api.get(third["previous"]).json()
    assert back["results"] == second["results"]
    assert user_api.get(back["previous"]).json()["results"] == first["results"]


def test_list_filters(user_api, user):
    a = enqueuing.enqueue("DEMO_TASK", owner=user, priority="HIGH", queue="fast")
    b = enqueuing.enqueue("REPORT", owner=user, priority="LOW")
    c = enqueuing.enqueue("DEMO_TASK", owner=user, scheduled_at=timezone.now() + dt.timedelta(hours=1))
    Job.objects.filter(id=b.id).update(status=JobStatus.FAILED)
    Job.objects.filter(id=a.id).update(created_at=timezone.now() - dt.timedelta(days=2))

    def ids(query: str) -> set[str]:
        resp = user_api.get(f"{JOBS}?{query}")
        assert resp.status_code == 200, resp.content
        return {r["id"] for r in resp.json()["results"]}

    assert ids("status=FAILED") == {str(b.id)}
    assert ids("status=QUEUED&status=SCHEDULED") == {str(a.id), str(c.id)}
    assert ids("type=DEMO_TASK") == {str(a.id), str(c.id)}
    assert ids("priority=HIGH") == {str(a.id)}
    assert ids("priority=MEDIUM") == {str(c.id)}
    assert ids("priority=LOW&type=REPORT") == {str(b.id)}
    assert ids("queue=fast") == {str(a.id)}
    day_ago = (timezone.now() - dt.timedelta(days=1)).isoformat()
    assert ids(f"created_before={day_ago.replace('+', '%2B')}") == {str(a.id)}
    assert ids(f"created_after={day_ago.replace('+', '%2B')}") == {str(b.id), str(c.id)}


def test_the_priority_filter_takes_a_priority_as_jobs_read_back(user_api, admin_api, user):
    odd = enqueuing.enqueue("DEMO_TASK", owner=user, priority=37)  # reads back as "37"
    low = enqueuing.enqueue("DEMO_TASK", owner=user, priority=-50)  # reads back as "LOW"
    assert user_api.get(f"{JOBS}/{odd.id}").json()["priority"] == "37"
    for url in (JOBS, "/api/admin/jobs"):
        client = user_api if url == JOBS else admin_api
        assert [r["id"] for r in client.get(url, {"priority": "37"}).json()["results"]] == [str(odd.id)]
        assert [r["id"] for r in client.get(url, {"priority": "-50"}).json()["results"]] == [str(low.id)]
        assert client.get(url, {"priority": "HIGH"}).json()["count"] == 0
        for bad in ("101", "-101", "1_0", "\u0663", "1.5", "high", "0x10"):
            resp = client.get(url, {"priority": bad})
            assert resp.status_code == 400, (bad, resp.content)
            assert "priority" in _error(resp)["details"]


def test_search_matches_part_of_the_name_or_the_type_in_any_case(user_api, user, other_user):
    nightly = enqueuing.enqueue("DEMO_TASK", owner=user, name="Nightly Invoices")
    report = enqueuing.enqueue("REPORT", owner=user, name="weekly")
    enqueuing.enqueue("DEMO_TASK", owner=user, name="other")
    enqueuing.enqueue("REPORT", owner=other_user, name="nightly too")  # not mine

    def names(term: str) -> set[str]:
        resp = user_api.get(JOBS, {"search": term})
        assert resp.status_code == 200, resp.content
        return {r["name"] for r in resp.json()["results"]}

    assert names("nightly") == {nightly.name}
    assert names("INVOICE") == {nightly.name}
    assert names("repo") == {report.name}
    assert names("%") == set()  # a LIKE wildcard is a literal character
    assert names("  ") == {"Nightly Invoices", "weekly", "other"}
    assert user_api.get(JOBS, {"search": "x" * 201}).status_code == 400
    assert user_api.get(JOBS, {"search": "a\x00b"}).status_code == 400


def test_search_finds_my_jobs_by_id_key_or_error_and_never_another_users(user_api, admin_api, user, other_user):
    # The console's plain-text rule (scheduler.job_search.jobs_filter_by_list_search): id, key, error text too.
    mine = JobFactory(owner=user, name="mine", idempotency_key="key-1", last_error="Ärger: bank said no")
    theirs = JobFactory(owner=other_user, name="theirs", idempotency_key="key-2", last_error="Ärger: bank said no")

    def ids(client, term: str) -> set[str]:
        resp = client.get(JOBS if client is user_api else "/api/admin/jobs", {"search": term})
        assert resp.status_code == 200, (term, resp.content)
        return {r["id"] for r in resp.json()["results"]}

    for term in (str(mine.id), short_job_id(mine.id), "key-1", "ÄRGER: BANK"):
        assert ids(user_api, term) == {str(mine.id)}, term
    for term in (str(theirs.id), short_job_id(theirs.id), "key-2", "theirs", "Error:ärger args.k:1"):
        assert ids(user_api, term) == set(), term  # another user's job is never found
    assert ids(admin_api, "ärger") == {str(mine.id), str(theirs.id)}


@pytest.mark.parametrize("path", [JOBS, "/api/admin/jobs"])
def test_search_takes_the_console_qualifiers(user_api, admin_api, user, other_user, path):
    # The console's syntax (scheduler.job_search); the API matched only name or type, so these found nothing.
    mine = JobFactory(owner=user, name="nightly", payload={"customer": 42, "user": {"plan": "pro"}})
    failed = JobFactory(owner=user, name="weekly", payload={"customer": "42"}, failed=True, last_error="Timeout: 30 s")
    JobFactory(owner=user, name="other", payload={"customer": 7})
    theirs = JobFactory(owner=other_user, payload={"customer": 42}, failed=True, last_error="timeout")
    client = user_api if path == JOBS else admin_api

    def ids(term: str) -> set[str]:
        resp = client.get(path, {"search": term})
        assert resp.status_code == 200, (term, resp.content)
        return {r["id"] for r in resp.json()["results"]}

    everyone = {str(theirs.id)} if path != JOBS else set()  # a USER sees only their own jobs
    assert ids("args.customer:42") == {str(mine.id), str(failed.id)} | everyone
    assert ids('args.customer:"42"') == {str(failed.id)}  # quoted: text only
    assert ids("args.user.plan:pro") == {str(mine.id)}
    assert ids("error:TIMEOUT") == {str(failed.id)} | everyone
    assert ids('error:"timeout: 30"') == {str(failed.id)}
    assert ids("args.customer:42 night") == {str(mine.id)}  # plain text: part of the name or type
    assert ids("args.customer:42 demo_task error:timeout") == {str(failed.id)} | everyone


HOSTILE_SEARCHES = [
    ("args.:1", "args.<key>"),  # no key
    ("args.", "args.<key>"),
    ("args.a..b:1", "args.<key>"),
    ("args.customer:", "has no value"),
    ("args." + ".".join("k" * 9) + ":1", "at most 8 keys"),
    ("args." + ".".join(["k"] * 60) + ":1", "at most 8 keys"),
    ('error:"not closed', "not closed"),
    ('args.x:"a"b', "closing quote"),
    ('"', None),  # a lone quote is plain text: no qualifier
    ("error:", "An error: term wants 1 to"),
    (" ".join(["error:x"] * 21), "at most 20 terms"),
    (" ".join(["a"] * 21), "at most 20 terms"),
    ("x" * 201, "at most 200 characters"),
    ("x" * 10_000, "at most 200 characters"),
    ("args.k:" + "9" * 10_000, "at most 200 characters"),
]


@pytest.mark.parametrize("path", [JOBS, "/api/admin/jobs"])
@pytest.mark.parametrize(("term", "says"), HOSTILE_SEARCHES)
def test_a_search_that_cannot_be_read_is_a_400_that_says_why(user_api, admin_api, user, path, term, says):
    JobFactory(owner=user, payload={"k": 1})
    client = user_api if path == JOBS else admin_api

    resp = client.get(path, {"search": term})

    if says is None:
        assert resp.status_code == 200, resp.content
        return
    assert resp.status_code == 400, resp.content
    error = _error(resp)
    assert error["code"] == "validation_error"
    assert error["message"].startswith("search: ") and says in error["message"], error
    assert set(error["details"]) == {"search"}


@pytest.mark.parametrize("path", [JOBS, "/api/admin/jobs"])
@pytest.mark.parametrize(
    "query",
    [
        "search=%00",  # NUL: refused before any view (core.failsafe)
        "search=args.k:%00",
        "search=%ED%A0%80",  # a lone surrogate's UTF-8 bytes: no valid text, read as U+FFFD
        "search=args.k:%ED%A0%80",
        "search=error:%ED%A0%80",
        "search=args.k:%22%5Cud800%22",  # args.k:"\ud800" as a JSON escape: six characters of text
        "search=args.%5Cud800:1",
        "search=args.k:%5Cu0000",
        "search=error:%22",
        "search=args.k:1e999",
        "search=args.k:NaN",
        "search=" + "%22" * 150,
        "search=" + "args.a" * 33,
    ],
)
def test_hostile_search_text_is_answered_never_a_500(user_api, admin_api, user, path, query):
    JobFactory(owner=user, payload={"k": 1})
    client = user_api if path == JOBS else admin_api

    resp = client.get(f"{path}?{query}")

    assert resp.status_code in (200, 400), resp.content
    if resp.status_code == 400:
        assert _error(resp)["code"] == "validation_error"


def test_the_schedule_filter_lists_the_jobs_one_schedule_fired(user_api, user):
    schedule = user_api.post(
        "/api/schedules",
        {"name": "s", "interval_seconds": 3600, "job": {"type": "DEMO_TASK"}},
        format="json",
    ).json()
    fired = user_api.post(f"/api/schedules/{schedule['id']}/trigger").json()
    enqueuing.enqueue("DEMO_TASK", owner=user)

    resp = user_api.get(JOBS, {"schedule": schedule["id"]})

    assert [r["id"] for r in resp.json()["results"]] == [fired["id"]]
    assert user_api.get(JOBS, {"schedule": 10**30}).json()["results"] == []
    assert user_api.get(JOBS, {"schedule": "x"}).status_code == 400


@pytest.mark.parametrize(
    ("path", "query", "named"),
    [
        (JOBS, "statuss=DEAD", "statuss"),
        (JOBS, "owner=1", "owner"),  # an ADMIN-only filter is unknown on a USER's own list
        (JOBS, "status=QUEUED&sort=name&page=2", "page"),
        ("/api/admin/jobs", "search=x&nope=1", "nope"),
        ("/api/schedules", "enabled=true&owner=1", "owner"),
        ("/api/jobs/{job}/attempts", "status=FAILED", "status"),
        ("/api/jobs/{job}/events", "event_type=JOB_CREATED", "event_type"),
        ("/api/schedules/{schedule}/runs", "schedule=1", "schedule"),
    ],
)
def test_an_unknown_query_parameter_is_a_400_naming_it(user_api, admin_api, user, path, query, named):
    job = enqueuing.enqueue("DEMO_TASK", owner=user)
    schedule = user_api.post(
        "/api/schedules", {"name": "s", "interval_seconds": 3600, "job": {"type": "DEMO_TASK"}}, format="json"
    ).json()
    client = admin_api if path.startswith("/api/admin") else user_api
    url = path.format(job=job.id, schedule=schedule["id"])

    resp = client.get(f"{url}?{query}")

    assert resp.status_code == 400, resp.content
    error = _error(resp)
    assert error["code"] == "validation_error"
    assert error["message"].startswith(f"{named}: Unknown query parameter.")
    assert "cursor" in error["message"] and "page_size" in error["message"]  # says what it does take
    assert named in error["details"]
    # The same list without the unknown parameter answers.
    known = "&".join(p for p in query.split("&") if p.split("=")[0] not in error["details"])
    assert client.get(f"{url}?{known}").status_code == 200


@pytest.mark.parametrize("path", [JOBS, "/api/admin/jobs"])
@pytest.mark.parametrize("value", ["caf%ED%A0%80", "caf%E9"], ids=["lone-surrogate-bytes", "latin-1"])
def test_a_search_that_is_not_utf8_is_a_400_not_a_search_for_replacement_characters(
    user_api, admin_api, user, path, value
):
    # Django reads such bytes as U+FFFD: the search looked for text the client never sent.
    job = enqueuing.enqueue("DEMO_TASK", owner=user, name="caf\ufffd")
    client = admin_api if path.startswith("/api/admin") else user_api

    resp = client.get(f"{path}?search={value}")

    assert resp.status_code == 400, resp.content
    error = _error(resp)
    assert error["code"] == "validation_error"
    assert set(error["details"]) == {"search"}
    # The same character sent as UTF-8 is searched for like any other.
    assert [j["id"] for j in client.get(f"{path}?search=caf%EF%BF%BD").json()["results"]] == [str(job.id)]


@pytest.mark.parametrize("query", ["status=BOGUS", "priority=URGENT", "priority=101", "created_after=yesterday"])
def test_a_bad_filter_value_is_400_not_ignored(user_api, user, query):
    enqueuing.enqueue("DEMO_TASK", owner=user)
    resp = user_api.get(f"{JOBS}?{query}")
    assert resp.status_code == 400, resp.content
    assert query.split("=")[0] in _error(resp)["details"]


@pytest.mark.parametrize("value", ["success", "SUCCESS,FAILED", "BOGUS"])
def test_a_bad_status_is_a_400_that_lists_the_statuses_and_how_to_ask_for_several(user_api, value):
    resp = user_api.get(JOBS, {"status": value})

    assert resp.status_code == 400, resp.content
    message = _error(resp)["details"]["status"][0]
    assert message == (
        f"{value!r} is not a status: use CREATED, SCHEDULED, QUEUED, RUNNING, SUCCESS, FAILED, RETRYING, DEAD"
        " or CANCELLED, in capitals; for several, repeat the parameter (status=FAILED&status=DEAD)."
    )


def test_a_repeated_status_lists_the_jobs_of_any_of_them(user_api, user):
    failed = JobFactory(owner=user, failed=True)
    dead = JobFactory(owner=user, dead=True)
    JobFactory(owner=user)

    resp = user_api.get(f"{JOBS}?status=FAILED&status=DEAD")

    assert {row["id"] for row in resp.json()["results"]} == {str(failed.id), str(dead.id)}


# --- detail -----------------------------------------------------------------------------------


def test_detail(user_api, user):
    job = enqueuing.enqueue("DEMO_TASK", {"k": 1}, owner=user, name="one")
    resp = user_api.get(f"{JOBS}/{job.id}")
    assert resp.status_code == 200
    assert (resp.json()["id"], resp.json()["payload"], resp.json()["name"]) == (str(job.id), {"k": 1}, "one")


def test_unknown_and_malformed_ids_are_404(user_api):
    missing = user_api.get(f"{JOBS}/{uuid.uuid4()}")
    assert missing.status_code == 404
    assert _error(missing)["code"] == "not_found"
    malformed = user_api.get(f"{JOBS}/not-a-uuid")
    assert malformed.status_code == 404
    assert malformed.json()["error"]["code"] == "not_found"


def test_detail_does_not_answer_other_methods(user_api, user):
    job = enqueuing.enqueue("DEMO_TASK", owner=user)
    for method in ("put", "patch", "delete"):
        resp = getattr(user_api, method)(f"{JOBS}/{job.id}", {"status": "SUCCESS"}, format="json")
        assert resp.status_code == 405
    assert Job.objects.get(id=job.id).status == JobStatus.QUEUED


# --- actions ----------------------------------------------------------------------------------


def test_cancel_a_queued_job_is_200_and_cancelled(user_api, user):
    job = enqueuing.enqueue("DEMO_TASK", owner=user)
    resp = user_api.post(f"{JOBS}/{job.id}/cancel")
    assert resp.status_code == 200
    assert resp.json()["status"] == "CANCELLED"
    assert resp.json()["finished_at"] is not None


def test_cancel_a_running_job_is_202_and_only_requests_it(user_api, user):
    job = JobFactory(owner=user, running=True)
    resp = user_api.post(f"{JOBS}/{job.id}/cancel")
    assert resp.status_code == 202
    assert (resp.json()["status"], resp.json()["cancel_requested"]) == ("RUNNING", True)
    # Asking again is harmless and answers the same.
    assert user_api.post(f"{JOBS}/{job.id}/cancel").status_code == 202
    assert not OutboxEvent.objects.filter(job_id=job.id).exists()


@pytest.mark.parametrize(
    ("outcome", "final"), [(leasing.Outcome.SUCCEEDED, "SUCCESS"), (leasing.Outcome.PERMANENT, "FAILED")]
)
def test_a_cancel_that_came_too_late_is_explained_on_the_finished_job(user_api, user, outcome, final):
    """A thread handler that never checks ``ctx.cancelled`` returns: the job ends as it ran, the API says why."""
    job = enqueuing.enqueue("DEMO_TASK", owner=user)
    (claimed,) = leasing.claim_jobs(worker_id="test-host:1:abc", limit=1, queues=None)
    assert _detail(user_api, job)["cancellation"] is None

    assert user_api.post(f"{JOBS}/{job.id}/cancel").status_code == 202
    assert _detail(user_api, job)["cancellation"] == {
        "code": "requested",
        "message": "Cancellation requested: the job stops when its handler next checks.",
    }
    leasing.record_outcomes([leasing.Report(job=claimed, outcome=outcome, error="" if final == "SUCCESS" else "no")])

    body = _detail(user_api, job)
    assert (body["status"], body["cancel_requested"]) == (final, True)
    assert body["cancellation"] == {
        "code": "finished_first",
        "message": f"Cancellation was requested, but the job finished first ({final}): its handler ended before"
        " it checked for the request.",
    }
    assert user_api.get(JOBS).json()["results"][0]["cancellation"]["code"] == "finished_first"


def test_cancel_a_finished_job_is_409_invalid_state(user_api, user):
    job = JobFactory(owner=user, succeeded=True)
    resp = user_api.post(f"{JOBS}/{job.id}/cancel")
    assert resp.status_code == 409
    error = _error(resp)
    assert error["code"] == "invalid_state"
    assert error["details"] == {"status": "SUCCESS"}


def test_retry_a_failed_job(user_api, user):
    job = enqueuing.enqueue("DEMO_TASK", owner=user)
    Job.objects.filter(id=job.id).update(status=JobStatus.FAILED, attempts=4, finished_at=timezone.now())
    resp = user_api.post(f"{JOBS}/{job.id}/retry")
    assert resp.status_code == 200, resp.content
    assert (resp.json()["status"], resp.json()["finished_at"]) == ("RETRYING", None)
    assert Job.objects.get(id=job.id).attempts_left == 4


def test_a_users_retry_of_their_dead_job_is_a_409_that_says_an_admin_recovers_it(user_api, user):
    dead = JobFactory(owner=user, dead=True)

    resp = user_api.post(f"{JOBS}/{dead.id}/retry")

    assert resp.status_code == 409
    error = _error(resp)
    assert error["code"] == "invalid_state"
    assert "this one is DEAD" in error["message"] and "Only an ADMIN can recover it" in error["message"]
    assert Job.objects.get(id=dead.id).status == JobStatus.DEAD


def test_with_the_setting_an_owner_retries_their_dead_job_through_the_recover_transition(
    user_api, other_api, user, settings
):
    settings.SCHEDULER = {**settings.SCHEDULER, "OWNERS_MAY_RETRY_DEAD": True}
    dead = JobFactory(owner=user, dead=True, attempts=4, max_retries=3)
    queued = JobFactory(owner=user)

    assert other_api.post(f"{JOBS}/{dead.id}/retry").status_code == 404  # still only the owner's
    resp = user_api.post(f"{JOBS}/{dead.id}/retry")

    assert resp.status_code == 200, resp.content
    assert resp.json()["status"] == "QUEUED"
    job = Job.objects.get(id=dead.id)
    assert (job.status, job.attempts_base, job.attempts_left) == (JobStatus.QUEUED, 4, 4)
    event = OutboxEvent.objects.filter(job_id=dead.id).get()
    assert (event.event_type, event.from_status, event.to_status) == ("JOB_RECOVERED", "DEAD", "QUEUED")
    assert event.payload["reason"] == "owner_retry"
    # Other states still answer 409; recover itself stays an ADMIN's.
    assert user_api.post(f"{JOBS}/{queued.id}/retry").status_code == 409
    assert user_api.post(f"{JOBS}/{dead.id}/recover").status_code in (403, 409)


def test_recover_is_for_admins_only(admin_api, user_api, user, other_user):
    mine = JobFactory(owner=user, dead=True)
    theirs = JobFactory(owner=other_user, dead=True)

    own = user_api.post(f"{JOBS}/{mine.id}/recover")
    assert own.status_code == 403
    assert _error(own)["code"] == "permission_denied"
    others = user_api.post(f"{JOBS}/{theirs.id}/recover")
    assert others.status_code == 404
    assert Job.objects.filter(status=JobStatus.DEAD).count() == 2

    resp = admin_api.post(f"{JOBS}/{mine.id}/recover")
    assert resp.status_code == 200
    assert resp.json()["status"] == "QUEUED"
    job = Job.objects.get(id=mine.id)
    assert (job.attempts_base, job.attempts_left) == (4, 4)


def test_attempts_are_paginated_in_order_with_their_tracebacks(user_api, admin_api, user):
    job = JobFactory(owner=user, failed=True, attempts=3)
    now = timezone.now()
    for n in (3, 1, 2):
        JobAttempt.objects.create(
            job=job,
            attempt_number=n,
            status=AttemptStatus.FAILED,
            worker="w1",
            started_at=now,
            error=f"ValueError: e{n}",
            traceback=f'Traceback (most recent call last):\n  File "jobs.py", line {n}\nValueError: e{n}\n',
        )

    page = user_api.get(f"{JOBS}/{job.id}/attempts?page_size=2").json()

    assert page["count"] == 3
    assert [a["attempt_number"] for a in page["results"]] == [1, 2]
    assert set(page["results"][0]) == {
        "attempt_number",
        "status",
        "worker",
        "started_at",
        "finished_at",
        "error",
        "traceback",
    }
    assert page["results"][0]["error"] == "ValueError: e1"
    assert page["results"][0]["traceback"].endswith("ValueError: e1\n")
    # An ADMIN reads the same tracebacks of someone else's job.
    as_admin = admin_api.get(f"{JOBS}/{job.id}/attempts").json()["results"]
    assert [a["traceback"].splitlines()[-1] for a in as_admin] == ["ValueError: e1", "ValueError: e2", "ValueError: e3"]
    assert [a["attempt_number"] for a in user_api.get(page["next"]).json()["results"]] == [3]


def test_result_is_404_no_result_until_there_is_one(user_api, user):
    job = JobFactory(owner=user, running=True)
    none_yet = user_api.get(f"{JOBS}/{job.id}/result")
    assert none_yet.status_code == 404
    assert _error(none_yet)["code"] == "no_result"

    Job.objects.filter(id=job.id).update(
        result_attempt=1,
        result_status=AttemptStatus.SUCCEEDED,
        result={"echo": [1, 2]},
        result_at=dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC),
    )
    resp = user_api.get(f"{JOBS}/{job.id}/result")
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "SUCCEEDED",
        "result": {"echo": [1, 2]},
        "attempt": 1,
        "created_at": "2026-01-02T03:04:05.678000Z",
    }


def test_job_lists_leave_each_handlers_result_in_the_database(user):
    job = JobFactory(owner=user, succeeded=True)
    Job.objects.filter(id=job.id).update(
        result_attempt=1, result_status=AttemptStatus.SUCCEEDED, result={"big": "x" * 10_000}, result_at=timezone.now()
    )

    for listed in (selectors.job_list_owned(owner=user).get(id=job.id), selectors.job_list_all().get(id=job.id)):
        assert listed.get_deferred_fields() == {"result"}
    assert selectors.job_get(job_id=job.id, actor=user).stored_result.result == {"big": "x" * 10_000}


# --- admin list -------------------------------------------------------------------------------


def test_admin_list_shows_every_owner_and_filters_by_owner(admin_api, user_api, user, other_user):
    a = enqueuing.enqueue("DEMO_TASK", owner=user)
    b = enqueuing.enqueue("REPORT", owner=other_user, priority="LOW")

    everyone = admin_api.get("/api/admin/jobs").json()
    assert {r["id"] for r in everyone["results"]} == {str(a.id), str(b.id)}
    by_owner = admin_api.get(f"/api/admin/jobs?owner={other_user.pk}").json()
    assert [r["id"] for r in by_owner["results"]] == [str(b.id)]
    assert admin_api.get("/api/admin/jobs?priority=LOW&type=REPORT").json()["count"] == 1
    assert admin_api.get("/api/admin/jobs?owner=me").status_code == 400

    refused = user_api.get("/api/admin/jobs")
    assert refused.status_code == 403
    assert _error(refused)["code"] == "permission_denied"


# --- BOLA: another user's job id is a 404 on every endpoint; an admin sees all ----------------

# (method, path, the state in which the owner's call would succeed, the owner's success status)
ENDPOINTS = [
    ("get", "/api/jobs/{id}", "queued", 200),
    ("post", "/api/jobs/{id}/cancel", "queued", 200),
    ("post", "/api/jobs/{id}/cancel", "running", 202),
    ("post", "/api/jobs/{id}/retry", "failed", 200),
    ("post", "/api/jobs/{id}/recover", "dead", 200),
    ("get", "/api/jobs/{id}/attempts", "failed", 200),
    ("get", "/api/jobs/{id}/result", "succeeded", 200),
]


def _job_in(state: str, owner) -> Job:
    job = JobFactory(owner=owner, **({} if state == "queued" else {state: True}))
    if state == "succeeded":
        Job.objects.filter(id=job.id).update(
            result_attempt=1, result_status=AttemptStatus.SUCCEEDED, result=1, result_at=timezone.now()
        )
    return job


@pytest.mark.parametrize(("method", "path", "state", "_ok"), ENDPOINTS)
def test_another_users_job_is_404_on_every_endpoint_and_untouched(other_api, user, method, path, state, _ok):
    job = _job_in(state, user)
    before = _snapshot(job.id)

    resp = getattr(other_api, method)(path.format(id=job.id))

    assert resp.status_code == 404, resp.content
    assert _error(resp)["code"] == "not_found"
    assert str(job.id) not in resp.content.decode()
    assert _snapshot(job.id) == before


@pytest.mark.parametrize(("method", "path", "state", "ok"), ENDPOINTS)
def test_an_admin_reaches_every_users_job_on_every_endpoint(admin_api, user, method, path, state, ok):
    job = _job_in(state, user)
    resp = getattr(admin_api, method)(path.format(id=job.id))
    assert resp.status_code == ok, resp.content


def test_another_users_idempotency_key_is_theirs_alone(user_api, other_api):
    first = _post(user_api, {"type": "DEMO_TASK"}, HTTP_IDEMPOTENCY_KEY="shared")
    second = _post(other_api, {"type": "DEMO_TASK", "payload": {"different": True}}, HTTP_IDEMPOTENCY_KEY="shared")
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]


def test_a_user_cannot_see_jobs_of_others_in_lists(other_api, user):
    for _ in range(3):
        enqueuing.enqueue("DEMO_TASK", owner=user)
    assert other_api.get(JOBS).json()["count"] == 0
    # ``owner`` is an ADMIN filter: on a USER's own list it is refused, never a way in.
    assert other_api.get(f"{JOBS}?owner={user.pk}").status_code == 400


# --- schema -----------------------------------------------------------------------------------


def test_schema_documents_every_job_endpoint_and_the_idempotency_headers(api):
    resp = api.get("/api/schema/?format=json")
    assert resp.status_code == 200
    schema = json.loads(resp.content)
    paths = schema["paths"]
    for path, method in [
        ("/api/jobs", "get"),
        ("/api/jobs", "post"),
        ("/api/jobs/{job_id}", "get"),
        ("/api/jobs/{job_id}/cancel", "post"),
        ("/api/jobs/{job_id}/retry", "post"),
        ("/api/jobs/{job_id}/recover", "post"),
        ("/api/jobs/{job_id}/attempts", "get"),
        ("/api/jobs/{job_id}/result", "get"),
        ("/api/admin/jobs", "get"),
    ]:
        assert method in paths[path], (path, method)
    create = paths["/api/jobs"]["post"]
    assert {"in": "header", "name": "Idempotency-Key"}.items() <= next(
        p for p in create["parameters"] if p["name"] == "Idempotency-Key"
    ).items()
    assert "Idempotent-Replayed" in create["responses"]["200"]["headers"]
    assert {"200", "201", "400", "409", "413"} <= set(create["responses"])
    assert {p["name"] for p in paths["/api/admin/jobs"]["get"]["parameters"]} >= {
        "owner",
        "status",
        "type",
        "priority",
        "queue",
        "created_after",
        "created_before",
    }
    assert schema["components"]["schemas"]["Priority"]["enum"] == ["HIGH", "MEDIUM", "LOW"]
    for path in ("/api/jobs", "/api/admin/jobs"):
        search = next(p for p in paths[path]["get"]["parameters"] if p["name"] == "search")
        assert search["schema"] == {"type": "string", "maxLength": 200}
        assert "`args.<key>:<value>`" in search["description"] and "`error:<text>`" in search["description"]
        assert "is a 400 that says why" in search["description"]


@pytest.mark.parametrize(
    "value",
    ["2026-01-01T00:00:00+23:59", "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"],
)
def test_created_filters_with_extreme_offsets_never_500(user_api, value):
    """Found by schemathesis: PostgreSQL rejects offsets beyond 15:59; the filter normalises to UTC first."""
    for name in ("created_before", "created_after"):
        resp = user_api.get("/api/jobs", {name: value})
        assert resp.status_code in (200, 400), resp.content
        if resp.status_code == 400:
            assert resp.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize(
    "body",
    [
        {"type": "DEMO_TASK", "payload": {"result": "a\u0000b"}},
        {"type": "DEMO_TASK", "payload": {"k\u0000": 1}},
        {"type": "DEMO_TASK", "payload": {}, "name": "x\u0000"},
    ],
)
def test_nul_characters_are_a_400_not_a_500(user_api, body):
    """Found by a cron engineer: PostgreSQL's jsonb and text reject U+0000."""
    resp = user_api.post("/api/jobs", body, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["code"] == "validation_error"
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("when", "status"),
    [("2030-01-01T00:00:00+16:00", 200), ("2030-01-01T00:00:00-23:59", 200), ("0001-01-01T00:00:00+01:00", 400)],
)
def test_a_cursor_time_with_an_offset_postgresql_refuses_is_read_in_utc_not_a_500(user_api, user, when, status):
    """PostgreSQL takes UTC offsets up to +-15:59 only; Python's datetimes go to +-23:59."""
    (job_id,) = enqueuing.enqueue_many([{"type": "DEMO_TASK"}], owner=user)
    token = base64.urlsafe_b64encode(json.dumps({"v": [when, str(job_id)], "r": 0}).encode()).decode().rstrip("=")

    resp = user_api.get(f"{JOBS}?cursor={token}")

    assert resp.status_code == status, resp.content


def test_a_job_whose_type_or_queue_is_not_a_string_is_a_400_that_says_a_string_is_expected(user_api):
    resp = user_api.post("/api/jobs", {"type": "DEMO_TASK", "queue": 5, "name": True}, format="json")
    assert resp.status_code == 400, resp.content
    details = resp.json()["error"]["details"]
    assert details["queue"] == ["A string is expected, not a number."]
    assert details["name"] == ["A string is expected, not a boolean."]


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"priority": True}, "priority", "A string is expected, not a boolean: one of HIGH, MEDIUM, LOW."),
        ({"priority": ["HIGH"]}, "priority", "A string is expected, not an array: one of HIGH, MEDIUM, LOW."),
        ({"priority": 37}, "priority", "A string is expected, not a number: one of HIGH, MEDIUM, LOW."),
    ],
)
def test_a_named_choice_given_another_json_type_says_a_string_is_expected(user_api, change, field, message):
    # DRF's ChoiceField answered '"True" is not a valid choice.' and '"['HIGH']" ...': Python's spelling.
    resp = user_api.post("/api/jobs", {"type": "DEMO_TASK", **change}, format="json")

    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["details"][field] == [message]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/api/jobs", [], "A JSON object is expected, not an array."),
        ("/api/jobs", 5, "A JSON object is expected, not a number."),
        ("/api/schedules/preview", "0 * * * *", "A JSON object is expected, not a string."),
        ("/api/auth/register", True, "A JSON object is expected, not a boolean."),
    ],
)
def test_a_body_that_is_no_json_object_says_so_in_json_words(user_api, path, body, message):
    # DRF said "Invalid data. Expected a dictionary, but got list.": Python's type names.
    resp = user_api.post(path, json.dumps(body), content_type="application/json")

    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["details"] == {"non_field_errors": [message]}


def test_a_schedules_job_that_is_no_json_object_says_so(user_api):
    body = {"name": "s", "cron": "0 * * * *", "job": 5}

    resp = user_api.post("/api/schedules", body, format="json")

    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["details"]["job"] == {"non_field_errors": ["A JSON object is expected, not a number."]}


@pytest.mark.parametrize(
    ("query", "named"), [("type=A&type=B", "type"), ("queue=a&queue=default", "queue"), ("search=a&search=b", "search")]
)
def test_a_single_valued_filter_given_twice_is_a_400_naming_it(user_api, user, query, named):
    enqueuing.enqueue("DEMO_TASK", owner=user)

    resp = user_api.get(f"{JOBS}?{query}")

    assert resp.status_code == 400, resp.content
    assert _error(resp)["message"].startswith(f"{named}: Given 2 times")


def test_status_may_be_repeated_as_documented(user_api, user):
    enqueuing.enqueue("DEMO_TASK", owner=user)

    assert user_api.get(f"{JOBS}?status=QUEUED&status=FAILED").status_code == 200
