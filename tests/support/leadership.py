"""Scheduler leadership in tests: a Redis role of each test's own, and a leader holding it."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator

import pytest
from django_redis import get_redis_connection

from scheduler.leadership import Leadership, lock_key, token_key
from tests.support.jobs import db_now


def an_hour_ago_on_the_minute() -> dt.datetime:
    """About an hour before the database's now, on a whole ten minutes (a fire time of "*/5" too)."""
    t = (db_now() - dt.timedelta(hours=1)).replace(second=0, microsecond=0)
    return t - dt.timedelta(minutes=t.minute % 10)


@pytest.fixture
def role() -> Iterator[str]:
    """A role of its own per test, so Redis keys never leak between tests; its keys are deleted after."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    try:
        get_redis_connection("default").delete(lock_key(name), token_key(name))
    except Exception:  # noqa: S110 - a private server may be gone
        pass


@pytest.fixture
def leaders(role: str) -> Iterator[Callable[[], Leadership]]:
    """Build Leadership objects for ``role`` (10 s TTL); release them all at the end."""
    made: list[Leadership] = []

    def build() -> Leadership:
        lead = Leadership(role=role, ttl_seconds=10, redis_retry_seconds=0)
        made.append(lead)
        return lead

    yield build
    for lead in made:
        lead.release()


@pytest.fixture
def leader(leaders: Callable[[], Leadership]) -> Leadership:
    """A Leadership that holds ``role`` now."""
    lead = leaders()
    assert lead.acquire_or_renew()
    return lead
