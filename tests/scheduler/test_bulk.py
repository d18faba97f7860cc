"""Bulk actions (scheduler.bulk): each job through its service; a job the service refuses is counted, never fatal."""

from __future__ import annotations

import pytest

from scheduler.bulk import BulkAction, job_bulk_apply, job_bulk_apply_filtered
from scheduler.models import Job
from scheduler.states import JobStatus
from tests.support.factories import JobFactory
from tests.support.jobs import finished_unique_and_plain

pytestmark = pytest.mark.django_db

CONFLICT = "A live job with the same unique content exists"


def _status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(id=job.id)


@pytest.mark.parametrize(
    ("action", "finished", "moved_to"),
    [
        (BulkAction.RECOVER, JobStatus.DEAD, JobStatus.QUEUED),
        (BulkAction.RETRY, JobStatus.FAILED, JobStatus.RETRYING),
    ],
)
def test_a_unique_conflict_is_counted_as_failed_with_its_reason_and_the_rest_is_applied(
    user, action, finished, moved_to
):
    a, b, c = finished_unique_and_plain(user, finished)

    result = job_bulk_apply(action=action, job_ids=[a.id, b.id])

    assert (result.changed, result.skipped, result.missing, result.failed, result.total) == (1, 0, 0, 1, 2)
    (failure,) = result.failures
    assert failure.job_ids == (a.id,)
    assert failure.code == "unique_conflict"
    assert failure.reason.startswith(CONFLICT)
    assert CONFLICT in result.message()
    assert (_status(a), _status(b), _status(c)) == (finished, moved_to, JobStatus.QUEUED)


def test_a_refused_permission_is_counted_as_failed_and_the_batch_goes_on(user, other_user):
    own_dead = JobFactory(owner=user, dead=True)
    others_dead = JobFactory(owner=other_user, dead=True)  # a job the USER cannot see: missing

    result = job_bulk_apply(action=BulkAction.RECOVER, job_ids=[own_dead.id, others_dead.id], actor=user)

    assert (result.changed, result.missing, result.failed) == (0, 1, 1)
    assert result.failures[0].code == "permission_denied"
    assert "Only an ADMIN may do this." in result.message()
    assert _status(own_dead) == _status(others_dead) == JobStatus.DEAD


def test_failures_with_the_same_reason_are_reported_once_with_their_ids(user):
    jobs = JobFactory.create_batch(7, owner=user, dead=True)

    result = job_bulk_apply(action=BulkAction.RECOVER, job_ids=[j.id for j in jobs], actor=user)

    assert result.failed == 7
    assert len(result.failures) == 1
    message = result.message()
    assert message.count("Only an ADMIN may do this.") == 1
    assert "and 2 more" in message


def test_a_request_stops_at_its_time_budget_and_counts_the_jobs_it_left_for_the_next(user):
    # Each job is its own service call (about 5 ms): 10,000 took 47 s, near the web server's 60 s
    # timeout, after which the operator saw an error page and no counts. A budget of 0 s still
    # handles one job per request, so applying it again always makes progress.
    jobs = JobFactory.create_batch(3, owner=user, dead=True)
    ids = [j.id for j in jobs]

    first = job_bulk_apply(action=BulkAction.RECOVER, job_ids=ids, budget_seconds=0)

    assert (first.changed, first.left, first.total) == (1, 2, 3)
    assert first.message() == (
        "Recovered 1 job; skipped 0 whose state did not allow it."
        " 2 jobs were not handled: the request stopped at its 0 s budget; apply the action again for them."
    )
    assert sorted(_status(j) for j in jobs) == [JobStatus.DEAD, JobStatus.DEAD, JobStatus.QUEUED]
    second = job_bulk_apply_filtered(action=BulkAction.RECOVER, queryset=Job.objects.all(), budget_seconds=0)
    assert (second.changed, second.skipped, second.left) == (1, 1, 1)
    third = job_bulk_apply_filtered(action=BulkAction.RECOVER, queryset=Job.objects.all(), budget_seconds=0)
    assert (third.changed, third.skipped, third.left) == (1, 2, 0)
    assert "not handled" not in third.message()
    assert {_status(j) for j in jobs} == {JobStatus.QUEUED}
    everything = job_bulk_apply(action=BulkAction.CANCEL, job_ids=ids)  # no budget: all of them
    assert (everything.changed, everything.left) == (3, 0)
