"""Actions on an existing job: cancel, retry and recover, each checked against the actor and written by ``lifecycle``.

Views, pages, the admin (through ``scheduler.bulk``) and code call these; ``actor`` None is a
trusted caller. A job the actor cannot see is JobNotFound (404, never 403, so ids cannot be
probed); a move the job's state does not allow is IllegalTransition (409). A move made for an
actor is recorded in the operator action history (``scheduler.action_log``) in the move's
transaction, whether an ADMIN or the job's owner made it: "who cancelled this job" has one answer.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.admin.models import CHANGE
from django.core.exceptions import PermissionDenied
from django.db import transaction

from scheduler import lifecycle, selectors
from scheduler.action_log import action_record
from scheduler.conf import conf
from scheduler.exceptions import IllegalTransition, JobNotFound
from scheduler.models import Job
from scheduler.notify import notify_queued
from scheduler.states import CANCELLABLE, JobStatus

# A cancel that races a job's own moves (e.g. RUNNING -> RETRYING between our two statements) retries.
CANCEL_TRIES = 3


def _current_status(job_id: uuid.UUID) -> str:
    status = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
    if status is None:
        raise JobNotFound()
    return status


def _authorize(*, job_id: uuid.UUID, actor: Any, admin_only: bool = False) -> None:
    """Check that ``actor`` may act on the job; None is a trusted caller (admin site, command, code).

    A job the actor cannot see raises JobNotFound (404, never 403, so ids cannot be probed);
    an ``admin_only`` action on a job they can see raises PermissionDenied (403).
    """
    if actor is None:
        return
    if not selectors.job_visible_to(actor=actor).filter(id=job_id).exists():
        raise JobNotFound()
    if admin_only and not getattr(actor, "is_admin", False):
        raise PermissionDenied("Only an ADMIN may do this.")


@transaction.atomic
def job_cancel(*, job_id: uuid.UUID, actor: Any = None) -> Job:
    """Cancel a job: CREATED/SCHEDULED/QUEUED/RETRYING move to CANCELLED at once; RUNNING gets
    ``cancel_requested`` and moves to CANCELLED when its handler stops (DESIGN.md).

    ``actor`` (a User, or None for a trusted caller) must own the job or be an ADMIN. Returns the
    job as it is now: still RUNNING (with ``cancel_requested``) when the stop is up to its worker.
    Raises JobNotFound, or IllegalTransition (409) from a finished state.
    """
    _authorize(job_id=job_id, actor=actor)
    for _ in range(CANCEL_TRIES):
        moved = lifecycle.cancel(job_id)
        if moved is not None:
            message = f"Cancelled ({moved.from_status} → CANCELLED)."
            break
        # The worker that holds the lease makes the RUNNING -> CANCELLED move.
        if lifecycle.request_cancel(job_id):
            message = "Requested cancellation (RUNNING: its worker stops it)."
            break
        status = _current_status(job_id)
        if status not in CANCELLABLE and status != JobStatus.RUNNING:
            raise IllegalTransition(f"A {status} job cannot be cancelled.", details={"status": status})
        # The job moved between our two statements into a state we can act on: go again.
    else:
        status = _current_status(job_id)
        raise IllegalTransition(f"The job kept changing state ({status}); try again.", details={"status": status})
    return _recorded(job_id=job_id, actor=actor, message=message)


def _recorded(*, job_id: uuid.UUID, actor: Any, message: str) -> Job:
    """Read the job as it is now and record ``message`` for ``actor`` on it (``action_log``); return the job."""
    job = Job.objects.get(id=job_id)
    action_record(actor=actor, objects=[job], flag=CHANGE, message=message)
    return job


DEAD_RECOVERY_MESSAGE = (
    "This job is DEAD: it used every attempt of its budget (dead-lettered). Only an ADMIN can recover it "
    "(POST /api/jobs/{id}/recover, or the operator console); ask one."
)


def dead_retry_allowed() -> bool:
    """True when owners may retry their own DEAD jobs (``STINT_OWNERS_MAY_RETRY_DEAD``; default off)."""
    return conf().owners_may_retry_dead


@transaction.atomic
def job_retry(*, job_id: uuid.UUID, actor: Any = None) -> Job:
    """Retry a FAILED job now with a fresh attempt budget (FAILED -> RETRYING, due immediately).

    ``actor`` (a User, or None for a trusted caller) must own the job or be an ADMIN. A stale
    ``cancel_requested`` from the failed run is cleared so the new run is not cancelled at once.
    A DEAD job is recovery, an ADMIN's action (DESIGN.md); when an ADMIN has set
    ``STINT_OWNERS_MAY_RETRY_DEAD``, its owner's retry makes the same move as ``job_recover``
    (DEAD -> QUEUED with a fresh budget, JOB_RECOVERED with reason ``owner_retry``). Raises
    JobNotFound, or IllegalTransition (409) from any other state, whose message says who may
    recover a DEAD job, or UniqueConflict (409) for a unique job whose live duplicate exists.
    """
    _authorize(job_id=job_id, actor=actor)
    from scheduler.flow.unique import guard  # a unique job's live duplicate: 409, not a database error

    with guard():
        moved = lifecycle.retry_failed(job_id, reason="manual_retry")
    if moved is None and dead_retry_allowed():
        return _recover(job_id=job_id, reason="owner_retry", actor=actor)
    if moved is None:
        status = _current_status(job_id)
        message = f"Only a FAILED job can be retried; this one is {status}."
        if status == JobStatus.DEAD:
            message = f"{message} {DEAD_RECOVERY_MESSAGE}"
        raise IllegalTransition(message, details={"status": status})
    return _recorded(job_id=job_id, actor=actor, message=f"Retried ({moved.from_status} → RETRYING).")


@transaction.atomic
def job_recover(*, job_id: uuid.UUID, actor: Any = None) -> Job:
    """Put a DEAD job back on its queue with a fresh attempt budget (DEAD -> QUEUED).

    ``actor`` (a User, or None for a trusted caller) must be an ADMIN: a USER gets JobNotFound
    for another's job and PermissionDenied (403) for their own. Raises JobNotFound, or
    IllegalTransition (409) from any state but DEAD.
    """
    _authorize(job_id=job_id, actor=actor, admin_only=True)
    return _recover(job_id=job_id, reason=None, actor=actor)


def _recover(*, job_id: uuid.UUID, reason: str | None, actor: Any) -> Job:
    """DEAD -> QUEUED (the table's recover transition) with a fresh budget; raise IllegalTransition otherwise."""
    from scheduler.flow.unique import guard  # a unique job's live duplicate: 409, not a database error

    with guard():
        moved = lifecycle.recover(job_id, reason=reason)
    if moved is None:
        status = _current_status(job_id)
        raise IllegalTransition(
            f"Only a FAILED or DEAD job can be retried; this one is {status}."
            if reason
            else f"Only a DEAD job can be recovered; this one is {status}.",
            details={"status": status},
        )
    verb = "Retried (recovered: " if reason else "Recovered ("
    job = _recorded(job_id=job_id, actor=actor, message=f"{verb}DEAD → QUEUED, fresh attempt budget).")
    notify_queued([job.queue])
    return job
