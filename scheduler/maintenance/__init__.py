"""Background services run by ``run_scheduler``: each is ``run_once(now) -> count`` plus a thin loop.

A service is any object with ``name`` (str), ``interval_seconds`` (float), ``leader_only``
(bool: run only while this process holds cron leadership) and ``run_once(now=None) -> int``
(rows changed; ``now`` is an aware UTC datetime for tests, None for the database clock).
``default_services()`` is the list ``run_scheduler`` runs.
"""

from __future__ import annotations

import datetime as dt
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


def default_services() -> list[Service]:
    """Return the services ``run_scheduler`` runs, in tick order."""
    from audit.quarantine import QuarantinePruner
    from scheduler.maintenance.promoter import DuePromoter
    from scheduler.maintenance.pruner import Pruner
    from scheduler.maintenance.reconciler import AuditReconciler
    from scheduler.maintenance.rescuer import LeaseRescuer, WorkerReaper
    from scheduler.outbox import OutboxPruner, OutboxRelay

    services: list[Service] = [DuePromoter(), LeaseRescuer(), WorkerReaper(), Pruner()]
    # The cron firer needs leadership: see leader_services().
    services += [OutboxRelay(), OutboxPruner(), AuditReconciler(), QuarantinePruner()]
    from scheduler.flow.aging import Reprioritizer  # flow control (issue 17): off unless AGING_SECONDS
    from scheduler.flow.pruner import AdmissionPruner

    services += [Reprioritizer(), AdmissionPruner()]
    return services


def leader_services(leadership: Leadership) -> list[Service]:
    """Return the services that run only while ``leadership`` is held (the cron firer)."""
    from scheduler.maintenance.cron_firer import CronFirer

    return [CronFirer(leadership=leadership)]
