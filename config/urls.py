"""Root URLs: /api/, /admin/, user pages under /, /metrics."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from audit.api import JobEventListView
from core.api_docs import DocsView, SchemaView
from core.errors import api_not_found
from scheduler.api import flow as flow_api
from scheduler.api import queues as queue_api
from scheduler.api import schedules as schedule_api
from scheduler.health import HealthView
from scheduler.metrics_view import metrics_view

handler400 = "core.errors.handler400"
handler404 = "core.errors.handler404"
handler500 = "core.errors.handler500"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/health", HealthView.as_view(), name="health"),
    path("metrics", metrics_view, name="metrics"),
    path("api/auth/", include("accounts.urls")),
    path("api/admin/queues/<str:name>/pause", queue_api.QueuePauseView.as_view(), name="admin-queue-pause"),
    path("api/admin/queues/<str:name>/resume", queue_api.QueueResumeView.as_view(), name="admin-queue-resume"),
    path("api/admin/queues/<str:name>/limits", flow_api.QueueLimitView.as_view(), name="admin-queue-limits"),
    path("api/admin/types/<str:name>/limits", flow_api.TypeLimitView.as_view(), name="admin-type-limits"),
    path("api/admin/limits", flow_api.LimitListView.as_view(), name="admin-limits"),
    path("api/schedules", schedule_api.ScheduleListCreateView.as_view(), name="schedule-list"),
    path("api/schedules/preview", schedule_api.SchedulePreviewView.as_view(), name="schedule-preview"),
    path("api/schedules/<int:schedule_id>", schedule_api.ScheduleDetailView.as_view(), name="schedule-detail"),
    path(
        "api/schedules/<int:schedule_id>/trigger", schedule_api.ScheduleTriggerView.as_view(), name="schedule-trigger"
    ),
    path("api/schedules/<int:schedule_id>/runs", schedule_api.ScheduleRunListView.as_view(), name="schedule-runs"),
    path("api/jobs/<uuid:job_id>/events", JobEventListView.as_view(), name="job-events"),
    path("api/", include("scheduler.api.urls")),
    path("api/schema/", SchemaView.as_view(), name="schema"),
    # GET and HEAD only: the Swagger page's HTML renderer has no template for OPTIONS (a 500); others get a 405.
    path("api/docs/", DocsView.as_view(url_name="schema", http_method_names=["get", "head"]), name="docs"),
    path("api", api_not_found),  # nor /api: an API client gets the JSON 404, not the pages' HTML one
    path("api/", api_not_found),  # /api/ itself has no resource (the docs are /api/docs/)
    path("api/<path:path>", api_not_found),  # any other /api/ path: the JSON 404, DEBUG or not
    path("", include("pages.urls")),  # user pages: last, so every explicit path above wins
]
