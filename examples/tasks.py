"""Plain Django ``@task`` functions: nothing here knows about Stint, yet each runs as a Stint job.

Enqueue them with ``manage.py example_tasks`` (or ``add.enqueue(2, 3)`` in ``manage.py shell``)
and watch them in the console at /admin/: their type is the task's import path.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from stint_tasks.compat import TaskContext

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    """Return ``a + b`` (a sync task)."""
    return a + b


@task(priority=50)
async def greet(name: str, delay_seconds: float = 0.5) -> str:
    """Wait ``delay_seconds`` on the worker's event loop, then greet ``name`` (an async task, priority 50)."""
    await asyncio.sleep(delay_seconds)
    return f"hello, {name}"


@task(takes_context=True)
def flaky_report(context: TaskContext, fail_attempts: int = 1) -> dict[str, int]:
    """Fail the first ``fail_attempts`` attempts, then report which attempt succeeded (uses the context).

    ``OPTIONS['tasks']`` in settings gives it 2 retries with a 2 s backoff base.
    """
    if context.attempt <= fail_attempts:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return {"attempt": context.attempt, "job": context.task_result.id}


@task
def always_fails() -> None:
    """Raise every time: retried with backoff, then dead-lettered (the job ends DEAD, the result FAILED)."""
    raise ValueError("this example task always fails")


@task
def heartbeat() -> str:
    """Return the worker's clock (a periodic task: ``OPTIONS['periodic']``, synced by ``make run``)."""
    return dt.datetime.now(dt.UTC).isoformat()
