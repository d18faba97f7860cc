"""The locks of ``scheduler.schedules``: the schedule quota counts creates one after another and blocks nothing else.

Real concurrent transactions on separate connections (one per thread), hence ``transaction=True``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from django.db import connection, transaction
from rest_framework_simplejwt.tokens import RefreshToken

from scheduler import schedules
from scheduler.enqueuing import enqueue
from scheduler.exceptions import InvalidSchedule
from scheduler.models import CronSchedule, IdempotencyRecord, Job
from scheduler.queues import queue_ensure
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SCHEDULE = {"name": "s", "interval_seconds": 3600, "job": {"type": "DEMO_TASK", "payload": {}}}
LOCK_TIMEOUT = "2s"  # a write that waits on the open create fails after this instead of hanging
HOLD_SECONDS = 60  # at most, the open create's transaction


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


@contextmanager
def _create_held_open(owner, pool: ThreadPoolExecutor) -> Iterator[None]:
    """Run ``schedule_create`` for ``owner`` on another connection and keep its transaction open for the block.

    The transaction commits when the block ends; the create's locks (the quota's on the owner's
    row among them) are held until then.
    """
    inside, release = threading.Event(), threading.Event()

    def hold() -> int:
        try:
            with transaction.atomic():
                made = schedules.schedule_create(owner=owner, actor=owner, **SCHEDULE)
                inside.set()
                release.wait(timeout=HOLD_SECONDS)
            return made.id
        finally:
            connection.close()

    held = pool.submit(hold)
    wait_until(lambda: inside.is_set() or held.done(), what="the create inside its transaction")
    try:
        yield
    finally:
        release.set()
        held.result(timeout=HOLD_SECONDS)


def _enqueue(user) -> None:
    enqueue("DEMO_TASK", owner=user)


def _enqueue_with_key(user) -> None:
    enqueue("DEMO_TASK", owner=user, idempotency_key="k")


def _mint_refresh_token(user) -> None:
    RefreshToken.for_user(user)  # writes an outstanding-token row that references the user


@pytest.mark.parametrize(
    "write",
    [_enqueue, _enqueue_with_key, _mint_refresh_token],
    ids=["job", "job-with-idempotency-key", "refresh-token"],
)
def test_an_open_schedule_create_does_not_block_the_owners_writes_that_reference_the_user(
    user, write: Callable[..., None]
):
    # The quota's lock on the owner's row was FOR UPDATE, which conflicts with the FOR KEY SHARE
    # of every foreign-key check on that row: while one create of a user was open, that user's
    # job inserts, idempotency records and logins waited for it.
    queue_ensure(name="default")  # committed first: the create inserts no queue row another insert could wait on
    with ThreadPoolExecutor(max_workers=1) as pool, _create_held_open(user, pool):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_TIMEOUT])
            write(user)  # the foreign keys are checked at commit (deferred): the atomic block's end

    assert CronSchedule.objects.filter(owner=user).count() == 1
    if write is not _mint_refresh_token:
        assert Job.objects.filter(owner=user).count() == 1
    if write is _enqueue_with_key:
        assert IdempotencyRecord.objects.get(owner=user).job_id is not None


def test_a_create_waits_for_an_open_create_of_the_same_owner_and_then_counts_its_schedule(user, settings):
    # Forced interleaving: without the lock the second create would count 0 (the first's row is
    # not committed) and make a second schedule past a quota of one.
    settings.SCHEDULER = {**settings.SCHEDULER, "MAX_SCHEDULES_PER_USER": 1}
    queue_ensure(name="default")  # else the second would wait on the first's new queue row, not on the quota

    def second() -> str:
        try:
            schedules.schedule_create(owner=user, actor=user, **SCHEDULE)
            return "created"
        except InvalidSchedule as exc:
            return str(exc)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        with _create_held_open(user, pool):
            contender = pool.submit(second)
            # Done already (it did not wait): the outcome below says what it did instead.
            wait_until(
                lambda: contender.done() or _waiting_on_a_lock(), what="the second create waiting on the owner's row"
            )
        outcome = contender.result(timeout=HOLD_SECONDS)

    assert outcome == "A user may hold at most 1 schedules."
    assert CronSchedule.objects.filter(owner=user).count() == 1


def test_concurrent_creates_never_exceed_the_quota(user, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "MAX_SCHEDULES_PER_USER": 3}
    creates = 8
    start = threading.Barrier(creates)

    def create(_: int) -> bool:
        try:
            start.wait(timeout=HOLD_SECONDS)
            schedules.schedule_create(owner=user, actor=user, **SCHEDULE)
            return True
        except InvalidSchedule:
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=creates) as pool:
        made = list(pool.map(create, range(creates)))

    assert sorted(made) == [False] * 5 + [True] * 3
    assert CronSchedule.objects.filter(owner=user).count() == 3
