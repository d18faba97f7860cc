"""URLs of the jobs API, mounted at /api/ with explicit paths (other apps mount siblings there)."""

from __future__ import annotations

from django.urls import path

from scheduler.api import views

urlpatterns = [
    path("jobs", views.JobListCreateView.as_view(), name="job-list"),
    path("jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/retry", views.JobRetryView.as_view(), name="job-retry"),
    path("jobs/<uuid:job_id>/recover", views.JobRecoverView.as_view(), name="job-recover"),
    path("jobs/<uuid:job_id>/attempts", views.JobAttemptListView.as_view(), name="job-attempts"),
    path("jobs/<uuid:job_id>/result", views.JobResultView.as_view(), name="job-result"),
    path("admin/jobs", views.AdminJobListView.as_view(), name="admin-job-list"),
]
