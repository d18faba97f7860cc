"""Reads of the audit trail, scoped to what the asking user may see."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from audit.models import AuditEvent
from scheduler.exceptions import JobNotFound
from scheduler.models import Job


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
