"""The schedules API: CRUD for owners and admins, trigger, preview, strict bodies, 400 on bad cron or zone."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from prometheus_client import REGISTRY

from scheduler.models import CronSchedule, Job
from scheduler.states import JobStatus

pytestmark = pytest.mark.django_db

NIGHTLY = {
    "name": "nightly report",
    "cron": "30 2 * * *",
    "timezone": "America/New_York",
    "misfire_policy": "catch_up",
    "overlap_policy": "skip",
    "job": {"type": "REPORT", "payload": {"since": "2024-01-01"}, "priority": "HIGH", "queue": "reports"},
}


def db_clock() -> dt.datetime:
    """The database's wall clock (``clock_timestamp()``), as the schedule services read it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def parse(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def create(client, body=None):
    resp = client.post("/api/schedules", body or NIGHTLY, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def test_an_idempotency_key_makes_a_retried_create_one_schedule(user_api, user):
    # Names are not unique: a create retried without a key made a second schedule, and every fire
    # twice. With the key, the retry answers the first schedule (as POST /api/jobs does).
    key = {"Idempotency-Key": "nightly-1"}
    first = user_api.post("/api/schedules", NIGHTLY, format="json", headers=key)
    again = user_api.post("/api/schedules", NIGHTLY, format="json", headers=key)

    assert first.status_code == 201, first.content
    assert again.status_code == 200, again.content
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    schedule = CronSchedule.objects.get(owner=user)
    assert again.json()["id"] == first.json()["id"] == schedule.id
    assert again.headers["Location"] == first.headers["Location"] == f"http://testserver/api/schedules/{schedule.id}"
    assert LogEntry.objects.filter(object_id=str(schedule.id)).count() == 1  # the replay recorded nothing


def test_create_reads_back_with_every_documented_field(user_api, user):
    body = create(user_api)
    assert set(body) >= {
        "id",
        "name",
        "cron",
        "interval_seconds",
        "timezone",
        "enabled",
        "misfire_policy",
        "overlap_policy",
        "job",
        "next_fire_at",
        "last_fired_at",
        "next_fire_times",
    }
    assert body["owner"] == user.id
    assert (body["cron"], body["interval_seconds"], body["timezone"]) == ("30 2 * * *", None, "America/New_York")
    assert (body["enabled"], body["misfire_policy"], body["overlap_policy"]) == (True, "catch_up", "skip")
    assert body["job"] == {
        "type": "REPORT",
        "payload": {"since": "2024-01-01"},
        "priority": "HIGH",
        "queue": "reports",
        "max_retries": 3,
        "timeout_seconds": 300,
    }
    assert body["last_fired_at"] is None
    times = [parse(t) for t in body["next_fire_times"]]
    assert len(times) == 5
    assert times[0] == parse(body["next_fire_at"])
    assert times[0] > db_now()
    assert all(t.utcoffset() == dt.timedelta(0) for t in times)
    assert all(t.astimezone(dt.UTC).minute == 30 for t in times)


def test_defaults_and_interval_schedules(user_api):
    resp = user_api.post(
        "/api/schedules", {"name": "tick", "interval_seconds": 60, "job": {"type": "DEMO_TASK"}}, format="json"
    )
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert (body["cron"], body["interval_seconds"], body["timezone"]) == (None, 60, "UTC")
    assert (body["enabled"], body["misfire_policy"], body["overlap_policy"]) == (True, "skip", "allow")
    assert body["job"]["priority"] == "MEDIUM"
    assert body["job"]["queue"] == "default"
    times = [parse(t) for t in body["next_fire_times"]]
    assert [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)] == [60.0] * 4


def test_macros_are_stored_expanded(user_api):
    body = create(user_api, {**NIGHTLY, "cron": "@hourly", "timezone": "UTC"})
    assert body["cron"] == "0 * * * *"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * * *"}, "cron"),
        ({"cron": "@reboot"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),  # never fires
        ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"cron": None}, "cron"),  # neither cron nor interval
        ({"interval_seconds": 60}, "cron"),  # both
        ({"interval_seconds": 0, "cron": None}, "interval_seconds"),
        ({"misfire_policy": "sometimes"}, "misfire_policy"),
        ({"overlap_policy": "queue"}, "overlap_policy"),
        ({"name": ""}, "name"),
        ({"owner": 1}, "owner"),  # unknown field
        ({"next_fire_at": "2030-01-01T00:00:00Z"}, "next_fire_at"),  # read-only: unknown in a body
        ({"job": {"type": "NO_SUCH_HANDLER"}}, "job"),
        ({"job": {"type": "DEMO_TASK", "max_retries": 11}}, "job"),
        ({"job": {"type": "DEMO_TASK", "status": "SUCCESS"}}, "job"),  # unknown nested field
        ({"job": {"type": "DEMO_TASK", "priority": "URGENT"}}, "job"),
    ],
)
def test_bad_bodies_are_400_with_the_field_named(user_api, change, field):
    resp = user_api.post("/api/schedules", {**NIGHTLY, **change}, format="json")
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["code"] == "validation_error"
    assert field in error["details"]
    assert not CronSchedule.objects.exists()


def test_an_oversized_template_payload_is_413(user_api):
    resp = user_api.post(
        "/api/schedules", {**NIGHTLY, "job": {"type": "DEMO_TASK", "payload": {"x": "y" * 11_000}}}, format="json"
    )
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "payload_too_large"


def test_users_see_only_their_own_schedules_and_admins_see_all(user_api, other_api, admin_api):
    mine = create(user_api)
    theirs = create(other_api, {**NIGHTLY, "name": "theirs"})
    listed = user_api.get("/api/schedules").json()
    assert set(listed) == {"count", "next", "previous", "results"}
    assert [s["id"] for s in listed["results"]] == [mine["id"]]
    assert {s["id"] for s in admin_api.get("/api/schedules").json()["results"]} == {mine["id"], theirs["id"]}
    for method, suffix in (("get", ""), ("patch", ""), ("put", ""), ("delete", ""), ("post", "/trigger")):
        resp = getattr(user_api, method)(f"/api/schedules/{theirs['id']}{suffix}", {"name": "x"}, format="json")
        assert resp.status_code == 404, (method, resp.content)
        assert resp.json()["error"]["code"] == "not_found"
    assert CronSchedule.objects.get(id=theirs["id"]).name == "theirs"
    assert not Job.objects.exists()
    assert admin_api.get(f"/api/schedules/{mine['id']}").status_code == 200
    assert admin_api.patch(f"/api/schedules/{mine['id']}", {"enabled": False}, format="json").status_code == 200


def _ids(resp) -> list[int]:
    assert resp.status_code == 200, resp.content
    return [s["id"] for s in resp.json()["results"]]


def test_the_list_finds_schedules_by_exact_name_enabled_and_job_type(user_api, other_api, admin_api):
    # A Celery beat user looks an entry up by name; a name is a label, so it may list several.
    nightly = create(user_api)
    again = create(user_api)
    off = create(user_api, {**NIGHTLY, "name": "Nightly Report", "enabled": False})
    tick = create(user_api, {"name": "tick", "interval_seconds": 60, "job": {"type": "DEMO_TASK"}})
    theirs = create(other_api)

    assert _ids(user_api.get("/api/schedules", {"name": "nightly report"})) == [nightly["id"], again["id"]]
    assert _ids(user_api.get("/api/schedules", {"name": "Nightly Report"})) == [off["id"]]  # letter case counts
    for near in ("nightly", "nightly report ", " nightly report", "nightly%", "NIGHTLY REPORT"):
        assert _ids(user_api.get("/api/schedules", {"name": near})) == [], near
    assert _ids(user_api.get("/api/schedules", {"enabled": "false"})) == [off["id"]]
    assert _ids(user_api.get("/api/schedules", {"enabled": "True"})) == [nightly["id"], again["id"], tick["id"]]
    assert _ids(user_api.get("/api/schedules", {"job_type": "DEMO_TASK"})) == [tick["id"]]
    assert _ids(user_api.get("/api/schedules", {"job_type": "REPORT", "enabled": "true"})) == [
        nightly["id"],
        again["id"],
    ]
    assert _ids(user_api.get("/api/schedules", {"name": "nightly report", "enabled": "false"})) == []
    # A USER's filter looks at their own schedules only; an ADMIN's at everyone's.
    assert _ids(admin_api.get("/api/schedules", {"name": "nightly report"})) == [
        nightly["id"],
        again["id"],
        theirs["id"],
    ]
    # Blank values filter nothing, as on GET /api/jobs.
    assert len(_ids(user_api.get("/api/schedules", {"name": "", "enabled": "", "job_type": ""}))) == 4


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("enabled=maybe", "enabled"),
        ("enabled=yes", "enabled"),
        ("enabled=1", "enabled"),
        ("name=" + "n" * 10_240, "name"),
        ("job_type=" + "t" * 10_240, "job_type"),
        ("name=" + "%C3%A4" * 201, "name"),  # 201 characters (402 bytes)
        ("name=%ED%A0%80", "name"),  # a lone surrogate's bytes: Django would read U+FFFD
        ("job_type=%FF%FE", "job_type"),
        ("enabled=%ED%A0%80", "enabled"),
        ("nme=nightly", "nme"),
        ("owner=1", "owner"),
        # A filter takes one value: the second one was read alone (enabled=true&enabled=false listed the disabled).
        ("enabled=true&enabled=false", "enabled: Given 2 times"),
        ("name=nightly&name=other", "name: Given 2 times"),
        ("job_type=REPORT&job_type=DEMO_TASK", "job_type: Given 2 times"),
        ("page_size=1&page_size=2", "page_size: Given 2 times"),
    ],
)
def test_a_bad_list_filter_is_a_400_naming_it(user_api, query, field):
    """``field``: the parameter the 400 names, then what its message starts with after "name: " (if anything)."""
    create(user_api)
    name, _, says = field.partition(": ")

    resp = user_api.get(f"/api/schedules?{query}")

    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["code"] == "validation_error"
    assert set(error["details"]) == {name}
    assert error["message"].startswith(f"{name}: {says}")


@pytest.mark.parametrize("query", ["name=a%00b", "job_type=%00", "enabled=true%00"])
def test_a_nul_in_a_list_filter_is_a_400(user_api, query):
    resp = user_api.get(f"/api/schedules?{query}")

    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["code"] == "validation_error"


def test_a_name_of_the_longest_storable_length_is_a_filter_not_an_error(user_api):
    longest = create(user_api, {**NIGHTLY, "name": "ä" * 200})

    assert _ids(user_api.get("/api/schedules", {"name": "ä" * 200})) == [longest["id"]]


def test_the_schema_documents_the_list_filters(api):
    schema = api.get("/api/schema/?format=json").json()
    params = {p["name"]: p for p in schema["paths"]["/api/schedules"]["get"]["parameters"]}

    assert {"name", "enabled", "job_type", "cursor", "page_size"} <= set(params)
    assert params["enabled"]["schema"]["type"] == "boolean"
    assert params["name"]["schema"]["type"] == params["job_type"]["schema"]["type"] == "string"
    assert "exact name" in params["name"]["description"]
    assert "`true`" in params["enabled"]["description"]


def test_anonymous_requests_are_401(api):
    assert api.get("/api/schedules").status_code == 401
    assert api.post("/api/schedules/preview", {"cron": "* * * * *"}, format="json").status_code == 401


def test_patch_changes_only_what_it_names(user_api):
    body = create(user_api)
    resp = user_api.patch(
        f"/api/schedules/{body['id']}", {"name": "renamed", "job": {"payload": {"v": 2}}}, format="json"
    )
    assert resp.status_code == 200, resp.content
    after = resp.json()
    assert after["name"] == "renamed"
    assert after["job"] == {**body["job"], "payload": {"v": 2}}
    assert after["next_fire_at"] == body["next_fire_at"]  # not a timing change


def test_patch_switches_between_cron_and_interval_and_recomputes_the_next_fire(user_api):
    body = create(user_api)
    to_interval = user_api.patch(f"/api/schedules/{body['id']}", {"interval_seconds": 90}, format="json").json()
    assert (to_interval["cron"], to_interval["interval_seconds"]) == (None, 90)
    # The grid starts at the whole second of the PATCH, read on the database's wall clock: compare
    # with that clock now, not with now(), which is this test transaction's (earlier) start.
    assert parse(to_interval["next_fire_at"]) <= db_clock() + dt.timedelta(seconds=90)
    to_cron = user_api.patch(f"/api/schedules/{body['id']}", {"cron": "*/10 * * * *"}, format="json").json()
    assert (to_cron["cron"], to_cron["interval_seconds"]) == ("*/10 * * * *", None)
    assert parse(to_cron["next_fire_at"]).minute % 10 == 0
    bad = user_api.patch(f"/api/schedules/{body['id']}", {"timezone": "Nowhere/Land"}, format="json")
    assert bad.status_code == 400
    assert "timezone" in bad.json()["error"]["details"]
    assert CronSchedule.objects.get(id=body["id"]).timezone == "America/New_York"


def test_a_schedule_stored_in_a_form_refused_since_can_be_renamed_and_disabled_but_not_set_to_another(user_api):
    """A stored ``*/1000`` (minute 0, hourly) predates the step check: edits that keep it pass, a new one is a 400."""
    body = create(user_api)
    CronSchedule.objects.filter(id=body["id"]).update(cron="*/1000 * * * *")

    renamed = user_api.patch(f"/api/schedules/{body['id']}", {"name": "kept"}, format="json")
    assert renamed.status_code == 200, renamed.content
    # next_fire_at stays (no timing change); the times after it follow the stored expression.
    assert [parse(t).minute for t in renamed.json()["next_fire_times"][1:]] == [0] * 4
    off = user_api.patch(f"/api/schedules/{body['id']}", {"enabled": False, "timezone": "UTC"}, format="json")
    assert (off.status_code, off.json()["cron"]) == (200, "*/1000 * * * *")
    other = user_api.patch(f"/api/schedules/{body['id']}", {"cron": "*/999 * * * *"}, format="json")
    assert other.status_code == 400
    assert "larger than the minute field" in other.json()["error"]["details"]["cron"][0]


def test_disable_clears_the_timetable_and_enable_restarts_it_from_now(user_api):
    body = create(user_api)
    off = user_api.patch(f"/api/schedules/{body['id']}", {"enabled": False}, format="json").json()
    assert (off["enabled"], off["next_fire_at"], off["next_fire_times"]) == (False, None, [])
    on = user_api.patch(f"/api/schedules/{body['id']}", {"enabled": True}, format="json").json()
    assert parse(on["next_fire_at"]) > db_now()
    assert len(on["next_fire_times"]) == 5


def test_put_replaces_the_whole_schedule(user_api):
    body = create(user_api)
    resp = user_api.put(
        f"/api/schedules/{body['id']}",
        {"name": "every minute", "cron": "* * * * *", "job": {"type": "DEMO_TASK"}},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    after = resp.json()
    assert (after["timezone"], after["misfire_policy"], after["overlap_policy"]) == ("UTC", "skip", "allow")
    assert after["job"] == {
        "type": "DEMO_TASK",
        "payload": {},
        "priority": "MEDIUM",
        "queue": "default",
        "max_retries": 3,
        "timeout_seconds": 300,
    }
    missing = user_api.put(f"/api/schedules/{body['id']}", {"name": "x"}, format="json")
    assert missing.status_code == 400
    assert "job" in missing.json()["error"]["details"]


def test_delete_removes_the_schedule_and_keeps_its_jobs(user_api):
    body = create(user_api)
    job = user_api.post(f"/api/schedules/{body['id']}/trigger").json()
    assert user_api.delete(f"/api/schedules/{body['id']}").status_code == 204
    assert user_api.get(f"/api/schedules/{body['id']}").status_code == 404
    assert Job.objects.get(id=job["id"]).schedule_id is None


def test_trigger_fires_now_and_leaves_the_timetable(user_api, user, django_capture_on_commit_callbacks):
    body = create(user_api)
    before = db_now()
    labels = {"type": "REPORT", "queue": "reports", "priority": "HIGH"}
    counted = REGISTRY.get_sample_value("jobs_created_total", labels) or 0.0
    with django_capture_on_commit_callbacks(execute=True):
        resp = user_api.post(f"/api/schedules/{body['id']}/trigger")
    assert resp.status_code == 201, resp.content
    assert REGISTRY.get_sample_value("jobs_created_total", labels) == counted + 1
    job = resp.json()
    assert (job["schedule"], job["type"], job["priority"], job["queue"], job["owner"]) == (
        body["id"],
        "REPORT",
        "HIGH",
        "reports",
        user.id,
    )
    assert job["status"] == JobStatus.QUEUED
    assert parse(job["fire_time"]) >= before
    after = user_api.get(f"/api/schedules/{body['id']}").json()
    assert after["next_fire_at"] == body["next_fire_at"]
    assert after["last_fired_at"] == job["fire_time"]
    assert user_api.post(f"/api/schedules/{body['id']}/trigger").json()["id"] != job["id"]


def test_runs_list_every_fire_newest_first_with_status_duration_and_counts(user_api, other_api, admin_api, user):
    body = create(user_api)
    other = create(user_api, {**NIGHTLY, "name": "other"})
    fired = [user_api.post(f"/api/schedules/{body['id']}/trigger").json() for _ in range(3)]
    user_api.post(f"/api/schedules/{other['id']}/trigger")
    done = Job.objects.get(id=fired[0]["id"])
    Job.objects.filter(id=done.id).update(
        status=JobStatus.SUCCESS,
        attempts=1,
        started_at=done.fire_time + dt.timedelta(seconds=1),
        finished_at=done.fire_time + dt.timedelta(seconds=3.5),
    )
    Job.objects.filter(id=fired[1]["id"]).update(status=JobStatus.DEAD, last_error="boom")

    first = user_api.get(f"/api/schedules/{body['id']}/runs?page_size=2")

    assert first.status_code == 200, first.content
    page = first.json()
    assert page["count"] == 3
    assert page["by_status"] == {"SUCCESS": 1, "DEAD": 1, "QUEUED": 1}
    assert [r["job"] for r in page["results"]] == [fired[2]["id"], fired[1]["id"]]  # newest fire first
    assert set(page["results"][0]) == {
        "job",
        "fire_time",
        "status",
        "attempts",
        "scheduled_at",
        "started_at",
        "finished_at",
        "duration_seconds",
        "last_error",
    }
    assert page["results"][1]["last_error"] == "boom"
    rest = user_api.get(page["next"]).json()["results"]
    assert [(r["job"], r["status"], r["duration_seconds"]) for r in rest] == [(fired[0]["id"], "SUCCESS", 2.5)]
    assert page["results"][0]["duration_seconds"] is None  # not finished
    # Another user's schedule is a 404; an ADMIN sees anyone's.
    assert other_api.get(f"/api/schedules/{body['id']}/runs").status_code == 404
    assert admin_api.get(f"/api/schedules/{body['id']}/runs").json()["count"] == 3
    assert user_api.get("/api/schedules/999999999/runs").status_code == 404
    assert user_api.get(f"/api/schedules/{body['id']}/runs?cursor=bad").status_code == 400


def test_preview_lists_fire_times_after_start_in_utc(user_api):
    resp = user_api.post(
        "/api/schedules/preview",
        {"cron": "30 2 * * *", "timezone": "America/New_York", "start": "2024-03-09T00:00:00-05:00", "count": 3},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"fire_times": ["2024-03-09T07:30:00Z", "2024-03-10T07:00:00Z", "2024-03-11T06:30:00Z"]}
    interval = user_api.post(
        "/api/schedules/preview",
        {"interval_seconds": 90, "start": "2024-01-01T00:00:00+00:00", "count": 2},
        format="json",
    )
    assert interval.json() == {"fire_times": ["2024-01-01T00:01:30Z", "2024-01-01T00:03:00Z"]}
    default = user_api.post("/api/schedules/preview", {"cron": "@daily"}, format="json").json()
    assert len(default["fire_times"]) == 5
    assert parse(default["fire_times"][0]) > db_now()


@pytest.mark.parametrize(
    ("cron", "zone", "start"),
    [
        ("0 0 29 2 *", "UTC", "9997-01-01T00:00:00Z"),  # the next leap day is in year 10000
        ("0 0 29 2 1", "UTC", "9999-01-01T00:00:00Z"),
        ("0 0 * 2 *", "UTC", "9999-03-01T00:00:00Z"),
        ("0 0 1 1 *", "UTC", "9999-06-01T00:00:00Z"),
        ("@yearly", "Asia/Tokyo", "9999-06-01T00:00:00Z"),
        ("0 0 1 */7 *", "UTC", "9999-09-01T00:00:00Z"),
    ],
)
def test_preview_stops_at_year_9999_without_an_error(user_api, cron, zone, start):
    resp = user_api.post(
        "/api/schedules/preview", {"cron": cron, "timezone": zone, "start": start, "count": 5}, format="json"
    )
    assert resp.status_code == 200, resp.content
    assert all(t.startswith("9999-") for t in resp.json()["fire_times"])


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"])
@pytest.mark.parametrize("start", [None, "2024-01-01T00:00:00Z"])
def test_preview_of_an_expression_that_never_fires_is_the_400_of_create(user_api, cron, start):
    created = user_api.post("/api/schedules", {**NIGHTLY, "cron": cron}, format="json")
    assert created.status_code == 400, created.content
    body = {"cron": cron, "timezone": NIGHTLY["timezone"]} | ({"start": start} if start else {})
    resp = user_api.post("/api/schedules/preview", body, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json() == created.json()
    assert resp.json()["error"] == {
        "code": "validation_error",
        "message": "This expression never fires.",
        "details": {"cron": ["This expression never fires."]},
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "not cron"}, "cron"),
        ({"cron": "*/1000 * * * *"}, "cron"),  # a step past the field: minute 0 alone
        ({"cron": "0 0 15W * *"}, "cron"),
        ({"cron": "0 0 L * L5"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Europe/Atlantis"}, "timezone"),
        ({"cron": "* * * * *", "count": 0}, "count"),
        ({"cron": "* * * * *", "count": 101}, "count"),
        ({"cron": "* * * * *", "start": "2024-01-01T00:00:00"}, "start"),  # no offset
        ({}, "cron"),
        ({"cron": "* * * * *", "interval_seconds": 5}, "cron"),
        ({"cron": "* * * * *", "extra": 1}, "extra"),
    ],
)
def test_preview_rejects_bad_input(user_api, body, field):
    resp = user_api.post("/api/schedules/preview", body, format="json")
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["error"]["details"]


def test_the_schema_documents_the_schedule_endpoints(api):
    resp = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert resp.status_code == 200
    schema = resp.json() if resp["Content-Type"].endswith("json") else None
    paths = schema["paths"] if schema else resp.content.decode()
    for path in (
        "/api/schedules",
        "/api/schedules/{schedule_id}",
        "/api/schedules/{schedule_id}/trigger",
        "/api/schedules/{schedule_id}/runs",
    ):
        assert path in paths
    assert "/api/schedules/preview" in paths


def test_the_schema_documents_the_idempotency_key_of_a_schedule_create(api):
    schema = api.get("/api/schema/?format=json").json()
    create = schema["paths"]["/api/schedules"]["post"]
    key = next(p for p in create["parameters"] if p["name"] == "Idempotency-Key")
    assert key["in"] == "header"
    assert "Idempotent-Replayed" in create["responses"]["200"]["headers"]
    assert "Location" in create["responses"]["201"]["headers"]
    assert {"200", "201", "400", "404", "409", "413"} <= set(create["responses"])
    assert "idempotency_conflict" in create["responses"]["409"]["description"]
    assert "deleted" in create["responses"]["404"]["description"]


def test_a_user_may_hold_at_most_the_configured_number_of_schedules(user_api, admin_api, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "MAX_SCHEDULES_PER_USER": 2}
    body = {"name": "s", "interval_seconds": 60, "job": {"type": "DEMO_TASK", "payload": {}}}
    assert [user_api.post("/api/schedules", body, format="json").status_code for _ in range(3)] == [201, 201, 400]
    refused = user_api.post("/api/schedules", body, format="json").json()
    assert refused["error"]["code"] == "validation_error"
    assert "at most 2" in refused["error"]["message"]
    # ADMINs are exempt; the limit is per user.
    assert [admin_api.post("/api/schedules", body, format="json").status_code for _ in range(3)] == [201] * 3


def test_a_user_schedule_may_not_fire_more_often_than_the_minimum(user_api, admin_api, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "MIN_SCHEDULE_INTERVAL_SECONDS": 300}
    job = {"type": "DEMO_TASK", "payload": {}}

    every_second = user_api.post("/api/schedules", {"name": "s", "interval_seconds": 1, "job": job}, format="json")
    every_minute = user_api.post("/api/schedules", {"name": "c", "cron": "* * * * *", "job": job}, format="json")
    # Every 10 minutes, but with two fires a minute apart on the hour: the shortest gap counts.
    twice_at_the_hour = user_api.post("/api/schedules", {"name": "t", "cron": "0,1 * * * *", "job": job}, format="json")

    for response, field in ((every_second, "interval_seconds"), (every_minute, "cron"), (twice_at_the_hour, "cron")):
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["code"] == "validation_error"
        assert "at most once every 300 seconds" in error["message"]
        assert field in error["details"]
    assert "60 seconds apart" in twice_at_the_hour.json()["error"]["message"]
    ok = user_api.post("/api/schedules", {"name": "ok", "cron": "*/5 * * * *", "job": job}, format="json")
    assert ok.status_code == 201
    # Changing the timing is checked too; ADMINs are exempt.
    patched = user_api.patch(f"/api/schedules/{ok.json()['id']}", {"interval_seconds": 299}, format="json")
    assert patched.status_code == 400
    assert (
        admin_api.post("/api/schedules", {"name": "a", "interval_seconds": 1, "job": job}, format="json").status_code
        == 201
    )


def test_the_default_minimum_is_a_minute(user_api):
    job = {"type": "DEMO_TASK", "payload": {}}
    assert (
        user_api.post("/api/schedules", {"name": "s", "interval_seconds": 59, "job": job}, format="json").status_code
        == 400
    )
    assert (
        user_api.post("/api/schedules", {"name": "s", "interval_seconds": 60, "job": job}, format="json").status_code
        == 201
    )


@pytest.mark.parametrize(
    ("path", "change", "field", "kind"),
    [
        ("/api/schedules", {"timezone": 5}, "timezone", "a number"),
        ("/api/schedules", {"timezone": ["UTC"]}, "timezone", "an array"),
        ("/api/schedules", {"name": 7.5}, "name", "a number"),
        ("/api/schedules", {"cron": 5}, "cron", "a number"),
        ("/api/schedules/preview", {"timezone": 5}, "timezone", "a number"),
        ("/api/schedules/preview", {"cron": {"m": 0}}, "cron", "an object"),
    ],
)
def test_a_string_field_given_another_json_type_is_a_400_that_says_a_string_is_expected(
    user_api, path, change, field, kind
):
    # DRF's CharField turns 5 into "5": the zone then read "Unknown time zone '5'", which hid the mistake.
    body = {**NIGHTLY, **change} if path == "/api/schedules" else {"cron": "0 * * * *", **change}
    resp = user_api.post(path, body, format="json")
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["details"][field] == [f"A string is expected, not {kind}."]
    assert not CronSchedule.objects.exists()


@pytest.mark.parametrize(
    ("body", "first", "last", "count"),
    [
        (
            {"cron": "0 0 * * *", "timezone": "Pacific/Kiritimati", "start": "0001-01-01T00:00:00Z", "count": 100},
            "0001-01-01T10:29:20Z",
            "0001-04-10T10:29:20Z",
            100,
        ),
        (
            {"cron": "* * * * *", "timezone": "Etc/GMT+12", "start": "9999-12-31T23:00:00Z", "count": 100},
            "9999-12-31T23:01:00Z",
            "9999-12-31T23:59:00Z",
            59,
        ),
        (
            {"cron": "0 0 29 2 *", "timezone": "Etc/GMT+12", "start": "9000-01-01T00:00:00Z", "count": 100},
            "9004-02-29T12:00:00Z",  # 9000, 9100 and 9300 are not leap years; 9200 is
            "9412-02-29T12:00:00Z",
            100,
        ),
    ],
    ids=["year-1-west-of-utc", "year-9999-end", "sparse-count-100"],
)
def test_preview_at_both_ends_of_the_calendar_lists_fire_times(user_api, body, first, last, count):
    resp = user_api.post("/api/schedules/preview", body, format="json")
    assert resp.status_code == 200, resp.content
    times = resp.json()["fire_times"]
    assert (len(times), times[0], times[-1]) == (count, first, last)


def test_a_list_holding_a_star_is_a_400_on_create_and_preview_and_a_stored_one_fires_as_cron_reads_it(user_api):
    """ISC cron reads '15,*' (not starting with *) as restricted: with a day of week, either day matching."""
    for path, body in (
        ("/api/schedules", {**NIGHTLY, "cron": "0 0 15,* * 1"}),
        ("/api/schedules/preview", {"cron": "0 0 *,15 * 1"}),
    ):
        resp = user_api.post(path, body, format="json")
        assert resp.status_code == 400, resp.content
        assert "holds * beside other values" in resp.json()["error"]["details"]["cron"][0]
    body = create(user_api, {**NIGHTLY, "timezone": "UTC"})
    CronSchedule.objects.filter(id=body["id"]).update(cron="0 0 15,* * 1")

    renamed = user_api.patch(f"/api/schedules/{body['id']}", {"name": "kept"}, format="json")

    assert renamed.status_code == 200, renamed.content
    assert renamed.json()["cron"] == "0 0 1-31 * 1"  # what cron read it as: every day, or Mondays
    times = [parse(t) for t in renamed.json()["next_fire_times"][1:]]
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [dt.timedelta(days=1)] * 3


def test_preview_of_a_day_of_week_reaching_7_includes_sunday_and_an_ambiguous_start_step_is_a_400(user_api):
    resp = user_api.post(
        "/api/schedules/preview",
        {"cron": "0 0 * * 5-7/2", "start": "2024-01-01T00:00:00Z", "count": 4},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    # 2024-01-05 is a Friday, 01-07 a Sunday (7 is Sunday too).
    assert resp.json()["fire_times"] == [
        "2024-01-05T00:00:00Z",
        "2024-01-07T00:00:00Z",
        "2024-01-12T00:00:00Z",
        "2024-01-14T00:00:00Z",
    ]
    ambiguous = user_api.post("/api/schedules/preview", {"cron": "0 0 * * 1/2"}, format="json")
    assert ambiguous.status_code == 400, ambiguous.content
    assert "write 1-7/2 to include Sunday, or 1-6/2" in ambiguous.json()["error"]["details"]["cron"][0]


def test_a_change_that_sends_no_payload_keeps_the_stored_payload_s_numbers_exactly(user_api, user):
    # jsonb keeps a number exactly; Python reads 0.10000000000000000001 as 0.1 and 1e-400 as 0.0.
    # Disabling, renaming or a template change without a payload wrote the payload back as read.
    schedule = CronSchedule.objects.create(owner=user, name="exact", cron="0 * * * *", job_type="DEMO_TASK")

    def stored() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT job_payload::text FROM stint_schedule WHERE id = %s", [schedule.id])
            return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE stint_schedule SET job_payload = '{"a": 0.10000000000000000001, "b": 1e-400}' WHERE id = %s""",
            [schedule.id],
        )
    before = stored()
    url = f"/api/schedules/{schedule.id}"

    for change in ({"enabled": False}, {"name": "renamed"}, {"cron": "5 * * * *"}, {"job": {"priority": "HIGH"}}):
        response = user_api.patch(url, change, format="json")
        assert response.status_code == 200, (change, response.content)
        assert stored() == before, change
    assert user_api.patch(url, {"job": {"payload": {"a": 1}}}, format="json").status_code == 200
    assert stored() == '{"a": 1}'
