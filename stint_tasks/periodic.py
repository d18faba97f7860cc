"""Periodic tasks: a Stint schedule (cron or interval, with its DST, misfire and overlap rules) that fires a ``@task``.

Django's Tasks API has no periodic tasks (django-tasks#259); here a schedule's job template names
the task path and carries ``{"args", "kwargs"}``. Declare them in ``OPTIONS['periodic']`` and run
``manage.py sync_periodic_tasks``, or call ``task_schedule`` from code. Only project code may aim a
schedule at a task: the REST API and pages accept ``@handler`` types only (see
``enqueuing.enqueue_request``'s ``trusted``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction

from scheduler import schedules
from scheduler.exceptions import InvalidSchedule
from scheduler.models import CronSchedule, MisfirePolicy, OverlapPolicy
from stint_tasks import registry
from stint_tasks.compat import normalize_json


@transaction.atomic
def task_schedule(
    task: Any,
    *,
    owner: Any,
    name: str,
    cron: str | None = None,
    interval_seconds: int | None = None,
    timezone: str = "UTC",
    misfire_policy: str = MisfirePolicy.SKIP,
    overlap_policy: str = OverlapPolicy.ALLOW,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    enabled: bool = True,
) -> CronSchedule:
    """Create, or update in place, ``owner``'s schedule ``name`` that fires ``task`` with ``args``/``kwargs``.

    ``task`` is a ``Task`` of a Stint backend or its path; the jobs get its priority and queue, and
    the retries/timeout of ``OPTIONS``. Timing as ``schedules.schedule_create`` (a change of timing
    takes effect at the scheduler's next tick). Raises ``InvalidSchedule`` for a task no Stint
    backend registered, bad timing or policies, ``TypeError``/``ValueError`` for arguments that
    are not JSON.
    """
    path = task if isinstance(task, str) else task.module_path
    known = registry.get_task(path)
    if known is None:
        raise InvalidSchedule(f"{path!r} is not a task of a Stint backend.", details={"job": {"type": [path]}})
    job = {
        "type": path,
        "payload": {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs or {}))},
        "priority": known.priority,
        "queue": known.queue_name,
    }
    timing = {
        "cron": cron,
        "interval_seconds": interval_seconds,
        "timezone": timezone,
        "misfire_policy": misfire_policy,
        "overlap_policy": overlap_policy,
        "enabled": enabled,
    }
    owner_id = getattr(owner, "pk", owner)
    existing = CronSchedule.objects.select_for_update().filter(owner_id=owner_id, name=name).first()
    if existing is None:
        return schedules.schedule_create(owner=owner_id, name=name, job=job, trusted=True, **timing)
    return schedules.schedule_update(schedule_id=existing.id, changes={**timing, "job": job}, trusted=True)


def sync_periodic(*, owner: Any) -> list[CronSchedule]:
    """Create or update, for ``owner``, every schedule in each Stint backend's ``OPTIONS['periodic']``.

    Returns them in declaration order. Raises as ``task_schedule`` (the system check reports the
    same problems before this runs).
    """
    synced = []
    for alias in registry.stint_backend_aliases():
        for name, entry in (registry.backend_options(alias).get("periodic") or {}).items():
            options = {k: v for k, v in entry.items() if k != "task"}
            synced.append(task_schedule(entry["task"], owner=owner, name=name, **options))
    return synced
