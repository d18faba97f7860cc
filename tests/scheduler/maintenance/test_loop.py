"""The scheduler loop (scheduler.maintenance.loop): runs each service on its interval, leader services while leading."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import pytest
from django.db import connection

from core.pg_connect import pg_connect
from scheduler.maintenance import default_services
from scheduler.maintenance.loop import SchedulerLoop
from scheduler.maintenance.promoter import DuePromoter

# -- SchedulerLoop ---------------------------------------------------------------------------


class FakeService:
    """A service that counts its runs and may raise."""

    def __init__(
        self,
        name: str,
        *,
        interval: float = 0.0,
        fails: bool = False,
        leader_only: bool = False,
        on_run: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.on_run = on_run
        self.interval_seconds = interval
        self.leader_only = leader_only
        self.fails = fails
        self.runs = 0

    def run_once(self, now: dt.datetime | None = None) -> int:
        self.runs += 1
        if self.on_run is not None:
            self.on_run()
        if self.fails:
            raise RuntimeError(f"{self.name} broke")
        return 2


class FakeLeadership:
    def __init__(self, leading: bool) -> None:
        self.leading = leading
        self.released = False

    def acquire_or_renew(self) -> bool:
        return self.leading

    def release(self) -> None:
        self.released = True


def test_a_failing_service_run_is_logged_and_counts_nothing() -> None:
    fast, broken = FakeService("fast"), FakeService("broken", fails=True)
    loop = SchedulerLoop(services=[broken, fast])

    assert loop._run_one(broken) == 0
    assert loop._run_one(fast) == 2
    assert (fast.runs, broken.runs) == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_a_lock_timeout_is_logged_as_a_wait_for_a_lock_not_as_the_database_down(caplog) -> None:
    """A real 55P03: another session holds stint_job ACCESS EXCLUSIVE past this session's lock_timeout."""
    promoter = DuePromoter()
    loop = SchedulerLoop(services=[promoter])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '100ms'")  # an operator's or a role's setting, not the scheduler's
    with pg_connect(autocommit=False) as locker, caplog.at_level(logging.WARNING, logger="scheduler.maintenance.loop"):
        locker.execute("LOCK TABLE stint_job IN ACCESS EXCLUSIVE MODE")
        assert loop._run_one(promoter) == 0
        locker.rollback()

    [record] = [r for r in caplog.records if r.name == "scheduler.maintenance.loop"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "promoter: waiting for a lock timed out (SQLSTATE 55P03 lock_not_available:"
        " canceling statement due to lock timeout); retrying"
    )
    assert loop._run_one(promoter) == 0  # the lock is gone: the next run works


@pytest.mark.parametrize("leading", [True, False])
def test_loop_runs_leader_services_only_while_leading(leading: bool) -> None:
    loop = SchedulerLoop(services=[], leadership=FakeLeadership(leading), tick_seconds=0.01)
    # The loop ends once every service that may run has run: cron too while leading.
    plain = FakeService("plain", on_run=None if leading else loop.stop)
    cron = FakeService("cron", leader_only=True, on_run=lambda: plain.runs and loop.stop())
    loop.services, loop.leader_services = [plain], [cron]

    assert loop.run() == 0

    assert plain.runs >= 1
    assert (cron.runs >= 1) if leading else (cron.runs == 0)


def test_loop_stops_and_releases_leadership() -> None:
    leadership = FakeLeadership(True)
    loop = SchedulerLoop(services=[], leadership=leadership, tick_seconds=0.01)
    loop.stop()

    assert loop.run() == 0
    assert leadership.released


def test_default_services_cover_promotion_rescue_reaping_and_pruning() -> None:
    names = {s.name for s in default_services()}
    assert {"promoter", "rescuer", "worker_reaper", "pruner"} <= names


def test_an_idle_service_backs_off_to_at_most_a_second_and_a_busy_one_keeps_its_interval() -> None:
    from scheduler.maintenance.loop import IDLE_MAX_SECONDS, idle_interval

    assert idle_interval(0.1, 0, now=100.0) == 0.1
    assert idle_interval(0.1, 2, now=100.0) == pytest.approx(0.4)
    assert idle_interval(0.1, 50, now=100.0) == IDLE_MAX_SECONDS
    # Backed off, it wakes just after the next whole second, when cron fires fall due.
    assert idle_interval(0.1, 50, now=100.7) == pytest.approx(0.305)
    assert idle_interval(60.0, 50, now=100.7) == 60.0  # a slow service keeps its own interval


class IdleService(FakeService):
    """Finds nothing to do, but knows when work falls due."""

    def __init__(self, due: float | None) -> None:
        super().__init__("idle", interval=60.0)
        self.next_due_seconds = due

    def run_once(self, now: dt.datetime | None = None) -> int:
        self.runs += 1
        return 0


class RecordingStop:
    """Stands in for the loop's stop event: records each wait, then stops the loop."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def is_set(self) -> bool:
        return bool(self.waits)

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return True


def test_the_loop_wakes_a_service_when_its_work_falls_due_before_its_next_poll() -> None:
    loop = SchedulerLoop(services=[])
    loop._stop = RecordingStop()

    loop._service_loop(IdleService(due=0.25), leader_only=False)

    assert loop._stop.waits == [0.25]
