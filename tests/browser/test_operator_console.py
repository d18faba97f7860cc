"""In a real browser as an ADMIN: bulk-recover the DEAD jobs of one type from a filtered list; pause a
queue, see its jobs wait while others run, resume it and see them run; the dashboard, with a screenshot."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduler import queues
from scheduler.enqueuing import enqueue
from scheduler.models import Job, JobAttempt, LeaderFence, WorkerNode
from scheduler.states import AttemptStatus, JobStatus
from tests.browser.conftest import UI_WAIT, accessibility_basics, screenshot, wait_until
from tests.support.factories import PASSWORD, JobFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def operator(transactional_db):
    """A staff ADMIN (not a superuser: the role is what opens the console)."""
    return UserFactory(username="ops", admin=True, is_superuser=False)


def admin_sign_in(page, user) -> None:
    """Sign in on the admin's own login page."""
    page.goto("/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label(re.compile(r"^Password:?$")).fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def run_action(page, label: str) -> None:
    """Choose an admin action for the checked rows and press Go."""
    page.get_by_role("combobox", name="Action").select_option(label=label)
    page.get_by_role("button", name="Go").click()


def test_bulk_recover_dead_jobs_of_one_type_from_a_filtered_list(page, operator):
    owner = UserFactory()
    failing = JobFactory.create_batch(3, owner=owner, dead=True, type="FAILING", last_error="always fails")
    other_type = JobFactory.create_batch(2, owner=owner, dead=True, type="DEMO_TASK")
    finished = JobFactory(owner=owner, succeeded=True, type="FAILING")
    admin_sign_in(page, operator)

    page.goto("/admin/scheduler/job/")
    filters = page.locator("#changelist-filter")
    filters.locator('details[data-filter-title="status"]').get_by_role("link", name=re.compile("^dead$", re.I)).click()
    filters.locator('details[data-filter-title="type"]').get_by_role("link", name="FAILING", exact=True).click()
    expect(page.locator("#result_list tbody tr")).to_have_count(3)

    page.get_by_role("link", name=re.compile(r"^Recover all matching \(3\)")).click()
    expect(page.get_by_role("heading", level=1, name="Recover all matching jobs?")).to_be_visible()
    expect(page.get_by_test_id("bulk-total")).to_have_text("3")
    expect(page.get_by_test_id("bulk-eligible")).to_have_text("3")
    assert Job.objects.filter(status=JobStatus.DEAD).count() == 5  # the confirmation page changed nothing
    screenshot(page, "admin_bulk_confirm")
    page.get_by_role("button", name="Yes, recover 3 jobs").click()

    expect(page.locator(".messagelist")).to_contain_text("Recovered 3 jobs; skipped 0 whose state did not allow it.")
    assert set(Job.objects.filter(id__in=[j.id for j in failing]).values_list("status", flat=True)) == {
        JobStatus.QUEUED
    }
    assert set(Job.objects.filter(id__in=[j.id for j in other_type]).values_list("status", flat=True)) == {
        JobStatus.DEAD
    }
    assert Job.objects.get(id=finished.id).status == JobStatus.SUCCESS
    # The list keeps its filters: no DEAD FAILING jobs are left in it.
    assert "status__exact=DEAD" in page.url and "type=FAILING" in page.url
    expect(page.locator("#result_list tbody tr")).to_have_count(0)

    # A recovered job's read-only page: its badge, and the JOB_RECOVERED step would follow in its timeline.
    page.goto(f"/admin/scheduler/job/{failing[0].id}/change/")
    expect(page.locator('.field-status_badge [data-status="QUEUED"]')).to_be_visible()
    expect(page.locator(".field-timeline")).to_contain_text("JOB_RECOVERED")
    expect(page.get_by_role("button", name="Save")).to_have_count(0)
    accessibility_basics(page)
    screenshot(page, "admin_job_detail")


def test_pause_a_queue_enqueue_see_jobs_wait_resume_see_them_run(page, operator, workers):
    queues.queue_resume(name="reports")  # known, active
    admin_sign_in(page, operator)

    page.goto("/admin/scheduler/queue/")
    page.locator("#result_list tr", has_text="reports").get_by_role("checkbox").check()
    run_action(page, "Pause selected queues")
    expect(page.locator(".messagelist")).to_contain_text("Paused 1 queue: reports.")
    expect(page.locator("#result_list tr", has_text="reports").locator('[data-state="paused"]')).to_be_visible()

    # A worker starts (it reads the paused set before its first claim); jobs go to both queues.
    workers.start()
    waiting = [enqueue("DEMO_TASK", {"result": i}, queue="reports", owner=operator, name=f"r{i}") for i in range(3)]
    sentinel = enqueue("DEMO_TASK", {"result": "s"}, queue="default", owner=operator, name="sentinel")
    wait_until(
        lambda: Job.objects.get(id=sentinel.id).status == JobStatus.SUCCESS, what="the default queue's job to run"
    )

    # The worker is running jobs, yet the paused queue's jobs wait QUEUED.
    page.goto("/admin/scheduler/job/?queue=reports")
    expect(page.locator('#result_list [data-status="QUEUED"]')).to_have_count(3)
    page.goto("/admin/scheduler/queue/")
    row = page.locator("#result_list tr", has_text="reports")
    expect(row.locator("td.field-queued")).to_have_text("3")
    assert {j.status for j in Job.objects.filter(queue="reports")} == {JobStatus.QUEUED}

    row.get_by_role("checkbox").check()
    run_action(page, "Resume selected queues")
    expect(page.locator(".messagelist")).to_contain_text("Resumed 1 queue: reports.")

    # On the operator's own jobs page the badges turn SUCCESS by themselves.
    page.goto("/?queue=reports")
    expect(page.locator('[data-job-id] [data-status="SUCCESS"]')).to_have_count(3, timeout=UI_WAIT)
    assert {j.status for j in Job.objects.filter(id__in=[j.id for j in waiting])} == {JobStatus.SUCCESS}


def test_dashboard_screenshot_and_accessibility(page, operator, workers):
    owner = UserFactory()
    queues.queue_pause(name="held")  # the real worker below must leave the seeded QUEUED rows alone
    JobFactory.create_batch(2, owner=owner, dead=True, type="FAILING", last_error="FAILING always fails")
    JobFactory(owner=owner, queue="held", scheduled_at=timezone.now() - dt.timedelta(minutes=3))
    JobFactory(owner=owner, failed=True)
    JobFactory(owner=owner, scheduled=True)
    now = timezone.now()
    for minutes_ago, status in [(1, AttemptStatus.SUCCEEDED), (1, AttemptStatus.SUCCEEDED), (5, AttemptStatus.FAILED)]:
        ok = status == AttemptStatus.SUCCEEDED
        job = JobFactory(owner=owner, succeeded=ok, failed=not ok)
        finished = now - dt.timedelta(minutes=minutes_ago)
        JobAttempt.objects.create(job=job, attempt_number=1, status=status, started_at=finished, finished_at=finished)
    LeaderFence.objects.create(role="cron", token=42, holder="scheduler-host:4242:cafe")
    worker = workers.start(concurrency=3)
    enqueue("DEMO_TASK", {}, owner=owner, queue="held")  # outbox backlog: no relay runs in this test
    wait_until(lambda: WorkerNode.objects.filter(supervisor_pid=worker.pid).exists(), what="the worker row")

    admin_sign_in(page, operator)
    page.goto("/admin/")

    dashboard = page.locator("#stint-dashboard")
    expect(dashboard.get_by_role("heading", name="Operations dashboard")).to_be_visible()
    expect(dashboard.locator('[data-count-for="DEAD"]')).to_have_text("2")
    expect(dashboard.locator("#stint-dead-jobs")).to_contain_text("FAILING always fails")
    expect(dashboard.locator("#stint-workers")).to_contain_text("1 live")
    expect(dashboard.locator("#stint-workers")).to_contain_text("of 3 slots busy")
    expect(dashboard.locator("#stint-leader")).to_contain_text("token 42")
    expect(dashboard.locator("#stint-leader")).to_contain_text("scheduler-host:4242:cafe")
    expect(dashboard.locator("#stint-throughput svg rect[fill='#1a7f37']")).to_have_count(1)
    expect(dashboard.locator("#stint-throughput svg rect[fill='#cf222e']")).to_have_count(1)
    expect(dashboard.locator("#stint-throughput desc")).to_contain_text("2 succeeded and 1 failed")
    expect(dashboard.locator("#stint-oldest-queued .stint-figure")).to_contain_text("min")
    backlog = int(dashboard.locator("#stint-outbox .stint-figure").inner_text())
    assert backlog >= 2
    found = accessibility_basics(page)
    assert {b["text"] for b in found["badges"]} >= set(JobStatus.values)
    path = screenshot(page, "dashboard")
    assert path.exists()

    # The dead jobs link leads to the filtered list, badges and all.
    dashboard.get_by_role("link", name="Review and recover").click()
    expect(page.locator('#result_list [data-status="DEAD"]')).to_have_count(2)
    accessibility_basics(page)
    screenshot(page, "admin_dead_jobs")
