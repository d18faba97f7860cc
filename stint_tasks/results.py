"""Build Django's ``TaskResult`` for a task job from Stint's tables (the job with its result, attempts) in one query."""

from __future__ import annotations

import builtins
import datetime as dt
import json
import re
import uuid
from typing import Any

from django.db import connection

from core.stored_json import read_stored
from scheduler.states import AttemptStatus, JobStatus
from stint_tasks import registry
from stint_tasks.compat import InvalidTask, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus
from stint_tasks.exceptions import TaskCancelled, TaskExited, TaskLost, TaskResultNotJSON, TaskTimedOut
from stint_tasks.execution import class_path

# Job status -> Django's TaskResultStatus. Waiting (including between retries) is READY; every
# finished-but-not-successful end is FAILED, or CANCELLED where the Django version has it.
_STATUS: dict[str, str] = {
    JobStatus.CREATED: "READY",
    JobStatus.SCHEDULED: "READY",
    JobStatus.QUEUED: "READY",
    JobStatus.RETRYING: "READY",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.SUCCESS: "SUCCESSFUL",
    JobStatus.FAILED: "FAILED",
    JobStatus.DEAD: "FAILED",
    JobStatus.CANCELLED: "CANCELLED",
}
_FINISHED = frozenset({JobStatus.SUCCESS, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED})
# Attempts that ended without a Python exception of the task's own, named by our classes.
_ATTEMPT_ERROR_CLASS = {
    AttemptStatus.TIMED_OUT: class_path(TaskTimedOut),
    AttemptStatus.LOST: class_path(TaskLost),
    AttemptStatus.CANCELLED: class_path(TaskCancelled),
}
# Our exceptions whose message starts with the class path of the exception they stand for.
_WRAPPERS = frozenset({TaskExited.__name__, TaskResultNotJSON.__name__})

# The exception line that ends a Python traceback: ``[module.]QualName`` then ``: message`` or nothing.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s|$)")
# A worker that shut down handed the attempt back (``runner._drain``): not an error of the task.
HANDED_BACK_ERROR = "worker shut down"

_QUERY = """
    SELECT j.type, j.status, j.priority, j.queue, j.payload::text, j.created_at, j.finished_at,
           coalesce((SELECT json_agg(json_build_array(a.attempt_number, a.status, a.worker, a.started_at,
                                                      a.error, a.traceback) ORDER BY a.attempt_number)
                     FROM stint_attempt a WHERE a.job_id = j.id), '[]')::text,
           CASE WHEN j.status = 'SUCCESS' THEN j.result::text END
    FROM stint_job j
    WHERE j.id = %s
"""


def status_of(job_status: str) -> Any:
    """Return the ``TaskResultStatus`` for a Stint job status (CANCELLED -> FAILED where Django has no CANCELLED)."""
    name = _STATUS[JobStatus(job_status)]
    return getattr(TaskResultStatus, name, TaskResultStatus.FAILED)


def exception_class_path(*, attempt_status: str, error: str, traceback: str) -> str:
    """Return the class path (``module.QualName``) of the exception that ended a failed attempt.

    A timed-out, lost or cancelled attempt names a ``stint_tasks.exceptions`` class. Otherwise the
    attempt's ``error`` starts with the class name (``execute._describe``: ``"ValueError: ..."``)
    and its traceback ends with the exception line, which Python writes as ``module.QualName:
    message`` (the module left out for builtins): the last such line with that name gives the
    path. A ``TaskExited`` names the ``BaseException`` it stands for in its message, and a
    ``TaskResultNotJSON`` the error ``normalize_json`` raised (``builtins.TypeError``).
    """
    if attempt_status in _ATTEMPT_ERROR_CLASS:
        return _ATTEMPT_ERROR_CLASS[AttemptStatus(attempt_status)]
    name, _, rest = error.partition(":")
    name = name.strip()
    if name in _WRAPPERS and ":" in rest:
        return rest.split(":", 1)[0].strip()
    for line in reversed(traceback.splitlines()):
        match = _EXCEPTION_LINE.match(line)
        if match and match.group(1).rsplit(".", 1)[-1] == name:
            dotted = match.group(1)
            return dotted if "." in dotted else f"builtins.{dotted}"
    if name.isidentifier() and isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    return "builtins.Exception"


def _aware(value: Any) -> dt.datetime | None:
    """``value`` read as an ISO 8601 datetime; None when it is none (a payload edited by hand: not text, not ISO)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None


def task_result(*, job_id: str, backend_alias: str, task: Any = None, attempt: int | None = None) -> Any:
    """Return the ``TaskResult`` of task job ``job_id`` (a UUID string) as backend ``backend_alias`` shows it.

    ``task`` defaults to the registered task of the job's type (a job that is not a known task,
    or an id that is not a UUID, raises ``TaskResultDoesNotExist``). ``attempt`` (the running
    attempt's number) pins ``worker_ids`` to exactly that many entries for a ``TaskContext``.
    Fields: status (``status_of``); ``enqueued_at`` = created_at; ``started_at`` = the first
    attempt's start, ``last_attempted_at`` = the latest one's; ``finished_at`` once finished;
    ``worker_ids`` = each attempt's worker; ``errors`` = one ``TaskError`` per attempt that did
    not succeed and was not handed back; ``return_value`` = the stored result when SUCCESSFUL.
    A stored payload or result Python's json cannot read (``core.stored_json``) reads as no args
    and as an ``UnreadableJSON`` return value; a ``run_after`` that is not ISO text as none.
    """
    try:
        key = uuid.UUID(str(job_id))
    except ValueError:
        raise TaskResultDoesNotExist(job_id) from None
    with connection.cursor() as cursor:
        cursor.execute(_QUERY, [key])
        row = cursor.fetchone()
    if row is None:
        raise TaskResultDoesNotExist(job_id)
    job_type, status, priority, queue, payload_text, created_at, finished_at, attempts_text, result_text = row
    base = task if task is not None else registry.get_task(job_type)
    if base is None or base.module_path != job_type:
        raise TaskResultDoesNotExist(job_id)
    payload = read_stored(payload_text) if payload_text else {}
    payload = payload if isinstance(payload, dict) else {}  # an unreadable one too: no args, as the worker runs none
    run_after = _aware(payload.get("run_after"))
    try:
        shown = base.using(priority=priority, queue_name=queue, run_after=run_after, backend=backend_alias)
    except InvalidTask:  # e.g. a queue since removed from QUEUES: show the task as defined
        shown = base
    attempts = json.loads(attempts_text)
    if attempt is not None:
        attempts = attempts[:attempt]
    worker_ids = [a[2] for a in attempts]
    if attempt is not None:
        worker_ids += [""] * (attempt - len(worker_ids))
    errors = [
        TaskError(
            exception_class_path=exception_class_path(attempt_status=a[1], error=a[4], traceback=a[5]), traceback=a[5]
        )
        for a in attempts
        if a[1] not in (AttemptStatus.SUCCEEDED, AttemptStatus.RUNNING) and a[4] != HANDED_BACK_ERROR
    ]
    result = TaskResult(
        task=shown,
        id=str(key),
        status=status_of(status),
        enqueued_at=created_at,
        started_at=_aware(attempts[0][3]) if attempts else None,
        last_attempted_at=_aware(attempts[-1][3]) if attempts else None,
        finished_at=finished_at if status in _FINISHED else None,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=backend_alias,
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == JobStatus.SUCCESS and result_text is not None:
        object.__setattr__(result, "_return_value", read_stored(result_text))
    return result
