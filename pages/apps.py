"""App config for the user pages."""

from __future__ import annotations

from django.apps import AppConfig


class PagesConfig(AppConfig):
    """Server-rendered pages under ``/``: sign in, my jobs, new job, job detail, schedules."""

    name = "pages"
    default_auto_field = "django.db.models.BigAutoField"
