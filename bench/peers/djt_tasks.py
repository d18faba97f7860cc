"""The django-tasks peer's ``noop`` @task (its own module, so its path is the same in producer and worker)."""

from __future__ import annotations

from django_tasks import task

from bench import probe


@task()
def noop(i: int) -> None:
    """Record the start; nothing else."""
    probe.started(i)
