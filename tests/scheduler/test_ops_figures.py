"""The console's per-queue and per-worker figures (scheduler.ops_figures) and their page, fragment and JSON."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from scheduler.models import Queue, WorkerNode
from scheduler.ops_figures import Minute, lag_chart_build, ops_figures
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db

PAGE = "/admin/stint/queues/"


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def finished(queue: str, status: str, *, ago: float, run: float, lag: float):
    """A job of ``queue`` that ended ``status`` ``ago`` seconds ago after ``run`` s, started ``lag`` s late."""
    end = db_now() - dt.timedelta(seconds=ago)
    start = end - dt.timedelta(seconds=run)
    return JobFactory(
        queue=queue,
        status=status,
        attempts=1,
        scheduled_at=start - dt.timedelta(seconds=lag),
        started_at=start,
        finished_at=end,
    )


@pytest.fixture
def seeded():
    Queue.objects.create(name="mail")
    Queue.objects.create(name="idle", paused=True)
    finished("mail", "SUCCESS", ago=10, run=1, lag=0.1)
    finished("mail", "SUCCESS", ago=20, run=3, lag=0.3)
    finished("mail", "SUCCESS", ago=600, run=2, lag=0.2)
    finished("mail", "FAILED", ago=30, run=5, lag=0.5)
    finished("mail", "DEAD", ago=900, run=4, lag=0.4)
    finished("mail", "SUCCESS", ago=7200, run=100, lag=100)  # two hours ago: outside the window
    finished("mail", "CANCELLED", ago=5, run=1, lag=1)  # not completed, not failed
    JobFactory.create_batch(3, queue="mail")  # QUEUED
    JobFactory(queue="mail", running=True)
    JobFactory(queue="reports", scheduled=True)
    now = db_now()
    JobFactory(queue="mail", failed=True)  # ended without a recorded start: no run time, no lag
    WorkerNode.objects.create(
        queues=["mail", "reports"],
        id="host:1:a",
        hostname="host",
        pid=1,
        concurrency=4,
        pool="threads",
        busy_slots=3,
        jobs_done=42,
        started_at=now - dt.timedelta(minutes=5),
        last_heartbeat_at=now - dt.timedelta(seconds=2),
    )
    WorkerNode.objects.create(
        id="host:2:b",
        hostname="host",
        pid=2,
        concurrency=2,
        pool="processes",
        busy_slots=0,
        jobs_done=7,
        started_at=now - dt.timedelta(hours=3),
        last_heartbeat_at=now - dt.timedelta(hours=2),
    )  # silent for two hours: no longer listed


def test_per_queue_depth_counts_and_percentiles_over_the_last_minute_and_hour(seeded):
    figures = ops_figures()

    by_name = {q.name: q for q in figures.queues}
    assert list(by_name) == ["idle", "mail", "reports"]
    mail = by_name["mail"]
    assert mail.depth == {"SCHEDULED": 0, "QUEUED": 3, "RUNNING": 1, "RETRYING": 0}
    assert (mail.completed_last_minute, mail.completed_last_hour) == (2, 3)
    assert (mail.failed_last_minute, mail.failed_last_hour) == (2, 3)
    # Run times 1, 3, 2, 5, 4 s; lags 0.1..0.5 s (PostgreSQL's percentile_cont interpolates).
    assert mail.run_p50_seconds == pytest.approx(3.0)
    assert mail.run_p95_seconds == pytest.approx(4.8)
    assert mail.lag_p50_seconds == pytest.approx(0.3)
    assert mail.lag_p95_seconds == pytest.approx(0.48)
    assert by_name["idle"].paused and by_name["idle"].completed_last_hour == 0
    assert by_name["idle"].run_p50_seconds is None
    assert by_name["reports"].depth["SCHEDULED"] == 1
    assert [w.id for w in figures.workers] == ["host:1:a"]
    worker = figures.workers[0]
    assert (worker.slots_busy, worker.slots_total, worker.jobs_done, worker.alive) == (3, 4, 42, True)
    assert worker.queues == ["mail", "reports"]
    assert 1 <= worker.last_heartbeat_age_seconds < 60
    assert len(figures.minutes) == 60
    assert sum(m.completed for m in figures.minutes) == 3 and sum(m.failed for m in figures.minutes) == 3


def test_the_charts_can_cover_one_queue(seeded):
    finished("reports", "SUCCESS", ago=15, run=1, lag=9)

    one = ops_figures(queue="reports")
    assert sum(m.completed for m in one.minutes) == 1
    assert max(m.lag_p95_seconds or 0 for m in one.minutes) == pytest.approx(9)
    assert {q.name: q.completed_last_hour for q in one.queues}["mail"] == 3  # the table still has every queue
    assert sum(m.completed for m in ops_figures(queue="nope").minutes) == 0


def test_the_lag_chart_scales_to_the_highest_p95_and_skips_idle_minutes():
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    minutes = [
        Minute(minute=start, completed=1, failed=0, lag_p50_seconds=1.0, lag_p95_seconds=2.0),
        Minute(minute=start, completed=0, failed=0, lag_p50_seconds=None, lag_p95_seconds=None),
        Minute(minute=start, completed=1, failed=0, lag_p50_seconds=0.0, lag_p95_seconds=4.0),
    ]

    chart = lag_chart_build(minutes)

    assert chart.y_max_seconds == 4.0 and chart.p95_max_seconds == 4.0
    assert chart.p95_points == "120.0,76.0 600.0,12.0"  # the top of the plot is the hour's highest p95
    assert chart.p50_points == "120.0,108.0 600.0,140.0"
    assert lag_chart_build(minutes[1:2]).p50_points == ""


def test_page_fragment_and_json_for_operators_only(client, admin_user, user, seeded):
    assert client.get(PAGE).status_code == 302  # to the admin's sign-in
    client.force_login(user)
    assert client.get(f"{PAGE}data.json").status_code == 302  # a USER is not an operator
    client.force_login(admin_user)

    html = client.get(PAGE).content.decode()
    assert 'data-queue="mail"' in html and 'data-worker="host:1:a"' in html
    assert '<td data-figure="jobs_done">42</td>' in html and "3 / 4" in html
    assert "<polyline" in html and "Jobs finished per minute" in html
    live = client.get(f"{PAGE}live/?queue=mail").content.decode()
    assert "<html" not in live and "queue mail" in live
    data = client.get(f"{PAGE}data.json").json()
    assert {q["name"] for q in data["queues"]} == {"idle", "mail", "reports"}
    mail = next(q for q in data["queues"] if q["name"] == "mail")
    assert mail["completed_last_hour"] == 3 and mail["depth"]["QUEUED"] == 3
    assert data["workers"][0]["jobs_done"] == 42 and len(data["minutes"]) == 60


@pytest.mark.parametrize("value", ["", "x" * 101, "a\x00b", "%", "' OR 1=1 --", "\ud800"[:0] + "é" * 50])
def test_any_chart_queue_value_answers(client, admin_user, value):
    client.force_login(admin_user)
    expected = 400 if "\x00" in value else 200  # a NUL is refused before any view (core.failsafe)
    for path in ("", "live/", "data.json"):
        assert client.get(f"{PAGE}{path}", {"queue": value}).status_code == expected
