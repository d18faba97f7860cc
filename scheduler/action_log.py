"""The operator action history: who cancelled, retried or recovered a job, paused a queue, changed a limit or schedule.

Entries are Django's own ``django.contrib.admin.models.LogEntry`` rows, so each object's admin
History page, the admin index's "Recent actions" and the console's "Operator actions" list and
dashboard card show them, with no table of our own. The services write them
(``scheduler.job_actions``, ``scheduler.queues``, ``scheduler.flow.limits``,
``scheduler.schedules``) in the transaction of the change they record: every door (console, API,
user pages) records the same way, and a change that rolls back leaves no entry. A trusted caller
(``actor`` None: the scheduler's own moves, commands, project code) is not recorded: there is no
one to name. ``scheduler.maintenance.pruner`` deletes entries older than
``SCHEDULER["OPERATOR_LOG_RETENTION_DAYS"]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.admin.models import LogEntry
from django.db import models, transaction

RECENT_SHOWN = 10  # entries on the dashboard's card
VALUE_CHARS = 60  # characters of an old or new value kept in a change message


def action_record(*, actor: Any, objects: Iterable[models.Model], flag: int, message: str) -> int:
    """Record that ``actor`` did ``flag`` (ADDITION, CHANGE or DELETION) to each of ``objects``; return how many.

    One ``LogEntry`` per object, saved in one statement (``LogEntry.objects.log_actions``) with
    ``message`` (plain text, shown as written) as its change message and ``str(object)`` (cut at
    200 characters) as its name. ``actor`` None, or a user without a primary key (anonymous), records
    nothing and returns 0. Call it inside the transaction that makes the change (RuntimeError
    otherwise), after the change, so the entry commits or rolls back with it; a deleted object is
    recorded before its ``delete()`` (which clears its primary key).
    """
    user_id = getattr(actor, "pk", None)
    if user_id is None:
        return 0
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("An operator action is recorded in the transaction of its change.")
    rows = list(objects)
    if not rows:
        return 0
    LogEntry.objects.log_actions(user_id=user_id, queryset=rows, action_flag=flag, change_message=message)
    return len(rows)


def value_text(value: Any) -> str:
    """Render a field's value for a change message: ``-`` for None, else its text cut at ``VALUE_CHARS``."""
    if value is None:
        return "-"
    text = str(value)
    return text if len(text) <= VALUE_CHARS else f"{text[: VALUE_CHARS - 1]}…"


def changes_text(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Return "concurrency 5 → 10; rate_limit - → 3" for the fields whose value differs, or "" when none does."""
    return "; ".join(
        f"{field} {value_text(before.get(field))} → {value_text(after.get(field))}"
        for field in after
        if before.get(field) != after.get(field)
    )


def actions_recent(*, limit: int = RECENT_SHOWN) -> list[LogEntry]:
    """Return the latest ``limit`` entries of every user, newest first (by id: the primary key's index)."""
    return list(LogEntry.objects.select_related("user", "content_type").order_by("-id")[:limit])
