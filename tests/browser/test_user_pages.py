"""In a real browser: a user registers, runs a job to SUCCESS and reads its timeline, cancels a scheduled
job, previews and creates a schedule; another user gets a 404 for the first user's job."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduler import queues
from scheduler.enqueuing import enqueue
from scheduler.models import CronSchedule, Job
from scheduler.states import JobStatus
from tests.browser.conftest import UI_WAIT, accessibility_basics, screenshot
from tests.support.factories import PASSWORD, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def nav(page, name: str) -> None:
    """Follow a link of the main navigation."""
    page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).click()


def sign_in(page, username: str, password: str = PASSWORD) -> None:
    """Sign in through the login form."""
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label(re.compile(r"^Password:?$")).fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1, name="My jobs")).to_be_visible()


def new_job(page, *, name: str, payload: dict, queue: str = "default", run_at: str = "") -> None:
    """Fill and submit the new-job form; land on the job's page."""
    nav(page, "New job")
    expect(page.get_by_role("heading", level=1, name="New job")).to_be_visible()
    page.get_by_label("Name").fill(name)
    page.get_by_label("Type").select_option("DEMO_TASK")
    page.get_by_label("Payload").fill(json.dumps(payload))
    page.get_by_label("Queue").fill(queue)
    if run_at:
        page.get_by_label("Run at (UTC)").fill(run_at)
    page.get_by_role("button", name="Create job").click()
    expect(page.get_by_role("heading", level=1, name=f"Job “{name}”")).to_be_visible()


def test_register_create_a_job_watch_it_succeed_and_read_its_timeline(page, workers):
    workers.start()
    page.goto("/register/")
    accessibility_basics(page)
    page.get_by_label("Username").fill("ada")
    page.get_by_label(re.compile(r"^Password:?$")).fill(PASSWORD)
    page.get_by_label("Password again").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_text("Welcome, ada. Your account is ready.")).to_be_visible()

    new_job(page, name="first job", payload={"sleep_seconds": 0.3, "result": "hello"})

    # The page refreshes itself: no reload, the badge turns SUCCESS when the worker is done.
    page.evaluate("window.__sameDocument = true")
    expect(page.locator('#job-status [data-status="SUCCESS"]')).to_be_visible(timeout=UI_WAIT)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.locator("#job-result")).to_contain_text('"echo": "hello"')
    expect(page.locator("#attempts tbody tr")).to_have_count(1)
    events = page.locator("#timeline tbody tr").evaluate_all("rows => rows.map(r => r.dataset.event)")
    assert events == ["JOB_CREATED", "JOB_QUEUED", "JOB_STARTED", "JOB_COMPLETED"]
    sequences = page.locator("#timeline tbody tr td:first-child").all_inner_texts()
    assert sequences == ["1", "2", "3", "4"]
    accessibility_basics(page)
    screenshot(page, "job_detail")

    # My jobs: a job waiting in a paused queue shows QUEUED, then SUCCESS once resumed, without a reload.
    queues.queue_pause(name="later")
    new_job(page, name="second job", payload={"result": 2}, queue="later")
    nav(page, "My jobs")
    second = Job.objects.get(name="second job")
    cell = page.locator(f'[data-job-id="{second.id}"]')
    expect(cell.locator('[data-status="QUEUED"]')).to_be_visible()
    page.evaluate("window.__sameDocument = true")
    queues.queue_resume(name="later")
    expect(cell.locator('[data-status="SUCCESS"]')).to_be_visible(timeout=UI_WAIT)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.locator('[data-job-id] [data-status="SUCCESS"]')).to_have_count(2)
    accessibility_basics(page)


def test_cancel_a_scheduled_job(page, transactional_db):
    user = UserFactory()
    sign_in(page, user.username)
    tomorrow = (timezone.now() + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")

    new_job(page, name="tomorrow's job", payload={}, run_at=tomorrow)
    expect(page.locator('#job-status [data-status="SCHEDULED"]')).to_be_visible()
    page.get_by_role("button", name="Cancel job").click()

    expect(page.get_by_text("Job cancelled.")).to_be_visible()
    expect(page.locator('#job-status [data-status="CANCELLED"]')).to_be_visible()
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    expect(page.locator('#timeline tr[data-event="JOB_CANCELLED"]')).to_have_count(1)
    assert Job.objects.get(owner=user).status == JobStatus.CANCELLED


def test_create_a_schedule_and_see_the_preview(page, transactional_db):
    user = UserFactory()
    sign_in(page, user.username)
    nav(page, "Schedules")
    page.get_by_role("link", name="New schedule").click()
    expect(page.get_by_role("heading", level=1, name="New schedule")).to_be_visible()
    accessibility_basics(page)

    page.get_by_label("Name").fill("quarter hours")
    page.get_by_role("textbox", name="Cron expression").fill("*/15 * * * *")
    page.get_by_label("Timezone").fill("Europe/London")
    page.get_by_label("Job type").select_option("DEMO_TASK")
    page.get_by_role("button", name="Preview fire times").click()

    times = page.locator("#preview-times time")
    expect(times).to_have_count(5)
    instants = [dt.datetime.fromisoformat(t) for t in times.evaluate_all("ts => ts.map(t => t.dateTime)")]
    assert instants == sorted(instants) and {t.minute for t in instants} <= {0, 15, 30, 45}
    assert not CronSchedule.objects.exists()  # a preview saves nothing

    page.get_by_role("button", name="Save schedule").click()
    expect(page.get_by_text("Schedule “quarter hours” created.")).to_be_visible()
    expect(page.locator("#next-fire-times time")).to_have_count(5)
    schedule = CronSchedule.objects.get(owner=user)
    assert (schedule.cron, schedule.timezone, schedule.enabled) == ("*/15 * * * *", "Europe/London", True)

    page.get_by_role("link", name="Back to schedules").click()
    row = page.locator(f'tr[data-schedule="{schedule.id}"]')
    expect(row).to_contain_text("quarter hours")
    row.get_by_role("button", name=re.compile("^Disable")).click()
    expect(row).to_contain_text("none while disabled")


def test_another_user_cannot_open_the_first_users_job(page, new_page, transactional_db):
    owner = UserFactory()
    job = enqueue("DEMO_TASK", {"secret": "owner only"}, owner=owner, name="private")
    intruder = UserFactory()
    sign_in(page, intruder.username)

    response = page.goto(f"/jobs/{job.id}/")

    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", level=1, name="Not found")).to_be_visible()
    expect(page.get_by_text("owner only")).to_have_count(0)
    accessibility_basics(page)

    owners_page = new_page()
    sign_in(owners_page, owner.username)
    response = owners_page.goto(f"/jobs/{job.id}/")
    assert response is not None and response.status == 200
    expect(owners_page.get_by_text("owner only")).to_be_visible()
