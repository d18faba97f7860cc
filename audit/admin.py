"""The audit trail in the operator console, read-only: events as the consumer stored them, and its quarantine."""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from audit.models import AuditEvent, QuarantinedMessage
from audit.quarantine import MAX_VALUE_BYTES, clean_text
from audit.timeline import job_timeline
from scheduler.admin import EventListMixin, JobAdmin, OperatorAdmin, job_link
from scheduler.models import Job

PREVIEW_CHARS = 80  # characters of an error or value shown in the list


# The job page gains the audit trail here, in the app that owns it: the scheduler never imports audit.
admin.site.unregister(Job)


@admin.register(Job)
class JobWithTrailAdmin(JobAdmin):
    """``scheduler.admin.JobAdmin`` plus the job's event timeline (audit trail, completed from the outbox)."""

    readonly_fields = (*JobAdmin.readonly_fields, "timeline")
    fieldsets = (*JobAdmin.fieldsets, ("Timeline", {"fields": ("timeline",)}))

    @admin.display(description="event timeline")
    def timeline(self, job: Job) -> SafeString:
        """The job's lifecycle events in sequence order (``audit.timeline.job_timeline``)."""
        rows = [(e, e.occurred_at.isoformat(timespec="milliseconds")) for e in job_timeline(job_id=job.id)]
        return SafeString(render_to_string("admin/scheduler/job/_timeline.html", {"rows": rows}))


@admin.register(AuditEvent)
class AuditEventAdmin(EventListMixin, OperatorAdmin):
    """Audit events, newest first; searchable by job id or event id, filterable by type."""

    list_display = (
        "id",
        "event_type",
        "job",
        "sequence",
        "transition",
        "attempt",
        "owner_id",
        "occurred_at",
        "received_at",
    )
    list_filter = ("event_type",)


def _bytes_text(value: bytes | memoryview | None) -> str:
    """Bytes shown as text: UTF-8 where it decodes, ``\\xNN`` escapes where it does not; NUL escaped."""
    if value is None:
        return "(null)"
    return clean_text(bytes(value).decode("utf-8", "backslashreplace"), 4 * MAX_VALUE_BYTES)


@admin.register(QuarantinedMessage)
class QuarantinedMessageAdmin(OperatorAdmin):
    """Messages the audit consumer set aside, newest first: where they were, what they held, and why."""

    list_display = ("id", "received_at", "reason", "where", "job", "short_error", "value_preview")
    list_filter = ("reason", "topic")
    search_fields = ("job_id",)
    search_help_text = "A job id or an event id (full), or words of the error."
    ordering = ("-id",)
    fields = (
        "received_at",
        "reason",
        "topic",
        "partition",
        "offset",
        "event_id",
        "job",
        "error",
        "key_text",
        "value_size",
        "value_text",
    )
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[QuarantinedMessage], search_term: str
    ) -> tuple[QuerySet[QuarantinedMessage], bool]:
        """Exact job id or event id; any other term matches the error text."""
        term = search_term.strip()
        try:
            value = uuid.UUID(term)
        except ValueError:
            return (queryset.filter(error__icontains=term) if term else queryset), False
        return queryset.filter(Q(job_id=value) | Q(event_id=value)), False

    @admin.display(description="message", ordering="offset")
    def where(self, message: QuarantinedMessage) -> str:
        """topic[partition]@offset."""
        return f"{message.topic}[{message.partition}]@{message.offset}"

    @admin.display(description="job")
    def job(self, message: QuarantinedMessage) -> SafeString | str:
        """Link to the job, when the value parsed far enough to name one."""
        return job_link(message.job_id) if message.job_id else "-"

    @admin.display(description="error")
    def short_error(self, message: QuarantinedMessage) -> str:
        """The error, cut for the list."""
        return Truncator(message.error).chars(PREVIEW_CHARS)

    @admin.display(description="value")
    def value_preview(self, message: QuarantinedMessage) -> str:
        """The start of the raw value."""
        return Truncator(_bytes_text(message.value)).chars(PREVIEW_CHARS)

    @admin.display(description="value (as received, cut to 64 KiB)")
    def value_text(self, message: QuarantinedMessage) -> str:
        """The raw value as text."""
        return _bytes_text(message.value)

    @admin.display(description="key")
    def key_text(self, message: QuarantinedMessage) -> str:
        """The raw key as text."""
        return _bytes_text(message.key)
