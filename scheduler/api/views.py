"""Job endpoints (DESIGN.md, REST API). Each view validates, calls one service or selector, serializes.

Ownership is enforced below the views: services and selectors take the requesting user as
``actor`` and answer 404 for another user's job, so no endpoint can forget the check.
"""

from __future__ import annotations

import uuid

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics, permissions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.openapi import ERROR_REF
from core.pagination import KeysetPagination
from scheduler import enqueuing, job_actions, selectors
from scheduler.api.filters import AdminJobFilter, JobFilter
from scheduler.api.serializers import (
    JobAttemptSerializer,
    JobCreateSerializer,
    JobResultSerializer,
    JobSerializer,
)
from scheduler.models import Attempt, Job
from scheduler.states import JobStatus

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
UNIQUE_DUPLICATE_HEADER = "Unique-Duplicate"  # a unique job's live duplicate was returned (scheduler.flow.unique)


class JobPagination(KeysetPagination):
    """Jobs newest first, paged by key (``core.pagination``); ``page_size`` up to 200."""

    ordering = selectors.NEWEST_FIRST


class AttemptPagination(KeysetPagination):
    """A job's attempts, first first (``attempt_number`` is unique within a job)."""

    ordering = ("attempt_number",)


class IsAdminRole(permissions.BasePermission):
    """Only users with the ADMIN role."""

    message = "Only an ADMIN may do this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        """True for an authenticated ADMIN."""
        return bool(request.user is not None and getattr(request.user, "is_admin", False))


def _error(description: str) -> OpenApiResponse:
    # The envelope component is core.openapi's, which also documents the generic 400/401/404/413.
    return OpenApiResponse(ERROR_REF, description=description)


INVALID_STATE = _error("`invalid_state`: the job's status does not allow this action.")


JOB_ID = OpenApiParameter("job_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


@extend_schema_view(
    get=extend_schema(
        operation_id="jobs_list",
        summary="List your jobs, newest first",
        tags=["jobs"],
        responses=JobSerializer(many=True),
    ),
)
class JobListCreateView(generics.ListAPIView):
    """GET /api/jobs: the caller's jobs. POST /api/jobs: create a job, idempotently with a key."""

    serializer_class = JobSerializer
    filterset_class = JobFilter
    pagination_class = JobPagination

    def get_queryset(self) -> QuerySet[Job]:
        """The caller's own jobs (an ADMIN's too: all owners are under /api/admin/jobs)."""
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        return selectors.job_list_owned(owner=self.request.user)

    @extend_schema(
        operation_id="jobs_create",
        summary="Create a job",
        description=(
            "201 with the new job. With an `Idempotency-Key`, repeating the same body returns the "
            "original job with 200 and `Idempotent-Replayed: true`; the same key with a different "
            "body is a 409. With `unique`, a live job of the same content is returned with 200 and "
            "`Unique-Duplicate: true`. Unknown fields are a 400; a payload over 10 KB is a 413."
        ),
        tags=["jobs"],
        request=JobCreateSerializer,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="1-255 printable ASCII characters, unique per user for 24 h.",
            ),
            OpenApiParameter("Location", str, OpenApiParameter.HEADER, response=[200, 201], description="The job."),
            OpenApiParameter(
                REPLAYED_HEADER, str, OpenApiParameter.HEADER, response=[200], description="`true` on a replay."
            ),
            OpenApiParameter(
                UNIQUE_DUPLICATE_HEADER,
                str,
                OpenApiParameter.HEADER,
                response=[200],
                description="`true` when `unique` found a live duplicate: the body is that job.",
            ),
        ],
        responses={
            201: JobSerializer,
            200: OpenApiResponse(JobSerializer, description="Idempotent replay: the original job."),
            409: _error("`idempotency_conflict`: this key was used with a different body."),
            413: _error("`payload_too_large`: the payload is over 10 KB, or the body far over."),
        },
    )
    def post(self, request: Request) -> Response:
        """Validate the body, enqueue through the one service path, answer 201 (or 200 on replay)."""
        body = JobCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        outcome = enqueuing.enqueue_request(
            data["type"],
            data["payload"],
            priority=data["priority"],
            queue=data["queue"],
            scheduled_at=data["scheduled_at"],
            max_retries=data.get("max_retries"),
            timeout_seconds=data.get("timeout_seconds"),
            idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
            owner=request.user,
            name=data["name"],
            unique=data["unique"],
        )
        headers = {"Location": request.build_absolute_uri(reverse("job-detail", kwargs={"job_id": outcome.job.id}))}
        if outcome.replayed:
            headers[REPLAYED_HEADER] = "true"
        if outcome.duplicate:
            headers[UNIQUE_DUPLICATE_HEADER] = "true"
        code = status.HTTP_200_OK if outcome.replayed or outcome.duplicate else status.HTTP_201_CREATED
        return Response(JobSerializer(outcome.job).data, status=code, headers=headers)


@extend_schema_view(
    get=extend_schema(
        operation_id="admin_jobs_list",
        summary="List every owner's jobs (ADMIN)",
        tags=["admin"],
        responses={200: JobSerializer(many=True), 403: _error("Not an ADMIN.")},
    ),
)
class AdminJobListView(generics.ListAPIView):
    """GET /api/admin/jobs: all owners' jobs, ADMIN only, with an ``owner`` filter."""

    serializer_class = JobSerializer
    filterset_class = AdminJobFilter
    pagination_class = JobPagination
    permission_classes = [permissions.IsAuthenticated, IsAdminRole]

    def get_queryset(self) -> QuerySet[Job]:
        """Every job, newest first."""
        return selectors.job_list_all()


class JobDetailView(APIView):
    """GET /api/jobs/{id}: one job, for its owner or an ADMIN."""

    @extend_schema(
        operation_id="jobs_retrieve",
        summary="Get a job",
        tags=["jobs"],
        parameters=[JOB_ID],
        responses={200: JobSerializer, 404: _error("No such job, or not yours.")},
    )
    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        """Return the job; 404 when it is missing or someone else's."""
        return Response(JobSerializer(selectors.job_get(job_id=job_id, actor=request.user)).data)


class JobCancelView(APIView):
    """POST /api/jobs/{id}/cancel."""

    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job",
        description=(
            "200 with the CANCELLED job. A RUNNING job cannot be stopped from here: it gets "
            "`cancel_requested` and the answer is 202; its worker moves it to CANCELLED when the "
            "handler stops. 409 from a finished state."
        ),
        tags=["jobs"],
        parameters=[JOB_ID],
        request=None,
        responses={
            200: JobSerializer,
            202: OpenApiResponse(JobSerializer, description="Cancellation requested of a RUNNING job."),
            409: INVALID_STATE,
        },
    )
    def post(self, request: Request, job_id: uuid.UUID) -> Response:
        """Cancel the job, or request cancellation while it runs."""
        job = job_actions.job_cancel(job_id=job_id, actor=request.user)
        code = status.HTTP_202_ACCEPTED if job.status == JobStatus.RUNNING else status.HTTP_200_OK
        return Response(JobSerializer(job).data, status=code)


class JobRetryView(APIView):
    """POST /api/jobs/{id}/retry."""

    @extend_schema(
        operation_id="jobs_retry",
        summary="Retry a FAILED job",
        description=(
            "FAILED -> RETRYING, due now, with a fresh attempt budget. A DEAD job is recovered by an ADMIN "
            "(`/recover`): its owner's retry is a 409 saying so, unless the server sets "
            "`STINT_OWNERS_MAY_RETRY_DEAD`, when it moves DEAD -> QUEUED with a fresh budget (JOB_RECOVERED). "
            "409 from any other state."
        ),
        tags=["jobs"],
        parameters=[JOB_ID],
        request=None,
        responses={200: JobSerializer, 409: INVALID_STATE},
    )
    def post(self, request: Request, job_id: uuid.UUID) -> Response:
        """Retry the job."""
        return Response(JobSerializer(job_actions.job_retry(job_id=job_id, actor=request.user)).data)


class JobRecoverView(APIView):
    """POST /api/jobs/{id}/recover (ADMIN)."""

    @extend_schema(
        operation_id="jobs_recover",
        summary="Recover a DEAD job (ADMIN)",
        description=(
            "DEAD -> QUEUED with a fresh attempt budget. A USER gets 403 for their own job and 404 "
            "for anyone else's. 409 from any state but DEAD."
        ),
        tags=["admin"],
        parameters=[JOB_ID],
        request=None,
        responses={
            200: JobSerializer,
            403: _error("A USER asking to recover their own job."),
            404: _error("No such job, or a USER asking about someone else's."),
            409: INVALID_STATE,
        },
    )
    def post(self, request: Request, job_id: uuid.UUID) -> Response:
        """Recover the job."""
        return Response(JobSerializer(job_actions.job_recover(job_id=job_id, actor=request.user)).data)


@extend_schema_view(
    get=extend_schema(
        operation_id="jobs_attempts_list",
        summary="List a job's attempts, first first",
        tags=["jobs"],
        parameters=[JOB_ID],
        responses=JobAttemptSerializer(many=True),
    ),
)
class JobAttemptListView(generics.ListAPIView):
    """GET /api/jobs/{id}/attempts: paginated."""

    serializer_class = JobAttemptSerializer
    pagination_class = AttemptPagination
    filter_backends: list = []

    def get_queryset(self) -> QuerySet[Attempt]:
        """The job's attempts; 404 when the job is missing or someone else's."""
        if getattr(self, "swagger_fake_view", False):
            return Attempt.objects.none()
        return selectors.job_attempt_list(job_id=self.kwargs["job_id"], actor=self.request.user)

    def paginate_queryset(self, queryset: QuerySet[Attempt]) -> list[Attempt] | None:
        """The page of finished attempts; the last page also shows a RUNNING job's current attempt."""
        page = super().paginate_queryset(queryset)
        running = selectors.job_running_attempt(job_id=self.kwargs["job_id"])
        if running is not None and page is not None:
            self.paginator.count += 1
            if self.paginator.next is None:
                page.append(running)
        return page


class JobResultView(APIView):
    """GET /api/jobs/{id}/result."""

    @extend_schema(
        operation_id="jobs_result_retrieve",
        summary="Get a job's result",
        description="404 with code `no_result` until the job has one.",
        tags=["jobs"],
        parameters=[JOB_ID],
        responses={200: JobResultSerializer, 404: _error("`not_found` (no such job) or `no_result` (none yet).")},
    )
    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        """Return the result of the job's latest finished attempt."""
        return Response(JobResultSerializer(selectors.job_result_get(job_id=job_id, actor=request.user)).data)
