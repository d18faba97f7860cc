"""A handler that chooses its retry delay (``RetryAfter``), on real ``run_workers`` processes.

In the thread pool, the process pool and the isolation slot. The handler is ``HOSTILE_RETRY_AFTER``
of the test-only app ``tests.support.hostile``, plugged into the worker processes with
``STINT_EXTRA_APPS`` as a user plugs in their own app.
"""

from __future__ import annotations

import datetime as dt

import pytest

import tests.support.hostile.jobs  # noqa: F401 - registers the HOSTILE_* job types in this process too
from scheduler.enqueuing import enqueue
from scheduler.maintenance.promoter import DuePromoter
from scheduler.models import Attempt, Job, OutboxEvent, WorkerNode
from scheduler.retry import MAX_BACKOFF_SECONDS
from scheduler.states import AttemptStatus, EventType, JobStatus
from tests.support.jobs import attempts
from tests.support.processes import Processes, pool_children, status_is, wait_until, worker_pid

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_backoff")]

ASKED = 2  # seconds the honest handler asks for: ten times the processes' longest backoff (FAST)
BACKOFF_INSTEAD = "retried after the job type's backoff instead"


@pytest.fixture
def handlers(procs: Processes) -> Processes:
    """``procs`` whose worker processes also load the ``tests.support.hostile`` handlers."""
    procs.env["STINT_EXTRA_APPS"] = "tests.support.hostile"
    return procs


def assert_ran_again_no_sooner_than_asked(job: Job) -> None:
    """``job`` failed once with RetryAfter(ASKED), was due ASKED s after that outcome, then succeeded no sooner."""
    done = Job.objects.get(id=job.id)
    first, second = Attempt.objects.filter(job_id=job.id).order_by("attempt_number")
    assert attempts(job) == [(1, AttemptStatus.FAILED), (2, AttemptStatus.SUCCEEDED)]
    assert first.error == f"RetryAfter: asked for seconds (retried in {ASKED} s, as the handler asked)"
    # Both written by the outcome's one statement, with the database's now(): exactly the delay apart.
    assert done.scheduled_at == first.finished_at + dt.timedelta(seconds=ASKED)
    assert second.started_at >= done.scheduled_at  # not run before the time it asked for
    assert done.stored_result.result == {"attempt": 2}
    retried = OutboxEvent.objects.get(job_id=job.id, event_type=EventType.JOB_RETRIED)
    assert (retried.payload["backoff_seconds"], retried.payload["reason"]) == (ASKED, "retry_after")


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_job_that_asks_to_be_retried_in_2_s_is_due_then_runs_again_and_succeeds(handlers: Processes, pool: str):
    handlers.worker(concurrency=1, pool=pool)
    handlers.scheduler()  # promotes it when due
    job = enqueue("HOSTILE_RETRY_AFTER", {"seconds": ASKED}, max_retries=1)

    wait_until(status_is(job, JobStatus.SUCCESS), what="the job ran again and succeeded")

    assert_ran_again_no_sooner_than_asked(job)


def test_an_isolated_job_that_asks_for_a_delay_gets_it_from_the_isolation_slot(handlers: Processes) -> None:
    job = enqueue("HOSTILE_RETRY_AFTER", {"seconds": ASKED}, max_retries=1)
    Job.objects.filter(id=job.id).update(isolated=True)  # as after a run that killed its process
    worker = handlers.worker(concurrency=1)
    handlers.scheduler()

    wait_until(status_is(job, JobStatus.SUCCESS), what="the job ran in isolation, then again, and succeeded")

    assert_ran_again_no_sooner_than_asked(job)
    isolation = set(WorkerNode.objects.filter(supervisor_pid=worker.pid, isolation=True).values_list("id", flat=True))
    first, second = Attempt.objects.filter(job_id=job.id).order_by("attempt_number")
    assert first.worker in isolation  # its first run, in the isolation slot's pool child
    assert second.worker not in isolation  # it ran without killing its process: no longer isolated
    assert Job.objects.get(id=job.id).isolated is False


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_delay_that_cannot_be_read_or_is_absurd_never_costs_the_worker(handlers: Processes, pool: str) -> None:
    worker = handlers.worker(concurrency=1, pool=pool)
    process = worker_pid(worker)
    children = pool_children(process)
    unreadable = enqueue("HOSTILE_RETRY_AFTER", {"delay": "unreadable", "times": 2}, max_retries=1)
    huge = enqueue("HOSTILE_RETRY_AFTER", {"delay": "huge"}, max_retries=1)

    wait_until(
        lambda: status_is(unreadable, JobStatus.DEAD)() and status_is(huge, JobStatus.RETRYING)(),
        each=DuePromoter().run_once,
        what="the unreadable delay's job was dead-lettered after its backoffs, the huge one's is waiting",
    )
    after = enqueue("HOSTILE_RETRY_AFTER", {"times": 0})
    wait_until(status_is(after, JobStatus.SUCCESS), what="the next job ran in the same one slot")

    error = f"_UnreadableDelay: asked for something (its delay could not be read (SystemExit): {BACKOFF_INSTEAD})"
    assert (
        list(Attempt.objects.filter(job_id=unreadable.id).values_list("status", "error"))
        == [(AttemptStatus.FAILED, error)] * 2
    )
    (clamped,) = Attempt.objects.filter(job_id=huge.id)
    week = dt.timedelta(seconds=MAX_BACKOFF_SECONDS)
    most = MAX_BACKOFF_SECONDS
    assert clamped.error == f"RetryAfter: asked for huge (retried in {most} s: it asked for more than {most} s)"
    assert Job.objects.get(id=huge.id).scheduled_at == clamped.finished_at + week
    # Neither the worker process nor its pool child was replaced.
    assert worker_pid(worker) == process
    assert pool_children(process) == children
