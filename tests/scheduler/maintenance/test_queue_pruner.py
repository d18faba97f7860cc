"""Queue retention (scheduler.maintenance.queue_pruner): an unused queue row goes, one anything refers to stays.

Driven through ``QueuePruner().run_once(now)``. The race tests run the pruner and a writer on
threads, each with its own connection, and watch the locks from a third.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from scheduler import queues
from scheduler.enqueuing import enqueue
from scheduler.flow.models import FlowLimit
from scheduler.job_actions import job_cancel
from scheduler.maintenance import default_services
from scheduler.maintenance.pruner import Pruner
from scheduler.maintenance.queue_pruner import QueuePruner
from scheduler.models import Job, Queue, WorkerNode
from scheduler.schedules import schedule_create
from tests.support.factories import JobFactory, UserFactory, worker_node
from tests.support.jobs import db_now
from tests.support.subprocess_env import database_url

DAY = dt.timedelta(days=1)
WAIT = 10.0  # seconds a test waits for another thread to reach a point


@pytest.fixture(autouse=True)
def _retention(settings) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "QUEUE_RETENTION_DAYS": 7, "RETENTION_CANCELLED_DAYS": 7}


def idle_queue(name: str, *, age: dt.timedelta = 30 * DAY, paused: bool = False) -> str:
    """A queue row last written ``age`` ago (by the database clock), with no jobs."""
    Queue.objects.create(name=name, paused=paused)
    Queue.objects.filter(name=name).update(created_at=db_now() - age, updated_at=db_now() - age)
    return name


def names() -> set[str]:
    return set(Queue.objects.values_list("name", flat=True))


@pytest.mark.django_db
def test_a_users_junk_queues_go_once_their_jobs_are_pruned(api, user) -> None:
    """The report: 5 POST /api/jobs by a USER, each naming a new queue, left 5 rows no maintenance removed."""
    from tests.conftest import bearer

    api.credentials(HTTP_AUTHORIZATION=bearer(user))
    junk = {f"junk-{n}" for n in range(5)}
    for name in sorted(junk):
        response = api.post("/api/jobs", {"name": "x", "type": "DEMO_TASK", "queue": name}, format="json")
        assert response.status_code == 201, response.content
        job_cancel(job_id=response.json()["id"])
    assert junk <= names()
    with connection.cursor() as cursor:  # relayed: nothing holds the jobs back
        cursor.execute("UPDATE stint_outbox SET published_at = now()")
    later = db_now() + 8 * DAY

    assert QueuePruner().run_once(now=later) == 0  # their jobs are still kept (7 days): seen in use
    assert Pruner().run_once(now=later) >= 5  # the jobs' own retention
    assert QueuePruner().run_once(now=later) == 0  # seen in use a moment ago
    assert QueuePruner().run_once(now=later + 8 * DAY) == 5

    assert not junk & names()
    enqueue("DEMO_TASK", queue="junk-0")  # a name used again is a queue again
    assert "junk-0" in names()


@pytest.mark.django_db
def test_a_queue_anything_refers_to_is_kept(settings) -> None:
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [{"scope": "queue", "name": "limited-in-settings", "concurrency": 1}],
    }
    kept = {
        idle_queue("default"),  # every job's default
        idle_queue("paused", paused=True),
        idle_queue("limited-in-settings"),
        idle_queue("limited"),
        idle_queue("scheduled"),
        idle_queue("served"),
        idle_queue("recent", age=6 * DAY),
    }
    FlowLimit.objects.create(scope="queue", name="limited", concurrency=2)
    schedule_create(
        owner=UserFactory(), name="s", interval_seconds=3600, job={"type": "DEMO_TASK", "queue": "scheduled"}
    )
    Queue.objects.filter(name="scheduled").update(updated_at=db_now() - 30 * DAY)
    live = worker_node(last_heartbeat_at=db_now())
    stopped = worker_node(last_heartbeat_at=db_now() - DAY, stopped_at=db_now() - DAY)
    WorkerNode.objects.filter(id=live.id).update(queues=["other", "served"])
    WorkerNode.objects.filter(id=stopped.id).update(queues=["was-served"])
    doomed = {idle_queue("was-served"), idle_queue("idle-1"), idle_queue("idle-2")}
    for status in ("queued", "succeeded", "dead"):  # a job of any status keeps its queue
        kept.add(idle_queue(f"with-{status}-job"))
        JobFactory(**({status: True} if status != "queued" else {}), queue=f"with-{status}-job")

    assert QueuePruner().run_once() == len(doomed)

    assert names() == kept
    touched = Queue.objects.get(name="with-dead-job").updated_at
    assert touched > db_now() - dt.timedelta(minutes=1)  # seen in use: not read again for 7 days
    assert QueuePruner().run_once() == 0
    assert Queue.objects.get(name="with-dead-job").updated_at == touched


@pytest.mark.django_db
def test_zero_days_keeps_queues_forever(settings) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "QUEUE_RETENTION_DAYS": 0}
    idle_queue("idle", age=3650 * DAY)
    assert QueuePruner().run_once() == 0
    assert names() == {"idle"}


@pytest.mark.django_db
def test_a_run_deletes_in_bounded_batches_and_the_next_run_goes_on() -> None:
    for n in range(7):
        idle_queue(f"idle-{n}", age=(30 + n) * DAY)
    assert QueuePruner(batch_size=2, max_batches=3).run_once() == 6
    assert names() == {"idle-0"}  # oldest first
    assert QueuePruner(batch_size=2, max_batches=3).run_once() == 1
    assert names() == set()


@pytest.mark.django_db
def test_run_scheduler_runs_it() -> None:
    assert "queue_pruner" in {service.name for service in default_services()}


# -- races with writers of the same queue ------------------------------------------------------------


def _on_thread(function: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``function`` on a thread with its own connection; its result or exception lands in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(function())
        except Exception as exc:  # the test asserts on it
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def _row_taken(probe: psycopg.Connection, name: str) -> bool:
    """Whether a transaction has locked or deleted queue ``name``'s row (its ``xmax``; a read that locks nothing)."""
    row = probe.execute("SELECT xmax::text <> '0' FROM stint_queue WHERE name = %s", [name]).fetchone()
    return bool(row and row[0])


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_flight_when_the_pruner_deletes_its_queue_keeps_its_queue_and_job() -> None:
    """The enqueue passed the queue row (ON CONFLICT DO NOTHING: no lock) before the delete; its job is uncommitted.

    The pruner waits for every transaction that wrote stint_queue before its delete, sees the job
    once it commits, and undoes the delete: the job is never lost and never left without its queue.
    """
    idle_queue("idle")
    enqueued, release = threading.Event(), threading.Event()

    def enqueue_and_hold() -> Job:
        with transaction.atomic():
            job = enqueue("DEMO_TASK", queue="idle")
            enqueued.set()
            assert release.wait(WAIT)
        return job

    writer, written = _on_thread(enqueue_and_hold)
    assert enqueued.wait(WAIT)
    pruner, pruned = _on_thread(lambda: QueuePruner().run_once())
    with psycopg.connect(database_url(), autocommit=True) as probe:
        _until(lambda: _row_taken(probe, "idle"), "the pruner deleted the queue row")
    release.set()
    writer.join(WAIT)
    pruner.join(WAIT)

    assert isinstance(written[0], Job), written
    assert pruned == [0]
    assert Job.objects.get(id=written[0].id).queue == "idle"
    assert "idle" in names()
    assert QueuePruner().run_once() == 0  # now seen in use
    assert "idle" in names()


def _enqueue() -> Any:
    return enqueue("DEMO_TASK", queue="idle")


def _pause() -> Any:
    return queues.queue_pause(name="idle")


def _resume() -> Any:
    return queues.queue_resume(name="idle")


def _schedule() -> Any:
    owner = UserFactory()
    return schedule_create(owner=owner, name="s", interval_seconds=3600, job={"type": "DEMO_TASK", "queue": "idle"})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", [_enqueue, _pause, _resume, _schedule], ids=lambda f: f.__name__.strip("_"))
def test_a_writer_that_meets_the_pruners_delete_succeeds_and_the_queue_stays(write: Callable[[], Any]) -> None:
    """The writer comes while the pruner holds its deleted row (waiting for an unrelated transaction).

    The writer waits for the pruner, the pruner sees it waiting and gives its batch up at once
    (it does not wait out its deadline): the writer succeeds and the queue row is there.
    """
    idle_queue("idle")
    with psycopg.connect(database_url()) as unrelated:  # a transaction that wrote stint_queue, open
        unrelated.execute("LOCK TABLE stint_queue IN ROW EXCLUSIVE MODE")
        pruner, pruned = _on_thread(lambda: QueuePruner(wait_seconds=60).run_once())
        with psycopg.connect(database_url(), autocommit=True) as probe:
            _until(lambda: _row_taken(probe, "idle"), "the pruner deleted the queue row")
        writer, written = _on_thread(write)
        writer.join(WAIT)
        pruner.join(WAIT)
        assert not pruner.is_alive(), "the pruner waited for its deadline while a writer waited for it"

    assert written and not isinstance(written[0], Exception), written
    assert pruned == [0]
    assert "idle" in names()
    if write is _enqueue:
        assert Job.objects.get(id=written[0].id).queue == "idle"
