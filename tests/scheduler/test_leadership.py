"""Leadership: the Redis lock and its fencing tokens, the database fence, the advisory-lock fallback."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection
from django_redis import get_redis_connection

from scheduler.leadership import (
    Leadership,
    _claim,
    _claim_next,
    advisory_key,
    fence_check,
    fence_token,
    lock_key,
    token_key,
)
from scheduler.models import LeaderFence
from tests.support.redis_server import RedisServer
from tests.support.subprocess_env import database_url

pytestmark = pytest.mark.django_db


@pytest.fixture
def make(role) -> Iterator:
    """Build Leadership objects for ``role``; release them all at the end."""
    made: list[Leadership] = []

    def build(ttl_seconds: float = 10) -> Leadership:
        lead = Leadership(role=role, ttl_seconds=ttl_seconds, redis_retry_seconds=0)
        made.append(lead)
        return lead

    yield build
    for lead in made:
        lead.release()


def test_the_first_process_leads_with_a_token_and_the_others_wait(make, role):
    a, b = make(), make()
    assert a.acquire_or_renew() is True
    assert (a.is_leader, a.mode) == (True, "redis")
    assert a.token is not None and a.token >= 1
    assert a.leading_since is not None
    assert b.acquire_or_renew() is False
    assert (b.is_leader, b.token) == (False, None)
    # The term's token is claimed in the database at once.
    assert fence_token(role=role) == a.token
    assert get_redis_connection("default").get(lock_key(role)).decode() == f"{a.holder}:{a.token}"


def test_renewal_keeps_the_token_and_extends_the_lock(make, role):
    a = make(ttl_seconds=10)
    a.acquire_or_renew()
    token = a.token
    redis = get_redis_connection("default")
    redis.pexpire(lock_key(role), 500)
    assert a.acquire_or_renew() is True
    assert a.token == token
    assert redis.pttl(lock_key(role)) > 5000


def test_release_frees_the_lock_and_the_next_leader_gets_a_larger_token(make):
    a, b = make(), make()
    a.acquire_or_renew()
    first = a.token
    a.release()
    assert (a.is_leader, a.token, a.mode) == (False, None, None)
    assert b.acquire_or_renew() is True
    assert b.token > first


def test_a_lost_lock_ends_the_term_and_the_stale_token_is_fenced_out(make, role):
    a, b = make(), make()
    a.acquire_or_renew()
    stale = a.token
    # A pauses past its TTL: the lock expires (deleted here, not waited for) and B takes over.
    get_redis_connection("default").delete(lock_key(role))
    assert b.acquire_or_renew() is True
    assert b.token > stale
    # A still believes it leads until it next renews; the database refuses its token anyway.
    assert a.is_leader is True
    assert fence_check(role=role, token=stale, holder=a.holder) is False
    assert fence_check(role=role, token=b.token, holder=b.holder) is True
    assert a.acquire_or_renew() is False
    assert (a.is_leader, a.token) == (False, None)


def test_fence_check_inserts_the_row_and_accepts_equal_or_newer_tokens(role):
    assert fence_check(role=role, token=5, holder="x") is True
    assert LeaderFence.objects.get(role=role).token == 5
    assert fence_check(role=role, token=5, holder="x") is True
    assert fence_check(role=role, token=4, holder="y") is False
    assert fence_check(role=role, token=9, holder="z") is True
    assert LeaderFence.objects.get(role=role).token == 9


def test_the_token_counter_never_falls_below_the_database_fence(make, role):
    # Redis lost its counter (restart without persistence) or a fallback leader moved the fence on.
    LeaderFence.objects.create(role=role, token=1000)
    get_redis_connection("default").set(token_key(role), 3)
    a = make()
    assert a.acquire_or_renew() is True
    assert a.token == 1001
    assert int(get_redis_connection("default").get(token_key(role))) == 1001


def test_a_claim_must_be_strictly_newer_than_the_fence(role):
    # Tokens from Redis and from the fallback never tie: of two equal claims the second fails.
    LeaderFence.objects.create(role=role, token=7)
    assert _claim(role=role, token=7, holder="x", handover_seconds=10, waited_seconds=0) is None
    assert _claim(role=role, token=8, holder="x", handover_seconds=10, waited_seconds=0) is not None
    assert _claim_next(role=role, holder="y", handover_seconds=10, waited_seconds=0)[0] == 9


def _age_the_fence(role: str, seconds: float) -> None:
    """Move the fence row's times ``seconds`` into the past (the test's transaction stops the clock)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE stint_leader_fence SET updated_at = updated_at - make_interval(secs => %s),"
            " alive_at = alive_at - make_interval(secs => %s), led_since = led_since - make_interval(secs => %s)"
            " WHERE role = %s",
            [seconds, seconds, seconds, role],
        )


def test_a_successor_within_a_ttl_of_a_release_continues_the_leadership(make, role):
    a, b = make(ttl_seconds=10), make(ttl_seconds=10)
    a.acquire_or_renew()
    assert b.acquire_or_renew() is False  # B runs, waiting for the lock
    _age_the_fence(role, 600)  # A has led for ten minutes
    since = LeaderFence.objects.get(role=role).led_since
    time.sleep(0.3)
    a.release()  # a rolling restart: A's end is recorded now ...
    with connection.cursor() as cursor:  # ... 0.2 s before B claims (this test's clock stands still)
        cursor.execute("UPDATE stint_leader_fence SET alive_at = alive_at - interval '0.2 s' WHERE role = %s", [role])
    assert b.acquire_or_renew() is True
    # Fires due in the few milliseconds between the two terms are late, not missed.
    assert b.leading_since == since
    assert LeaderFence.objects.get(role=role).led_since == since


def test_a_lost_lock_is_recorded_so_the_next_term_continues_the_leadership(make, role):
    a, b = make(ttl_seconds=10), make(ttl_seconds=10)
    a.acquire_or_renew()
    _age_the_fence(role, 600)
    since = LeaderFence.objects.get(role=role).led_since
    first = a.token
    get_redis_connection("default").delete(lock_key(role))  # FLUSHALL, or the key evicted
    # A sees its lock gone, records its term's end and, the lock being free, takes a new term at
    # once (B could as well): the leadership goes on, and so does its start.
    assert a.acquire_or_renew() is True
    assert a.token > first
    assert a.leading_since == since
    assert b.acquire_or_renew() is False


def test_schedulers_all_stopped_then_started_again_leave_a_gap_however_short(make, role):
    a = make(ttl_seconds=10)
    a.acquire_or_renew()
    a.release()  # every scheduler stopped gracefully ...
    _age_the_fence(role, 2)  # ... 2 s before a new one, started since, claims
    b = make(ttl_seconds=10)
    assert b.acquire_or_renew() is True
    assert b.leading_since == LeaderFence.objects.get(role=role).updated_at  # its own claim: fires between are missed


def test_a_successor_long_after_its_predecessor_was_last_seen_starts_a_new_leadership(make, role):
    a, b = make(ttl_seconds=10), make(ttl_seconds=10)
    a.acquire_or_renew()
    # A vanished (SIGKILL) 11 s ago, more than a TTL, with nothing recorded since.
    _age_the_fence(role, 11)
    get_redis_connection("default").delete(lock_key(role))
    assert b.acquire_or_renew() is True
    assert b.leading_since == LeaderFence.objects.get(role=role).updated_at  # its own claim
    assert b.leading_since > a.leading_since - dt.timedelta(seconds=11)  # not A's, moved 11 s back


def test_a_successor_of_a_leader_killed_right_after_a_write_starts_a_new_leadership(make, role):
    # A SIGKILLed leader's lock expires a TTL after its last renewal, and its last fire wrote
    # alive_at at most a tick before that: its successor claimed within a TTL of that write and
    # was taken for a handover, so every fire of the failover's gap was "late" and fired (with
    # misfire_policy skip, three where one was due: seen in tests/e2e/test_cron_failover.py).
    a, b = make(ttl_seconds=10), make(ttl_seconds=10)
    a.acquire_or_renew()
    assert b.acquire_or_renew() is False  # B runs, waiting for the lock ...
    b._candidate_since -= 60  # ... for a minute (monotonic seconds)
    _age_the_fence(role, 9.8)  # A's last write, a TTL less a tick before B can claim
    get_redis_connection("default").delete(lock_key(role))  # A's lock expired
    assert b.acquire_or_renew() is True
    assert b.leading_since == LeaderFence.objects.get(role=role).updated_at  # its own claim: the gap's fires missed


@pytest.mark.django_db(transaction=True)
def test_a_claim_does_not_wait_on_a_fence_row_a_frozen_leader_holds(make, role):
    LeaderFence.objects.create(role=role, token=5)
    b = make()
    # A former leader frozen (SIGSTOP) inside a fire transaction: the fence row stays locked until
    # PostgreSQL ends its session (idle in transaction), up to a minute.
    with psycopg.connect(database_url()) as frozen:
        frozen.execute("SELECT 1 FROM stint_leader_fence WHERE role = %s FOR UPDATE", [role])
        started = time.monotonic()
        assert b.acquire_or_renew() is False  # the claim gave up after CLAIM_LOCK_TIMEOUT
        assert time.monotonic() - started < 10
        assert get_redis_connection("default").get(lock_key(role)) is None  # its Redis lock given back
    assert b.acquire_or_renew() is True  # the next tick, once the row is free
    assert b.token > 5


def test_an_invalid_ttl_is_refused():
    with pytest.raises(ValueError, match="positive"):
        Leadership(role="x", ttl_seconds=0)


# -- Redis down: the PostgreSQL advisory lock ----------------------------------------------------


@pytest.fixture
def private_redis(settings) -> Iterator[RedisServer]:
    """A redis-server of our own, wired in as the default cache, that the test may stop."""
    server = RedisServer()
    server.start()
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": server.url}}
    yield server
    server.close()


def _advisory_lock_held(role: str) -> bool:
    """True when some session holds the role's advisory lock (checked from a fresh connection)."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", [advisory_key(role)]).fetchone()[0]
        if got:
            conn.execute("SELECT pg_advisory_unlock(%s)", [advisory_key(role)])
        return not got


def test_redis_down_hands_the_term_to_the_advisory_lock_and_back(private_redis, make, role):
    a, b = make(), make()
    assert a.acquire_or_renew() is True
    redis_token = a.token
    since = a.leading_since
    _age_the_fence(role, 5)  # A has led 5 s, and last wrote then
    led_since = LeaderFence.objects.get(role=role).led_since

    private_redis.stop()
    # A cannot renew in Redis: it moves to the advisory lock at once, with a newer token, and
    # keeps its leading_since (no tick was lost). B cannot lead: the advisory lock is A's.
    assert a.acquire_or_renew() is True
    assert a.mode == "postgres"
    assert a.token > redis_token
    assert a.leading_since == since
    assert fence_token(role=role) == a.token
    assert LeaderFence.objects.get(role=role).led_since == led_since  # the same leadership, for a successor
    assert _advisory_lock_held(role)
    assert b.acquire_or_renew() is False
    assert a.acquire_or_renew() is True  # renewing in fallback mode keeps the token
    pg_token = a.token

    private_redis.start()  # back, and empty: no lock, no counter
    assert a.acquire_or_renew() is True
    assert a.mode == "redis"
    assert a.token > pg_token  # the counter restarted at 1 but the floor is the fence
    assert not _advisory_lock_held(role)
    assert b.acquire_or_renew() is False


def test_when_redis_returns_another_process_may_take_over_and_the_fallback_leader_steps_down(private_redis, make, role):
    a, b = make(), make()
    private_redis.stop()
    assert a.acquire_or_renew() is True
    assert a.mode == "postgres"
    assert b.acquire_or_renew() is False

    private_redis.start()
    assert b.acquire_or_renew() is True  # the Redis lock is free and its token beats the fence
    assert b.mode == "redis"
    assert b.token > a.token
    assert fence_check(role=role, token=a.token, holder=a.holder) is False
    assert a.acquire_or_renew() is False  # A sees B's lock and steps down
    assert a.token is None
    assert not _advisory_lock_held(role)


def test_with_redis_unreachable_from_the_start_the_first_process_leads_through_postgresql(settings, make):
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:9/0"}}
    a, b = make(), make()
    assert a.acquire_or_renew() is True
    assert a.mode == "postgres"
    assert b.acquire_or_renew() is False
    a.release()  # closing the session frees the advisory lock at once
    assert b.acquire_or_renew() is True
    assert b.token > 0
