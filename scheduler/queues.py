"""Queue services: pause, resume and list named queues (rows created on first use), and name unused ones.

A paused queue keeps its jobs QUEUED: each claim statement reads the paused flags itself
(``lifecycle.NOT_PAUSED``), so no claim that begins after a pause has committed takes the queue's
jobs (one in flight then may still finish); workers also re-read the paused set every poll
interval (``scheduler.workers.runner``), which is how soon they see a resume. Nothing is lost and
resuming lets the jobs run in their usual order. The admin and ``POST /api/admin/queues/{name}/pause|resume``
call these; a pause or resume that changes the queue for an actor is recorded in the operator
action history (``scheduler.action_log``) in its transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.contrib.admin.models import CHANGE
from django.db import transaction
from django.db.models.functions import Now

from scheduler.action_log import action_record
from scheduler.exceptions import InvalidQueue
from scheduler.jobspec import QUEUE_NAME
from scheduler.models import Queue
from scheduler.selectors import flow_names_in_use

logger = logging.getLogger(__name__)


def _checked(name: str) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise InvalidQueue(
            "A queue name is 1-100 characters: letters, digits, '_', '.', ':' or '-'.",
            details={"name": ["1-100 characters: letters, digits, '_', '.', ':' or '-'."]},
        )
    return name


def queues_unused(*, names: Sequence[str]) -> list[str]:
    """Return those of ``names`` (queue names) that nothing sends jobs to, in the order given.

    Used by ``run_workers --queues`` to name typos at start. A queue is used by the default queue
    being it, a job of any status in it, a schedule's job template, or a registered job type's
    default queue (a Django task's ``queue_name``): ``selectors.flow_names_in_use`` without its
    live-worker rule (the worker asking serves the names it asks about), nor does a ``stint_queue``
    row count. At most one query, bounded by ``selectors.IN_USE_CHECK_MS`` (past it every name
    counts as used: no warning rather than a false one). Raises only database errors.
    """
    used = flow_names_in_use(names=[("queue", name) for name in names], workers=False)
    return [name for name in dict.fromkeys(names) if ("queue", name) not in used]


def queue_ensure(*, name: str) -> None:
    """Create queue ``name``'s row unless it exists (``INSERT ... ON CONFLICT DO NOTHING``); call it in a transaction.

    The insert waits for a queue pruner that deleted the row and has not committed, then
    inserts it anew; and a pruner waits for the transaction that made it before it commits a
    delete (``scheduler.maintenance.queue_pruner``). So a row a transaction ensured before it
    wrote what needs the queue (a schedule) outlives the transaction. ``name`` is not validated
    here; raises only database errors.
    """
    Queue.objects.bulk_create([Queue(name=name)], ignore_conflicts=True)


def _set_paused(*, name: str, paused: bool, actor: Any) -> Queue:
    name = _checked(name)
    with transaction.atomic():
        queue_ensure(name=name)
        changed = Queue.objects.filter(name=name).exclude(paused=paused).update(paused=paused, updated_at=Now())
        queue = Queue.objects.get(name=name)
        if changed:
            action_record(actor=actor, objects=[queue], flag=CHANGE, message="Paused." if paused else "Resumed.")
    if changed:
        logger.info("queue %s %s", name, "paused" if paused else "resumed", extra={"queue": name})
    return queue


def queue_pause(*, name: str, actor: Any = None) -> Queue:
    """Pause queue ``name`` (creating its row if new) and return it; pausing twice is a no-op.

    ``actor`` (a User, or None for a trusted caller) is recorded as the one who paused it
    (``scheduler.action_log``); a no-op is not recorded.
    Workers stop leasing from it within one poll interval (``SCHEDULER["POLL_SECONDS"]``); its
    jobs wait QUEUED. A job already RUNNING finishes normally. Raises InvalidQueue (400) for a
    name that no job could carry.
    """
    return _set_paused(name=name, paused=True, actor=actor)


def queue_resume(*, name: str, actor: Any = None) -> Queue:
    """Resume queue ``name`` (creating its row if new) and return it; resuming twice is a no-op.

    ``actor`` as ``queue_pause``. Raises InvalidQueue (400) for a bad name.
    """
    return _set_paused(name=name, paused=False, actor=actor)
