"""App config: plug the task registry into Stint's job-type resolution and discover task modules."""

from __future__ import annotations

from django.apps import AppConfig


class StintTasksConfig(AppConfig):
    """Django's Tasks framework on Stint."""

    name = "stint_tasks"
    verbose_name = "Stint tasks"

    def ready(self) -> None:
        """Let workers resolve task paths and flow control see the tasks' queues, then import the task modules."""
        from scheduler.registry import add_queue_source, add_resolver
        from stint_tasks import registry

        add_resolver(registry.resolve_task)
        add_queue_source(registry.task_queues)
        registry.discover()
