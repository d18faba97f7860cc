"""Apply cancel, retry or recover to many jobs through the one-job services, counting what happened.

Each job goes through its own service call (``scheduler.job_actions``), in its own short
transaction, so a bulk action obeys exactly the rules of the API and of a single click: a job
whose state does not allow the action is skipped and counted, never forced. Used by the admin's
actions and its "all matching jobs" view.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from scheduler import job_actions
from scheduler.exceptions import IllegalTransition, JobNotFound
from scheduler.models import Job
from scheduler.states import CANCELLABLE, JobStatus

logger = logging.getLogger(__name__)


class BulkAction(enum.StrEnum):
    """What a bulk request does to each job."""

    CANCEL = "cancel"
    RETRY = "retry"
    RECOVER = "recover"


# Statuses in which each action can change a job (RUNNING: cancellation is requested of its worker).
ELIGIBLE: dict[BulkAction, frozenset[str]] = {
    BulkAction.CANCEL: frozenset(CANCELLABLE | {JobStatus.RUNNING}),
    BulkAction.RETRY: frozenset({JobStatus.FAILED}),
    BulkAction.RECOVER: frozenset({JobStatus.DEAD}),
}

_SERVICES: dict[BulkAction, Callable[..., Job]] = {
    BulkAction.CANCEL: job_actions.job_cancel,
    BulkAction.RETRY: job_actions.job_retry,
    BulkAction.RECOVER: job_actions.job_recover,
}

PAST_TENSE = {BulkAction.CANCEL: "Cancelled", BulkAction.RETRY: "Retried", BulkAction.RECOVER: "Recovered"}


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkOutcome:
    """Counts of one bulk request: ``requested`` are RUNNING jobs whose cancellation awaits their worker."""

    action: BulkAction
    changed: int = 0
    requested: int = 0
    skipped: int = 0
    missing: int = 0

    @property
    def total(self) -> int:
        """Jobs the request named."""
        return self.changed + self.requested + self.skipped + self.missing

    def message(self) -> str:
        """Return one sentence for people, e.g. "Recovered 3 jobs; skipped 1 whose state did not allow it."."""
        parts = [f"{PAST_TENSE[self.action]} {self.changed} job{'s' if self.changed != 1 else ''}"]
        if self.requested:
            parts.append(f"requested cancellation of {self.requested} running")
        parts.append(f"skipped {self.skipped} whose state did not allow it")
        if self.missing:
            parts.append(f"{self.missing} no longer existed")
        return "; ".join(parts) + "."


def job_bulk_apply(*, action: BulkAction | str, job_ids: Iterable[uuid.UUID], actor: Any = None) -> BulkOutcome:
    """Apply ``action`` to each of ``job_ids`` through its service and return the counts.

    ``actor`` is passed on to each service (None: a trusted caller). A job in a state that does
    not allow the action (``IllegalTransition``) is skipped; one deleted meanwhile is missing.
    Other errors propagate: the jobs already handled keep their new state.
    """
    action = BulkAction(action)
    service = _SERVICES[action]
    changed = requested = skipped = missing = 0
    for job_id in job_ids:
        try:
            job = service(job_id=job_id, actor=actor)
        except IllegalTransition:
            skipped += 1
            continue
        except JobNotFound:
            missing += 1
            continue
        if action == BulkAction.CANCEL and job.status == JobStatus.RUNNING:
            requested += 1
        else:
            changed += 1
    outcome = BulkOutcome(action=action, changed=changed, requested=requested, skipped=skipped, missing=missing)
    if outcome.total:
        logger.info(
            "bulk %s: %d changed, %d requested, %d skipped, %d missing",
            action,
            changed,
            requested,
            skipped,
            missing,
        )
    return outcome


def job_bulk_apply_filtered(*, action: BulkAction | str, queryset: Any, actor: Any = None) -> BulkOutcome:
    """Apply ``action`` to every job of ``queryset`` (a ``Job`` queryset) and return the counts.

    Jobs whose status is not in ``ELIGIBLE[action]`` when the set is read are counted as skipped
    without a service call (a filtered set may hold many finished jobs); the rest go through
    ``job_bulk_apply``, whose services re-check the state under a row lock.
    """
    action = BulkAction(action)
    rows = list(queryset.order_by().values_list("id", "status"))
    ids = [job_id for job_id, status in rows if status in ELIGIBLE[action]]
    outcome = job_bulk_apply(action=action, job_ids=ids, actor=actor)
    return BulkOutcome(
        action=action,
        changed=outcome.changed,
        requested=outcome.requested,
        skipped=outcome.skipped + len(rows) - len(ids),
        missing=outcome.missing,
    )
