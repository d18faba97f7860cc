"""The backend's ``OPTIONS``: per-task retries, timeouts and backoff, extra task modules, periodic tasks.

::

    TASKS = {"default": {
        "BACKEND": "stint_tasks.backend.StintBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "defaults": {"max_retries": 3, "timeout_seconds": 300},          # every task of this backend
            "tasks": {"shop.tasks.charge": {"max_retries": 0, "timeout_seconds": 30,
                                            "backoff_base_seconds": 2, "backoff_max_seconds": 60,
                                            "backoff_jitter": True}},
            "modules": ["shop.emails"],   # task modules besides each installed app's tasks.py
            "periodic": {"nightly-report": {"task": "shop.tasks.report", "cron": "30 2 * * *",
                                            "timezone": "Europe/London", "misfire_policy": "skip",
                                            "overlap_policy": "skip", "args": [], "kwargs": {}}},
        },
    }}

Unset values fall back to Stint's (``SCHEDULER`` settings: 3 retries, 300 s, backoff 1 s doubling
to 30 s). ``validate`` lists every problem; the system check reports them (``stint_tasks.checks``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.retry import MAX_BACKOFF_SECONDS, is_backoff_seconds
from scheduler.states import MAX_RETRIES_RANGE as JOB_MAX_RETRIES_RANGE
from scheduler.states import TIMEOUT_RANGE

OPTION_KEYS = frozenset({"defaults", "tasks", "modules", "periodic"})
TASK_OPTION_KEYS = frozenset(
    {"max_retries", "timeout_seconds", "backoff_base_seconds", "backoff_max_seconds", "backoff_jitter"}
)
PERIODIC_KEYS = frozenset(
    {"task", "cron", "interval_seconds", "timezone", "misfire_policy", "overlap_policy", "args", "kwargs", "enabled"}
)
# The job spec's ranges (scheduler.states), but a task may opt out of retries (Django's own
# backends never retry): the backend enqueues as trusted code, which may give max_retries 0.
MAX_RETRIES_RANGE = (0, JOB_MAX_RETRIES_RANGE[1])
BACKOFF_RULE = f"a number of seconds from 0 to {MAX_BACKOFF_SECONDS}"  # is_backoff_seconds, as @handler's
MODULE_NAME = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z"
)  # \Z: "$" also matches before a final newline


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSettings:
    """A task's Stint settings; None means Stint's default (``SCHEDULER`` or the job defaults)."""

    max_retries: int | None = None
    timeout_seconds: int | None = None
    backoff_base_seconds: float | None = None
    backoff_max_seconds: float | None = None
    backoff_jitter: bool | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def task_option_errors(where: str, values: Any) -> list[str]:
    """Return the problems of one ``defaults`` or per-task entry (a dict of ``TASK_OPTION_KEYS``)."""
    if not isinstance(values, Mapping):
        return [f"{where} must be a dict of {', '.join(sorted(TASK_OPTION_KEYS))}."]
    errors = [f"{where}: unknown option {key!r}." for key in sorted(set(values) - TASK_OPTION_KEYS, key=str)]
    checks = {
        "max_retries": (
            lambda v: _is_int(v) and MAX_RETRIES_RANGE[0] <= v <= MAX_RETRIES_RANGE[1],
            f"{MAX_RETRIES_RANGE[0]} to {MAX_RETRIES_RANGE[1]}",
        ),
        "timeout_seconds": (
            lambda v: _is_int(v) and TIMEOUT_RANGE[0] <= v <= TIMEOUT_RANGE[1],
            f"{TIMEOUT_RANGE[0]} to {TIMEOUT_RANGE[1]}",
        ),
        "backoff_base_seconds": (is_backoff_seconds, BACKOFF_RULE),
        "backoff_max_seconds": (is_backoff_seconds, BACKOFF_RULE),
        "backoff_jitter": (lambda v: isinstance(v, bool), "true or false"),
    }
    for key, (ok, expected) in checks.items():
        if key in values and not ok(values[key]):
            errors.append(f"{where}: {key} must be {expected}, not {values[key]!r}.")
    return errors


def validate(options: Any) -> list[str]:
    """Return every problem in a backend's ``OPTIONS`` that can be seen without the task registry."""
    if not isinstance(options, Mapping):
        return ["OPTIONS must be a dict."]
    errors = [f"unknown OPTIONS key {key!r}." for key in sorted(set(options) - OPTION_KEYS, key=str)]
    if "defaults" in options:
        errors += task_option_errors("OPTIONS['defaults']", options["defaults"])
    per_task = options.get("tasks", {})
    if not isinstance(per_task, Mapping):
        errors.append("OPTIONS['tasks'] must map task paths to option dicts.")
    else:
        for path, values in per_task.items():
            errors += task_option_errors(f"OPTIONS['tasks'][{path!r}]", values)
    modules = options.get("modules", [])
    if not isinstance(modules, list | tuple) or not all(isinstance(m, str) and MODULE_NAME.match(m) for m in modules):
        errors.append("OPTIONS['modules'] must be a list of dotted module names.")
    periodic = options.get("periodic", {})
    if not isinstance(periodic, Mapping) or not all(isinstance(v, Mapping) for v in periodic.values()):
        errors.append("OPTIONS['periodic'] must map schedule names to dicts.")
    else:
        for name, entry in periodic.items():
            unknown = sorted(set(entry) - PERIODIC_KEYS, key=str)
            errors += [f"OPTIONS['periodic'][{name!r}]: unknown key {key!r}." for key in unknown]
            if not isinstance(entry.get("task"), str):
                errors.append(f"OPTIONS['periodic'][{name!r}]: 'task' (a task path) is required.")
    return errors


def task_settings(options: Mapping[str, Any], path: str) -> TaskSettings:
    """Return the settings of task ``path``: its ``tasks`` entry over ``defaults`` (invalid values ignored)."""
    merged: dict[str, Any] = {}
    for layer in (options.get("defaults"), (options.get("tasks") or {}).get(path)):
        if isinstance(layer, Mapping) and not task_option_errors("", layer):
            merged.update(layer)
    return TaskSettings(**{k: v for k, v in merged.items() if k in TASK_OPTION_KEYS})


def task_modules(options: Mapping[str, Any]) -> list[str]:
    """Return the extra task modules named in ``OPTIONS['modules']`` (invalid names dropped)."""
    modules = options.get("modules", []) if isinstance(options, Mapping) else []
    if not isinstance(modules, list | tuple):
        return []
    return [m for m in modules if isinstance(m, str) and MODULE_NAME.match(m)]
