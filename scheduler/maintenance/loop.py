"""The ``run_scheduler`` loop: runs each service at its interval; leader-only services only while leading."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from scheduler import metrics
from scheduler.maintenance import Service

logger = logging.getLogger(__name__)


class SchedulerLoop:
    """Tick every ``tick_seconds``; run each service whose interval has elapsed.

    ``leadership`` is an object with ``acquire_or_renew() -> bool``, ``is_leader`` and
    ``release()`` (``scheduler.leadership.Leadership``) or None, in which case leader-only
    services never run. A failing service is logged and retried at its next interval; a
    database outage closes the connection so the next tick reconnects.
    """

    def __init__(
        self,
        *,
        services: Sequence[Service],
        leader_services: Sequence[Service] = (),
        leadership: Any = None,
        tick_seconds: float = 0.2,
    ) -> None:
        self.services = list(services)
        self.leader_services = list(leader_services)
        self.leadership = leadership
        self.tick_seconds = tick_seconds
        self._stop = threading.Event()
        self._next: dict[str, float] = {}

    def stop(self) -> None:
        """Finish the current tick and return from ``run``."""
        self._stop.set()

    def run(self) -> int:
        """Run until stopped; release leadership on the way out; return 0."""
        try:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(self.tick_seconds)
        finally:
            if self.leadership is not None:
                try:
                    self.leadership.release()
                except Exception:  # releasing is best effort; the TTL frees it anyway
                    logger.warning("could not release leadership", exc_info=True)
        return 0

    def tick(self) -> int:
        """Run every due service once; return rows changed."""
        changed = 0
        leading = False
        if self.leadership is not None and self.leader_services:
            try:
                leading = bool(self.leadership.acquire_or_renew())
            except Exception:  # leadership backends fail independently; never crash the loop
                logger.exception("leadership check failed")
                leading = False
            metrics.scheduler_is_leader.set(1 if leading else 0)
        now = time.monotonic()
        for service in self.services + (self.leader_services if leading else []):
            if self._stop.is_set():
                break
            if self._next.get(service.name, 0.0) > now:
                continue
            self._next[service.name] = now + service.interval_seconds
            try:
                changed += service.run_once()
            except (OperationalError, InterfaceError) as exc:
                logger.warning("%s: database unavailable (%s); retrying", service.name, exc)
                connection.close()
            except DatabaseError:
                logger.exception("%s failed", service.name)
                connection.close()
            except Exception:  # one service's bug must not stop the others
                logger.exception("%s failed", service.name)
        return changed
