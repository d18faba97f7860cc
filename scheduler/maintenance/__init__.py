"""Background services run by ``run_scheduler``: each is ``run_once(now) -> count`` plus a thin loop.

A service is any object with ``name`` (str), ``interval_seconds`` (float), ``leader_only``
(bool: run only while this process holds cron leadership) and ``run_once(now=None) -> int``
(rows changed; ``now`` is an aware UTC datetime for tests, None for the database clock).
``default_services()`` is the list ``run_scheduler`` runs: the scheduler's own, then those other
apps add with ``register_service`` from their ``AppConfig.ready()`` (the audit app's quarantine
pruner), so the scheduler imports no app built on it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler.leadership import Leadership


class Service(Protocol):
    """One maintenance duty of the scheduler process."""

    name: str
    interval_seconds: float
    leader_only: bool

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Do one round of work; return how many rows it changed."""
        ...


def delete_expired(
    *, table: str, time_column: str, where: str, now: dt.datetime | None, age: dt.timedelta, batch: int, batches: int
) -> int:
    """Delete rows of ``table`` whose ``time_column`` is before ``now - age``, oldest first; return how many.

    The retention rule of a growing table, in bounded statements: at most ``batches`` deletes of
    ``batch`` rows (each its own transaction), stopping at the first short one. ``where`` is an
    extra SQL condition (constant text, e.g. ``published_at IS NOT NULL``). ``now`` defaults to
    the database clock. Several schedulers may run it at once: each deletes rows the others have
    not locked (``SKIP LOCKED``). Raises only database errors.
    """
    from django.db import connection

    sql = f"""
        DELETE FROM {table} WHERE id IN (
            SELECT id FROM {table}
            WHERE {where} AND {time_column} < coalesce(%s, now()) - %s
            ORDER BY {time_column}
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        )
    """  # noqa: S608 - constant table and column names from the callers
    total = 0
    for _ in range(batches):
        with connection.cursor() as cursor:
            cursor.execute(sql, [now, age, batch])
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            break
    return total


_registered: list[Callable[[], Service]] = []


def register_service(factory: Callable[[], Service]) -> None:
    """Add a service built by ``factory()`` to ``default_services()`` (once per factory; from ``AppConfig.ready``)."""
    if factory not in _registered:
        _registered.append(factory)


def default_services() -> list[Service]:
    """Return the services ``run_scheduler`` runs, in tick order: the scheduler's own, then registered ones."""
    from scheduler.maintenance.claim_index import ClaimIndexUpkeep
    from scheduler.maintenance.outbox_pruner import OutboxPruner
    from scheduler.maintenance.promoter import DuePromoter
    from scheduler.maintenance.pruner import Pruner
    from scheduler.maintenance.queue_pruner import QueuePruner
    from scheduler.maintenance.reconciler import AuditReconciler
    from scheduler.maintenance.relay import OutboxRelay
    from scheduler.maintenance.rescuer import LeaseRescuer, WorkerReaper

    services: list[Service] = [DuePromoter(), LeaseRescuer(), WorkerReaper(), Pruner(), QueuePruner()]
    # The cron firer needs leadership: see leader_services().
    services += [OutboxRelay(), OutboxPruner(), AuditReconciler(), ClaimIndexUpkeep()]
    from scheduler.flow.aging import Reprioritizer  # flow control (issue 17): off unless AGING_SECONDS
    from scheduler.flow.pruner import AdmissionPruner

    services += [Reprioritizer(), AdmissionPruner()]
    return services + [factory() for factory in _registered]


def leader_services(leadership: Leadership) -> list[Service]:
    """Return the services that run only while ``leadership`` is held (the cron firer)."""
    from scheduler.maintenance.cron_firer import CronFirer

    return [CronFirer(leadership=leadership)]
