"""Django tasks on real ``run_workers`` processes: results, async on the event loop, commit visibility, hostile types.

Workers import the test tasks through ``STINT_TASK_MODULES`` (``conftest.FAST``), as a project lists
its task modules in ``OPTIONS['modules']``.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from django.db import connection, transaction

from core.pg_connect import pg_connect
from scheduler import lifecycle
from scheduler.lifecycle import NewJob
from scheduler.maintenance.promoter import DuePromoter
from scheduler.models import Job, Queue
from scheduler.notify import CHANNEL
from scheduler.states import JobStatus
from stint_tasks.compat import TaskResultStatus
from tests.stint_tasks import tasks as t
from tests.stint_tasks.conftest import Workers, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def finished(result):
    def check():
        result.refresh()
        return result.is_finished

    return check


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_sync_async_context_and_failing_tasks_run_on_a_worker(workers: Workers, pool: str) -> None:
    workers.start(concurrency=4, pool=pool)
    added = t.add.enqueue(2, 3)
    awaited = t.async_add.enqueue(40, 2)
    with_context = t.attempt_of.enqueue(fail_until=1)
    failing = t.fails.enqueue()
    Job.objects.filter(id=failing.id).update(max_retries=1)
    not_json = t.returns_unstorable.enqueue("set")  # 3 retries left, none to be used

    promote = DuePromoter().run_once  # retries wait for the scheduler's promoter
    for result in (added, awaited, with_context, failing, not_json):
        wait_until(finished(result), what=f"{result.task.name} finished", each=promote)

    assert (added.status, added.return_value, added.attempts) == (TaskResultStatus.SUCCESSFUL, 5, 1)
    assert awaited.return_value == 42
    assert with_context.return_value == {"attempt": 2, "id": with_context.id, "workers": 2}
    assert [e.exception_class_path for e in with_context.errors] == ["builtins.KeyError"]
    assert failing.status == TaskResultStatus.FAILED and failing.attempts == 2
    assert [e.exception_class for e in failing.errors] == [ValueError, ValueError]
    assert Job.objects.get(id=failing.id).status == JobStatus.DEAD
    assert (not_json.status, not_json.attempts) == (TaskResultStatus.FAILED, 1)
    assert [e.exception_class_path for e in not_json.errors] == ["builtins.TypeError"]
    assert Job.objects.get(id=not_json.id).status == JobStatus.FAILED
    assert added.worker_ids == [Job.objects.get(id=added.id).attempts_made.get().worker] and added.worker_ids[0]


def test_a_task_enqueued_in_a_transaction_runs_only_after_commit_woken_by_its_notify(workers: Workers) -> None:
    # A poll interval far beyond the wait: only the NOTIFY sent at commit can wake the idle worker.
    workers.start(concurrency=1, env={"STINT_POLL_SECONDS": "120"})
    listener = pg_connect()
    listener.execute(f"LISTEN {CHANNEL}")
    try:
        with transaction.atomic():
            result = t.add.enqueue(1, 1)
            rolled_back_id = None
            try:
                with transaction.atomic():
                    rolled_back_id = t.add.enqueue(9, 9).id
                    raise RuntimeError("roll back the inner one")
            except RuntimeError:
                pass
            assert list(listener.notifies(timeout=0.5)) == []  # nothing is sent before the commit
            assert Job.objects.get(id=result.id).status == JobStatus.QUEUED
        assert [n.payload.split(",", 1)[1] for n in listener.notifies(timeout=5, stop_after=1)] == ["default"]
    finally:
        listener.close()

    wait_until(finished(result), what="the committed task ran")
    assert result.return_value == 2
    assert not Job.objects.filter(id=rolled_back_id).exists()


def test_an_uncommitted_task_is_invisible_to_a_worker(workers: Workers) -> None:
    # The queue's row exists, as on any used system: the first enqueue to a brand-new queue holds
    # that row's insert lock until it commits, which would make the second enqueue below wait.
    Queue.objects.get_or_create(name="default")
    workers.start(concurrency=1)
    started = threading.Event()
    release = threading.Event()
    seen: dict[str, object] = {}

    def hold_open() -> None:
        with transaction.atomic():
            seen["id"] = t.add.enqueue(3, 4).id
            started.set()
            release.wait(60)
        connection.close()

    holder = threading.Thread(target=hold_open)
    holder.start()
    assert started.wait(10)
    marker = t.add.enqueue(0, 0)  # committed after the held one was inserted
    wait_until(finished(marker), what="a later, committed task ran")
    assert not Job.objects.filter(id=seen["id"]).exists()  # not even visible, let alone run
    release.set()
    holder.join(10)
    held = t.add.get_result(seen["id"])
    wait_until(finished(held), what="the held task ran once committed")
    assert held.return_value == 7


def test_a_hostile_job_type_is_failed_without_importing_anything(workers: Workers, tmp_path: Path) -> None:
    trap = tmp_path / "imported"
    workers.start(concurrency=1, env={"STINT_TRAP_FILE": str(trap)})
    job_id = uuid.uuid4()
    with transaction.atomic():  # a row written behind the API's back (it refuses such types)
        lifecycle.create_jobs(
            [
                NewJob(
                    id=job_id,
                    owner_id=None,
                    name="",
                    type="tests.stint_tasks.trap.boom",
                    payload={"args": [], "kwargs": {}},
                    priority=0,
                    queue="default",
                    scheduled_at=None,
                    max_retries=3,
                    timeout_seconds=10,
                )
            ]
        )
    wait_until(lambda: Job.objects.get(id=job_id).status == JobStatus.FAILED, what="the hostile job failed")
    assert "Unknown job type" in Job.objects.get(id=job_id).last_error
    assert not trap.exists()
