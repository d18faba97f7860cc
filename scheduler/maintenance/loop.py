"""The ``run_scheduler`` loop: each service runs at its interval in its own thread; leader-only ones only while leading.

One thread per service keeps a slow one (the outbox relay waiting on an unreachable broker)
from delaying promotion, lease rescue or the renewal of cron leadership. Each thread has its
own database connection (Django's connections are per thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connection

from core.dberrors import db_error_summary
from scheduler import metrics
from scheduler.maintenance import Service

logger = logging.getLogger(__name__)

IDLE_MAX_SECONDS = 1.0  # an idle service backs off to at most this interval (or its own, if longer)
SECOND_ALIGN_SECONDS = 0.005  # an idle poll lands this long after a whole second
DUE_MIN_WAIT_SECONDS = 0.005  # the shortest wait for a service's ``next_due_seconds`` (e.g. due rows locked elsewhere)


def idle_interval(base: float, idle_runs: int, *, now: float | None = None) -> float:
    """Return the wait in seconds after ``idle_runs`` consecutive runs that changed nothing.

    ``base * 2**idle_runs``, capped at ``max(base, IDLE_MAX_SECONDS)``, and for a backed-off
    service also cut to end just after the next whole second of ``now`` (epoch seconds, default
    the clock): cron fires and delayed jobs fall due on whole seconds, so an idle service still
    acts within milliseconds of them while polling about once a second, which keeps an idle
    scheduler under 1% of a core.
    """
    wait = min(base * (2 ** min(idle_runs, 16)), max(base, IDLE_MAX_SECONDS))
    if wait > base:
        now = time.time() if now is None else now
        wait = min(wait, 1.0 - now % 1.0 + SECOND_ALIGN_SECONDS)
    return wait


class SchedulerLoop:
    """Run services at their intervals until stopped.

    ``leadership`` is an object with ``acquire_or_renew() -> bool`` and ``release()``
    (``scheduler.leadership.Leadership``) or None, in which case leader-only services never run.
    A failing service is logged and retried at its next interval; a database error closes that
    thread's connection so its next run reconnects. A service with a ``next_due_seconds``
    attribute (the promoter) that is not None after a run is run again no later than that many
    seconds after it ended.
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
        self._leading = threading.Event()
        self._next: dict[str, float] = {}

    def stop(self) -> None:
        """Let every service finish its current run, then return from ``run``."""
        self._stop.set()

    def run(self) -> int:
        """Run until stopped; release leadership on the way out; return 0."""
        leader_names = {s.name for s in self.leader_services}
        threads = [
            threading.Thread(
                target=self._service_loop, args=(s, s.name in leader_names), name=f"stint-{s.name}", daemon=True
            )
            for s in self.services + (self.leader_services if self.leadership is not None else [])
        ]
        for thread in threads:
            thread.start()
        try:
            while not self._stop.is_set():
                self._renew_leadership()
                self._stop.wait(self.tick_seconds)
        finally:
            for thread in threads:
                thread.join(timeout=30)
            if self.leadership is not None:
                self._leading.clear()
                try:
                    self.leadership.release()
                except Exception:  # releasing is best effort; the TTL frees it anyway
                    logger.warning("could not release leadership", exc_info=True)
            close_old_connections()
        return 0

    def _renew_leadership(self) -> bool:
        if self.leadership is None or not self.leader_services:
            return False
        try:
            leading = bool(self.leadership.acquire_or_renew())
        except Exception:  # leadership backends fail independently; never crash the loop
            logger.exception("leadership check failed")
            leading = False
        if leading:
            self._leading.set()
        else:
            self._leading.clear()
        metrics.scheduler_is_leader.set(1 if leading else 0)
        return leading

    def _service_loop(self, service: Service, leader_only: bool) -> None:
        idle = 0  # consecutive runs that changed nothing
        while not self._stop.is_set():
            if leader_only and not self._leading.is_set():
                self._stop.wait(self.tick_seconds)
                continue
            started = time.monotonic()
            idle = 0 if self._run_one(service) else idle + 1
            wait = max(self.tick_seconds / 4, idle_interval(service.interval_seconds, idle))
            wait -= time.monotonic() - started
            due = getattr(service, "next_due_seconds", None)  # set by a service that knows when work falls due
            if due is not None:
                wait = min(wait, max(due, DUE_MIN_WAIT_SECONDS))
            self._stop.wait(wait)
        close_old_connections()

    def _run_one(self, service: Service) -> int:
        try:
            return service.run_once()
        except (OperationalError, InterfaceError) as exc:
            # psycopg makes a lock or statement timeout an OperationalError too: the summary says which.
            logger.warning("%s: %s; retrying", service.name, db_error_summary(exc))
            connection.close()
        except DatabaseError:
            logger.exception("%s failed", service.name)
            connection.close()
        except Exception:  # one service's bug must not stop the others
            logger.exception("%s failed", service.name)
        return 0
