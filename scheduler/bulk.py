"""Apply cancel, retry or recover to many jobs through the one-job services, counting what happened.

Each job goes through its own service call (``scheduler.job_actions``), in its own short
transaction, so a bulk action obeys exactly the rules of the API and of a single click: a job
whose state does not allow the action is skipped and counted, never forced; one the service refuses
for another reason (a unique job's live duplicate, a permission) is counted as failed with that
reason, and the batch goes on. Used by the admin's actions and its "all matching jobs" view.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet

from scheduler import job_actions
from scheduler.exceptions import IllegalTransition, JobNotFound, StintError
from scheduler.ids import short_job_id
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
FAILED_IDS_SHOWN = 5  # job ids named per failure reason in the message; the rest are counted
# Seconds of service calls one console request may spend (about 5 ms a job, so some 4,000 jobs):
# well inside the web server's timeout (gunicorn's 60 s), after which the operator would get an
# error page instead of the counts. The jobs left over are counted; applying the action again
# goes on with them (a filtered set re-reads only the jobs still eligible).
CONSOLE_BUDGET_SECONDS = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkFailure:
    """Jobs a service refused for one reason other than their state: its error code, message and the jobs."""

    code: str
    reason: str
    job_ids: tuple[uuid.UUID, ...]

    def sentence(self) -> str:
        """Return e.g. "Failed for 2 jobs (89abcdef, 0123cdef): A live job ... ends."."""
        shown = ", ".join(short_job_id(job_id) for job_id in self.job_ids[:FAILED_IDS_SHOWN])
        more = len(self.job_ids) - FAILED_IDS_SHOWN
        if more > 0:
            shown = f"{shown} and {more} more"
        count = len(self.job_ids)
        return f"Failed for {count} job{'s' if count != 1 else ''} ({shown}): {self.reason.rstrip('.')}."


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkOutcome:
    """Counts of one bulk request: ``requested`` are RUNNING jobs whose cancellation awaits their worker;
    ``failed`` are jobs a service refused for another reason than their state, grouped in ``failures``;
    ``left`` are jobs not handled because the request's time budget ran out (``budget_seconds``)."""

    action: BulkAction
    changed: int = 0
    requested: int = 0
    skipped: int = 0
    missing: int = 0
    failures: tuple[BulkFailure, ...] = ()
    left: int = 0
    budget_seconds: float | None = None

    @property
    def failed(self) -> int:
        """Jobs a service refused for another reason than their state (``failures``)."""
        return sum(len(failure.job_ids) for failure in self.failures)

    @property
    def total(self) -> int:
        """Jobs the request named."""
        return self.changed + self.requested + self.skipped + self.missing + self.failed + self.left

    def message(self) -> str:
        """Return sentences for people, e.g. "Recovered 3 jobs; skipped 1 whose state did not allow it.".

        Each failure reason follows in a sentence of its own (``BulkFailure.sentence``), then the
        jobs left when the time budget ran out, if any.
        """
        parts = [f"{PAST_TENSE[self.action]} {self.changed} job{'s' if self.changed != 1 else ''}"]
        if self.requested:
            parts.append(f"requested cancellation of {self.requested} running")
        parts.append(f"skipped {self.skipped} whose state did not allow it")
        if self.missing:
            parts.append(f"{self.missing} no longer existed")
        sentences = ["; ".join(parts) + ".", *(failure.sentence() for failure in self.failures)]
        if self.left:
            sentences.append(
                f"{self.left} job{'s were' if self.left != 1 else ' was'} not handled: the request stopped at its"
                f" {self.budget_seconds:g} s budget; apply the action again for {'them' if self.left != 1 else 'it'}."
            )
        return " ".join(sentences)


def job_bulk_apply(
    *, action: BulkAction | str, job_ids: Iterable[uuid.UUID], actor: Any = None, budget_seconds: float | None = None
) -> BulkOutcome:
    """Apply ``action`` to each of ``job_ids`` through its service and return the counts.

    ``actor`` is passed on to each service (None: a trusted caller). A job in a state that does
    not allow the action (``IllegalTransition``) is skipped; one deleted meanwhile is missing;
    one refused for another reason, any other ``StintError`` (``UniqueConflict``: a unique job's
    live duplicate) or ``PermissionDenied``, is failed with the error's code and message, as the
    API answers it for that job. Each call is its own transaction, so a refusal never aborts
    the batch. Unexpected errors (a bug, a database that is down) propagate: the jobs already
    handled keep their new state. With ``budget_seconds`` (seconds, >= 0; None: no bound), no
    job is started once that much time has passed, except the first: the rest are counted as
    ``left``, so a request stays inside a web server's timeout (``CONSOLE_BUDGET_SECONDS``).
    """
    action = BulkAction(action)
    service = _SERVICES[action]
    changed = requested = skipped = missing = left = 0
    failed: dict[tuple[str, str], list[uuid.UUID]] = {}
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    for n, job_id in enumerate(job_ids):
        if left or (deadline is not None and n and time.monotonic() >= deadline):  # the first job always runs
            left += 1
            continue
        try:
            job = service(job_id=job_id, actor=actor)
        except IllegalTransition:
            skipped += 1
            continue
        except JobNotFound:
            missing += 1
            continue
        except StintError as exc:
            failed.setdefault((exc.code, str(exc)), []).append(job_id)
            continue
        except PermissionDenied as exc:
            failed.setdefault(("permission_denied", str(exc) or "Permission denied."), []).append(job_id)
            continue
        if action == BulkAction.CANCEL and job.status == JobStatus.RUNNING:
            requested += 1
        else:
            changed += 1
    failures = tuple(
        BulkFailure(code=code, reason=reason, job_ids=tuple(ids)) for (code, reason), ids in failed.items()
    )
    outcome = BulkOutcome(
        action=action,
        changed=changed,
        requested=requested,
        skipped=skipped,
        missing=missing,
        failures=failures,
        left=left,
        budget_seconds=budget_seconds,
    )
    if outcome.total:
        logger.info(
            "bulk %s: %d changed, %d requested, %d skipped, %d missing, %d failed (%s), %d left",
            action,
            changed,
            requested,
            skipped,
            missing,
            outcome.failed,
            ", ".join(f"{f.code}: {len(f.job_ids)}" for f in failures) or "-",
            left,
        )
    return outcome


def job_bulk_apply_filtered(
    *, action: BulkAction | str, queryset: Any, actor: Any = None, budget_seconds: float | None = None
) -> BulkOutcome:
    """Apply ``action`` to every job of ``queryset`` (a ``Job`` queryset) and return the counts.

    Jobs whose status is not in ``ELIGIBLE[action]`` when the set is read are counted as skipped
    without a service call (a filtered set may hold many finished jobs); the rest go through
    ``job_bulk_apply`` (with ``budget_seconds``), whose services re-check the state under a row
    lock.
    """
    action = BulkAction(action)
    rows = list(queryset.order_by().values_list("id", "status"))
    ids = [job_id for job_id, status in rows if status in ELIGIBLE[action]]
    outcome = job_bulk_apply(action=action, job_ids=ids, actor=actor, budget_seconds=budget_seconds)
    return dataclasses.replace(outcome, skipped=outcome.skipped + len(rows) - len(ids))


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkCounts:
    """How many jobs a set holds, and how many of them each bulk action would change now."""

    total: int
    eligible: dict[BulkAction, int]


def jobs_count_for_bulk(*, jobs: QuerySet[Job]) -> BulkCounts:
    """Count ``jobs`` and, for each bulk action, those it would change now (their status is in ``ELIGIBLE``).

    One query, one scan of the set: ``COUNT(*)`` plus a ``COUNT(*) FILTER (WHERE status IN ...)``
    per action over ``jobs`` (any filtered ``Job`` queryset; its ordering is dropped). The
    console's job list uses it as its page count, so the links cost no query of their own. A job
    whose state changes before the action runs is skipped then, so the action may change fewer.
    """
    counts = jobs.order_by().aggregate(
        total=Count("pk"),
        **{action.value: Count("pk", filter=Q(status__in=ELIGIBLE[action])) for action in BulkAction},
    )
    return BulkCounts(total=counts["total"], eligible={action: counts[action.value] for action in BulkAction})
