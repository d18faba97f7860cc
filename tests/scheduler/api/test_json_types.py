"""Every number and boolean field of the JSON API takes its own JSON type, as its text fields do.

DRF reads a body as a form: ``"max_retries": "5"`` was 5, ``"enabled": "yes"``, ``"on"`` and ``1``
were true. A JSON client that sends those has a bug the API hid. Each such value is a 400 naming
the type expected (``accounts.serializers.StrictTextMixin``; the flow limits' own validator says
the same). A number with no fraction written as ``5.0`` is still an integer (DRF and JSON Schema
read it so), and ``1`` is a number of seconds as good as ``1.0``.
"""

from __future__ import annotations

import pytest

from scheduler.flow import limits as flow_limits
from scheduler.flow.models import FlowLimit
from scheduler.models import CronSchedule, Job

pytestmark = pytest.mark.django_db

JOB = {"type": "DEMO_TASK"}
SCHEDULE = {"name": "s", "cron": "0 * * * *", "job": {"type": "DEMO_TASK"}}
INTERVAL = {"name": "s", "interval_seconds": 3600, "job": {"type": "DEMO_TASK"}}
PREVIEW = {"cron": "0 * * * *"}
LIMIT = "/api/admin/queues/invoices/limits"

INTEGER = "An integer is expected, not {}."
NUMBER = "A number is expected, not {}."
BOOLEAN = "true or false is expected, not {}."
STRING = "A string is expected, not {}."


@pytest.fixture(autouse=True)
def _fresh_limits():
    flow_limits.forget_cache()
    yield
    flow_limits.forget_cache()


def _wrong(body: dict, path: tuple[str, ...], value: object) -> dict:
    """``body`` with ``value`` at the key ``path`` (one key, or "job" then a template field)."""
    if len(path) == 1:
        return {**body, path[0]: value}
    return {**body, path[0]: {**body[path[0]], path[1]: value}}


CASES = [
    # POST /api/jobs
    ("post", "/api/jobs", JOB, ("max_retries",), "5", INTEGER.format("a string")),
    ("post", "/api/jobs", JOB, ("max_retries",), True, INTEGER.format("a boolean")),
    ("post", "/api/jobs", JOB, ("max_retries",), [5], INTEGER.format("an array")),
    ("post", "/api/jobs", JOB, ("timeout_seconds",), "30", INTEGER.format("a string")),
    ("post", "/api/jobs", JOB, ("timeout_seconds",), {"s": 30}, INTEGER.format("an object")),
    # POST /api/schedules, the schedule's own fields and its job template's
    ("post", "/api/schedules", SCHEDULE, ("enabled",), "yes", BOOLEAN.format("a string")),
    ("post", "/api/schedules", SCHEDULE, ("enabled",), "on", BOOLEAN.format("a string")),
    ("post", "/api/schedules", SCHEDULE, ("enabled",), "false", BOOLEAN.format("a string")),
    ("post", "/api/schedules", SCHEDULE, ("enabled",), 1, BOOLEAN.format("a number")),
    ("post", "/api/schedules", SCHEDULE, ("enabled",), 0.0, BOOLEAN.format("a number")),
    ("post", "/api/schedules", SCHEDULE, ("enabled",), [True], BOOLEAN.format("an array")),
    ("post", "/api/schedules", INTERVAL, ("interval_seconds",), "3600", INTEGER.format("a string")),
    ("post", "/api/schedules", INTERVAL, ("interval_seconds",), True, INTEGER.format("a boolean")),
    ("post", "/api/schedules", SCHEDULE, ("job", "max_retries"), "5", INTEGER.format("a string")),
    ("post", "/api/schedules", SCHEDULE, ("job", "timeout_seconds"), False, INTEGER.format("a boolean")),
    # POST /api/schedules/preview
    ("post", "/api/schedules/preview", PREVIEW, ("count",), "3", INTEGER.format("a string")),
    ("post", "/api/schedules/preview", PREVIEW, ("count",), True, INTEGER.format("a boolean")),
    ("post", "/api/schedules/preview", {}, ("interval_seconds",), "60", INTEGER.format("a string")),
    # PUT /api/admin/{queues,types}/{name}/limits (ADMIN; scheduler.flow.limits validates it)
    ("put", LIMIT, {}, ("concurrency",), "5", INTEGER.format("a string")),
    ("put", LIMIT, {}, ("concurrency",), True, INTEGER.format("a boolean")),
    ("put", LIMIT, {"rate_period_seconds": 60}, ("rate_limit",), [5], INTEGER.format("an array")),
    ("put", LIMIT, {"rate_limit": 5}, ("rate_period_seconds",), "60", NUMBER.format("a string")),
    ("put", LIMIT, {"rate_limit": 5}, ("rate_period_seconds",), True, NUMBER.format("a boolean")),
    ("put", LIMIT, {}, ("partition_key",), 5, STRING.format("a number")),
]


@pytest.mark.parametrize(("method", "url", "body", "path", "value", "message"), CASES)
def test_a_number_or_boolean_field_given_another_json_type_is_a_400_that_names_the_type(
    user_api, admin_api, method, url, body, path, value, message
):
    client = admin_api if url == LIMIT else user_api
    resp = getattr(client, method)(url, _wrong(body, path, value), format="json")

    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["code"] == "validation_error"
    details = error["details"]
    for key in path[:-1]:
        details = details[key]
    assert details[path[-1]] == [message]
    assert not Job.objects.exists() and not CronSchedule.objects.exists() and not FlowLimit.objects.exists()


@pytest.mark.parametrize(("value", "message"), [("false", BOOLEAN.format("a string")), (0, BOOLEAN.format("a number"))])
def test_patching_a_schedule_with_a_boolean_of_another_json_type_is_a_400_and_changes_nothing(user_api, value, message):
    created = user_api.post("/api/schedules", SCHEDULE, format="json").json()

    resp = user_api.patch(f"/api/schedules/{created['id']}", {"enabled": value}, format="json")

    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["details"] == {"enabled": [message]}
    assert CronSchedule.objects.get().enabled is True


def test_an_integer_written_with_a_zero_fraction_is_that_integer_and_a_whole_number_of_seconds_is_a_number(
    user_api, admin_api
):
    job = user_api.post("/api/jobs", {**JOB, "max_retries": 5.0, "timeout_seconds": 30.0}, format="json")
    assert job.status_code == 201, job.content
    assert (job.json()["max_retries"], job.json()["timeout_seconds"]) == (5, 30)
    preview = user_api.post("/api/schedules/preview", {**PREVIEW, "count": 2.0}, format="json")
    assert preview.status_code == 200, preview.content
    assert len(preview.json()["fire_times"]) == 2
    limit = admin_api.put(LIMIT, {"concurrency": 5.0, "rate_limit": 10, "rate_period_seconds": 1}, format="json")
    assert limit.status_code == 200, limit.content
    assert (limit.json()["concurrency"], limit.json()["rate_period_seconds"]) == (5, 1.0)
    assert isinstance(limit.json()["concurrency"], int)


@pytest.mark.parametrize("value", [5.5, 1e300])
def test_an_integer_with_a_fraction_or_beyond_its_range_is_still_refused(user_api, value):
    resp = user_api.post("/api/jobs", {**JOB, "max_retries": value}, format="json")

    assert resp.status_code == 400, resp.content
    assert "max_retries" in resp.json()["error"]["details"]


def test_null_is_left_to_the_field(user_api):
    # interval_seconds allows null (a cron schedule has none); max_retries does not.
    assert user_api.post("/api/schedules", {**SCHEDULE, "interval_seconds": None}, format="json").status_code == 201
    resp = user_api.post("/api/jobs", {**JOB, "max_retries": None}, format="json")
    assert resp.status_code == 400
    assert resp.json()["error"]["details"]["max_retries"] == ["This field may not be null."]


def test_the_schema_says_integer_and_boolean_for_these_fields(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    job = components["JobCreateRequest"]["properties"]
    schedule = components["ScheduleWriteRequest"]["properties"]
    preview = components["SchedulePreviewRequest"]["properties"]
    assert job["max_retries"]["type"] == job["timeout_seconds"]["type"] == "integer"
    assert schedule["enabled"]["type"] == "boolean"
    assert schedule["interval_seconds"]["type"] == "integer"
    assert preview["count"]["type"] == "integer"


@pytest.mark.parametrize(
    ("period", "message"),
    [("60", INTEGER.format("a string")), (True, INTEGER.format("a boolean")), ([60], INTEGER.format("an array"))],
)
def test_a_unique_period_of_another_json_type_is_a_400_that_names_the_type(user_api, period, message):
    # unique.period is checked by scheduler.flow.unique, not a serializer: it said "Whole seconds..." to "60".
    resp = user_api.post("/api/jobs", {**JOB, "unique": {"period": period}}, format="json")

    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["details"] == {"unique.period": [message]}
    assert not Job.objects.exists()


def test_a_unique_period_with_a_zero_fraction_is_that_integer_as_every_integer_field_reads_it(user_api):
    first = user_api.post("/api/jobs", {**JOB, "unique": {"period": 60.0}}, format="json")
    again = user_api.post("/api/jobs", {**JOB, "unique": {"period": 60}}, format="json")

    assert first.status_code == 201, first.content
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]  # the same period: a duplicate
    assert user_api.post("/api/jobs", {**JOB, "unique": {"period": 60.5}}, format="json").status_code == 400
