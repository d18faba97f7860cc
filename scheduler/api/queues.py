"""Queue endpoints (ADMIN): POST /api/admin/queues/{name}/pause and /resume.

Thin views over ``scheduler.queues``: a paused queue's jobs wait QUEUED and workers stop leasing
from it within one poll interval; resuming lets them run. Both are idempotent.
"""

from __future__ import annotations

from collections.abc import Callable

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.openapi import ERROR_REF
from scheduler import queues, selectors
from scheduler.api.views import IsAdminRole
from scheduler.models import Queue

QUEUE_NAME_PARAM = OpenApiParameter(
    "name", OpenApiTypes.STR, OpenApiParameter.PATH, description="1-100 of: letters, digits, '_', '.', ':', '-'."
)


class QueueSerializer(serializers.ModelSerializer):
    """A queue as read: ``name``, ``paused``, ``created_at``, ``updated_at``."""

    class Meta:
        model = Queue
        fields = ["name", "paused", "created_at", "updated_at"]
        read_only_fields = fields


def _queue_schema(summary: str, description: str, operation_id: str) -> extend_schema:
    return extend_schema(
        operation_id=operation_id,
        summary=summary,
        description=description,
        tags=["admin"],
        parameters=[QUEUE_NAME_PARAM],
        request=None,
        responses={
            200: QueueStateSerializer,
            400: OpenApiResponse(ERROR_REF, description="Not a valid queue name."),
            403: OpenApiResponse(ERROR_REF, description="Not an ADMIN."),
        },
    )


class QueueStateSerializer(QueueSerializer):
    """A queue after a pause or resume: the queue, and whether anything uses its name (``flow_names_in_use``)."""

    in_use = serializers.BooleanField(
        read_only=True,
        help_text="False when no job (of any status), schedule, live worker or task names the queue (a typo never "
        "matches); a pause is no use.",
    )
    warning = serializers.CharField(read_only=True, allow_null=True, help_text="Why ``in_use`` is false, or null.")

    class Meta(QueueSerializer.Meta):
        fields = [*QueueSerializer.Meta.fields, "in_use", "warning"]
        read_only_fields = fields


def _changed(request: Request, name: str, change: Callable[..., Queue], *, resumed: bool) -> Response:
    """Apply ``change`` to queue ``name`` as the request's user; answer it with ``in_use`` as it is after the change.

    As the limits' answers are: a pause or resume is no use of the name (nor its queue row), so a
    typo paused twice warns twice. ``change`` checks the name first (400 before any read).
    """
    queue = change(name=name, actor=request.user)
    use = selectors.flow_name_use(scope="queue", name=name, resumed=resumed)
    queue.in_use, queue.warning = use["in_use"], use["warning"]
    return Response(QueueStateSerializer(queue).data)


class QueuePauseView(APIView):
    """POST /api/admin/queues/{name}/pause (ADMIN)."""

    permission_classes = [permissions.IsAuthenticated, IsAdminRole]

    @_queue_schema(
        "Pause a queue (ADMIN)",
        "Workers stop leasing from the queue within one poll interval; its jobs wait QUEUED and nothing "
        "is lost. A queue no job has used yet is created paused. Pausing a paused queue changes nothing.",
        "admin_queues_pause",
    )
    def post(self, request: Request, name: str) -> Response:
        """Pause the queue and return it."""
        return _changed(request, name, queues.queue_pause, resumed=False)


class QueueResumeView(APIView):
    """POST /api/admin/queues/{name}/resume (ADMIN)."""

    permission_classes = [permissions.IsAuthenticated, IsAdminRole]

    @_queue_schema(
        "Resume a queue (ADMIN)",
        "Workers lease from the queue again within one poll interval. Resuming an active queue changes nothing.",
        "admin_queues_resume",
    )
    def post(self, request: Request, name: str) -> Response:
        """Resume the queue and return it."""
        return _changed(request, name, queues.queue_resume, resumed=True)
