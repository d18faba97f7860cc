"""Run one task attempt inside a Stint worker: arguments from the payload, context, async tasks, errors.

Handlers get ``(payload, ctx)``; ``task_runner(task)`` adapts a Django ``Task`` to that shape. The
payload is ``{"args": [...], "kwargs": {...}}`` (written by ``StintBackend.enqueue`` or a periodic
schedule). What the task returns passes Django's ``normalize_json`` (a value it refuses fails the
attempt, as in Django's own backends) and becomes the job's result. An exception fails the attempt
and is retried by Stint's rules; the attempt keeps its message and traceback, from which
``results`` reads back ``TaskError.exception_class_path``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from scheduler.exceptions import JobCancelled, PermanentError
from scheduler.registry import CancelFlag, JobContext
from stint_tasks.compat import TaskContext, normalize_json
from stint_tasks.exceptions import TaskExited

CANCEL_POLL_SECONDS = 0.05  # how often an async task's event loop checks the job's cancel flag


def class_path(cls: type) -> str:
    """Return ``module.QualName`` of an exception class (``builtins.ValueError``), as Django's backends do."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    if not isinstance(payload, dict):
        raise PermanentError("a task payload must be an object with 'args' and 'kwargs'")
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise PermanentError("a task payload's 'args' must be a list and 'kwargs' an object")
    return args, kwargs


def _run_coroutine(func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], cancel_flag: CancelFlag) -> Any:
    """Run ``func(*args, **kwargs)`` on a fresh event loop; cancel it once ``cancel_flag`` is set.

    The worker sets the flag when the job's cancellation is requested or its timeout passes, so
    an async task stops at its next ``await`` and frees its thread slot (a sync task in a thread
    cannot be stopped). Raises ``JobCancelled`` when it was cancelled that way.
    """

    async def supervise() -> Any:
        work = asyncio.ensure_future(func(*args, **kwargs))
        while not work.done():
            if cancel_flag.is_set():
                work.cancel()
            await asyncio.wait({work}, timeout=CANCEL_POLL_SECONDS)
        return work.result()

    try:
        return asyncio.run(supervise())
    except asyncio.CancelledError:
        if cancel_flag.is_set():
            raise JobCancelled() from None
        raise


def task_runner(task: Any) -> Callable[[Any, JobContext], Any]:
    """Return the ``(payload, ctx) -> result`` handler that runs ``task`` (a Django ``Task``).

    ``takes_context`` tasks get a ``TaskContext`` whose ``attempt`` is Stint's attempt number
    (1-based) and whose ``task_result`` is the job as ``get_result`` shows it. Raises what the
    task raised (a ``BaseException`` that is not an ``Exception`` becomes ``TaskExited``, so the
    worker's thread survives ``SystemExit``), ``JobCancelled``, or ``PermanentError`` for a
    payload that is not ``{"args": [...], "kwargs": {...}}``.
    """
    is_async = inspect.iscoroutinefunction(task.func)

    def run(payload: Any, ctx: JobContext) -> Any:
        args, kwargs = _arguments(payload)
        if task.takes_context:
            args = [_context(task, ctx), *args]
        try:
            if is_async:
                value = _run_coroutine(task.func, args, kwargs, ctx.cancel_flag)
            else:
                value = task.func(*args, **kwargs)
            return normalize_json(value)
        except Exception:
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit from task code
            raise TaskExited(f"{class_path(type(exc))}: {exc}") from exc

    return run


def _context(task: Any, ctx: JobContext) -> Any:
    from stint_tasks.results import task_result

    result = task_result(job_id=str(ctx.job_id), backend_alias=task.backend, task=task, attempt=ctx.attempt)
    return TaskContext(task_result=result)
