"""ctx.progress (scheduler.flow.progress): rate-limited, fenced writes that the API and job page show."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from scheduler import leasing
from scheduler.enqueuing import enqueue
from scheduler.flow.progress import ProgressWriter, checked, writer
from scheduler.models import Job
from scheduler.registry import handler
from scheduler.workers.execute import run_handler

PROGRESSING = "TEST_FLOW_PROGRESS"
HEARTBEAT_SECONDS = 10.0  # the default heartbeat interval: progress must show within one


@handler(PROGRESSING)
def _progressing(payload: Any, ctx: Any) -> str:
    """Report a burst of progress; the last value must still reach the database."""
    for step in range(1, 6):
        ctx.progress(step * 10, f"step {step}")
    return "done"


def _wait(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_the_last_progress_of_a_burst_reaches_the_api_within_one_heartbeat(user, user_api, client):
    job = enqueue(PROGRESSING, owner=user)
    (claimed,) = leasing.claim_jobs(worker_id="w", limit=1, queues=None)
    started = time.monotonic()
    report = run_handler(claimed, threading.Event())
    assert report.outcome == leasing.Outcome.SUCCEEDED
    # The job is still RUNNING (its outcome not recorded): the pending last value gets written.
    _wait(lambda: (Job.objects.get(id=job.id).progress or {}).get("percent") == 50, HEARTBEAT_SECONDS)
    assert time.monotonic() - started < HEARTBEAT_SECONDS
    writer.join(HEARTBEAT_SECONDS)
    body = user_api.get(f"/api/jobs/{job.id}").json()
    assert body["progress"]["percent"] == 50
    assert body["progress"]["message"] == "step 5"
    assert body["progress"]["at"]
    client.force_login(user)
    page = client.get(f"/jobs/{job.id}/live/")
    assert b"step 5" in page.content


@pytest.mark.django_db(transaction=True)
def test_the_last_progress_survives_an_outcome_recorded_at_once(user, user_api):
    job = enqueue(PROGRESSING, owner=user)
    (claimed,) = leasing.claim_jobs(worker_id="w", limit=1, queues=None)
    report = run_handler(claimed, threading.Event())
    leasing.record_outcomes([report])  # at once: before the once-a-second batch could run
    body = user_api.get(f"/api/jobs/{job.id}").json()
    assert body["status"] == "SUCCESS"
    assert body["progress"]["percent"] == 50 and body["progress"]["message"] == "step 5"


@pytest.mark.django_db(transaction=True)
def test_progress_of_a_run_that_lost_its_lease_is_not_written(user):
    job = enqueue(PROGRESSING, owner=user)
    (claimed,) = leasing.claim_jobs(worker_id="w", limit=1, queues=None)
    leasing.record_outcomes([leasing.Report(job=claimed, outcome=leasing.Outcome.HANDED_BACK)])
    stale = ProgressWriter(interval=3600.0)
    stale.report(job_id=job.id, lease_token=claimed.lease_token, percent=99, message="stale")
    assert stale.flush() == 1
    assert Job.objects.get(id=job.id).progress is None


@pytest.mark.parametrize(
    "percent,message", [(-1, ""), (101, ""), (float("nan"), ""), (True, ""), ("5", ""), (5, 3), (10**400, "")]
)
def test_bad_progress_is_the_handlers_error(percent, message):
    with pytest.raises(ValueError):
        checked(percent, message)


def test_a_long_message_is_cut_and_nul_removed():
    assert checked(12.345, "a\x00" + "b" * 1000) == {"percent": 12.35, "message": "a" + "b" * 498}


class _LyingFloat(float):
    """50.0 that says NaN when ``float()`` asks it: the number checked must be the number stored."""

    def __float__(self) -> float:
        return float("nan")


class _LyingInt(int):
    def __float__(self) -> float:
        return float("inf")


@pytest.mark.django_db(transaction=True)
def test_a_number_subclass_stores_its_own_value_and_spoils_no_neighbours_progress(user):
    # checked() tested the number, then stored float(percent), which a subclass's __float__ chose: NaN
    # reached the writer's one statement for every job of the process, which jsonb refused, so no
    # job's progress in that batch was written (a handler reporting in a loop kept it so).
    assert checked(_LyingFloat(50.0), "") == {"percent": 50.0, "message": ""}
    assert checked(_LyingInt(7), "") == {"percent": 7.0, "message": ""}

    hostile, neighbour = enqueue(PROGRESSING, owner=user), enqueue(PROGRESSING, owner=user)
    claimed = leasing.claim_jobs(worker_id="w", limit=2, queues=None)
    batch = ProgressWriter(interval=3600.0)
    for run, percent in zip(sorted(claimed, key=lambda c: c.id != hostile.id), [_LyingFloat(50.0), 20], strict=True):
        batch.report(job_id=run.id, lease_token=run.lease_token, percent=percent, message="")
    assert batch.flush() == 2
    assert Job.objects.get(id=hostile.id).progress["percent"] == 50.0
    assert Job.objects.get(id=neighbour.id).progress["percent"] == 20
