"""``StintBackend``: Django's Tasks API on Stint's jobs (enqueue, results, priorities, deferral, async tasks)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.core import checks

from core.parsers import has_lone_surrogate
from scheduler import enqueuing
from scheduler.jobspec import QUEUE_NAME
from scheduler.models import Job
from scheduler.states import PRIORITY_MAX, PRIORITY_MIN
from stint_tasks import registry
from stint_tasks.compat import BaseTaskBackend, InvalidTask, TaskResult, TaskResultStatus, normalize_json, task_enqueued
from stint_tasks.results import task_result


class StintBackend(BaseTaskBackend):
    """Enqueue each task call as a Stint job; ``run_workers`` runs it.

    The job's type is the task's import path (``Task.module_path``), its payload ``{"args",
    "kwargs"}`` (plus ``run_after`` when deferred), its queue ``queue_name``, its ``scheduled_at``
    ``run_after``, its priority Django's -100..100 (higher first, claimed in that order), its
    name the function's name, no owner. Retries, timeout and backoff come from ``OPTIONS``
    (``stint_tasks.options``). The job is inserted in the caller's transaction: rolled back, it
    never existed; committed, workers see it (and get its NOTIFY) only then.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Any) -> None:
        """Django's checks (module-level function, priority, queues, aware ``run_after``), Stint's, then register it.

        Stint's checks are on the task's import path (``module_path``), which every job of the task
        stores as its ``type`` (``task_path_problem``), and on the priority and queue name a job
        takes from it (``task_options_problem``). Django calls this when the task is defined
        (``@task``), copied (``using()``) and enqueued, so a path a job cannot hold fails at
        definition instead of in every ``enqueue`` as a database error. Raises ``InvalidTask``.
        Registration is what lets a worker run the task: see ``registry``.
        """
        super().validate_task(task)
        problem = task_path_problem(task.module_path) or task_options_problem(task)
        if problem is not None:
            raise InvalidTask(problem)
        registry.register(task)

    def enqueue(self, task: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Insert the job and return its ``TaskResult`` (READY, ``enqueued_at`` from the database clock).

        ``args``/``kwargs`` must survive Django's JSON normalisation (``TypeError``/``ValueError``
        otherwise) and fit Stint's payload limit (``InvalidJob``, ``PayloadTooLarge``). Raises
        ``InvalidTask`` for a task this backend refuses.
        """
        self.validate_task(task)
        args = normalize_json(list(args))
        kwargs = normalize_json(dict(kwargs))
        payload: dict[str, Any] = {"args": args, "kwargs": kwargs}
        if task.run_after is not None:
            payload["run_after"] = task.run_after.isoformat()
        job = enqueuing.enqueue_request(
            task.module_path,
            payload,
            priority=task.priority,
            queue=task.queue_name,
            scheduled_at=task.run_after,
            name=task.name[:200],
            trusted=True,
        ).job
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.READY,
            enqueued_at=job.created_at,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """Return the ``TaskResult`` for ``result_id`` (a job id); raise ``TaskResultDoesNotExist``."""
        return task_result(job_id=result_id, backend_alias=self.alias)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """System checks of this ``TASKS`` entry (``stint_tasks.checks``)."""
        from stint_tasks.checks import backend_messages

        return backend_messages(self)


def task_path_problem(path: str) -> str | None:
    """Return why a job's ``type`` cannot hold the task path ``path``, or None when it can.

    The limit is ``Job.type``'s ``max_length`` (100 characters); PostgreSQL's text types refuse
    U+0000 and no UTF-8 encodes a lone UTF-16 surrogate (U+D800-U+DFFF), either of which a
    function's ``__module__`` or ``__qualname__`` can be given.
    """
    limit = Job._meta.get_field("type").max_length
    if len(path) > limit:
        return (
            f"Task path {path!r} is {len(path)} characters; a Stint job stores it as its type, which holds at"
            f" most {limit}. Shorten the module path or the function name."
        )
    if "\x00" in path:
        return f"Task path {path!r} contains U+0000, which a Stint job's type cannot store."
    if has_lone_surrogate(path):
        return f"Task path {path!r} contains a lone UTF-16 surrogate, which a Stint job's type cannot store."
    return None


def task_options_problem(task: Any) -> str | None:
    """Return why a job cannot take ``task``'s priority or queue name, or None when it can.

    Django checks only that the priority lies from -100 to 100 (a float or a bool does) and that
    the queue is in ``QUEUES`` when that lists any; a job's priority is a whole number
    (``states.priority_value``) and its queue 1-100 of letters, digits and ``_.:-``
    (``jobspec.QUEUE_NAME``), which every ``enqueue`` would otherwise refuse as ``InvalidJob``.
    """
    priority = task.priority
    if not isinstance(priority, int) or isinstance(priority, bool):
        return f"priority must be a whole number between {PRIORITY_MIN} and {PRIORITY_MAX}; got {priority!r}."
    queue = task.queue_name
    if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
        return (
            f"queue name {queue!r} is not a Stint queue name: 1-100 characters, letters, digits, '_', '.', ':' or '-'."
        )
    return None
