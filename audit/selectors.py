"""Reads of the audit trail: a job's events, scoped to what the asking user may see; the trail's health."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max, Q, QuerySet

from audit.models import AuditEvent, QuarantinedMessage
from core.db_clock import age_seconds
from scheduler.exceptions import JobNotFound
from scheduler.maintenance.reconciler import STATE_NAME
from scheduler.models import Job, OutboxReconcile


def job_event_list(*, job_id: uuid.UUID, actor: Any) -> QuerySet[AuditEvent]:
    """Return job ``job_id``'s audit trail ordered by ``sequence``, if ``actor`` may see the job.

    An ADMIN sees every trail, a USER the trails of their own jobs. The owner comes from the job
    or, once the job is deleted (DATA_CLEANUP), from its audit events: the trail outlives the job.
    Raises JobNotFound (404, never 403, so other users' job ids cannot be probed) when neither
    the job nor any event of it exists, or when the actor may not see it. An existing job whose
    events have not arrived yet has an empty trail.
    """
    owners = list(Job.objects.filter(id=job_id).values_list("owner_id", flat=True)[:1])
    if not owners:
        owners = list(AuditEvent.objects.filter(job_id=job_id).values_list("owner_id", flat=True)[:1])
    if not owners:
        raise JobNotFound()
    if not getattr(actor, "is_admin", False) and (owners[0] is None or owners[0] != actor.pk):
        raise JobNotFound()
    return AuditEvent.objects.filter(job_id=job_id).order_by("sequence", "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Trail:
    """The event trail's health: the reconciler's last walk and repairs, and the audit consumer's quarantine."""

    last_reconcile_age_seconds: float | None  # None: the reconciler never ran
    checked_through_age_seconds: float | None  # how far behind now the reconciler has compared everything
    repaired_total: int
    last_repair_age_seconds: float | None
    quarantined: int  # messages in the quarantine (kept AUDIT_QUARANTINE_RETENTION_DAYS)
    quarantined_last_day: int
    newest_quarantined_age_seconds: float | None


def trail_health(*, now: dt.datetime) -> Trail:
    """Read the reconciler's record and count the quarantine (two small queries; ages against ``now``)."""
    state = OutboxReconcile.objects.filter(name=STATE_NAME).first()
    quarantine = QuarantinedMessage.objects.aggregate(
        n=Count("id"),
        last_day=Count("id", filter=Q(received_at__gte=now - dt.timedelta(days=1))),
        newest=Max("received_at"),
    )
    return Trail(
        last_reconcile_age_seconds=age_seconds(now, state.last_run_at) if state else None,
        checked_through_age_seconds=age_seconds(now, state.checked_published_at) if state else None,
        repaired_total=state.repaired_total if state else 0,
        last_repair_age_seconds=age_seconds(now, state.last_repair_at) if state else None,
        quarantined=quarantine["n"] or 0,
        quarantined_last_day=quarantine["last_day"] or 0,
        newest_quarantined_age_seconds=age_seconds(now, quarantine["newest"]),
    )
