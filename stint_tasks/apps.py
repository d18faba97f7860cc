"""App config: plug the task registry into Stint's job-type resolution and discover task modules."""

from __future__ import annotations

from django.apps import AppConfig


class StintTasksConfig(AppConfig):
    """Django's Tasks framework on Stint."""

    name = "stint_tasks"
    verbose_name = "Stint tasks"

    def ready(self) -> None:
        """Let workers resolve task paths (``registry.resolve_task``), then import the task modules."""
        from scheduler.registry import add_resolver
        from stint_tasks import registry

        add_resolver(registry.resolve_task)
        registry.discover()
