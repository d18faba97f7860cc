"""Reads of jobs, their attempts and results, scoped to what the asking user may see.

Visibility rule (DESIGN.md, REST API): a USER sees their own jobs, an ADMIN sees every job.
A job the actor may not see is reported as missing (``JobNotFound``, 404), never as forbidden,
so that ids of other users' jobs cannot be probed.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from scheduler.exceptions import JobNotFound, NoResult
from scheduler.models import Job, JobAttempt, JobResult
from scheduler.states import AttemptStatus, JobStatus

# Stable order for paging: created_at ties (jobs inserted by one statement share now()) break on id.
NEWEST_FIRST = ("-created_at", "-id")


def job_visible_to(*, actor: Any) -> QuerySet[Job]:
    """Return the jobs ``actor`` (a User) may see: every job for an ADMIN, their own otherwise."""
    if getattr(actor, "is_admin", False):
        return Job.objects.all()
    return Job.objects.filter(owner_id=actor.pk)


def job_list_owned(*, owner: Any) -> QuerySet[Job]:
    """Return ``owner``'s jobs, newest first (also for an ADMIN: the admin list is ``job_list_all``)."""
    return Job.objects.filter(owner_id=owner.pk).order_by(*NEWEST_FIRST)


def job_list_all() -> QuerySet[Job]:
    """Return every owner's jobs, newest first (the ADMIN list)."""
    return Job.objects.order_by(*NEWEST_FIRST)


def job_get(*, job_id: uuid.UUID, actor: Any) -> Job:
    """Return the job ``job_id`` if ``actor`` may see it; raise ``JobNotFound`` otherwise."""
    job = job_visible_to(actor=actor).filter(id=job_id).first()
    if job is None:
        raise JobNotFound()
    return job


def job_attempt_list(*, job_id: uuid.UUID, actor: Any) -> QuerySet[JobAttempt]:
    """Return the attempts of a job ``actor`` may see, first attempt first; raise ``JobNotFound`` otherwise.

    The finished attempts only: a RUNNING job's current attempt has no row until its outcome
    (``job_running_attempt`` describes it).
    """
    if not job_visible_to(actor=actor).filter(id=job_id).exists():
        raise JobNotFound()
    return JobAttempt.objects.filter(job_id=job_id).order_by("attempt_number")


def job_running_attempt(*, job_id: uuid.UUID) -> JobAttempt | None:
    """Return the attempt a RUNNING job is making now, as an unsaved ``JobAttempt``, or None.

    Attempts are written once, at their outcome (``scheduler.leasing``); until then the job row
    (``attempts``, ``lease_owner``, ``started_at``) describes the running one. No access check:
    callers check the job first (``job_attempt_list``).
    """
    row = (
        Job.objects.filter(id=job_id, status=JobStatus.RUNNING)
        .values_list("attempts", "lease_owner", "lease_token", "started_at")
        .first()
    )
    if row is None or not row[0] or JobAttempt.objects.filter(job_id=job_id, attempt_number=row[0]).exists():
        return None
    attempts, worker, token, started_at = row
    return JobAttempt(
        job_id=job_id,
        attempt_number=attempts,
        status=AttemptStatus.RUNNING,
        worker=worker or "",
        lease_token=token,
        started_at=started_at,
    )


def job_result_get(*, job_id: uuid.UUID, actor: Any) -> JobResult:
    """Return the result of a job ``actor`` may see.

    Raises ``JobNotFound`` when the job is missing or not visible, ``NoResult`` (404, code
    ``no_result``) while it has none.
    """
    if not job_visible_to(actor=actor).filter(id=job_id).exists():
        raise JobNotFound()
    result = JobResult.objects.filter(job_id=job_id).first()
    if result is None:
        raise NoResult()
    return result
