"""Jobs in the test database: claimed as a test worker, read back as the API shows them.

``maintenance_settings`` is the fixture of the maintenance tests: a ``LEASE`` s lease, backoff of
1 s doubling to 30 s without jitter, and workers gone after 60 s without a heartbeat.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

import scheduler
from scheduler import leasing, selectors
from scheduler.lifecycle import Claimed
from scheduler.maintenance.promoter import DuePromoter
from scheduler.models import Attempt, Job, OutboxEvent
from scheduler.states import JobStatus

WORKER = "test-host:1:abc"  # the worker id the tests claim as
LEASE = 30  # seconds: LEASE_SECONDS under ``maintenance_settings``


@pytest.fixture
def maintenance_settings(settings) -> None:
    """SCHEDULER settings of the maintenance tests (see the module docstring)."""
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "LEASE_SECONDS": LEASE,
        "BACKOFF_BASE_SECONDS": 1.0,
        "BACKOFF_MAX_SECONDS": 30.0,
        "BACKOFF_JITTER": False,
        "WORKER_DEAD_AFTER_SECONDS": 60,
    }


def db_now() -> dt.datetime:
    """The database's ``now()`` (the clock leases and schedules are written with)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def later(seconds: float) -> dt.datetime:
    """The database's ``now()`` plus ``seconds``."""
    return db_now() + dt.timedelta(seconds=seconds)


def claim(limit: int = 1) -> list[Claimed]:
    """Claim up to ``limit`` jobs from every queue as ``WORKER``."""
    return leasing.claim_jobs(worker_id=WORKER, limit=limit, queues=None)


def running_job(**options: Any) -> tuple[Job, Claimed]:
    """Enqueue a DEMO_TASK and claim it; it must be the only claimable job."""
    job = scheduler.enqueue("DEMO_TASK", {}, **options)
    (claimed,) = claim()
    assert claimed.id == job.id
    return job, claimed


def _run_both(outcome: leasing.Outcome) -> None:
    """Claim the two jobs of queue "w" and record ``outcome`` for both."""
    claimed = leasing.claim_jobs(worker_id="test-worker", limit=2, queues=["w"])
    assert len(claimed) == 2
    leasing.record_outcomes([leasing.Report(job=c, outcome=outcome, error="FAILING always fails") for c in claimed])


def finished_unique_and_plain(owner: Any, status: str) -> tuple[Job, Job, Job]:
    """Run a unique FAILING job A and a plain one B until they are DEAD or FAILED; enqueue A's live duplicate C.

    C goes to a queue nobody claims from, so it stays QUEUED and blocks A's retry or recovery
    (``UniqueConflict``). Returns (A, B, C).
    """
    unique = {"keys": ["k"]}
    a = scheduler.enqueue("FAILING", {"k": 1}, queue="w", max_retries=1, unique=unique, owner=owner)
    b = scheduler.enqueue("FAILING", {"k": 1}, queue="w", max_retries=1, owner=owner)
    if status == JobStatus.DEAD:  # both attempts of the budget fail
        _run_both(leasing.Outcome.RETRYABLE)
        DuePromoter().run_once(now=db_now() + dt.timedelta(days=1))
        _run_both(leasing.Outcome.RETRYABLE)
    else:
        _run_both(leasing.Outcome.PERMANENT)
    assert Job.objects.get(id=a.id).status == Job.objects.get(id=b.id).status == status
    c = scheduler.enqueue("FAILING", {"k": 1}, queue="unserved", max_retries=1, unique=unique, owner=owner)
    assert c.id != a.id and c.status == JobStatus.QUEUED
    return a, b, c


def status(job: Job | Claimed) -> str:
    """The job's status as stored now."""
    return Job.objects.values_list("status", flat=True).get(id=job.id)


def events(job: Job | Claimed) -> list[str]:
    """The job's outbox event types, in sequence order."""
    return list(OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").values_list("event_type", flat=True))


def attempts(job: Job | Claimed) -> list[tuple[int, str]]:
    """The job's attempts as the API lists them: the finished rows, then a RUNNING job's current one."""
    rows = list(Attempt.objects.filter(job_id=job.id).values_list("attempt_number", "status"))
    running = selectors.job_running_attempt(job_id=job.id)
    return rows + ([(running.attempt_number, running.status)] if running else [])


def run_on_threads(functions: list[Callable[[], Any]]) -> list[Any]:
    """Start every function at the same instant on its own thread (own connection); return results."""
    barrier = threading.Barrier(len(functions))
    results: list[Any] = [None] * len(functions)
    errors: list[Exception] = []

    def run(index: int, function: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = function()
        except Exception as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(functions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a service thread hung"
    if errors:
        raise errors[0]
    return results
