"""Rows whose jsonb Python cannot read are shown with a placeholder, never a 500: API, pages, console.

PostgreSQL's jsonb holds an integer of more than 4,300 digits and nesting deeper than Python's
recursion limit; Python's json refuses both. Stint never writes them (``jobspec.payload_json``),
so these rows are edited here by hand, as an operator's SQL would; every view that loaded one
answered 500 (``JSONField.from_db_value`` raised). ``core.stored_json.StoredJSONField`` reads
them as ``UnreadableJSON``.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from core.stored_json import StoredJSONField, UnreadableJSON
from scheduler.models import CronSchedule, Job, OutboxEvent
from scheduler.states import AttemptStatus, EventType, JobStatus
from tests.support.factories import JobFactory, outbox_row

pytestmark = pytest.mark.django_db

# jsonb keeps 5,000 digits; Python reads at most 4,300 (sys.get_int_max_str_digits()).
BIG = """('{"n": ' || repeat('9', 5000) || '}')::jsonb"""
# jsonb nests 5,000 deep (PostgreSQL's limit is its stack depth); Python's json stops near 1,000.
DEEP = "(repeat('[', 5000) || repeat(']', 5000))::jsonb"
BIG_WHY = "it holds a number of more than 4300 digits"
DEEP_WHY = "it nests deeper than Python can read"


def _sql(statement: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _text_of(table: str, column: str, row_id) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column}::text FROM {table} WHERE id = %s", [row_id])  # noqa: S608 - test constants
        return cursor.fetchone()[0]


@pytest.fixture
def bad_job(user):
    """A SUCCESS job of ``user`` whose payload, result, progress and trace context Python cannot read."""
    job = JobFactory(owner=user, name="bad one", succeeded=True)
    _sql(
        f"UPDATE stint_job SET payload = {BIG}, progress = {DEEP}, trace_context = {DEEP}, result = {BIG},"  # noqa: S608
        " result_attempt = 1, result_status = %s, result_at = now() WHERE id = %s",
        [AttemptStatus.SUCCEEDED, job.id],
    )
    return job


@pytest.fixture
def good_job(user):
    """A readable job of ``user`` beside ``bad_job``."""
    return JobFactory(owner=user, name="good one", payload={"k": 1})


@pytest.fixture
def bad_events(bad_job):
    """An audit event and an outbox event of ``bad_job``, each with a payload Python cannot read."""
    event = AuditEvent.objects.create(
        event_id=uuid.uuid4(),
        job_id=bad_job.id,
        event_type=EventType.JOB_CREATED,
        sequence=1,
        to_status=JobStatus.QUEUED,
        occurred_at=timezone.now(),
    )
    _sql(f"UPDATE stint_audit_event SET payload = {BIG} WHERE id = %s", [event.id])  # noqa: S608
    row = outbox_row(
        {"event_type": EventType.JOB_STARTED, "job_id": bad_job.id, "sequence": 2, "to_status": JobStatus.RUNNING},
        occurred_at=timezone.now(),
    )
    entries = row.entries()
    entries[0]["payload"] = "BIG"
    text = json.dumps(entries).replace('"BIG"', '{"n": ' + "9" * 5000 + "}")
    _sql("UPDATE stint_outbox SET events = %s::jsonb WHERE id = %s", [text, row.id])
    return event, OutboxEvent.objects.get(outbox_id=row.id).id


@pytest.fixture
def bad_schedule(user):
    """A schedule of ``user`` whose job payload Python cannot read."""
    schedule = CronSchedule.objects.create(owner=user, name="bad schedule", cron="0 * * * *", job_type="DEMO_TASK")
    _sql(f"UPDATE stint_schedule SET job_payload = {BIG} WHERE id = %s", [schedule.id])  # noqa: S608
    return schedule


# -- the field -----------------------------------------------------------------------------------


def test_the_field_reads_an_unreadable_value_as_a_placeholder_and_saves_it_back_unchanged(bad_job):
    before = _text_of("stint_job", "payload", bad_job.id)
    job = Job.objects.get(id=bad_job.id)

    assert job.payload == UnreadableJSON(why=BIG_WHY, text=before)
    assert str(job.progress) == f"(cannot be read: {DEEP_WHY})"
    job.name = "renamed"
    job.save()  # every column written back: the placeholder as the text it was read from

    assert _text_of("stint_job", "payload", bad_job.id) == before
    assert Job.objects.values_list("name", flat=True).get(id=bad_job.id) == "renamed"


def test_the_field_deconstructs_as_django_s_json_field_so_no_migration_names_it():
    _, path, _, kwargs = StoredJSONField(null=True).deconstruct()

    assert (path, kwargs) == ("django.db.models.JSONField", {"null": True})


# -- the API -------------------------------------------------------------------------------------


def test_the_job_api_shows_unreadable_fields_as_null_and_names_them(user_api, admin_api, bad_job, good_job):
    detail = user_api.get(f"/api/jobs/{bad_job.id}")
    assert detail.status_code == 200, detail.content
    body = detail.json()
    assert (body["payload"], body["progress"]) == (None, None)
    assert body["unreadable"] == {"payload": BIG_WHY, "progress": DEEP_WHY}

    for client, path in ((user_api, "/api/jobs"), (admin_api, "/api/admin/jobs")):
        listed = client.get(path)
        assert listed.status_code == 200, (path, listed.content)
        rows = {r["name"]: r for r in listed.json()["results"]}
        assert rows["bad one"]["unreadable"] == {"payload": BIG_WHY, "progress": DEEP_WHY}
        assert (rows["good one"]["payload"], "unreadable" in rows["good one"]) == ({"k": 1}, False)

    result = user_api.get(f"/api/jobs/{bad_job.id}/result")
    assert result.status_code == 200, result.content
    assert (result.json()["result"], result.json()["unreadable"]) == (None, {"result": BIG_WHY})
    assert "unreadable" not in user_api.get(f"/api/jobs/{good_job.id}").json()  # only when one cannot be read


def test_the_events_and_attempts_of_a_job_with_unreadable_documents_are_answered(user_api, bad_job, bad_events):
    events = user_api.get(f"/api/jobs/{bad_job.id}/events")
    assert events.status_code == 200, events.content
    assert [e["sequence"] for e in events.json()["results"]] == [1]
    attempts = user_api.get(f"/api/jobs/{bad_job.id}/attempts")
    assert attempts.status_code == 200, attempts.content


def test_a_schedule_with_an_unreadable_payload_reads_and_can_be_disabled_or_given_a_new_payload(user_api, bad_schedule):
    before = _text_of("stint_schedule", "job_payload", bad_schedule.id)
    url = f"/api/schedules/{bad_schedule.id}"

    for path in (url, "/api/schedules"):
        response = user_api.get(path)
        assert response.status_code == 200, (path, response.content)
    job = user_api.get(url).json()["job"]
    assert (job["payload"], job["unreadable"]) == (None, {"payload": BIG_WHY})

    off = user_api.patch(url, {"enabled": False}, format="json")
    assert off.status_code == 200, off.content
    assert _text_of("stint_schedule", "job_payload", bad_schedule.id) == before  # kept as stored
    kept = user_api.patch(url, {"job": {"priority": "HIGH"}}, format="json")
    assert kept.status_code == 400, kept.content
    assert BIG_WHY in kept.json()["error"]["details"]["job"]["payload"][0]
    fired = user_api.post(f"{url}/trigger")
    assert fired.status_code == 400, fired.content
    assert not Job.objects.filter(schedule_id=bad_schedule.id).exists()

    replaced = user_api.patch(url, {"job": {"payload": {"ok": True}}}, format="json")
    assert replaced.status_code == 200, replaced.content
    assert replaced.json()["job"]["payload"] == {"ok": True}
    assert "unreadable" not in replaced.json()["job"]


# -- the user pages ------------------------------------------------------------------------------


def test_the_user_pages_show_the_placeholder_and_the_rest(client, user, bad_job, good_job, bad_events, bad_schedule):
    client.force_login(user)

    for path in ("/", f"/jobs/{bad_job.id}/", f"/jobs/{bad_job.id}/live/", "/schedules/"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.content[:2000])
    listed = client.get("/").content.decode()
    assert "bad one" in listed and "good one" in listed
    page = client.get(f"/jobs/{bad_job.id}/").content.decode()
    assert f"(cannot be read: {BIG_WHY})" in page  # the payload and the result
    assert f"Progress (cannot be read: {DEEP_WHY})" in page
    assert 'data-event="JOB_CREATED"' in page  # the timeline still shows

    edit = client.get(f"/schedules/{bad_schedule.id}/edit/")
    assert edit.status_code == 200, edit.content[:2000]
    assert f"(cannot be read: {BIG_WHY})" in edit.content.decode()
    toggle = client.post(f"/schedules/{bad_schedule.id}/toggle/")
    assert toggle.status_code == 302
    assert CronSchedule.objects.values_list("enabled", flat=True).get(id=bad_schedule.id) is False


def _edit_form(client, path: str, **changes: str) -> dict[str, str]:
    """The schedule edit form's fields as a browser posts them unchanged (``changes`` applied)."""
    form = client.get(path).context["form"]
    data = {name: form[name].value() for name in form.fields}
    data = {name: "" if value is None else str(value) for name, value in data.items() if value is not False}
    if form["enabled"].value():
        data["enabled"] = "on"
    return {**data, **changes}


@pytest.mark.parametrize("path", ["/schedules/{id}/edit/", "/admin/scheduler/cronschedule/{id}/edit/"])
def test_the_schedule_edit_form_saved_as_shown_keeps_an_unreadable_payload(client, admin_user, bad_schedule, path):
    """Renaming or disabling in the form keeps the stored payload (as the API's PATCH without ``job``);
    a change of the job that keeps it is a 400 on the payload field that says why, not "Not valid JSON"."""
    bad_schedule.owner = admin_user
    bad_schedule.save(update_fields=["owner"])
    client.force_login(admin_user)
    path = path.format(id=bad_schedule.id)
    before = _text_of("stint_schedule", "job_payload", bad_schedule.id)

    data = _edit_form(client, path, name="renamed")
    data.pop("enabled")  # unticked: disabled
    saved = client.post(path, data)
    assert saved.status_code == 302, saved.content.decode()[-3000:]
    row = CronSchedule.objects.get(id=bad_schedule.id)
    assert (row.name, row.enabled) == ("renamed", False)
    assert _text_of("stint_schedule", "job_payload", bad_schedule.id) == before  # kept as stored

    previewed = client.post(path, {**_edit_form(client, path), "preview": "1"})
    assert previewed.status_code == 200, previewed.content.decode()[-3000:]

    changed = client.post(path, _edit_form(client, path, job_priority="HIGH"))
    assert changed.status_code == 400
    assert f"The stored payload (cannot be read: {BIG_WHY})" in " ".join(changed.context["form"].errors["job_payload"])
    assert _text_of("stint_schedule", "job_payload", bad_schedule.id) == before

    replaced = client.post(path, _edit_form(client, path, job_payload='{"ok": true}'))
    assert replaced.status_code == 302, replaced.content.decode()[-3000:]
    assert CronSchedule.objects.get(id=bad_schedule.id).job_payload == {"ok": True}


# -- the operator console ------------------------------------------------------------------------


def test_the_console_shows_the_placeholder_on_every_page_of_such_rows(
    client, admin_user, bad_job, good_job, bad_events, bad_schedule
):
    client.force_login(admin_user)
    audit_event, outbox_event_id = bad_events
    pages = [
        "/admin/scheduler/job/",
        f"/admin/scheduler/job/{bad_job.id}/change/",
        "/admin/scheduler/cronschedule/",
        f"/admin/scheduler/cronschedule/{bad_schedule.id}/change/",
        f"/admin/scheduler/cronschedule/{bad_schedule.id}/edit/",
        "/admin/audit/auditevent/",
        f"/admin/audit/auditevent/{audit_event.id}/change/",
        "/admin/scheduler/outboxevent/",
        f"/admin/scheduler/outboxevent/{outbox_event_id}/change/",
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code == 200, (path, response.content[:2000])
        if "/change/" in path or "/edit/" in path:
            assert "(cannot be read: " in response.content.decode(), path
    job_page = client.get(f"/admin/scheduler/job/{bad_job.id}/change/").content.decode()
    assert f"(cannot be read: {BIG_WHY})" in job_page  # payload and result
    assert f"Progress (cannot be read: {DEEP_WHY})" in job_page
