"""The tasks a worker may run: every ``@task`` on a Stint backend that the project's own code defined.

A task registers itself when its backend validates it (at decoration), so the registry holds only
``Task`` objects created by imported project code; discovery imports each installed app's
``tasks`` module and the modules listed in a Stint backend's ``OPTIONS['modules']``, in every
process (web, workers, pool children) at start-up. A worker turns a job type into a call only
through ``resolve_task``: it never imports a module or looks up an attribute named by a stored job
type, so a type string (from a request, a hand-edited row) can reach nothing else.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from django.conf import settings
from django.utils.module_loading import autodiscover_modules, import_string

from scheduler.registry import HandlerSpec
from stint_tasks.options import task_modules, task_settings

logger = logging.getLogger(__name__)

_TASKS: dict[str, Any] = {}  # task path -> the first Task object registered under it
_DISCOVERED: set[str] = set()  # paths registered by the time discovery finished
_IMPORT_FAILURES: dict[str, str] = {}  # OPTIONS['modules'] entry -> why its import failed at discovery
_LOCK = threading.Lock()


def register(task: Any) -> None:
    """Record ``task`` (a validated ``Task`` of a Stint backend) under its ``module_path``; the first one wins.

    ``Task.using()`` copies validate too: they share the original's function and context flag,
    which is all a worker needs, so they never replace it.
    """
    with _LOCK:
        _TASKS.setdefault(task.module_path, task)


def get_task(path: str) -> Any | None:
    """Return the registered ``Task`` for ``path``, or None."""
    return _TASKS.get(path)


def registered_paths() -> list[str]:
    """Return every registered task path, sorted."""
    return sorted(_TASKS)


def undiscovered_paths() -> list[str]:
    """Return the registered paths that discovery did not reach (a worker would not know them)."""
    return sorted(set(_TASKS) - _DISCOVERED)


def task_queues() -> set[str]:
    """Return the queue each registered task goes to unless enqueued ``using()`` another (``queue_name``)."""
    return {task.queue_name for task in list(_TASKS.values())}


def stint_backend_aliases() -> list[str]:
    """Return the aliases in ``settings.TASKS`` whose backend is (a subclass of) ``StintBackend``."""
    from stint_tasks.backend import StintBackend

    aliases = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if isinstance(backend, type) and issubclass(backend, StintBackend):
            aliases.append(alias)
    return aliases


def backend_options(alias: str) -> dict[str, Any]:
    """Return ``OPTIONS`` of the ``TASKS`` entry ``alias`` ({} when missing or not a dict)."""
    options = ((getattr(settings, "TASKS", None) or {}).get(alias) or {}).get("OPTIONS") or {}
    return options if isinstance(options, dict) else {}


def discover() -> None:
    """Import every installed app's ``tasks`` module and each Stint backend's ``OPTIONS['modules']``.

    An ``OPTIONS['modules']`` entry that fails to import (missing, broken, or defining a task its
    backend refuses) is logged, remembered for the system check (``import_failure``) and skipped;
    an app's ``tasks`` module that fails raises, as Django's own autodiscovery does. The set of
    paths known afterwards is what ``undiscovered_paths`` compares against.
    """
    autodiscover_modules("tasks")
    for alias in stint_backend_aliases():
        for module in task_modules(backend_options(alias)):
            try:
                importlib.import_module(module)
            except Exception as exc:
                logger.exception("could not import task module %s (TASKS[%r]['OPTIONS']['modules'])", module, alias)
                with _LOCK:
                    _IMPORT_FAILURES[module] = _describe(exc)
            else:
                with _LOCK:
                    _IMPORT_FAILURES.pop(module, None)
    with _LOCK:
        _DISCOVERED.update(_TASKS)


def import_failure(module: str) -> str | None:
    """Return ``"Type: message"`` of the error that the last ``discover`` got importing ``module``, or None."""
    return _IMPORT_FAILURES.get(module)


def _describe(exc: Exception) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ raises
        return type(exc).__name__


def resolve_task(name: str) -> HandlerSpec | None:
    """The ``scheduler.registry`` resolver: a spec running the registered task ``name``, or None.

    The spec carries the task's ``OPTIONS`` (retries, timeout, backoff) as per-type defaults.
    """
    task = _TASKS.get(name)
    if task is None:
        return None
    from stint_tasks.execution import task_runner

    s = task_settings(backend_options(task.backend), name)
    return HandlerSpec(
        name=name,
        func=task_runner(task),
        timeout_seconds=s.timeout_seconds,
        max_retries=s.max_retries,
        backoff_base_seconds=s.backoff_base_seconds,
        backoff_max_seconds=s.backoff_max_seconds,
        backoff_jitter=s.backoff_jitter,
    )
