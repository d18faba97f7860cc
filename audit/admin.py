"""The audit trail in the operator console, read-only: events as the consumer stored them."""

from __future__ import annotations

from django.contrib import admin
from django.utils.safestring import SafeString

from audit.models import AuditEvent
from scheduler.admin import EventSearchMixin, OperatorAdmin, job_link


@admin.register(AuditEvent)
class AuditEventAdmin(EventSearchMixin, OperatorAdmin):
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
    search_fields = ("job_id",)
    search_help_text = "A job id or an event id (full)."
    ordering = ("-id",)

    @admin.display(description="job")
    def job(self, event: AuditEvent) -> SafeString:
        """Link to the job (its page may be gone once the job was cleaned up)."""
        return job_link(event.job_id)

    @admin.display(description="transition")
    def transition(self, event: AuditEvent) -> str:
        """from -> to."""
        return f"{event.from_status or '-'} \u2192 {event.to_status}"
