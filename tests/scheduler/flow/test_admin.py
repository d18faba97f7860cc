"""The console's flow control: ADMINs set limits (the API's validation); job pages show progress and waits."""

from __future__ import annotations

import pytest

from scheduler import leasing
from scheduler.enqueuing import enqueue
from scheduler.flow import limits as flow_limits
from scheduler.flow.models import FlowLimit
from scheduler.models import Job

pytestmark = pytest.mark.django_db

ADD = "/admin/scheduler/flowlimit/add/"
LIST = "/admin/scheduler/flowlimit/"


def test_an_admin_adds_a_queue_limit_that_the_claim_then_enforces(operator):
    response = operator.post(ADD, {"scope": "queue", "name": "slow", "concurrency": "1"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert FlowLimit.objects.get(scope="queue", name="slow").concurrency == 1
    enqueue("DEMO_TASK", queue="slow")
    enqueue("DEMO_TASK", queue="slow")
    assert len(leasing.claim_jobs(worker_id="w", limit=5, queues=None)) == 1
    page = operator.get(LIST).content.decode()
    assert 'data-limit="queue:slow"' in page
    assert "Oldest waiting job per priority" in page
    assert 'data-priority="MEDIUM"' in page


@pytest.mark.parametrize(
    "form",
    [
        {"scope": "queue", "name": "slow"},
        {"scope": "queue", "name": "a b", "concurrency": "1"},
        {"scope": "queue", "name": "slow", "rate_limit": "5"},
        {"scope": "queue", "name": "slow", "partition_key": "1x"},
    ],
)
def test_the_form_refuses_what_the_api_refuses(operator, form):
    response = operator.post(ADD, form)
    assert response.status_code == 200  # the form again, with its errors
    assert not FlowLimit.objects.exists()


def test_a_user_cannot_reach_the_limits(client, user):
    client.force_login(user)
    assert client.get(LIST).status_code == 302  # to the login page


def test_the_job_page_shows_progress_and_the_waiting_reason(operator, user):
    flow_limits.limit_set(scope="type", name="DEMO_TASK", data={"concurrency": 1})
    running = enqueue("DEMO_TASK", owner=user)
    held = enqueue("DEMO_TASK", owner=user)
    leasing.claim_jobs(worker_id="w", limit=5, queues=None)
    Job.objects.filter(id=running.id).update(progress={"percent": 40, "message": "halfway-ish", "at": "now"})
    page = operator.get(f"/admin/scheduler/job/{running.id}/change/").content.decode()
    assert "halfway-ish" in page and 'value="40"' in page
    page = operator.get(f"/admin/scheduler/job/{held.id}/change/").content.decode()
    assert "Concurrency limit of type DEMO_TASK: 1 of 1 running." in page


def test_a_limit_on_a_name_nothing_uses_is_saved_with_a_warning_and_marked_on_the_list(operator):
    response = operator.post(ADD, {"scope": "queue", "name": "reprots", "concurrency": "1"}, follow=True)

    assert FlowLimit.objects.filter(scope="queue", name="reprots").exists()  # kept, as the API keeps it
    shown = [str(m) for m in response.context["messages"]]
    assert any("No job, schedule or worker uses the queue 'reprots' yet: check the name." in m for m in shown)
    page = operator.get(LIST).content.decode()
    assert 'data-in-use="unused"' in page  # the stored rows' column
    assert 'data-in-use="no"' in page and "check the name" in page  # the limits-in-effect table


def test_a_limit_on_a_used_name_is_marked_used_without_a_warning(operator, user):
    enqueue("DEMO_TASK", queue="slow", owner=user)

    response = operator.post(ADD, {"scope": "type", "name": "DEMO_TASK", "concurrency": "2"}, follow=True)
    operator.post(ADD, {"scope": "queue", "name": "slow", "concurrency": "1"})

    assert not any("check the name" in str(m) for m in response.context["messages"])
    page = operator.get(LIST).content.decode()
    assert page.count('data-in-use="yes"') == 4  # two rows, each in the list and in the table
    assert 'data-in-use="unused"' not in page and 'data-in-use="no"' not in page


def test_the_list_marks_unused_names_with_one_query_whatever_the_number_of_limits(operator, user):
    # The mark asked the database per row (queue row, workers, schedules): a page of 100 limits
    # read each name's use several times over. Now one query answers for the page.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    enqueue("DEMO_TASK", queue="slow", owner=user)
    flow_limits.limit_set(scope="queue", name="slow", data={"concurrency": 1})
    flow_limits.limit_set(scope="queue", name="reprots", data={"concurrency": 1})

    def in_use_queries() -> tuple[int, str]:
        flow_limits.forget_cache()
        with CaptureQueriesContext(connection) as queries:
            page = operator.get(LIST).content.decode()
        return sum("flow_names_in_use" in q["sql"] for q in queries.captured_queries), page

    few, page = in_use_queries()
    assert few == 1
    assert page.count("no queue of this name is in use") == 2  # the row and the limits-in-effect table
    for n in range(10):
        flow_limits.limit_set(scope="queue", name=f"typo{n}", data={"concurrency": 1})
        flow_limits.limit_set(scope="type", name=f"TYPO_{n}", data={"concurrency": 1})
    many, page = in_use_queries()
    assert many == 1
    assert page.count("no queue of this name is in use") == 2 * 11
    assert page.count("no type of this name is in use") == 2 * 10
