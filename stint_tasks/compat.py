"""One import surface for Django's Tasks API: ``django.tasks`` on Django 6, the ``django_tasks`` backport on 5.2."""

from __future__ import annotations

try:  # Django >= 6.0
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    TASKS_PACKAGE = "django.tasks"
except ImportError:  # Django 5.2 with django-tasks
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends  # type: ignore[no-redef]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError  # type: ignore[no-redef]
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    TASKS_PACKAGE = "django_tasks"

__all__ = [
    "TASKS_PACKAGE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
