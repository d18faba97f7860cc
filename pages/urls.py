"""URLs of the user pages, mounted at ``/`` after every explicit path (``config.urls``)."""

from __future__ import annotations

from django.urls import path

from pages import views

app_name = "pages"

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("login/", views.login_view, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("register/", views.register_view, name="register"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/status/", views.job_status, name="job-status"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<uuid:job_id>/live/", views.job_live, name="job-live"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<uuid:job_id>/retry/", views.job_retry, name="job-retry"),
    path("schedules/", views.schedule_list, name="schedule-list"),
    path("schedules/new/", views.schedule_new, name="schedule-new"),
    path("schedules/<int:schedule_id>/edit/", views.schedule_edit, name="schedule-edit"),
    path("schedules/<int:schedule_id>/toggle/", views.schedule_toggle, name="schedule-toggle"),
    path("schedules/<int:schedule_id>/delete/", views.schedule_delete, name="schedule-delete"),
]
