"""System checks of a Stint ``TASKS`` entry: queue names, ``OPTIONS``, periodic tasks, tasks a worker cannot find.

Django runs ``backend.check()`` for every configured backend (``django.tasks.checks``, or the
backport's ``django_tasks`` app). IDs: ``stint_tasks.E001``-``E006``, ``stint_tasks.W001``.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from typing import Any

from django.core import checks

from scheduler.cron import MISFIRE_POLICIES, spec_of, zone_for
from scheduler.exceptions import InvalidSchedule
from scheduler.jobspec import QUEUE_NAME
from scheduler.models import OverlapPolicy
from stint_tasks import registry
from stint_tasks.options import task_modules, validate


def backend_messages(backend: Any) -> list[checks.CheckMessage]:
    """Return the problems of ``backend``'s ``QUEUES`` and ``OPTIONS`` and of the tasks registered on it."""
    where = f"TASKS[{backend.alias!r}]"
    messages: list[checks.CheckMessage] = []

    def error(msg: str, code: str, hint: str | None = None) -> None:
        messages.append(checks.Error(f"{where}: {msg}", hint=hint, id=f"stint_tasks.{code}"))

    for queue in sorted(backend.queues, key=str):
        if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
            error(
                f"queue name {queue!r} is not a Stint queue name.",
                "E001",
                "1-100 characters: letters, digits, '_', '.', ':' or '-'.",
            )
    for problem in validate(backend.options):
        error(problem, "E002")
    if not isinstance(backend.options, dict):
        return messages
    for path in sorted(backend.options.get("tasks") or {}, key=str):
        if registry.get_task(path) is None:
            error(f"OPTIONS['tasks'] names {path!r}, which is not a task of a Stint backend.", "E003")
    for module in task_modules(backend.options):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package is missing or broken
            found = False
        if not found:
            error(f"OPTIONS['modules'] names {module!r}, which cannot be imported.", "E004")
        elif (failure := registry.import_failure(module)) is not None:  # e.g. a task the backend refuses
            error(f"OPTIONS['modules'] names {module!r}, whose import failed: {failure}", "E004")
    periodic = backend.options.get("periodic") or {}
    if isinstance(periodic, dict):
        for name, entry in periodic.items():
            if isinstance(entry, dict):
                for problem in _periodic_problems(backend, entry):
                    error(f"OPTIONS['periodic'][{name!r}]: {problem}", "E005")
    for path in registry.undiscovered_paths():
        task = registry.get_task(path)
        if task is not None and task.backend == backend.alias:
            messages.append(
                checks.Warning(
                    f"{where}: task {path!r} was defined outside the modules workers import, so a worker would"
                    " fail its jobs as an unknown type.",
                    hint="Define it in an installed app's tasks.py (or a module that imports), or list its module"
                    " in OPTIONS['modules'].",
                    id="stint_tasks.W001",
                )
            )
    return messages


def _periodic_problems(backend: Any, entry: dict[str, Any]) -> list[str]:
    problems = []
    task = registry.get_task(entry.get("task")) if isinstance(entry.get("task"), str) else None
    if task is None:
        problems.append(f"task {entry.get('task')!r} is not a task of a Stint backend.")
    elif backend.queues and task.queue_name not in backend.queues:
        problems.append(f"the task's queue {task.queue_name!r} is not in QUEUES.")
    if (entry.get("cron") is None) == (entry.get("interval_seconds") is None):
        problems.append("give exactly one of cron and interval_seconds.")
    try:
        zone_for(entry.get("timezone", "UTC"))
        spec_of(
            cron=entry.get("cron"),
            interval_seconds=entry.get("interval_seconds"),
            timezone=entry.get("timezone", "UTC"),
            anchor=dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
        )
    except (InvalidSchedule, TypeError, ValueError) as exc:
        problems.append(f"bad timing: {exc}")
    if entry.get("misfire_policy", "skip") not in MISFIRE_POLICIES:
        problems.append(f"misfire_policy must be one of {', '.join(MISFIRE_POLICIES)}.")
    if entry.get("overlap_policy", "allow") not in OverlapPolicy.values:
        problems.append(f"overlap_policy must be one of {', '.join(OverlapPolicy.values)}.")
    return problems
