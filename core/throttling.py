"""Rate-limit the API with one atomic sliding-window script in Redis, failing open when Redis is away.

How it fits together:

- ``SlidingWindowThrottle`` is the default DRF throttle (``REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]``).
  A view's ``throttle_scope`` picks the budget (default ``user``); rates come from
  ``settings.STINT_RATE_LIMITS`` (``{"user": "100/min", "auth": "10/min"}``, the same
  ``"<count>/<s|min|hour|day>"`` strings as DRF's ``DEFAULT_THROTTLE_RATES``), read per request
  so ``override_settings`` works; a scope without a rate of its own uses the ``user`` rate in a
  bucket of its own, and a rate of ``None`` turns a scope off. Scopes in ``ADDRESS_SCOPES``
  (login, register) are counted per client address; every other scope per user, or per address
  for an anonymous caller.
- The budget is a sliding log: one sorted set per (scope, identity) of request timestamps from
  Redis's own clock (``TIME``), so every web host agrees on the window. Prune, count, add and
  expire happen in one Lua script: concurrent requests can never both take the last slot.
- ``RateLimitHeadersMiddleware`` copies the decision the throttle left on the request into
  ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and ``X-RateLimit-Reset`` (seconds until the
  oldest counted request leaves the window, i.e. until ``Remaining`` next grows) on every
  response of a throttled scope, 429s included. A 429's ``Retry-After`` (set by DRF from
  ``wait()``) equals its ``X-RateLimit-Reset``. A middleware rather than a view hook, so views
  need no common base class.
- Redis unreachable: the request is allowed (fail open), no rate headers are sent, each such
  check counts in ``rate_limit_backend_errors_total``, a warning is logged at most once a
  minute, and Redis is left alone for ``BACKEND_RETRY_SECONDS`` so a hung server costs one
  socket timeout per second, not one per request.
- The client address is the socket peer (``REMOTE_ADDR``). With ``TRUSTED_PROXY_COUNT = N > 0``
  it is the N-th ``X-Forwarded-For`` entry from the right: the one our outermost trusted proxy
  appended. Entries to its left are client-supplied and never read, so a forged header cannot
  buy a fresh budget. IPv6 callers are counted per /64, the block one host usually controls.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from rest_framework.throttling import BaseThrottle

from core.metrics import rate_limit_backend_errors_total, rate_limit_rejections_total
from core.rates import Rate, rate_parse

if TYPE_CHECKING:  # rest_framework.views imports this module through DEFAULT_THROTTLE_CLASSES
    from redis.commands.core import Script
    from rest_framework.request import Request
    from rest_framework.views import APIView

# redis (8.x imports redis.asyncio and OpenTelemetry's metrics SDK, about 0.3 s) is imported on the first
# rate-limit check, not by every process that loads the admin (workers, scheduler, commands).

logger = logging.getLogger(__name__)

DEFAULT_SCOPE = "user"
ADDRESS_SCOPES = frozenset({"auth"})  # scopes counted per client address, never per user
CACHE_ALIAS = "default"
KEY_NAMESPACE = "rl"  # keys are cache.make_key("rl:<scope>:<identity>"), e.g. "stint:1:rl:auth:addr:203.0.113.7"
REQUEST_ATTR = "stint_rate_limit"  # where the throttle leaves its decision for the middleware
WARNING_INTERVAL_SECONDS = 60.0  # seconds between two "Redis unreachable" warnings
BACKEND_RETRY_SECONDS = 1.0  # seconds a failed Redis is bypassed before it is tried again
IPV6_PREFIX = 64  # bits of an IPv6 address that identify one client

# KEYS[1]: the sorted set of one budget. ARGV: limit, window (ms), a unique member.
# Returns {allowed (0/1), remaining, ms until the oldest counted request leaves the window}.
SLIDING_WINDOW_LUA = """
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local allowed = 0
if count < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
  count = count + 1
  allowed = 1
end
local reset = window
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if oldest[2] then
  reset = tonumber(oldest[2]) + window - now
end
return {allowed, limit - count, reset}
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitDecision:
    """What one check decided; ``reset_seconds`` is when ``remaining`` next grows (whole seconds, >= 1)."""

    scope: str
    allowed: bool
    limit: int
    remaining: int
    reset_seconds: int


def rate_for_scope(scope: str) -> Rate | None:
    """Return the configured rate of ``scope`` (``user``'s when it has none); None when turned off."""
    rates: dict[str, str | None] = settings.STINT_RATE_LIMITS
    value = rates[scope] if scope in rates else rates.get(DEFAULT_SCOPE)
    return None if value is None else rate_parse(value)


def _address_key(value: str) -> str | None:
    try:
        address = ipaddress.ip_address(value.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/{IPV6_PREFIX}", strict=False))
    return str(address)


def client_address(request: HttpRequest) -> str:
    """Return the caller's address as a rate-limit identity (IPv4, or an IPv6 /64 network).

    The socket peer, unless ``settings.TRUSTED_PROXY_COUNT`` is N > 0: then the N-th
    ``X-Forwarded-For`` entry from the right. A header with fewer entries than trusted proxies,
    or an entry that is no IP address, falls back to the peer: never to a client-chosen value.
    """
    peer = request.META.get("REMOTE_ADDR", "")
    proxies: int = settings.TRUSTED_PROXY_COUNT
    if proxies > 0:
        hops = [hop for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
        if len(hops) >= proxies:
            forwarded = _address_key(hops[-proxies])
            if forwarded is not None:
                return forwarded
    return _address_key(peer) or peer or "unknown"


def rate_identity(*, scope: str, user: Any, request: HttpRequest) -> str:
    """Return whose budget a request in ``scope`` counts against: ``"addr:<address>"`` or ``"user:<pk>"``.

    A scope in ``ADDRESS_SCOPES``, or an anonymous caller (``user`` None or not authenticated),
    is counted per ``client_address(request)``; every other caller per user. The one rule for
    the API throttle and the pages' and admin's limits alike.
    """
    if scope in ADDRESS_SCOPES or user is None or not user.is_authenticated:
        return f"addr:{client_address(request)}"
    return f"user:{user.pk}"


class _Interval:
    """A restartable span of ``interval`` seconds on the monotonic clock (thread-safe)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._next_at = 0.0

    def start_if_elapsed(self) -> bool:
        """Start a new span and return True, unless one is running (then False)."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_at:
                return False
            self._next_at = now + self.interval
            return True

    def running(self) -> bool:
        """Return True while a span runs."""
        with self._lock:
            return time.monotonic() < self._next_at

    def reset(self) -> None:
        """End the running span, if any."""
        with self._lock:
            self._next_at = 0.0


_warning_quiet = _Interval(WARNING_INTERVAL_SECONDS)  # no second warning while it runs
_backend_pause = _Interval(BACKEND_RETRY_SECONDS)  # Redis is not tried while it runs
_script: Script | None = None


def _backend_failed(exc: BaseException | None) -> None:
    rate_limit_backend_errors_total.inc()
    if _warning_quiet.start_if_elapsed():
        logger.warning("rate limiting is failing open: Redis unreachable or failing (%s)", exc or "recent error")


def window_hit(*, scope: str, identity: str, rate: Rate) -> RateLimitDecision | None:
    """Count one request against the (scope, identity) budget; return the decision.

    Returns None when Redis cannot be reached (the caller lets the request through); that is
    counted, logged at most once a minute, and Redis is skipped for ``BACKEND_RETRY_SECONDS``.
    """
    global _script
    if _backend_pause.running():
        _backend_failed(None)
        return None
    from django_redis import get_redis_connection
    from redis.exceptions import RedisError

    key = caches[CACHE_ALIAS].make_key(f"{KEY_NAMESPACE}:{scope}:{identity}")
    try:
        conn = get_redis_connection(CACHE_ALIAS)
        if _script is None:
            _script = conn.register_script(SLIDING_WINDOW_LUA)
        allowed, remaining, reset_ms = _script(
            keys=[key], args=[rate.limit, rate.window_seconds * 1000, uuid.uuid4().hex], client=conn
        )
    except (RedisError, OSError) as exc:
        _backend_pause.start_if_elapsed()
        _backend_failed(exc)
        return None
    return RateLimitDecision(
        scope=scope,
        allowed=bool(allowed),
        limit=rate.limit,
        remaining=max(int(remaining), 0),
        reset_seconds=max(math.ceil(int(reset_ms) / 1000), 1),
    )


def backend_state_reset() -> None:
    """Forget past Redis failures: the next check tries Redis, and the next failure warns again."""
    _backend_pause.reset()
    _warning_quiet.reset()


def rate_limits_clear() -> int:
    """Delete every rate-limit budget in Redis (all scopes and identities); return how many.

    For operators after a limit change, and for the test suite between tests.
    """
    from django_redis import get_redis_connection

    conn = get_redis_connection(CACHE_ALIAS)
    keys = list(conn.scan_iter(match=caches[CACHE_ALIAS].make_key(f"{KEY_NAMESPACE}:*"), count=500))
    return int(conn.delete(*keys)) if keys else 0


class SlidingWindowThrottle(BaseThrottle):
    """DRF throttle over ``window_hit``; see the module docstring for scopes, keys and headers."""

    def __init__(self) -> None:
        self._wait: int | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        """Count the request in its scope's budget; False (429) once the budget is spent."""
        scope: str = getattr(view, "throttle_scope", None) or DEFAULT_SCOPE
        rate = rate_for_scope(scope)
        if rate is None:
            return True
        identity = rate_identity(scope=scope, user=getattr(request, "user", None), request=request._request)
        decision = window_hit(scope=scope, identity=identity, rate=rate)
        if decision is None:
            return True
        previous: RateLimitDecision | None = getattr(request._request, REQUEST_ATTR, None)
        # With several throttles the most restrictive decision (a rejection first) is reported.
        if previous is None or (decision.allowed, decision.remaining) < (previous.allowed, previous.remaining):
            setattr(request._request, REQUEST_ATTR, decision)
        if not decision.allowed:
            rate_limit_rejections_total.labels(scope=scope).inc()
            self._wait = decision.reset_seconds
        return decision.allowed

    def wait(self) -> int | None:
        """Seconds until this budget has room again (DRF's ``Retry-After``)."""
        return self._wait


class RateLimitHeadersMiddleware:
    """Add ``X-RateLimit-Limit/Remaining/Reset`` to responses whose request was throttle-checked."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        """Pass the request on; decorate the response from the throttle's decision, if any."""
        response = self.get_response(request)
        decision: RateLimitDecision | None = getattr(request, REQUEST_ATTR, None)
        if decision is not None:
            response["X-RateLimit-Limit"] = str(decision.limit)
            response["X-RateLimit-Remaining"] = "0" if not decision.allowed else str(decision.remaining)
            response["X-RateLimit-Reset"] = str(decision.reset_seconds)
            if not decision.allowed:
                response["Retry-After"] = str(decision.reset_seconds)
        return response
