"""Whether a flow limit's or a pause's name is in use (selectors.flow_name_use): real use, not a queue row."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

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
    assert len(queries.captured_queries) == 1
    with CaptureQueriesContext(connection) as none:
        assert selectors.flow_names_in_use(names=[("queue", "default"), ("queue", "a\x00b")]) == {("queue", "default")}
    assert len(none.captured_queries) == 0


def test_the_job_check_is_an_index_probe_not_a_scan_of_the_jobs():
    JobFactory.create_batch(3, queue="reports", succeeded=True)
    JobFactory.create_batch(3)  # the default queue: no entry in the index
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE stint_job")
        cursor.execute("SELECT count(*) FROM stint_job WHERE queue <> 'default'")
        assert cursor.fetchone()[0] == 3
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_queue_used'")
        assert cursor.fetchone()[0].endswith("WHERE (NOT ((queue)::text = 'default'::text))")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + selectors.FLOW_NAMES_IN_USE_SQL, selectors.flow_names_params([("queue", "x")]))
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "job_queue_used" in plan, plan
