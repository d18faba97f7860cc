"""Built-in handlers: input that no retry can fix fails permanently (FAILED), not retried to DEAD."""

from __future__ import annotations

import threading

import pytest

from scheduler.leasing import Outcome
from scheduler.workers.execute import run_handler
from tests.support.factories import claimed_job

pytestmark = pytest.mark.django_db


def _run(job_type: str, payload: object, owner_id: int | None = None):
    job = claimed_job(job_type, payload=payload, owner_id=owner_id, timeout_seconds=10)
    return run_handler(job, threading.Event())


@pytest.mark.parametrize(
    ("job_type", "payload"),
    [
        ("DEMO_TASK", [1, 2]),
        ("DEMO_TASK", {"sleep_seconds": "soon"}),
        ("DEMO_TASK", {"fail_times": 1e400}),
        ("DATA_CLEANUP", {"older_than_days": 10**12}),
        ("DATA_CLEANUP", {"older_than_days": 0}),
        ("EMAIL", {"to": "a@example.test", "subject": "hi\nBcc: x@example.test", "body": ""}),
        ("EMAIL", {"to": 42}),
        ("REPORT", {"since": "yesterday"}),
    ],
)
def test_unfixable_input_fails_permanently(job_type, payload, user):
    report = _run(job_type, payload, owner_id=user.pk)
    assert report.outcome == Outcome.PERMANENT, report.error


def test_demo_task_echoes_and_fails_its_first_attempts():
    assert _run("DEMO_TASK", {"result": {"x": 1}}).result == {"echo": {"x": 1}, "attempt": 1}
    assert _run("DEMO_TASK", {"fail_times": 1}).outcome == Outcome.RETRYABLE


def test_email_goes_through_django_mail(mailoutbox, user):
    report = _run("EMAIL", {"to": ["a@example.test"], "subject": "s", "body": "b"}, owner_id=user.pk)
    assert report.outcome == Outcome.SUCCEEDED
    assert report.result == {"sent": 1}
    assert mailoutbox[0].to == ["a@example.test"]
