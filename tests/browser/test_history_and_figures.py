"""In a real browser at 1400 px: a dead job's tracebacks folded on its page; a schedule's runs on its page and in
the console, where an operator edits it; the live queues-and-workers page; no column cut. Screenshots for the
README come from here (``make screenshots``)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from playwright.sync_api import expect

from scheduler import enqueuing, schedules
from scheduler.models import CronSchedule, Job, Queue, WorkerNode
from scheduler.states import JobStatus
from tests.browser.conftest import (
    UI_WAIT,
    WIDE,
    accessibility_basics,
    nothing_cut,
    screenshot,
    wait_until,
)
from tests.browser.test_operator_console import admin_sign_in
from tests.browser.test_user_pages import sign_in
from tests.support.factories import JobFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def wide(page):
    """The page at the 1400 px an operator's screen has."""
    page.set_viewport_size(WIDE)
    return page


@pytest.fixture
def operator(transactional_db):
    return UserFactory(username="ops", admin=True, is_superuser=False)


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_a_dead_jobs_tracebacks_are_folded_on_its_page_which_says_who_can_recover_it(wide, workers):
    user = UserFactory(username="grace")
    workers.start()
    outcome = enqueuing.enqueue_request(
        "FAILING", {"why": "demo"}, owner=user, name="nightly import", max_retries=0, trusted=True
    )
    job = outcome.job
    wait_until(lambda: Job.objects.get(id=job.id).status == JobStatus.DEAD, what="the job to be dead-lettered")

    sign_in(wide, user.username)
    expect(wide.locator(f'tr[data-job-row="{job.id}"]')).to_contain_text("nightly import")
    nothing_cut(wide)  # the job list at 1400 px
    wide.goto(f"/jobs/{job.id}/")

    expect(wide.locator("#job-status")).to_contain_text("DEAD")
    expect(wide.locator("#dead-notice")).to_contain_text("Only an ADMIN can recover it")
    folded = wide.locator("#attempts details.traceback")
    expect(folded).to_have_count(1)
    trace = folded.locator("pre")
    expect(trace).to_be_hidden()  # collapsed until asked
    folded.locator("summary").click()
    expect(trace).to_be_visible()
    expect(trace).to_contain_text("Traceback (most recent call last)")
    expect(trace).to_contain_text("RetryableError")
    accessibility_basics(wide)
    nothing_cut(wide)
    screenshot(wide, "job_traceback", docs=True)
    # The retry button is not offered; asking anyway (a stale page) gets the readable 409.
    expect(wide.get_by_role("button", name="Retry job")).to_have_count(0)


def test_a_schedules_runs_on_its_page_and_in_the_console_where_an_operator_edits_it(wide, workers, operator):
    user = UserFactory(username="hopper")
    schedule = schedules.schedule_create(
        owner=user, name="hourly digest", cron="0 * * * *", job={"type": "DEMO_TASK", "payload": {"result": "ok"}}
    )
    fired = [schedules.schedule_trigger(schedule_id=schedule.id, actor=user) for _ in range(3)]
    workers.start()
    wait_until(
        lambda: set(Job.objects.filter(schedule_id=schedule.id).values_list("status", flat=True)) == {"SUCCESS"},
        what="the three runs to succeed",
    )
    never = JobFactory(owner=user, queue="default", scheduled=True)  # not a run: no schedule
    assert never.schedule_id is None

    sign_in(wide, user.username)
    wide.get_by_role("navigation", name="Main").get_by_role("link", name="Schedules", exact=True).click()
    row = wide.locator(f'tr[data-schedule="{schedule.id}"]')
    expect(row.locator("[data-last-run]")).to_contain_text("SUCCESS")
    nothing_cut(wide)
    row.get_by_role("link", name="hourly digest").click()
    expect(wide.locator("#run-counts")).to_contain_text("3 runs kept")
    expect(wide.locator('#run-counts [data-runs-status="SUCCESS"]')).to_contain_text("3")
    expect(wide.locator("#run-table tbody tr")).to_have_count(3)
    expect(wide.locator("#run-table tbody tr").first).to_have_attribute("data-run", str(fired[-1].id))
    expect(wide.locator("#last-run")).to_contain_text("SUCCESS")
    expect(wide.locator("#next-fire-times li")).to_have_count(5)
    accessibility_basics(wide)
    nothing_cut(wide)
    wide.locator("#runs-title").scroll_into_view_if_needed()
    screenshot(wide, "schedule_history", docs=True)

    # The operator's console: the same runs, and the schedule edited through the service.
    console = wide.context.browser.new_context(base_url=wide.url.split("/schedules")[0], viewport=WIDE)
    console.set_default_timeout(UI_WAIT)
    ops = console.new_page()
    try:
        admin_sign_in(ops, operator)
        ops.goto(f"/admin/scheduler/cronschedule/{schedule.id}/change/")
        expect(ops.locator("#run-table tbody tr")).to_have_count(3)
        ops.get_by_role("link", name="Edit this schedule").click()
        ops.get_by_label("fixed interval").check()
        ops.get_by_label("Interval (seconds)").fill("30")
        ops.get_by_role("button", name="Save schedule").click()
        expect(ops.locator(".errornote")).to_contain_text("at most once every 60 seconds")  # a USER's schedule
        ops.get_by_label("Interval (seconds)").fill("600")
        ops.get_by_role("button", name="Save schedule").click()
        expect(ops.locator(".messagelist")).to_contain_text("saved")
        edited = CronSchedule.objects.get(id=schedule.id)
        assert (edited.cron, edited.interval_seconds) == (None, 600)
        accessibility_basics(ops)
    finally:
        console.close()


def test_the_queues_and_workers_page_refreshes_live_from_the_database(wide, workers, operator):
    now = db_now()
    owner = UserFactory()
    Queue.objects.create(name="mail")
    for minutes_ago, status, run, lag in [
        (50, "SUCCESS", 0.8, 0.05),
        (40, "SUCCESS", 1.2, 0.2),
        (30, "FAILED", 2.5, 0.4),
        (20, "SUCCESS", 0.9, 1.5),
        (10, "DEAD", 3.0, 0.1),
        (5, "SUCCESS", 1.1, 0.3),
    ]:
        end = now - dt.timedelta(minutes=minutes_ago)
        start = end - dt.timedelta(seconds=run)
        JobFactory(
            owner=owner,
            queue="mail",
            status=status,
            attempts=1,
            scheduled_at=start - dt.timedelta(seconds=lag),
            started_at=start,
            finished_at=end,
        )
    JobFactory(owner=owner, queue="reports", scheduled=True)
    worker = workers.start(concurrency=3)

    admin_sign_in(wide, operator)
    wide.goto("/admin/")
    wide.locator("#stint-queues-link").click()
    expect(wide.get_by_role("heading", level=1)).to_have_text("Queues and workers")
    mail = wide.locator('#stint-queue-table tr[data-queue="mail"]')
    expect(mail.locator('[data-figure="completed_last_hour"]')).to_have_text("4")
    expect(mail.locator('[data-figure="failed_last_hour"]')).to_have_text("2")
    expect(mail.locator('[data-figure="run_p50"]')).not_to_have_text("-")
    expect(wide.locator('#stint-queue-table tr[data-queue="reports"] [data-depth="SCHEDULED"]')).to_have_text("1")
    expect(wide.locator("#stint-ops-throughput svg rect")).to_have_count(6)
    expect(wide.locator("#stint-ops-lag polyline")).to_have_count(2)
    node = wide.locator(f'#stint-worker-table tr[data-worker*=":{worker.pid}:"], #stint-worker-table tr[data-worker]')
    expect(node.first.locator('[data-figure="slots"]')).to_contain_text("/ 3")

    # New work, no reload: the page re-reads its figures and shows it.
    for _ in range(2):
        enqueuing.enqueue("DEMO_TASK", {}, owner=owner, queue="mail")
    wait_until(lambda: Job.objects.filter(queue="mail", status=JobStatus.SUCCESS).count() == 6, what="the new jobs")
    expect(mail.locator('[data-figure="completed_last_hour"]')).to_have_text("6", timeout=UI_WAIT)
    expect(mail.locator('[data-figure="completed_last_minute"]')).to_have_text("2")
    expect(node.first.locator('[data-figure="jobs_done"]')).to_have_text("2", timeout=UI_WAIT)
    accessibility_basics(wide)
    nothing_cut(wide)
    screenshot(wide, "queues_and_workers", docs=True)

    # The same figures as JSON, for scripts.
    data = wide.request.get("/admin/stint/queues/data.json").json()
    assert next(q for q in data["queues"] if q["name"] == "mail")["completed_last_hour"] == 6


def test_lists_do_not_cut_their_columns_at_1400_px(wide, operator):
    owner = UserFactory(username="a-user-with-a-rather-long-name")
    long_name = "quarterly revenue reconciliation for every region and currency"
    for i in range(3):
        JobFactory(owner=owner, name=f"{long_name} {i}", queue="finance.reports:eu-west", failed=True)
    schedules.schedule_create(
        owner=owner,
        name=long_name,
        cron="15 2 * * 1-5",
        timezone="America/Argentina/Buenos_Aires",
        job={"type": "REPORT", "queue": "finance.reports:eu-west"},
    )
    now = db_now()
    host = "ip-10-0-12-34.eu-west-1.compute.internal"
    WorkerNode.objects.create(
        id=f"{host}:123456:abcdef",
        hostname=host,
        pid=123456,
        supervisor_pid=123400,
        queues=["finance.reports:eu-west", "default"],
        concurrency=25,
        busy_slots=7,
        jobs_done=1234567,
        pool="processes",
        started_at=now,
        last_heartbeat_at=now,
    )
    admin_sign_in(wide, operator)
    for url in (
        "/admin/scheduler/job/",
        "/admin/scheduler/outboxevent/",
        "/admin/audit/auditevent/",
        "/admin/scheduler/cronschedule/",
        "/admin/scheduler/workernode/",
        "/admin/scheduler/queue/",
        "/admin/stint/queues/",
    ):
        wide.goto(url)
        expect(wide.get_by_role("heading", level=1)).to_be_visible()
        screenshot(wide, "wide" + url.replace("/", "_"))
        nothing_cut(wide)
    assert re.search(r"\d\d:\d\d:\d\d", wide.locator("#content").inner_text())  # times with seconds
