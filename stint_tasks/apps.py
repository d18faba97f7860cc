"""App config: plug the task registry into Stint's job-type resolution and discover task modules."""

from __future__ import annotations

from django.apps import AppConfig


class StintTasksConfig(AppConfig):
    """Django's Tasks framework on Stint."""

    name = "stint_tasks"
    verbose_name = "Stint tasks"

    def ready(self) -> None:
        """Let workers resolve task paths and flow control see the tasks' queues, then import the task modules.

        Also filters Django's tasks logger: a retried attempt's failure is a WARNING there (``RetriedAttemptFilter``).
        """
        import logging

        from scheduler.registry import add_queue_source, add_resolver, add_type_source
        from stint_tasks import registry
        from stint_tasks.compat import TASKS_PACKAGE
        from stint_tasks.execution import RetriedAttemptFilter

        tasks_logger = logging.getLogger(TASKS_PACKAGE)  # Django's receivers log there
        if not any(isinstance(f, RetriedAttemptFilter) for f in tasks_logger.filters):
            tasks_logger.addFilter(RetriedAttemptFilter())

        add_resolver(registry.resolve_task)
        add_queue_source(registry.task_queues)
        add_type_source(registry.registered_paths)  # named by unknown-type errors beside the @handler types
        registry.discover()
