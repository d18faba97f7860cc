"""Whether a flow limit's or a pause's name is in use (selectors.flow_name_use): real use, not a queue row."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.pg_connect import pg_connection_params
from scheduler import queues, selectors
from scheduler.models import CronSchedule, Queue, WorkerNode
from stint_tasks import registry as task_registry
from tests.support.factories import JobFactory, UserFactory

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

pytestmark = pytest.mark.django_db


def in_use(name: str, scope: str = "queue") -> bool:
    return selectors.flow_name_use(scope=scope, name=name)["in_use"]


def worker(worker_id: str, queues: list[str], *, heartbeat_ago: float = 0, stopped: bool = False) -> WorkerNode:
    now = timezone.now()
    return WorkerNode.objects.create(
        id=worker_id,
        hostname="h",
        pid=1,
        queues=queues,
        concurrency=1,
        pool="threads",
        started_at=now - dt.timedelta(hours=1),
        last_heartbeat_at=now - dt.timedelta(seconds=heartbeat_ago),
        stopped_at=now if stopped else None,
    )


def test_a_queue_row_alone_is_no_use_even_paused():
    # Pausing makes the row; the row counted as use, so the second pause of a typo did not warn.
    queues.queue_pause(name="reprots")

    assert Queue.objects.filter(name="reprots", paused=True).exists()
    assert in_use("reprots") is False
    assert in_use("default") is True  # the default queue, with no job and no row


@pytest.mark.parametrize("trait", ["scheduled", "running", "succeeded", "failed", "dead", "cancelled", None])
def test_a_job_of_any_status_puts_its_queue_in_use(trait):
    JobFactory(queue="reports", **({trait: True} if trait else {}))  # no queue row: the factory writes the job

    assert in_use("reports") is True
    assert in_use("reprots") is False


def test_a_schedule_firing_into_the_queue_puts_it_in_use():
    CronSchedule.objects.create(
        owner=UserFactory(), name="n", interval_seconds=60, job_type="DEMO_TASK", job_queue="nightly"
    )

    assert in_use("nightly") is True
    assert in_use("DEMO_TASK", "type") is True


def test_only_a_live_worker_restricted_to_the_queue_puts_it_in_use(settings):
    worker("live", ["live-q"])
    worker("silent", ["silent-q"], heartbeat_ago=settings.SCHEDULER["WORKER_DEAD_AFTER_SECONDS"] + 60)
    worker("stopped", ["stopped-q"], stopped=True)
    worker("any", [])  # serves every queue: names none of them

    assert [in_use(q) for q in ("live-q", "silent-q", "stopped-q", "other")] == [True, False, False, False]


def test_a_registered_tasks_queue_is_in_use(settings, monkeypatch):
    # Django's @task(queue_name=...) is the only default queue a registered job type has (@handler has none).
    monkeypatch.setattr(task_registry, "_TASKS", dict(task_registry._TASKS))
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": []}}

    def mailout() -> None:
        return None

    mailout.__module__, mailout.__qualname__ = "tests.stint_tasks.tasks", "mailout_for_in_use"
    assert in_use("mailouts") is False
    task(queue_name="mailouts")(mailout)

    assert in_use("mailouts") is True


def test_many_names_cost_one_query_and_a_name_no_queue_could_have_none():
    JobFactory(queue="reports", succeeded=True)
    names = [("queue", "reports"), ("queue", "reprots"), ("type", "DEMO_TASK"), ("type", "DEMO_TAKS")]
    names += [("queue", f"q{n}") for n in range(20)]

    with CaptureQueriesContext(connection) as queries:
        used = selectors.flow_names_in_use(names=[*names, ("queue", "a\x00b"), ("queue", "<b>")])

    assert used == {("queue", "reports"), ("type", "DEMO_TASK")}
    checks = [q for q in queries.captured_queries if "flow_names_in_use" in q["sql"]]
    others = [q["sql"] for q in queries.captured_queries if q not in checks]
    assert len(checks) == 1
    assert all("statement_timeout" in sql or "SAVEPOINT" in sql for sql in others), others  # its time bound
    with CaptureQueriesContext(connection) as none:
        assert selectors.flow_names_in_use(names=[("queue", "default"), ("queue", "a\x00b")]) == {("queue", "default")}
    assert len(none.captured_queries) == 0


def test_a_job_check_past_its_time_bound_answers_in_use_and_leaves_the_transaction_usable(
    monkeypatch, transactional_db
):
    # The job check has no index (it cost every job outside the default queue an index entry, about
    # 210 bytes of WAL): on a huge table it could hold up a pause. A session that locks the job table
    # stands in for that long scan.
    monkeypatch.setattr(selectors, "IN_USE_CHECK_MS", 200)
    locker = psycopg.connect(**pg_connection_params(), autocommit=False)
    try:
        locker.execute("LOCK TABLE stint_job IN ACCESS EXCLUSIVE MODE")
        with transaction.atomic():
            used = selectors.flow_names_in_use(names=[("queue", "reprots"), ("queue", "other")])
            with connection.cursor() as cursor:
                cursor.execute("SHOW statement_timeout")
                after = cursor.fetchone()[0]
    finally:
        locker.rollback()
        locker.close()

    assert used == {("queue", "reprots"), ("queue", "other")}  # no warning rather than a false one
    assert after != "200ms"
    assert selectors.flow_names_in_use(names=[("queue", "reprots")]) == set()


def test_the_time_bound_does_not_outlive_the_check_in_the_callers_transaction():
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        before = cursor.fetchone()[0]
        assert selectors.flow_names_in_use(names=[("queue", "reprots")]) == set()
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == before


# -- run_workers' --queues check (queues.queues_unused) ------------------------------------------


def test_the_queues_a_worker_names_are_unused_when_no_job_schedule_or_task_uses_them(settings, monkeypatch):
    # A typo in run_workers --queues ("reprots") would wait for ever in silence; its own worker (or
    # another with the same typo) serving the name is no use, unlike for a pause's warning.
    JobFactory(queue="reports", succeeded=True)
    CronSchedule.objects.create(
        owner=UserFactory(), name="n", interval_seconds=60, job_type="DEMO_TASK", job_queue="nightly"
    )
    monkeypatch.setattr(task_registry, "_TASKS", dict(task_registry._TASKS))
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": []}}

    def mailout() -> None:
        return None

    mailout.__module__, mailout.__qualname__ = "tests.stint_tasks.tasks", "mailout_for_queues_unused"
    task(queue_name="mailouts")(mailout)
    worker("live", ["reprots", "nightyl"])
    queues.queue_pause(name="nightyl")  # a row is no use either

    names = ["reprots", "default", "reports", "nightly", "mailouts", "nightyl"]
    assert queues.queues_unused(names=names) == ["reprots", "nightyl"]
    assert queues.queues_unused(names=["default", "reports"]) == []
