"""Built-in handlers (DESIGN.md, "Field names and built-in handlers")."""

from __future__ import annotations

import datetime as dt
from typing import Any

from scheduler.exceptions import PermanentError, RetryableError
from scheduler.registry import JobContext, handler

MAX_CLEANUP_DAYS = 36500  # days; larger values overflow a datetime


@handler("DEMO_TASK")
def demo_task(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Sleep ``sleep_seconds``, fail the first ``fail_times`` attempts, then echo ``result``.

    A payload that is not an object, or numbers that are not numbers, fail permanently: no retry
    can fix them.
    """
    payload = payload or {}
    if not isinstance(payload, dict):
        raise PermanentError("DEMO_TASK's payload must be an object")
    try:
        sleep_seconds = float(payload.get("sleep_seconds", 0) or 0)
        fail_times = int(payload.get("fail_times", 0) or 0)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PermanentError(f"sleep_seconds and fail_times must be numbers: {exc}") from exc
    if not 0 <= sleep_seconds <= 3600:
        raise PermanentError("sleep_seconds must be between 0 and 3600")
    ctx.sleep(sleep_seconds)
    if ctx.attempt <= fail_times:
        raise RetryableError(f"DEMO_TASK failing on purpose (attempt {ctx.attempt})")
    return {"echo": payload.get("result"), "attempt": ctx.attempt}


@handler("FAILING")
def failing(payload: Any, ctx: JobContext) -> None:
    """Always raise a retryable error."""
    raise RetryableError("FAILING always fails")


@handler("REPORT")
def report(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Count the owner's jobs by status and by type, optionally only those created ``since`` a date."""
    from django.db.models import Count

    from scheduler.models import Job

    jobs = Job.objects.filter(owner_id=ctx.owner_id)
    since = payload.get("since") if isinstance(payload, dict) else None
    if since:
        try:
            day = dt.date.fromisoformat(since)
        except (TypeError, ValueError) as exc:
            raise PermanentError(f"since must be an ISO date, got {since!r}") from exc
        jobs = jobs.filter(created_at__date__gte=day)
    by_status = dict(jobs.values_list("status").annotate(n=Count("id")).order_by())
    by_type = dict(jobs.values_list("type").annotate(n=Count("id")).order_by())
    return {"by_status": by_status, "by_type": by_type, "total": sum(by_status.values())}


@handler("DATA_CLEANUP")
def data_cleanup(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    """Delete the owner's finished jobs older than ``older_than_days`` (>= 1); return how many."""
    from django.db.models import Q
    from django.utils import timezone

    from scheduler.models import Job
    from scheduler.states import FINISHED

    days = (payload or {}).get("older_than_days") if isinstance(payload, dict) else None
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= MAX_CLEANUP_DAYS:
        raise PermanentError(f"older_than_days must be an integer from 1 to {MAX_CLEANUP_DAYS}")
    cutoff = timezone.now() - dt.timedelta(days=days)
    old = Job.objects.filter(owner_id=ctx.owner_id, status__in=FINISHED).filter(
        Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, updated_at__lt=cutoff)
    )
    _, per_model = old.exclude(id=ctx.job_id).delete()
    return {"deleted": per_model.get("scheduler.Job", 0)}


@handler("EMAIL")
def email(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Send ``subject``/``body`` to ``to`` (one address or a list) through Django's email backend."""
    from django.core.mail import BadHeaderError, send_mail

    payload = payload if isinstance(payload, dict) else {}
    to = payload.get("to")
    recipients = [to] if isinstance(to, str) else to
    if (
        not isinstance(recipients, list)
        or not recipients
        or not all(isinstance(r, str) and "@" in r for r in recipients)
    ):
        raise PermanentError("to must be an email address or a list of them")
    try:
        sent = send_mail(str(payload.get("subject", "")), str(payload.get("body", "")), None, recipients)
    except BadHeaderError as exc:  # a newline in a header: retrying cannot help
        raise PermanentError(f"invalid header: {exc}") from exc
    return {"sent": sent}
