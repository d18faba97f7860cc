"""Run one task attempt inside a Stint worker: arguments from the payload, context, async tasks, errors.

Handlers get ``(payload, ctx)``; ``task_runner(task)`` adapts a Django ``Task`` to that shape. The
payload is ``{"args": [...], "kwargs": {...}}`` (written by ``StintBackend.enqueue`` or a periodic
schedule). What the task returns passes Django's ``normalize_json`` and becomes the job's result; a
value it refuses fails the job at once (``TaskResultNotJSON``, a ``PermanentError``, read back as
the refusal's own class, as Django's own backends report it): the task has run, and a retry would
repeat its side effects only to return the same kind of value. An exception raised by the task
fails the attempt and is retried by Stint's rules; the attempt keeps its message and traceback,
from which ``results`` reads back ``TaskError.exception_class_path``.

As Django's own backends do, the worker sends ``task_started`` before the task runs (status
RUNNING) and ``task_finished`` after it (SUCCESSFUL, or FAILED with the attempt's error added;
sent inside the exception handler, so Django's logging receiver logs the traceback). Receivers
are called with ``send_robust``: one that raises is logged and cannot change the attempt's outcome.
Django's receiver logs every FAILED result at ERROR; for an attempt Stint will retry,
``RetriedAttemptFilter`` makes that line a WARNING saying so, and the final failure stays an ERROR.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import logging
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from scheduler import retry
from scheduler.exceptions import JobCancelled, PermanentError
from scheduler.registry import CancelFlag, JobContext
from scheduler.states import JobStatus
from scheduler.workers.execute import checked_result, exception_message, exception_traceback
from stint_tasks.compat import (
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from stint_tasks.exceptions import TaskExited, TaskResultNotJSON

CANCEL_POLL_SECONDS = 0.05  # how often an async task's event loop checks the job's cancel flag
logger = logging.getLogger(__name__)
# (attempt, attempts left) while task_finished is sent for an attempt the worker will retry.
_retried: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("stint_retried", default=None)


class RetriedAttemptFilter(logging.Filter):
    """On Django's tasks logger: an ERROR logged during ``task_finished`` of an attempt Stint retries is a WARNING.

    Django's ``log_task_finished`` logs every FAILED result with ``logger.exception``; its reference
    backends never retry, so a failure there is final. Here the job will run again: the line keeps
    its traceback, becomes a WARNING and says so ("(attempt 1 failed; it will be retried: 3 attempts
    left)"). Installed by ``StintTasksConfig.ready``; other records pass unchanged, but for their
    traceback text.

    The traceback of a record with ``exc_info`` is formatted here as the attempt stores it
    (``execute.exception_traceback``: cut, never raising) into ``exc_text``, which logging's
    ``Formatter`` (``LOG_FORMAT=plain``) writes instead of formatting the exception again (the
    JSON formatter, python-json-logger, still formats ``exc_info`` itself): a task's 50 MB message was
    otherwise logged whole at every attempt, and one whose ``__notes__`` raised made the logging
    call itself raise (``Handler.handleError`` formats the formatting error with its context), so
    that error replaced the task's own as the attempt's.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Downgrade the record if it is an ERROR logged during a retried attempt's ``task_finished``; keep it."""
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = exception_traceback(record.exc_info[1]).rstrip("\n")
        retried = _retried.get()
        if retried is not None and record.levelno >= logging.ERROR:
            attempt, left = retried
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.msg = f"{record.msg} (attempt {attempt} failed; it will be retried: {left} attempts left)"
        return True


def will_be_retried(ctx: JobContext, exc: BaseException) -> bool:
    """Whether the worker will retry the job after its attempt raised ``exc`` (``scheduler.leasing``'s rule).

    A retryable error (anything but ``PermanentError``) is retried as ``retry.after_failed_attempt``
    decides: while the budget has attempts left, unless the job's cancellation was requested.
    """
    if isinstance(exc, PermanentError):
        return False
    next_status = retry.after_failed_attempt(attempts_left=ctx.attempts_left or 0, cancel_requested=ctx.cancelled)
    return next_status == JobStatus.RETRYING


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
    (1-based) and whose ``task_result`` is the job as ``get_result`` shows it. Returns the task's
    value as ``normalize_json`` makes it. Raises what the task raised (a ``BaseException`` that is
    not an ``Exception`` becomes ``TaskExited``, so the worker's thread survives ``SystemExit``),
    ``JobCancelled``, ``TaskResultNotJSON`` (a ``PermanentError``: no retry) for a return value
    ``normalize_json`` refuses or a job cannot keep (``execute.checked_result``: NaN, U+0000, a
    lone surrogate, over 1 MB; its class path is ``builtins.ValueError``), or ``PermanentError``
    for a payload that is not ``{"args": [...], "kwargs": {...}}``.
    """
    is_async = inspect.iscoroutinefunction(task.func)

    def run(payload: Any, ctx: JobContext) -> Any:
        args, kwargs = _arguments(payload)
        shown = _result(task, ctx, args, kwargs)
        if task.takes_context:
            args = [TaskContext(task_result=shown), *args]
        _send(task_started, task, shown)
        try:
            if is_async:
                value = _run_coroutine(task.func, args, kwargs, ctx.cancel_flag)
            else:
                value = task.func(*args, **kwargs)
        except Exception as exc:
            _send_failed(task, shown, exc, ctx)
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit from task code
            _send_failed(task, shown, exc, ctx)
            raise TaskExited(f"{class_path(type(exc))}: {exception_message(exc)}") from exc
        # Outside the block above: the task has returned, so its side effects have happened, and a
        # value that cannot be stored must end the job, not send it round the retries again.
        try:
            value = normalize_json(value)
        except Exception as exc:  # TypeError, ValueError (bytes), RecursionError (deep nesting)...
            _send(task_finished, task, _failed(shown, exc))
            raise _not_json(exc) from exc
        # normalize_json passes what a job cannot keep (NaN, U+0000, a lone surrogate, any size): the
        # worker would fail the job for it after this signal had said SUCCESSFUL.
        value, problem = checked_result(value)
        if problem is not None:
            refused = ValueError(problem)
            _send(task_finished, task, _failed(shown, refused))
            raise TaskResultNotJSON(f"{class_path(ValueError)}: the task's return value cannot be stored: {problem}")
        _send(task_finished, task, _finished(shown, TaskResultStatus.SUCCESSFUL, value=value))
        return value

    return run


def _not_json(exc: Exception) -> TaskResultNotJSON:
    """The error for a return value that ``normalize_json`` refused with ``exc``.

    Its message starts with ``exc``'s class path (``builtins.TypeError: ...``), which ``results``
    reads back as the attempt's ``exception_class_path``, then names what was refused (Django's
    text says the type: ``Unsupported type: <class 'set'>``).
    """
    try:
        detail = str(exc)
    except Exception:  # a hostile exception's __str__ (from a return value's own Mapping or Sequence code)
        detail = "its message could not be read"
    if isinstance(exc, RecursionError):
        detail = f"nested too deeply ({detail})"
    return TaskResultNotJSON(f"{class_path(type(exc))}: the task's return value is not JSON: {detail}")


def _result(task: Any, ctx: JobContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The running attempt's ``TaskResult``: read from the tables for a ``TaskContext`` (one query).

    Otherwise built in memory for the signals, without a query: id, task, arguments, status
    RUNNING, ``started_at``/``last_attempted_at`` now; ``enqueued_at``, earlier errors and worker
    ids are left empty (``get_result`` reads them).
    """
    if task.takes_context:
        from stint_tasks.results import task_result

        return task_result(job_id=str(ctx.job_id), backend_alias=task.backend, task=task, attempt=ctx.attempt)
    now = timezone.now()
    return TaskResult(
        task=task,
        id=str(ctx.job_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[],
    )


def _finished(shown: Any, status: Any, *, value: Any = None, error: Any = None) -> Any:
    result = dataclasses.replace(
        shown, status=status, finished_at=timezone.now(), errors=[*shown.errors, *([error] if error else [])]
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)
    return result


def _failed(shown: Any, exc: BaseException) -> Any:
    # The traceback as the attempt stores it (cut, and never raising for a hostile exception: one
    # whose __notes__ raised replaced the task's own exception, and no task_finished was sent).
    error = TaskError(exception_class_path=class_path(type(exc)), traceback=exception_traceback(exc))
    return _finished(shown, TaskResultStatus.FAILED, error=error)


def _send_failed(task: Any, shown: Any, exc: BaseException, ctx: JobContext) -> None:
    """Send ``task_finished`` FAILED for the attempt that raised ``exc`` (Django logs it at WARNING if retried)."""
    retried = will_be_retried(ctx, exc)
    token = _retried.set((ctx.attempt, ctx.attempts_left or 0) if retried else None)
    try:
        _send(task_finished, task, _failed(shown, exc))
    finally:
        _retried.reset(token)


def _send(signal: Any, task: Any, result: Any) -> None:
    """Send ``signal`` for ``result`` to every receiver; a receiver's exception is logged, never raised."""
    if not signal.receivers:
        return
    try:
        responses = signal.send_robust(sender=type(task_backends[task.backend]), task_result=result)
    except Exception:  # e.g. the backend alias left TASKS since the job was enqueued
        logger.exception("task %s: its %s signal could not be sent", result.id, signal)
        return
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error("task %s: a signal receiver %r raised %r", result.id, receiver, response)
