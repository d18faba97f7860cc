"""A no-op Django ``@task`` for ``bench/tasks_throughput.py`` (installed with the ``bench`` app)."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def noop() -> None:
    """Do nothing: the benchmark measures the per-job cost of the path around it."""
