"""App config for the scheduler."""

from __future__ import annotations

from django.apps import AppConfig

import core.db_threads  # noqa: F401 - its receiver must be connected before any connection opens


class SchedulerConfig(AppConfig):
    """Jobs, schedules, leasing, execution, outbox and metrics."""

    name = "scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the handlers of every installed app's ``jobs.py``; turn tracing on if configured."""
        from scheduler import tracing
        from scheduler.registry import autodiscover

        autodiscover()
        tracing.configure_from_settings()
