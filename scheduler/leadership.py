"""Leader election for the scheduler: a Redis lock with fencing tokens, a PostgreSQL advisory-lock fallback.

Leadership is an optimization; the database is the guarantee (DESIGN.md). A leader holds the
Redis key ``stint:leader:<role>`` (``SET NX PX``, renewed by a compare-and-extend script) and a
fencing token from the atomic counter ``stint:leader:<role>:token``, handed out by the same
script that takes the lock. When Redis cannot be reached, a process may lead instead by holding
``pg_try_advisory_lock`` on a dedicated PostgreSQL connection, with a token from an atomic
increment of the fence row. Either way the token is claimed in ``stint_leader_fence`` when
leadership starts, and every leader write re-checks it in its own transaction
(``fence_check``): a token older than the newest the database has seen is refused, so a paused
or partitioned former leader cannot write.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import psycopg
from django.db import DatabaseError, connection, transaction
from redis.exceptions import RedisError

from core.db_role import application_name_for
from core.dberrors import db_error_summary
from core.pg_connect import pg_connection_params

logger = logging.getLogger(__name__)

DEFAULT_ROLE = "cron"
DEFAULT_TTL_SECONDS = 10  # seconds
# The lock is trusted locally for this fraction of its TTL after the request that set it was sent.
LOCAL_TTL_FRACTION = 0.9
PG_CONNECT_TIMEOUT = 3  # seconds
# While leading through the fallback, look for Redis again at most this often (a blackholed Redis
# costs a connect timeout per look).
REDIS_RETRY_SECONDS = 2.0  # seconds
# Server-side keepalives so that PostgreSQL drops the advisory lock of a vanished host in ~11 s.
PG_KEEPALIVES = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3"}

# KEYS[1] lock, KEYS[2] token counter; ARGV[1] holder, ARGV[2] TTL ms, ARGV[3] token floor.
# Takes the lock and the next token atomically, so a newer lock always carries a larger token.
_ACQUIRE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return false
end
local token = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if token <= floor then
    token = floor + 1
    redis.call('SET', KEYS[2], string.format('%d', token))
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%d', token), 'PX', ARGV[2])
return token
"""
# KEYS[1] lock; ARGV[1] expected value, ARGV[2] TTL ms. Extends only our own lock.
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS[1] lock; ARGV[1] expected value. Deletes only our own lock.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def lock_key(role: str) -> str:
    """Return the Redis key of ``role``'s lock."""
    return f"stint:leader:{role}"


def token_key(role: str) -> str:
    """Return the Redis key of ``role``'s fencing-token counter."""
    return f"stint:leader:{role}:token"


def advisory_key(role: str) -> int:
    """Return the signed 64-bit PostgreSQL advisory-lock key of ``role``."""
    return int.from_bytes(hashlib.sha256(f"stint:leader:{role}".encode()).digest()[:8], "big", signed=True)


def fence_check(*, role: str, token: int, holder: str = "") -> bool:
    """Record ``token`` as ``role``'s fence unless a newer one is there; return False when fenced out.

    Runs ``UPDATE stint_leader_fence SET token = %s WHERE role = %s AND token <= %s`` (inserting
    the row if missing) inside the caller's transaction: the row lock it takes serializes leader
    writes, and 0 rows means a newer leader exists, so the caller must abort its write.
    ``updated_at`` is left alone: it stays the database time at which the current term was claimed;
    ``alive_at`` becomes now (the holder led at this write).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE stint_leader_fence SET token = %s, holder = %s, alive_at = now() WHERE role = %s AND token <= %s",
            [token, holder, role, token],
        )
        if cursor.rowcount:
            return True
        cursor.execute(
            "INSERT INTO stint_leader_fence (role, token, holder, updated_at, alive_at, led_since)"
            " VALUES (%s, %s, %s, now(), now(), now()) ON CONFLICT (role) DO NOTHING",
            [role, token, holder],
        )
        return cursor.rowcount == 1


def mark_alive(*, role: str, token: int) -> None:
    """Record that ``token``'s term of ``role`` led until now (its end, seen by its holder).

    Writes ``alive_at`` only while ``token`` is still the fence's: a fenced-out holder writes
    nothing. Its successor, claiming within half a lock TTL, continues the same leadership
    (``led_since``), so the fires due meanwhile are late, not missed. Raises DatabaseError.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE stint_leader_fence SET alive_at = now() WHERE role = %s AND token = %s", [role, token])


# A claim does not wait on the fence row's lock: a former leader frozen inside a leader write
# (SIGSTOP, a stalled host) holds it until its session ends; the claim fails, the lock it took is
# released, and the next tick tries again.
CLAIM_LOCK_TIMEOUT = "1s"
HANDOVER_FRACTION = 0.5  # of a lock TTL: how recently a predecessor must have led for a claim to continue it

# The ``led_since`` a claim records: its predecessor's on a handover, else now(). A handover:
# the predecessor showed it led (its release, a lost lock, its last write) within ``%(handover)s``
# seconds (``HANDOVER_FRACTION`` of a lock TTL) and after this candidate began trying
# (``%(waited)s`` seconds ago), so a scheduler ran all along. Schedulers that all stopped and
# started again leave a gap, and so does a leader that died: its lock expires a TTL after its
# last renewal, so its successor claims at least a TTL less a tick after its last write, while a
# release or a lost lock is seen by a waiting candidate within a tick (a TTL exceeds two ticks).
_LED_SINCE = """
    CASE WHEN stint_leader_fence.alive_at >= now() - make_interval(secs => least(%(handover)s, %(waited)s))
         THEN coalesce(stint_leader_fence.led_since, stint_leader_fence.updated_at)
         ELSE now() END
"""


def fence_token(*, role: str) -> int:
    """Return the newest token the database has accepted for ``role`` (0 if none)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT token FROM stint_leader_fence WHERE role = %s", [role])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _claim(*, role: str, token: int, holder: str, handover_seconds: float, waited_seconds: float) -> dt.datetime | None:
    """Claim ``token`` if it is strictly newer than the fence; return its ``led_since`` or None.

    ``led_since``: the database time the leadership this term continues began (``_LED_SINCE``:
    ``handover_seconds`` is half the lock TTL, ``waited_seconds`` how long this process has been trying).
    Raises DatabaseError, among them a lock timeout (``CLAIM_LOCK_TIMEOUT``) while another
    session holds the fence row.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [CLAIM_LOCK_TIMEOUT])
        cursor.execute(
            f"""
            INSERT INTO stint_leader_fence (role, token, holder, updated_at, alive_at, led_since)
            VALUES (%(role)s, %(token)s, %(holder)s, now(), now(), now())
            ON CONFLICT (role) DO UPDATE SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now(),
                alive_at = now(), led_since = {_LED_SINCE}
                WHERE stint_leader_fence.token < EXCLUDED.token
            RETURNING led_since
            """,  # noqa: S608 - constant SQL
            {"role": role, "token": token, "holder": holder, "handover": handover_seconds, "waited": waited_seconds},
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _claim_next(*, role: str, holder: str, handover_seconds: float, waited_seconds: float) -> tuple[int, dt.datetime]:
    """Take the fence's next token (fallback mode); return it with its ``led_since`` (as ``_claim``)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [CLAIM_LOCK_TIMEOUT])
        cursor.execute(
            f"""
            INSERT INTO stint_leader_fence (role, token, holder, updated_at, alive_at, led_since)
            VALUES (%(role)s, 1, %(holder)s, now(), now(), now())
            ON CONFLICT (role) DO UPDATE SET token = stint_leader_fence.token + 1, holder = EXCLUDED.holder,
                updated_at = now(), alive_at = now(), led_since = {_LED_SINCE}
            RETURNING token, led_since
            """,  # noqa: S608 - constant SQL
            {"role": role, "holder": holder, "handover": handover_seconds, "waited": waited_seconds},
        )
        token, led_since = cursor.fetchone()
    return int(token), led_since


def _redis():
    from django_redis import get_redis_connection

    return get_redis_connection("default")


class Leadership:
    """This process's claim to lead ``role``; call ``acquire_or_renew()`` every tick.

    ``token`` (int or None) is the fencing token of the current term, ``is_leader`` whether the
    lock is held and not locally past its TTL, ``mode`` ``"redis"``, ``"postgres"`` or None, and
    ``leading_since`` the database time the unbroken leadership this term continues began: the
    term's own claim, or its predecessor's ``leading_since`` when that one ended no more than a
    lock TTL before (a handover: a release, a lost lock; ``stint_leader_fence.led_since``), and
    kept across a switch between Redis and PostgreSQL that loses no tick. The cron firer counts
    fires due before it as missed. Not thread-safe: one loop owns it.
    """

    def __init__(
        self,
        role: str = DEFAULT_ROLE,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        *,
        redis_retry_seconds: float = REDIS_RETRY_SECONDS,
    ) -> None:
        """Prepare to lead ``role`` with a lock of ``ttl_seconds`` (a failover takes at most that plus a tick)."""
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        self.role = role
        self.ttl_seconds = ttl_seconds
        self.redis_retry_seconds = redis_retry_seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.token: int | None = None
        self.mode: str | None = None
        self.leading_since: dt.datetime | None = None
        self._candidate_since: float | None = None  # monotonic: since when this process tries to lead
        self._lock_value: str | None = None
        self._valid_until = 0.0
        self._next_redis_look = 0.0
        self._pg: psycopg.Connection | None = None
        self._scripts: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"<Leadership {self.role} token={self.token} mode={self.mode}>"

    # -- public -------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True while a term is held and its lock is not locally older than its TTL."""
        return self.token is not None and time.monotonic() < self._valid_until

    def acquire_or_renew(self) -> bool:
        """Renew the current term or try to start one; return ``is_leader``.

        Redis first: renew our lock, or take a free one. If Redis is unreachable, hold (or try)
        the PostgreSQL advisory lock instead; once Redis answers again, the term moves back to
        Redis, or ends if another process holds the Redis lock. A database error ends no term
        by itself but starts none either.
        """
        started = time.monotonic()
        if self.mode == "redis":
            self._renew_redis(started)
        elif self.mode == "postgres":
            self._renew_postgres(started)
        if self.token is None:
            if self._candidate_since is None:
                self._candidate_since = started
            try:
                if not self._acquire_redis(started, continuing=False):
                    return False
            except RedisError:
                logger.debug("leadership %s: Redis unreachable, trying the advisory lock", self.role)
                self._acquire_postgres(started, continuing=False)
            except DatabaseError as exc:
                logger.warning("leadership %s: %s; not leading", self.role, db_error_summary(exc))
                if not connection.in_atomic_block:
                    connection.close()  # a broken connection is replaced at the next query
        return self.is_leader

    def release(self) -> None:
        """End the current term (its lock is freed now, not at TTL) and close the fallback connection.

        The term's end is recorded first (``mark_alive``), so a successor continues its leadership.
        """
        self._mark_alive()
        if self.mode == "redis" and self._lock_value is not None:
            try:
                self._script("release")(keys=[lock_key(self.role)], args=[self._lock_value])
            except RedisError:
                logger.warning("leadership %s: could not release the Redis lock", self.role)
        self._end_term()
        self._close_pg()

    def fenced_out(self) -> None:
        """End the current term because the database holds a newer token than ours."""
        if self.token is not None:
            logger.warning("leadership %s: token %s fenced out by a newer leader", self.role, self.token)
        self.release()

    # -- terms --------------------------------------------------------------------------------

    def _start_term(self, *, token: int, mode: str, started: float, now: dt.datetime, continuing: bool) -> None:
        if not continuing or self.leading_since is None:
            self.leading_since = now
        self.token, self.mode = token, mode
        self._candidate_since = None
        self._valid_until = started + self.ttl_seconds * LOCAL_TTL_FRACTION
        logger.info("leadership %s: leading with token %s (%s)", self.role, token, mode)

    def _waited(self, started: float) -> float:
        """Seconds this process has been trying to lead, up to ``started`` (monotonic)."""
        if self._candidate_since is None:
            self._candidate_since = started
        return max(0.0, started - self._candidate_since)

    def _mark_alive(self) -> None:
        """Best effort ``mark_alive`` for the current term: a database error only logs."""
        if self.token is None:
            return
        try:
            mark_alive(role=self.role, token=self.token)
        except DatabaseError as exc:
            logger.warning(
                "leadership %s: could not record the end of term %s: %s", self.role, self.token, db_error_summary(exc)
            )
            if not connection.in_atomic_block:
                connection.close()

    def _end_term(self) -> None:
        if self.token is not None:
            logger.info("leadership %s: term %s ended", self.role, self.token)
        self.token = self.mode = self._lock_value = None
        self.leading_since = None
        if self._candidate_since is None:
            self._candidate_since = time.monotonic()  # a candidate again from the end of its term
        self._valid_until = 0.0

    # -- Redis --------------------------------------------------------------------------------

    def _script(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            source = {"acquire": _ACQUIRE, "extend": _EXTEND, "release": _RELEASE}[name]
            script = self._scripts[name] = _redis().register_script(source)
        return script

    def _acquire_redis(self, started: float, *, continuing: bool) -> bool:
        """Take the Redis lock if it is free; True when a term started. Raises RedisError, DatabaseError."""
        if _redis().exists(lock_key(self.role)):
            return False
        floor = fence_token(role=self.role)
        ttl_ms = int(self.ttl_seconds * 1000)
        token = self._script("acquire")(
            keys=[lock_key(self.role), token_key(self.role)], args=[self.holder, ttl_ms, floor]
        )
        if token is None:
            return False
        token = int(token)
        value = f"{self.holder}:{token}"
        try:
            now = _claim(
                role=self.role,
                token=token,
                holder=self.holder,
                handover_seconds=self.ttl_seconds * HANDOVER_FRACTION,
                waited_seconds=self._waited(started),
            )
        except DatabaseError:
            self._script("release")(keys=[lock_key(self.role)], args=[value])
            raise
        if now is None:  # a newer token reached the database after we read the floor
            self._script("release")(keys=[lock_key(self.role)], args=[value])
            return False
        self._close_pg()  # a term moving back from the fallback frees the advisory lock
        self._lock_value = value
        self._start_term(token=token, mode="redis", started=started, now=now, continuing=continuing)
        return True

    def _renew_redis(self, started: float) -> None:
        try:
            extended = self._script("extend")(
                keys=[lock_key(self.role)], args=[self._lock_value, int(self.ttl_seconds * 1000)]
            )
        except RedisError:
            logger.warning("leadership %s: Redis unreachable while renewing token %s", self.role, self.token)
            # Hand the term to the fallback at once if we can: no tick is lost, so leading_since stays
            # (and the fallback's claim finds this term's end recorded, to carry led_since on).
            self._candidate_since = time.monotonic()
            self._mark_alive()
            self.token = self.mode = self._lock_value = None
            self._valid_until = 0.0
            self._acquire_postgres(started, continuing=True)
            if self.token is None:
                self.leading_since = None
            return
        if extended:
            self._valid_until = started + self.ttl_seconds * LOCAL_TTL_FRACTION
        else:
            logger.warning("leadership %s: Redis lock lost (token %s)", self.role, self.token)
            self._candidate_since = time.monotonic()  # trying again from before its end is recorded
            self._mark_alive()
            self._end_term()

    def _redis_lock_value(self) -> str | None:
        value = _redis().get(lock_key(self.role))
        return value.decode() if isinstance(value, bytes) else value

    # -- PostgreSQL fallback ------------------------------------------------------------------

    def _connect_pg(self) -> psycopg.Connection:
        if self._pg is not None and not self._pg.closed:
            return self._pg
        params = pg_connection_params(application_name=application_name_for("leader-lock"))  # core.db_role
        params.setdefault("connect_timeout", PG_CONNECT_TIMEOUT)
        self._pg = psycopg.connect(**params, autocommit=True)
        with self._pg.cursor() as cursor:
            for name, value in PG_KEEPALIVES.items():
                cursor.execute("SELECT set_config(%s, %s, false)", [name, value])
        return self._pg

    def _close_pg(self) -> None:
        if self._pg is not None:
            try:
                # Unlock before closing: the server ends a closed session (and frees its locks)
                # asynchronously, so a successor could otherwise still find the lock taken.
                self._pg.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error:
                pass  # a dead session holds no lock
            finally:
                self._pg.close()
                self._pg = None

    def _acquire_postgres(self, started: float, *, continuing: bool) -> None:
        try:
            conn = self._connect_pg()
            with conn.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [advisory_key(self.role)])
                got = cursor.fetchone()[0]
            if not got:
                return
            token, now = _claim_next(
                role=self.role,
                holder=self.holder,
                handover_seconds=self.ttl_seconds * HANDOVER_FRACTION,
                waited_seconds=self._waited(started),
            )
        except (psycopg.Error, DatabaseError):
            logger.warning("leadership %s: PostgreSQL advisory lock unavailable", self.role, exc_info=True)
            self._close_pg()
            return
        self._start_term(token=token, mode="postgres", started=started, now=now, continuing=continuing)

    def _renew_postgres(self, started: float) -> None:
        try:
            with self._connect_pg().cursor() as cursor:
                cursor.execute("SELECT 1")
        except psycopg.Error:
            logger.warning("leadership %s: lost the advisory-lock connection (token %s)", self.role, self.token)
            self._end_term()
            self._close_pg()
            return
        self._valid_until = started + self.ttl_seconds * LOCAL_TTL_FRACTION
        if started < self._next_redis_look:
            return
        self._next_redis_look = started + self.redis_retry_seconds
        # Move the term back to Redis as soon as it answers. If another process holds the Redis
        # lock it has claimed (or will claim) a newer token, so step down now rather than be fenced.
        try:
            value = self._redis_lock_value()
            if value is not None and not value.startswith(f"{self.holder}:"):
                logger.info("leadership %s: Redis is back and another process leads there", self.role)
                self.release()
                return
            if value is not None:  # our own lock from before the outage
                self._script("release")(keys=[lock_key(self.role)], args=[value])
            self._acquire_redis(started, continuing=True)
        except RedisError:
            return
        except DatabaseError:
            logger.warning("leadership %s: database unavailable while moving back to Redis", self.role)
