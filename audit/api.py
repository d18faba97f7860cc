"""GET /api/jobs/{id}/events: a job's audit trail (DESIGN.md, REST API and Field names)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers

from audit import selectors
from audit.models import AuditEvent
from core.pagination import KeysetPagination


class AuditEventSerializer(serializers.ModelSerializer):
    """An audit event as read: ``from_status`` is null for JOB_CREATED."""

    from_status = serializers.CharField(allow_null=True, read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["event_id", "event_type", "sequence", "attempt", "from_status", "to_status", "occurred_at"]
        read_only_fields = fields

    def to_representation(self, instance: AuditEvent) -> dict[str, Any]:
        """Serialize, with the stored empty ``from_status`` as null."""
        data = super().to_representation(instance)
        data["from_status"] = data["from_status"] or None
        return data


class EventPagination(KeysetPagination):
    """A job's events in sequence order, paged by key (``core.pagination``); ``page_size`` up to 200."""

    ordering = ("sequence", "id")


@extend_schema_view(
    get=extend_schema(
        operation_id="jobs_events_list",
        summary="List a job's audit trail, in sequence order",
        tags=["jobs"],
        responses=AuditEventSerializer(many=True),
    ),
)
class JobEventListView(generics.ListAPIView):
    """GET /api/jobs/{id}/events: the owner's or an admin's view of the job's lifecycle events; paginated.

    The trail is what the audit consumer has stored so far: events reach it within moments of
    their transition while Kafka is up, and after it returns otherwise.
    """

    serializer_class = AuditEventSerializer
    pagination_class = EventPagination
    filter_backends: list = []

    def get_queryset(self) -> QuerySet[AuditEvent]:
        """The job's events ordered by sequence; 404 when the job is missing or someone else's."""
        if getattr(self, "swagger_fake_view", False):
            return AuditEvent.objects.none()
        return selectors.job_event_list(job_id=self.kwargs["job_id"], actor=self.request.user)
