"""Flow limits across real worker processes: a concurrency limit survives SIGKILL, a rate limit holds per window.

``run_workers`` supervisors with several worker processes of 10 slots each claim from the test
database; the test samples the database continuously while they run. Limits are set as
database rows (``flow.limits.limit_set``), the way the API and console set them.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.models.functions import Now

from scheduler.enqueuing import enqueue_many
from scheduler.flow import limits as flow_limits
from scheduler.models import Attempt, Job, WorkerNode
from scheduler.states import JobStatus
from tests.support.processes import Processes, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LIMIT = 3
JOB_SECONDS = 0.5  # each job's handler sleeps this long
KILL_WITHIN = 0.2  # seconds: a job this fresh has at least 0.3 s of its sleep left when its process is killed
RUN_WAIT = 60.0  # seconds for every job to finish on two shared cores


@pytest.fixture
def procs(procs: Processes) -> Iterator[Processes]:
    """The suite's ``procs``; this process's cached flow limits are forgotten afterwards too."""
    try:
        yield procs
    finally:
        flow_limits.forget_cache()


def _running() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM stint_job WHERE status = 'RUNNING' AND type = 'DEMO_TASK'")
        return cursor.fetchone()[0]


def test_a_concurrency_limit_of_3_holds_across_4_workers_of_10_slots_through_a_sigkill(procs: Processes) -> None:
    flow_limits.limit_set(scope="type", name="DEMO_TASK", data={"concurrency": LIMIT})
    ids = enqueue_many([{"type": "DEMO_TASK", "payload": {"sleep_seconds": JOB_SECONDS}} for _ in range(24)])
    procs.scheduler()  # rescues the SIGKILLed worker's jobs and promotes them back to QUEUED
    workers = [procs.worker(concurrency=10, processes=2, ready=False) for _ in range(2)]
    procs.wait_ready(*workers)
    samples: list[int] = []
    killed = None
    deadline = time.monotonic() + RUN_WAIT
    while Job.objects.filter(id__in=ids, status=JobStatus.SUCCESS).count() < len(ids):
        assert time.monotonic() < deadline, f"not all done within {RUN_WAIT} s; samples {samples[-50:]}"
        samples.append(_running())
        if killed is None and samples[-1] > 0:
            # SIGKILL a worker process that holds a job: its unit stays taken until its lease is rescued.
            # Only a job that started under KILL_WITHIN ago (database clock) is a target, so that the
            # kill lands while its handler still sleeps, not after its outcome committed.
            fresh = Now() - datetime.timedelta(seconds=KILL_WITHIN)
            owner = Job.objects.filter(id__in=ids, status=JobStatus.RUNNING, started_at__gt=fresh).values_list(
                "lease_owner", flat=True
            )
            pid = WorkerNode.objects.filter(id__in=list(owner)).values_list("pid", flat=True).first()
            if pid:
                os.kill(pid, signal.SIGKILL)
                killed = pid
    assert killed is not None
    assert Attempt.objects.filter(job_id__in=ids, status="LOST").exists()  # the kill hit a running job
    assert max(samples) == LIMIT, f"max RUNNING {max(samples)} over {len(samples)} samples"


def test_a_rate_limit_admits_at_most_its_count_in_every_window(procs: Processes) -> None:
    count, period = 10, 2.0
    flow_limits.limit_set(scope="type", name="DEMO_TASK", data={"rate_limit": count, "rate_period_seconds": period})
    ids = enqueue_many([{"type": "DEMO_TASK"} for _ in range(32)])
    procs.worker(concurrency=10, processes=2)
    wait_until(
        lambda: Job.objects.filter(id__in=ids, status=JobStatus.SUCCESS).count() >= 30,
        what="30 jobs admitted (3 windows)",
        timeout=RUN_WAIT,
    )
    starts = sorted(Attempt.objects.filter(job_id__in=ids).values_list("started_at", flat=True))
    # Every window (t - period, t] ending at an admission holds at most `count` admissions: the log's rule.
    most = max(sum(1 for s in starts if t.timestamp() - period < s.timestamp() <= t.timestamp()) for t in starts)
    assert most <= count, f"{most} admissions within {period} s"
    # And it keeps admitting: every full window after the first admits a good share of its count.
    first, last = starts[0].timestamp(), starts[-1].timestamp()
    windows = [first + period * k for k in range(int((last - first) // period))]
    per_window = [sum(1 for s in starts if w <= s.timestamp() < w + period) for w in windows]
    assert per_window and min(per_window) >= count // 2, per_window
