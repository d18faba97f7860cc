"""The flow-limit API (scheduler.api.flow): ADMIN only, every bad input a 400, never a 500."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.enqueuing import enqueue
from scheduler.exceptions import InvalidJob
from scheduler.flow import limits as flow_limits
from scheduler.flow.models import FlowLimit
from scheduler.models import Queue
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_limits():
    flow_limits.forget_cache()
    yield
    flow_limits.forget_cache()


def test_an_admin_sets_reads_lists_and_removes_a_queue_limit(admin_api):
    body = {"concurrency": 5, "partition_key": "customer", "rate_limit": 100, "rate_period_seconds": 60}
    put = admin_api.put("/api/admin/queues/invoices/limits", body, format="json")
    assert put.status_code == 200, put.json()
    assert put.json() | {} == {
        **body,
        "partition_concurrency": 1,
        "rate_period_seconds": 60.0,
        "scope": "queue",
        "name": "invoices",
        "key": "queue:invoices",
        "source": "database",
        "running": 0,
        "admitted_in_window": 0,
        "in_use": False,  # no job has used the queue yet
        "warning": "No job, schedule or worker uses the queue 'invoices' yet: check the name. The setting is "
        "kept and applies to the queue's first jobs.",
    }
    assert admin_api.get("/api/admin/queues/invoices/limits").json()["concurrency"] == 5
    assert [item["key"] for item in admin_api.get("/api/admin/limits").json()] == ["queue:invoices"]
    assert admin_api.delete("/api/admin/queues/invoices/limits").status_code == 204
    assert admin_api.get("/api/admin/queues/invoices/limits").status_code == 404
    assert admin_api.delete("/api/admin/queues/invoices/limits").status_code == 404


def test_a_type_limit_and_the_waiting_reason_of_a_held_job(admin_api, user_api, user):
    assert admin_api.put("/api/admin/types/DEMO_TASK/limits", {"concurrency": 1}, format="json").status_code == 200
    from scheduler import leasing

    first = enqueue("DEMO_TASK", owner=user)
    held = enqueue("DEMO_TASK", owner=user)
    leasing.claim_jobs(worker_id="w", limit=5, queues=None)
    waiting = user_api.get(f"/api/jobs/{held.id}").json()["waiting"]
    assert waiting["code"] == "concurrency_limit"
    assert "1 of 1 running" in waiting["message"]
    assert user_api.get(f"/api/jobs/{first.id}").json()["waiting"] is None
    assert admin_api.get("/api/admin/types/DEMO_TASK/limits").json()["running"] == 1


def test_users_may_not_touch_limits(user_api):
    assert user_api.put("/api/admin/queues/q/limits", {"concurrency": 1}, format="json").status_code == 403
    assert user_api.get("/api/admin/limits").status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        {},
        [],
        "5",
        {"concurrency": 0},
        {"concurrency": "1"},
        {"concurrency": 1.5},
        {"rate_limit": 3},
        {"rate_limit": 3, "rate_period_seconds": -1},
        {"partition_key": "a.b"},
        {"concurrency": 1, "owner": 3},
    ],
)
def test_bad_limits_are_400_with_details(admin_api, body):
    response = admin_api.put("/api/admin/queues/q/limits", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_error"


def test_a_bad_name_is_400(admin_api):
    assert admin_api.put("/api/admin/queues/a%20b/limits", {"concurrency": 1}, format="json").status_code == 400
    assert admin_api.get("/api/admin/types/" + "x" * 101 + "/limits").status_code == 400


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=8,
)
FIELDS = st.sampled_from([*flow_limits.FIELDS, "other"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(FIELDS, JSON, max_size=5) | JSON, name=st.text(min_size=1, max_size=30))
def test_fuzzed_limit_bodies_and_names_are_200_or_400_never_500(admin_api, body, name):
    from urllib.parse import quote

    url = f"/api/admin/types/{quote(name, safe='')}/limits"
    response = admin_api.put(url, body, format="json")
    assert response.status_code in (200, 400, 404), (body, name, response.content[:300])


def test_the_waiting_reason_names_the_rate_limit_and_a_paused_queue(admin_api, user_api, user):
    from scheduler import leasing, queues

    body = {"rate_limit": 4, "rate_period_seconds": 60}
    assert admin_api.put("/api/admin/types/DEMO_TASK/limits", body, format="json").status_code == 200
    jobs = [enqueue("DEMO_TASK", owner=user) for _ in range(3)]
    assert len(leasing.claim_jobs(worker_id="w", limit=5, queues=None)) == 2  # a burst of 2, then paced
    waiting = user_api.get(f"/api/jobs/{jobs[2].id}").json()["waiting"]
    assert waiting["code"] == "rate_limit"
    assert "spaced 15 s apart" in waiting["message"]
    queues.queue_pause(name="default")
    assert user_api.get(f"/api/jobs/{jobs[2].id}").json()["waiting"]["code"] == "queue_paused"
    assert admin_api.get("/api/admin/types/DEMO_TASK/limits").json()["admitted_in_window"] == 2


@pytest.mark.parametrize("path", ["/api/admin/limits", "/api/admin/types/EMAIL/limits"])
def test_a_query_parameter_on_the_limit_reads_is_a_400_naming_it(admin_api, path):
    response = admin_api.get(path, {"x": "1"})
    assert response.status_code == 400
    assert response.json()["error"]["details"]["x"] == ["Unknown query parameter. This endpoint takes none."]


def test_a_limit_or_pause_on_a_name_nothing_uses_is_kept_and_says_so(admin_api, user_api):
    # As in Oban, a queue may be limited or paused before its first job; but a typo that never
    # matches is a trap, so the answer says when nothing (job, schedule, worker, handler) uses the name.
    typo = admin_api.put("/api/admin/queues/reprots/limits", {"concurrency": 3}, format="json")
    assert typo.status_code == 200, typo.content
    assert typo.json()["in_use"] is False
    assert "No job, schedule or worker uses the queue 'reprots'" in typo.json()["warning"]
    unknown_type = admin_api.put("/api/admin/types/DEMO_TAKS/limits", {"concurrency": 3}, format="json").json()
    assert unknown_type["in_use"] is False
    assert "No handler runs the job type 'DEMO_TAKS'" in unknown_type["warning"]
    paused = admin_api.post("/api/admin/queues/nightyl/pause").json()
    assert (paused["paused"], paused["in_use"]) == (True, False)
    assert "No job, schedule or worker uses the queue 'nightyl'" in paused["warning"]
    resumed = admin_api.post("/api/admin/queues/nigthly/resume").json()
    assert (resumed["paused"], resumed["in_use"]) == (False, False)
    assert resumed["warning"] == (
        "No job, schedule or worker uses the queue 'nigthly': check the name. It is not paused."
    )

    assert user_api.post("/api/jobs", {"type": "DEMO_TASK", "queue": "reports"}, format="json").status_code == 201
    known = admin_api.put("/api/admin/queues/reports/limits", {"concurrency": 3}, format="json").json()
    assert (known["in_use"], known["warning"]) == (True, None)
    handler = admin_api.put("/api/admin/types/DEMO_TASK/limits", {"concurrency": 3}, format="json").json()
    assert (handler["in_use"], handler["warning"]) == (True, None)
    assert admin_api.post("/api/admin/queues/default/pause").json()["in_use"] is True
    listed = {limit["key"]: limit["in_use"] for limit in admin_api.get("/api/admin/limits").json()}
    assert listed == {"queue:reprots": False, "type:DEMO_TAKS": False, "queue:reports": True, "type:DEMO_TASK": True}


def test_pausing_the_same_unknown_queue_twice_warns_both_times(admin_api):
    # The first pause made the queue's row, and a row counted as use: the second pause of the typo
    # answered in_use true with no warning, and so did every limit or resume on it afterwards.
    first = admin_api.post("/api/admin/queues/reprots/pause").json()
    second = admin_api.post("/api/admin/queues/reprots/pause").json()

    assert (first["paused"], first["in_use"], second["paused"], second["in_use"]) == (True, False, True, False)
    assert second["warning"] == first["warning"]
    assert "No job, schedule or worker uses the queue 'reprots' yet: check the name." in second["warning"]
    limit = admin_api.put("/api/admin/queues/reprots/limits", {"concurrency": 1}, format="json").json()
    assert (limit["in_use"], limit["warning"]) == (False, first["warning"])
    resumed = admin_api.post("/api/admin/queues/reprots/resume").json()
    assert (resumed["paused"], resumed["in_use"]) == (False, False)
    assert "It is not paused." in resumed["warning"]


def test_pause_resume_and_limits_answer_in_use_as_it_is_after_the_call(admin_api):
    # The limits answer read in_use after the change, pause and resume before it. Neither a pause nor
    # a limit is use, so both orders agree now; the answers are read after the change, as the limits' were.
    answers = [
        admin_api.post("/api/admin/queues/nightyl/pause").json(),
        admin_api.put("/api/admin/queues/nightyl/limits", {"concurrency": 1}, format="json").json(),
        admin_api.get("/api/admin/queues/nightyl/limits").json(),
        admin_api.post("/api/admin/queues/nightyl/resume").json(),
        admin_api.post("/api/admin/queues/nightyl/pause").json(),
    ]
    assert [a["in_use"] for a in answers] == [False] * 5
    assert {a["key"]: a["in_use"] for a in admin_api.get("/api/admin/limits").json()} == {"queue:nightyl": False}


def test_a_queue_whose_only_job_finished_is_in_use(admin_api, user):
    # A finished job in retention still names the queue: a pause or limit on it is no typo. The job
    # is written alone (no queue row), as a queue row may be missing: in_use read rows, not jobs.
    JobFactory(owner=user, queue="reports", succeeded=True)
    assert not Queue.objects.filter(name="reports").exists()

    answers = [
        admin_api.put("/api/admin/queues/reports/limits", {"concurrency": 1}, format="json").json(),
        admin_api.post("/api/admin/queues/reports/pause").json(),
        admin_api.post("/api/admin/queues/reports/resume").json(),
    ]
    assert [(a["in_use"], a["warning"]) for a in answers] == [(True, None)] * 3


@pytest.mark.parametrize("name", ["%00", "a%00b"])
@pytest.mark.parametrize("action", ["pause", "resume"])
def test_a_queue_name_postgresql_cannot_hold_is_a_400_on_pause_and_resume(admin_api, name, action):
    # The in_use check read the queue table with the raw name before the name was checked: a NUL
    # in the path (which the query-string guard does not see) reached PostgreSQL, a 500.
    response = admin_api.post(f"/api/admin/queues/{name}/{action}")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize(
    "path",
    [
        "/api/admin/queues/reports%0A/pause",
        "/api/admin/queues/reports%0A/resume",
        "/api/admin/queues/reports%0A/limits",
        "/api/admin/types/DEMO_TASK%0A/limits",
    ],
)
def test_a_name_with_a_trailing_newline_is_refused(admin_api, path):
    # '$' also matches before a final newline: "reports\n" passed the name check and made a queue
    # (or a limit) that no job, named without it, could ever use.
    method = admin_api.put if path.endswith("/limits") else admin_api.post

    response = method(path, {"concurrency": 3}, format="json")

    assert response.status_code == 400, response.content
    assert not Queue.objects.filter(name__endswith="\n").exists()
    assert not FlowLimit.objects.exists()


def test_enqueue_refuses_a_queue_name_with_a_trailing_newline(user):
    with pytest.raises(InvalidJob):
        enqueue("DEMO_TASK", {}, owner=user, queue="reports\n")
