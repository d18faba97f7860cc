"""Schedule endpoints (DESIGN.md, REST API): /api/schedules CRUD, /{id}/trigger, /preview.

Thin views: validate the body's shape, call one ``scheduler.schedules`` service, serialize.
Ownership is enforced by the services (``actor``): someone else's schedule is a 404.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.serializers import StrictSerializer
from core.openapi import ERROR_REF
from core.pagination import KeysetPagination
from scheduler import schedules
from scheduler.api.filters import ScheduleFilter
from scheduler.api.serializers import (
    AwareDateTimeField,
    JobFieldsSerializer,
    JobSerializer,
    JobStatusField,
    PriorityLabelField,
    ReportsUnreadable,
    StoredJSONField,
)
from scheduler.api.views import IDEMPOTENCY_HEADER, REPLAYED_HEADER
from scheduler.cron import MAX_INTERVAL_SECONDS, MISFIRE_POLICIES
from scheduler.models import CronSchedule, Job, MisfirePolicy, OverlapPolicy

SCHEDULE_ID = OpenApiParameter("schedule_id", OpenApiTypes.INT, OpenApiParameter.PATH)


# -- request shapes ---------------------------------------------------------------------------


class ScheduleJobSerializer(JobFieldsSerializer):
    """The template of the jobs a schedule fires: the fields of a job request (POST /api/jobs)."""


class ScheduleWriteSerializer(StrictSerializer):
    """Body of POST/PUT (every field) and PATCH (any field) on /api/schedules."""

    name = serializers.CharField(max_length=200)
    cron = serializers.CharField(
        max_length=200,
        allow_null=True,
        required=False,
        help_text="5 fields (m h dom mon dow) or @yearly, @monthly, @weekly, @daily, @midnight, @hourly.",
    )
    interval_seconds = serializers.IntegerField(
        min_value=1, max_value=MAX_INTERVAL_SECONDS, allow_null=True, required=False
    )
    timezone = serializers.CharField(max_length=64, default="UTC", help_text="IANA time zone, e.g. Europe/London.")
    enabled = serializers.BooleanField(default=True)
    misfire_policy = serializers.ChoiceField(choices=MISFIRE_POLICIES, default=MisfirePolicy.SKIP.value)
    overlap_policy = serializers.ChoiceField(choices=OverlapPolicy.values, default=OverlapPolicy.ALLOW.value)
    job = ScheduleJobSerializer()


class SchedulePreviewSerializer(StrictSerializer):
    """Body of POST /api/schedules/preview."""

    cron = serializers.CharField(max_length=200, allow_null=True, required=False)
    interval_seconds = serializers.IntegerField(
        min_value=1, max_value=MAX_INTERVAL_SECONDS, allow_null=True, required=False
    )
    timezone = serializers.CharField(max_length=64, default="UTC")
    start = AwareDateTimeField(required=False, allow_null=True, default=None, help_text="Default: now.")
    count = serializers.IntegerField(min_value=1, max_value=100, default=schedules.NEXT_FIRE_TIMES)


# -- response shapes --------------------------------------------------------------------------


class ScheduleJobReadSerializer(ReportsUnreadable, serializers.Serializer):
    """A schedule's job template as the API shows it."""

    type = serializers.CharField(source="job_type")
    payload = StoredJSONField(source="job_payload")
    priority = PriorityLabelField(source="job_priority_label")
    queue = serializers.CharField(source="job_queue")
    max_retries = serializers.IntegerField(source="job_max_retries")
    timeout_seconds = serializers.IntegerField(source="job_timeout_seconds")
    unreadable_sources: ClassVar[dict[str, str]] = {"payload": "job_payload"}


class ScheduleSerializer(serializers.ModelSerializer):
    """A schedule as the API shows it; ``next_fire_times`` are the next five, UTC ([] while disabled)."""

    owner = serializers.IntegerField(source="owner_id", read_only=True)
    job = ScheduleJobReadSerializer(source="*", read_only=True)
    next_fire_times = serializers.SerializerMethodField()

    class Meta:
        model = CronSchedule
        fields = [
            "id",
            "owner",
            "name",
            "cron",
            "interval_seconds",
            "timezone",
            "enabled",
            "misfire_policy",
            "overlap_policy",
            "job",
            "next_fire_at",
            "last_fired_at",
            "next_fire_times",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_next_fire_times(self, schedule: CronSchedule) -> list[str]:
        """The next five fire times, ISO 8601 UTC."""
        field = serializers.DateTimeField()
        return [field.to_representation(t) for t in schedules.schedule_next_fire_times(schedule)]


class ScheduleRunSerializer(serializers.ModelSerializer):
    """One fire of a schedule: the job it created, its status and how long its last run took."""

    job = serializers.UUIDField(source="id", read_only=True)
    status = JobStatusField()
    duration_seconds = serializers.SerializerMethodField(
        help_text="Seconds from the start of the job's last attempt to its finish; null until it finished."
    )

    class Meta:
        model = Job
        fields = [
            "job",
            "fire_time",
            "status",
            "attempts",
            "scheduled_at",
            "started_at",
            "finished_at",
            "duration_seconds",
            "last_error",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_duration_seconds(self, job: Job) -> float | None:
        """finished_at - started_at in seconds (None while unfinished or never started)."""
        return schedules.run_duration_seconds(job)


class SchedulePreviewResultSerializer(serializers.Serializer):
    """The answer of POST /api/schedules/preview."""

    fire_times = serializers.ListField(child=serializers.DateTimeField())


def _changes(data: dict[str, Any]) -> dict[str, Any]:
    changes = dict(data)
    if "job" in changes:
        changes["job"] = dict(changes["job"])
    return changes


# -- views ------------------------------------------------------------------------------------


class SchedulePagination(KeysetPagination):
    """Schedules by id, paged by key (``core.pagination``)."""

    ordering = ("id",)


@extend_schema_view(
    get=extend_schema(
        operation_id="schedules_list",
        summary="List schedules",
        description=(
            "Your schedules (an ADMIN's: everyone's), by id. `name` finds schedules by their exact name "
            "(a label, not a key: it may match several), as a Celery beat user looks an entry up; "
            "`enabled=true` or `false` and `job_type` (the type of the jobs it fires) narrow the list further. "
            "A bad filter value, or a query parameter this list does not know, is a 400 that names it."
        ),
        tags=["schedules"],
    ),
)
class ScheduleListCreateView(generics.ListAPIView):
    """GET /api/schedules: the caller's schedules (an ADMIN's: everyone's), by id, filtered. POST: create one."""

    serializer_class = ScheduleSerializer
    pagination_class = SchedulePagination
    filterset_class = ScheduleFilter

    def get_queryset(self) -> QuerySet[CronSchedule]:
        """Schedules the caller may see, by id."""
        if getattr(self, "swagger_fake_view", False):
            return CronSchedule.objects.none()
        return schedules.schedule_visible_to(actor=self.request.user)

    @extend_schema(
        operation_id="schedules_create",
        summary="Create a schedule",
        description=(
            "Exactly one of `cron` and `interval_seconds`; 201 with the new schedule. A schedule's name is "
            "not unique: to retry a create safely, send an `Idempotency-Key`. Repeating the same body with "
            "the key returns the original schedule (as it is now) with 200 and `Idempotent-Replayed: true`; "
            "the same key with a different body, or a key that already created a job, is a 409; once the "
            "key's schedule was deleted, the key answers 404 until it expires. 400 on a bad expression, "
            "zone, template or key."
        ),
        tags=["schedules"],
        request=ScheduleWriteSerializer,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="1-255 printable ASCII characters, unique per user for 24 h (shared with job creates).",
            ),
            OpenApiParameter(
                "Location", str, OpenApiParameter.HEADER, response=[200, 201], description="The schedule."
            ),
            OpenApiParameter(
                REPLAYED_HEADER, str, OpenApiParameter.HEADER, response=[200], description="`true` on a replay."
            ),
        ],
        responses={
            201: ScheduleSerializer,
            200: OpenApiResponse(ScheduleSerializer, description="Idempotent replay: the original schedule."),
            404: OpenApiResponse(
                ERROR_REF, description="`not_found`: the schedule this `Idempotency-Key` created was deleted since."
            ),
            409: OpenApiResponse(
                ERROR_REF,
                description="`idempotency_conflict`: this key was used with a different body, or to create a job.",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        """Create the schedule for the caller; 201, or 200 with ``Idempotent-Replayed`` on a replay of its key."""
        body = ScheduleWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = _changes(body.validated_data)
        outcome = schedules.schedule_create_request(
            owner=request.user,
            actor=request.user,
            idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
            **data,
        )
        schedule_id = outcome.schedule.id
        headers = {
            "Location": request.build_absolute_uri(reverse("schedule-detail", kwargs={"schedule_id": schedule_id}))
        }
        if outcome.replayed:
            headers[REPLAYED_HEADER] = "true"
        code = status.HTTP_200_OK if outcome.replayed else status.HTTP_201_CREATED
        return Response(ScheduleSerializer(outcome.schedule).data, status=code, headers=headers)


class ScheduleDetailView(APIView):
    """GET, PUT, PATCH, DELETE /api/schedules/{id}, for its owner or an ADMIN."""

    @extend_schema(
        operation_id="schedules_retrieve",
        summary="Get a schedule",
        tags=["schedules"],
        parameters=[SCHEDULE_ID],
        responses={200: ScheduleSerializer},
    )
    def get(self, request: Request, schedule_id: int) -> Response:
        """Return the schedule; 404 when missing or someone else's."""
        schedule = schedules.schedule_get(schedule_id=schedule_id, actor=request.user)
        return Response(ScheduleSerializer(schedule).data)

    @extend_schema(
        operation_id="schedules_update",
        summary="Replace a schedule",
        description="A change of cron, interval, zone or enabled applies from the scheduler's next tick.",
        tags=["schedules"],
        parameters=[SCHEDULE_ID],
        request=ScheduleWriteSerializer,
        responses={200: ScheduleSerializer},
    )
    def put(self, request: Request, schedule_id: int) -> Response:
        """Replace every writable field (a template field left out takes its default)."""
        return self._update(request, schedule_id, partial=False)

    @extend_schema(
        operation_id="schedules_partial_update",
        summary="Change a schedule",
        description="Setting `cron` clears `interval_seconds` and the other way round; `job` merges.",
        tags=["schedules"],
        parameters=[SCHEDULE_ID],
        request=ScheduleWriteSerializer,
        responses={200: ScheduleSerializer},
    )
    def patch(self, request: Request, schedule_id: int) -> Response:
        """Change the given fields only."""
        return self._update(request, schedule_id, partial=True)

    @extend_schema(
        operation_id="schedules_destroy",
        summary="Delete a schedule",
        tags=["schedules"],
        parameters=[SCHEDULE_ID],
        responses={204: None},
    )
    def delete(self, request: Request, schedule_id: int) -> Response:
        """Delete the schedule; its jobs stay."""
        schedules.schedule_delete(schedule_id=schedule_id, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _update(self, request: Request, schedule_id: int, *, partial: bool) -> Response:
        schedules.schedule_get(schedule_id=schedule_id, actor=request.user)  # 404 before 400
        body = ScheduleWriteSerializer(data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        changes = _changes(body.validated_data)
        if not partial:
            changes.setdefault("cron", None)
            changes.setdefault("interval_seconds", None)
            changes["job"] = {key: changes["job"].get(key) for key in schedules.JOB_KEYS}
        schedule = schedules.schedule_update(schedule_id=schedule_id, actor=request.user, changes=changes)
        return Response(ScheduleSerializer(schedule).data)


class ScheduleRunPagination(KeysetPagination):
    """A schedule's runs, newest fire first, paged by key; the page also carries ``by_status``."""

    ordering = schedules.RUN_ORDER

    def __init__(self) -> None:
        super().__init__()
        self.by_status: dict[str, int] = {}

    def get_paginated_response(self, data: Any) -> Response:
        """``{"count", "next", "previous", "results", "by_status"}``: runs counted by status over all pages."""
        response = super().get_paginated_response(data)
        response.data["by_status"] = self.by_status
        return response

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The page shape plus ``by_status``."""
        shape = super().get_paginated_response_schema(schema)
        shape["required"] = [*shape["required"], "by_status"]
        shape["properties"]["by_status"] = {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "description": "Every kept run of the schedule counted by job status (statuses without runs left out).",
        }
        return shape


@extend_schema_view(
    get=extend_schema(
        operation_id="schedules_runs_list",
        summary="List a schedule's runs, newest fire first",
        description=(
            "Every job the schedule fired (timetabled fires and manual triggers) with its fire time, "
            "status and duration; `by_status` counts them all. Runs are kept as long as their jobs "
            "(the retention rules)."
        ),
        tags=["schedules"],
        parameters=[SCHEDULE_ID],
        responses=ScheduleRunSerializer(many=True),
    ),
)
class ScheduleRunListView(generics.ListAPIView):
    """GET /api/schedules/{id}/runs: the jobs the schedule fired, for its owner or an ADMIN."""

    serializer_class = ScheduleRunSerializer
    pagination_class = ScheduleRunPagination
    filter_backends: list = []

    def get_queryset(self) -> QuerySet[Job]:
        """The schedule's runs; 404 when it is missing or someone else's."""
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        return schedules.schedule_runs(schedule_id=self.kwargs["schedule_id"], actor=self.request.user)

    def paginate_queryset(self, queryset: QuerySet[Job]) -> list[Job] | None:
        """Page the runs and count them by status (one grouped query on the schedule's index)."""
        page = super().paginate_queryset(queryset)
        self.paginator.by_status = schedules.schedule_run_counts(schedule_id=self.kwargs["schedule_id"])
        return page


class ScheduleTriggerView(APIView):
    """POST /api/schedules/{id}/trigger: fire now, once."""

    @extend_schema(
        operation_id="schedules_trigger",
        summary="Fire a schedule now",
        description="Creates one job now (also for a disabled schedule); the timetable is unchanged.",
        tags=["schedules"],
        parameters=[SCHEDULE_ID],
        request=None,
        responses={201: JobSerializer},
    )
    def post(self, request: Request, schedule_id: int) -> Response:
        """Create the job; 201 with it."""
        job = schedules.schedule_trigger(schedule_id=schedule_id, actor=request.user)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)


class SchedulePreviewView(APIView):
    """POST /api/schedules/preview: the fire times that would follow ``start``."""

    @extend_schema(
        operation_id="schedules_preview",
        summary="Preview fire times",
        description="`cron` or `interval_seconds`, `timezone`, `start` (default now), `count` 1-100; UTC times.",
        tags=["schedules"],
        request=SchedulePreviewSerializer,
        responses={200: SchedulePreviewResultSerializer},
    )
    def post(self, request: Request) -> Response:
        """Return the fire times; 400 on a bad expression or zone."""
        body = SchedulePreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        times = schedules.schedule_preview(**body.validated_data)
        return Response(SchedulePreviewResultSerializer({"fire_times": times}).data)
