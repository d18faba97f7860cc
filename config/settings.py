"""Project settings: the only module that reads the environment (django-environ)."""

from __future__ import annotations

import builtins
import importlib.util
import math
import os
import sys
from datetime import timedelta
from ipaddress import ip_network as _ip_network
from pathlib import Path
from typing import Any

import django
import environ
from django.core.exceptions import ImproperlyConfigured

from config import db_session as _db_session
from core import db_role as _db_role
from core import rates as _rates

BASE_DIR = Path(__file__).resolve().parent.parent


_FALSE_WORDS = frozenset({"false", "off", "no", "n", "0", ""})


class _Env(environ.Env):
    """django-environ's reader, whose cast errors name the variable (int("abc") alone says only "abc").

    A variable holding bytes that are not UTF-8 is an ImproperlyConfigured naming it (never its value).
    """

    def get_value(self, var: str, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 - environ.Env's
        raw = self.ENVIRON.get(var)
        if isinstance(raw, str) and not raw.isascii():
            try:
                raw.encode("utf-8")
            except UnicodeEncodeError:
                # Python reads a byte that is not UTF-8 as a lone surrogate, which no server takes:
                # every database connection (a password) or Kafka message would fail later. Not echoed.
                raise ImproperlyConfigured(f"{var} holds bytes that are not UTF-8: set it as UTF-8 text") from None
        try:
            return super().get_value(var, *args, **kwargs)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{var}: {exc}") from None

    def int(self, var: str, default: Any = environ.Env.NOTSET) -> Any:
        """Read ``var`` as a whole number (``-1``, ``300``); raise ImproperlyConfigured otherwise.

        django-environ's own int let ``int()``'s message through: ``1.5`` read as "invalid literal
        for int() with base 10: '1.5'", which does not say that the setting takes whole numbers.
        """
        raw = self.get_value(var, cast=str, default=default)
        if not isinstance(raw, str):  # the default, as given
            return raw
        try:
            return builtins.int(raw.strip())
        except ValueError:
            raise ImproperlyConfigured(f"{var}: {raw!r} is not a whole number") from None

    def float(self, var: str, default: Any = environ.Env.NOTSET) -> Any:
        """Read ``var`` as Python reads a number (``1e3`` is 1000.0); raise ImproperlyConfigured otherwise.

        django-environ's own float keeps only digits, "," "." and "-" of the text: ``1e3`` was
        13.0, ``500ms`` 500.0 and ``0x10`` 10.0, silently. NaN and infinities are refused too.
        """
        raw = self.get_value(var, cast=str, default=default)
        if not isinstance(raw, str):  # the default, as given
            return raw
        try:
            value = builtins.float(raw.strip())
        except ValueError as exc:
            raise ImproperlyConfigured(f"{var}: {exc}") from None
        if not math.isfinite(value):
            raise ImproperlyConfigured(f"{var}: {raw!r} is not a finite number")
        return value

    def bool(self, var: str, default: Any = environ.Env.NOTSET) -> Any:
        """Read ``var`` as true (``true``, ``yes``, ``on``, ``1``...) or false (``false``, ``no``, ``off``, ``0``, "").

        django-environ's own bool reads anything but its true words as false, so a typo
        (``METRICS_RESTRICTED=ture``) turned a protection off silently; here it is an
        ImproperlyConfigured naming the variable.
        """
        raw = self.get_value(var, cast=str, default=default)
        if not isinstance(raw, str):  # the default, as given
            return raw
        word = raw.strip().lower()
        if word in self.BOOLEAN_TRUE_STRINGS or word in _FALSE_WORDS:
            return word in self.BOOLEAN_TRUE_STRINGS
        raise ImproperlyConfigured(f"{var}: {raw!r} is not a boolean (true/false, yes/no, on/off, 1/0)")


env = _Env()


def _bounded(name: str, value: float, low: float, high: float = math.inf) -> Any:
    """Return ``value`` of the variable ``name``; raise ImproperlyConfigured unless ``low <= value <= high``.

    A number out of range started cleanly and then gave wrong answers or failed deep inside a
    process (a page size of 0 listed nothing under its count; a TTL of 0 let a replayed
    Idempotency-Key create a second job); here it names its variable at start-up. No ``high``:
    any number from ``low`` up.
    """
    if not low <= value <= high:
        span = f"{low} or more" if high == math.inf else f"from {low} to {high}"
        raise ImproperlyConfigured(f"{name} must be {span} (got {value!r})")
    return value


_TEN_YEARS_SECONDS = 10 * 365 * 86400  # the longest token lifetime or idempotency TTL (a timedelta ends near 2.7e12 s)
# The longest retention in days (0 keeps forever): 1e7 days before now() is "timestamp out of range"
# in every prune, 1e9 a timedelta OverflowError when the pruner is made.
_RETENTION_DAYS_MAX = 100 * 365
# PostgreSQL's timeouts are int milliseconds (INT_MAX): a longer idle_in_transaction_session_timeout is
# refused at every connect ("Value exceeds integer range"), or by the relay's set_config at every batch.
_PG_TIMEOUT_MAX_SECONDS = 2_147_483


environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DJANGO_ENV = env.str("DJANGO_ENV", default="development")
PRODUCTION = DJANGO_ENV == "production"

_DEV_SECRET = "dev-insecure-secret-key-change-me-0123456789abcdef"  # noqa: S105 - dev only
_DEV_JWT_KEY = "dev-insecure-jwt-signing-key-change-me-0123456789"  # noqa: S105 - dev only

SECRET_KEY = env.str("SECRET_KEY", default="" if PRODUCTION else _DEV_SECRET)
JWT_SIGNING_KEY = env.str("JWT_SIGNING_KEY", default="" if PRODUCTION else _DEV_JWT_KEY)
MIN_KEY_BYTES = 32  # bytes
# The ADMIN account's password on its first start (manage.py ensure_admin reads the variable itself);
# read here for the deploy check that refuses the example files' placeholders (config.checks).
STINT_ADMIN_PASSWORD = env.str("STINT_ADMIN_PASSWORD", default="")

if PRODUCTION:
    for _name, _value in (("SECRET_KEY", SECRET_KEY), ("JWT_SIGNING_KEY", JWT_SIGNING_KEY)):
        if len(_value.encode()) < MIN_KEY_BYTES:
            raise ImproperlyConfigured(f"{_name} must be set to at least {MIN_KEY_BYTES} bytes in production")
    if JWT_SIGNING_KEY == SECRET_KEY:
        raise ImproperlyConfigured("JWT_SIGNING_KEY must differ from SECRET_KEY")

DEBUG = env.bool("DEBUG", default=not PRODUCTION)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("DEBUG must be off in production")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=[] if PRODUCTION else ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "config.admin_site.StintAdminConfig",  # django.contrib.admin, open only to staff ADMINs
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # ArrayField (Job.unique_states); Django 6 checks that it is installed
    "rest_framework",
    "rest_framework_simplejwt.token_blacklist",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_prometheus",  # /metrics: HTTP metrics middleware + exposition (scheduler.metrics_view)
    "accounts",
    "scheduler",
    "stint_tasks",  # Django's Tasks framework on Stint (the TASKS backend below)
    "audit",
    "pages",
]
if django.VERSION < (6, 0):
    # Django 5.2 gets the Tasks API from the django-tasks backport; its app wires checks and signals.
    INSTALLED_APPS.insert(INSTALLED_APPS.index("stint_tasks"), "django_tasks")


def _importable(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute of one (an ``AppConfig`` path), that can be found."""
    for candidate in (name, name.rpartition(".")[0]):
        try:
            if candidate and importlib.util.find_spec(candidate) is not None:
                return True
        except (ImportError, ValueError):  # a missing parent package or a module's attribute; a relative name
            continue
    return False


# Extra apps: ``bench`` for the load test's handler, ``examples`` for the example tasks `make run` loads.
# A name that cannot be imported failed deep in django.setup() ("No module named ..."), naming no variable.
_EXTRA_APPS = env.list("STINT_EXTRA_APPS", default=[])
for _app in _EXTRA_APPS:
    if not _importable(_app):
        raise ImproperlyConfigured(
            f"STINT_EXTRA_APPS: {_app!r} is not a module or app config that can be imported (is it on PYTHONPATH?)"
        )
INSTALLED_APPS += _EXTRA_APPS

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",  # first: times the whole stack
    "core.request_id.RequestIdMiddleware",  # X-Request-ID in, on every log line, and out
    "core.failsafe.DatabaseDeadlineMiddleware",  # a frozen database: 503 after STINT_REQUEST_DB_TIMEOUT_SECONDS
    "scheduler.tracing_middleware.TraceRequestMiddleware",  # a span per request while tracing is on
    "core.body_limit.RequestBodyLimitMiddleware",  # 413 for an oversized body, before anything reads it
    "core.failsafe.BadTextMiddleware",  # 400 for NUL or a lone surrogate in a query string or form
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files under gunicorn, no CDN
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "core.throttling.RateLimitHeadersMiddleware",
    "core.failsafe.DatabaseUnavailableMiddleware",  # 503, not a 500 page, when the database is down
    "django_prometheus.middleware.PrometheusAfterMiddleware",  # last: sees the view and its response
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"

# PostgreSQL is the only supported database: leasing relies on SKIP LOCKED and LISTEN/NOTIFY.
try:
    DATABASES = {"default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/stint")}
except ValueError as _exc:  # urllib's port errors, from inside django-environ, named no variable
    raise ImproperlyConfigured(f"DATABASE_URL: {_exc}") from None
_POSTGRES_ENGINES = ("django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis")
if DATABASES["default"].get("ENGINE") not in _POSTGRES_ENGINES:
    # django-environ makes an unknown scheme the dummy backend, which fails only at the first query.
    raise ImproperlyConfigured(f"DATABASE_URL: {env.str('DATABASE_URL')!r} is not a PostgreSQL URL (postgres://...)")
# Seconds (0: a connection per request). Django adds it to time.monotonic(): 1e400 was an OverflowError
# at every connect.
DATABASES["default"].setdefault(
    "CONN_MAX_AGE", _bounded("DB_CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=60), 0, _TEN_YEARS_SECONDS)
)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("TEST", {})["NAME"] = env.str("TEST_DATABASE_NAME", default="test_stint")
# Every connection names its process and role in pg_stat_activity (core.db_role): stint-web,
# stint-scheduler, stint-worker... from STINT_DB_ROLE, else from the command line.
DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
    "application_name", _db_role.default_application_name(sys.argv, os.environ)
)
# A client that vanished (a partition) or stalled mid-transaction cannot hold a session and its row
# locks for long: TCP keepalives both ways and an idle-in-transaction bound (config.db_session); a
# connection attempt to a frozen server gives up (connect_timeout).
# A request waits on a database that does not answer (a frozen server) at most this long, then 503
# (core.failsafe.DatabaseDeadlineMiddleware); below gunicorn's timeout (docker/gunicorn.conf.py, 60 s).
STINT_REQUEST_DB_TIMEOUT_SECONDS = _bounded(
    "STINT_REQUEST_DB_TIMEOUT_SECONDS", env.float("STINT_REQUEST_DB_TIMEOUT_SECONDS", default=30.0), 0, 86400
)
# A parameter DATABASE_URL sets (connect_timeout, keepalives_idle, ...) wins over ours; its libpq
# ``options`` string goes in front of ours.
_url_options = DATABASES["default"]["OPTIONS"]
DATABASES["default"]["OPTIONS"] = _db_session.session_options(
    idle_in_transaction_seconds=_bounded(
        "STINT_DB_IDLE_IN_TRANSACTION_SECONDS",
        env.float("STINT_DB_IDLE_IN_TRANSACTION_SECONDS", default=_db_session.DEFAULT_IDLE_IN_TRANSACTION_SECONDS),
        0,
        _PG_TIMEOUT_MAX_SECONDS,
    ),
    connect_timeout_seconds=_bounded(
        "STINT_DB_CONNECT_TIMEOUT_SECONDS",
        env.int("STINT_DB_CONNECT_TIMEOUT_SECONDS", default=_db_session.DEFAULT_CONNECT_TIMEOUT_SECONDS),
        0,
        3600,
    ),
    server_options=env.bool("STINT_DB_SERVER_OPTIONS", default=True),
    existing_options=_url_options.get("options", ""),
) | {name: value for name, value in _url_options.items() if name != "options"}

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Seconds. Above 0: a negative one made redis-py's every connect raise ValueError ("Timeout value out
# of range"), which no fail-open path expects (every login and API request answered 500), and 0 is
# a non-blocking socket that never connects.
REDIS_SOCKET_TIMEOUT = _bounded("REDIS_SOCKET_TIMEOUT", env.float("REDIS_SOCKET_TIMEOUT", default=0.5), 0.001, 3600)
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            # Redis data is never unpickled: JSON only.
            "SERIALIZER": "django_redis.serializers.json.JSONSerializer",
            "SOCKET_CONNECT_TIMEOUT": REDIS_SOCKET_TIMEOUT,
            "SOCKET_TIMEOUT": REDIS_SOCKET_TIMEOUT,
        },
        "KEY_PREFIX": "stint",
    }
}

KAFKA_BOOTSTRAP_SERVERS = env.str("KAFKA_BOOTSTRAP_SERVERS", default="127.0.0.1:9092")
KAFKA_TOPIC = env.str("KAFKA_TOPIC", default="job-lifecycle-events")
KAFKA_TOPIC_PARTITIONS = _bounded("KAFKA_TOPIC_PARTITIONS", env.int("KAFKA_TOPIC_PARTITIONS", default=6), 1, 10_000)
# Longer than librdkafka's heartbeat.interval.ms (3000 ms, kept): a shorter session expires between two
# heartbeats. At most its max.poll.interval.ms (300000 ms, kept): a longer one fails the consumer's creation.
KAFKA_SESSION_TIMEOUT_MS = _bounded(
    "KAFKA_SESSION_TIMEOUT_MS", env.int("KAFKA_SESSION_TIMEOUT_MS", default=6000), 3001, 300_000
)
KAFKA_AUDIT_GROUP = env.str("KAFKA_AUDIT_GROUP", default="stint-audit")
# Outbox relay and pruner (scheduler.maintenance.relay, .outbox_pruner; typed in scheduler.kafka.EventStreamConf):
# every delivery report arrives within the timeout. librdkafka reads 0 as "never" and refuses anything up
# to the relay's linger.ms (5 ms) or negative; the relay holds its rows locked up to this long (an hour at most).
KAFKA_DELIVERY_TIMEOUT_MS = _bounded(
    "KAFKA_DELIVERY_TIMEOUT_MS", env.int("KAFKA_DELIVERY_TIMEOUT_MS", default=5000), 1000, 3_600_000
)
OUTBOX_BATCH_SIZE = _bounded("STINT_OUTBOX_BATCH_SIZE", env.int("STINT_OUTBOX_BATCH_SIZE", default=5000), 1, 1_000_000)
# As STINT_POLL_SECONDS: a wait of 1e20 s was an OverflowError that ended the relay's thread.
OUTBOX_RELAY_INTERVAL_SECONDS = _bounded(
    "STINT_OUTBOX_RELAY_INTERVAL_SECONDS",
    env.float("STINT_OUTBOX_RELAY_INTERVAL_SECONDS", default=0.1),
    0.01,
    7 * 86_400,
)
OUTBOX_RETENTION_DAYS = env.int("STINT_OUTBOX_RETENTION_DAYS", default=7)
# The audit consumer's quarantine (audit.quarantine): entries older than this are pruned (0: kept).
AUDIT_QUARANTINE_RETENTION_DAYS = env.int("STINT_AUDIT_QUARANTINE_RETENTION_DAYS", default=30)
# The relay holds its leased rows in a transaction while Kafka confirms (up to the delivery timeout
# plus 1 s); a relay stuck longer (SIGSTOPped, cut off) loses its session after this many seconds.
OUTBOX_LOCK_HOLD_SECONDS = _bounded(
    "STINT_OUTBOX_LOCK_HOLD_SECONDS", env.int("STINT_OUTBOX_LOCK_HOLD_SECONDS", default=60), 1, _PG_TIMEOUT_MAX_SECONDS
)
if OUTBOX_LOCK_HOLD_SECONDS < KAFKA_DELIVERY_TIMEOUT_MS // 1000 + 3:
    raise ImproperlyConfigured(
        "STINT_OUTBOX_LOCK_HOLD_SECONDS must exceed the delivery timeout (KAFKA_DELIVERY_TIMEOUT_MS) by 3 s"
    )
# The reconciler (scheduler.maintenance.reconciler) re-publishes an event published this long ago
# that has no audit row. At least the relay's lock hold plus 10 s: a mark commits within the lock
# hold of its published_at or never, and the walk's checkpoint must not pass an uncommitted one.
AUDIT_RECONCILE_AFTER_SECONDS = env.int("STINT_AUDIT_RECONCILE_AFTER_SECONDS", default=300)
if AUDIT_RECONCILE_AFTER_SECONDS < OUTBOX_LOCK_HOLD_SECONDS + 10:
    raise ImproperlyConfigured(
        "STINT_AUDIT_RECONCILE_AFTER_SECONDS must be at least STINT_OUTBOX_LOCK_HOLD_SECONDS + 10"
        f" ({OUTBOX_LOCK_HOLD_SECONDS + 10})"
    )
# The reconciler checks an event published more than AUDIT_RECONCILE_AFTER_SECONDS ago and less than the
# outbox retention ago: a retention of 0 days (or less) pruned each published row within a minute, so
# no event was ever checked and a lost one never repaired.
if OUTBOX_RETENTION_DAYS * 86400 <= AUDIT_RECONCILE_AFTER_SECONDS:
    raise ImproperlyConfigured(
        f"STINT_OUTBOX_RETENTION_DAYS ({OUTBOX_RETENTION_DAYS}) must keep published events longer than"
        f" STINT_AUDIT_RECONCILE_AFTER_SECONDS ({AUDIT_RECONCILE_AFTER_SECONDS} s), after which the reconciler"
        " checks them"
    )
_bounded("STINT_OUTBOX_RETENTION_DAYS", OUTBOX_RETENTION_DAYS, 1, _RETENTION_DAYS_MAX)
_bounded("STINT_AUDIT_QUARANTINE_RETENTION_DAYS", AUDIT_QUARANTINE_RETENTION_DAYS, 0, _RETENTION_DAYS_MAX)

AUTH_USER_MODEL = "accounts.User"

PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
    # Not a rule: on every password change it blacklists the user's refresh tokens (accounts.passwords).
    {"NAME": "accounts.passwords.RevokeRefreshTokensOnChange"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Every printed datetime has seconds (config/formats/en/formats.py): "2026-11-30 14:28:33".
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework_simplejwt.authentication.JWTAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["core.parsers.SafeJSONParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": _bounded("API_PAGE_SIZE", env.int("API_PAGE_SIZE", default=50), 1, 10_000),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_CLASSES": ["core.throttling.SlidingWindowThrottle"],
}

# API rate limits (core.throttling): "<count>/<s|min|hour|day>" per throttle scope; a view's
# throttle_scope picks one, "user" is the default and the fallback, None turns a scope off.
# "auth" (login, register) counts per client address, the others per user.
STINT_RATE_LIMITS: dict[str, str | None] = {
    "user": env.str("STINT_RATE_LIMIT_USER", default="100/min"),
    "auth": env.str("STINT_RATE_LIMIT_AUTH", default="10/min"),
}
for _scope, _rate in STINT_RATE_LIMITS.items():  # read per request: a bad one would be a 500 on every request
    try:
        _rates.rate_parse(_rate)
    except ImproperlyConfigured as exc:
        raise ImproperlyConfigured(f"STINT_RATE_LIMIT_{_scope.upper()}: {exc}") from None
# Reverse proxies in front of the web process that append to X-Forwarded-For. 0: the client
# address is the socket peer and X-Forwarded-For is ignored.
TRUSTED_PROXY_COUNT = _bounded("TRUSTED_PROXY_COUNT", env.int("TRUSTED_PROXY_COUNT", default=0), 0)

_JWT_ACCESS_SECONDS = env.int("JWT_ACCESS_LIFETIME_SECONDS", default=300)
_JWT_REFRESH_SECONDS = env.int("JWT_REFRESH_LIFETIME_SECONDS", default=86400)
SIMPLE_JWT = {
    "ACCESS_TOKEN_LIFETIME": timedelta(
        seconds=_bounded("JWT_ACCESS_LIFETIME_SECONDS", _JWT_ACCESS_SECONDS, 1, _TEN_YEARS_SECONDS)
    ),
    "REFRESH_TOKEN_LIFETIME": timedelta(
        seconds=_bounded("JWT_REFRESH_LIFETIME_SECONDS", _JWT_REFRESH_SECONDS, 1, _TEN_YEARS_SECONDS)
    ),
    "ROTATE_REFRESH_TOKENS": True,
    "BLACKLIST_AFTER_ROTATION": True,
    "UPDATE_LAST_LOGIN": False,
    "ALGORITHM": "HS256",
    "SIGNING_KEY": JWT_SIGNING_KEY,
    "AUTH_HEADER_TYPES": ("Bearer",),
    "LEEWAY": 0,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Stint API",
    "DESCRIPTION": "Distributed job scheduler for Django: jobs, schedules, audit trail.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "core.openapi.document_error_responses",  # the error envelope and 429 on every operation
    ],
}

# Job system tunables; read through scheduler.conf, never directly.
SCHEDULER = {
    "LEASE_SECONDS": env.int("STINT_LEASE_SECONDS", default=30),
    "HEARTBEAT_SECONDS": env.float("STINT_HEARTBEAT_SECONDS", default=10.0),
    "POLL_SECONDS": env.float("STINT_POLL_SECONDS", default=1.0),
    "SHUTDOWN_GRACE_SECONDS": env.float("STINT_SHUTDOWN_GRACE_SECONDS", default=25.0),
    "IDEMPOTENCY_TTL_SECONDS": env.int("STINT_IDEMPOTENCY_TTL_SECONDS", default=86400),
    "BACKOFF_BASE_SECONDS": env.float("STINT_BACKOFF_BASE_SECONDS", default=1.0),
    "BACKOFF_MAX_SECONDS": env.float("STINT_BACKOFF_MAX_SECONDS", default=30.0),
    "BACKOFF_JITTER": env.bool("STINT_BACKOFF_JITTER", default=False),
    "WORKER_DEAD_AFTER_SECONDS": env.int("STINT_WORKER_DEAD_AFTER_SECONDS", default=60),
    "MAX_PAYLOAD_BYTES": env.int("STINT_MAX_PAYLOAD_BYTES", default=10 * 1024),
    # Schedules a USER may hold (ADMINs are exempt; 0: no limit).
    "MAX_SCHEDULES_PER_USER": env.int("STINT_MAX_SCHEDULES_PER_USER", default=100),
    # The shortest gap between two fires of a USER's schedule (ADMINs are exempt; 0: no minimum).
    "MIN_SCHEDULE_INTERVAL_SECONDS": env.int("STINT_MIN_SCHEDULE_INTERVAL_SECONDS", default=60),
    # Retention of finished jobs by status, in days (0: keep forever): run_scheduler's pruner deletes
    # older ones with their attempts, result and audit events (their published outbox events go
    # with their outbox row, by OUTBOX_RETENTION_DAYS).
    "RETENTION_SUCCESS_DAYS": env.int("STINT_RETENTION_SUCCESS_DAYS", default=7),
    "RETENTION_CANCELLED_DAYS": env.int("STINT_RETENTION_CANCELLED_DAYS", default=7),
    "RETENTION_FAILED_DAYS": env.int("STINT_RETENTION_FAILED_DAYS", default=30),
    "RETENTION_DEAD_DAYS": env.int("STINT_RETENTION_DEAD_DAYS", default=30),
    # Days a queue row with no jobs and nothing else referring to it (pause, limit, schedule, live
    # worker) is kept after it was last written or seen in use (0: kept forever; scheduler.maintenance.queue_pruner).
    "QUEUE_RETENTION_DAYS": env.int("STINT_QUEUE_RETENTION_DAYS", default=7),
    # Days an entry of the operator action history (who cancelled, paused, changed a limit or a
    # schedule: django_admin_log, scheduler.action_log) is kept (0: kept forever; the pruner).
    "OPERATOR_LOG_RETENTION_DAYS": env.int("STINT_OPERATOR_LOG_RETENTION_DAYS", default=180),
    # Let owners retry their own dead-lettered jobs (the recover transition); off: only ADMINs recover.
    "OWNERS_MAY_RETRY_DEAD": env.bool("STINT_OWNERS_MAY_RETRY_DEAD", default=False),
    # Flow control (scheduler.flow): limits in code (the API and console add database ones), e.g.
    # [{"scope": "type", "name": "EMAIL", "rate_limit": 100, "rate_period_seconds": 60}].
    "FLOW_LIMITS": [],
    # No starvation: a job QUEUED longer than this gains AGING_STEP priority, up to AGING_MAX_PRIORITY,
    # once per such wait (0: off; scheduler.flow.aging).
    "AGING_SECONDS": env.int("STINT_AGING_SECONDS", default=0),
    "AGING_STEP": env.int("STINT_AGING_STEP", default=50),
    "AGING_MAX_PRIORITY": env.int("STINT_AGING_MAX_PRIORITY", default=50),
    # Enqueue and claim statements prepared once per connection (scheduler.prepared). Off
    # behind a pooler in transaction mode without prepared-statement support (PgBouncer < 1.21).
    "PREPARED_STATEMENTS": env.bool("STINT_DB_PREPARED_STATEMENTS", default=True),
    # run_scheduler VACUUMs stint_job (with index cleanup) once a claim reads this many pages of
    # finished jobs' dead index entries, about 200 jobs a page (scheduler.maintenance.claim_index; 0: never).
    "CLAIM_INDEX_VACUUM_PAGES": env.int("STINT_CLAIM_INDEX_VACUUM_PAGES", default=500),
}

# The largest API request body (core.parsers, core.body_limit), in bytes. The payload limit is
# measured on compact UTF-8 JSON; a raw body may honestly be several times larger (indentation,
# \uXXXX escapes of up to 6 bytes per character) plus the other fields: six payloads and 4 KB, the
# exact payload rule left to the job service.
API_MAX_BODY_BYTES = 6 * SCHEDULER["MAX_PAYLOAD_BYTES"] + 4096

for _key in ("MIN_SCHEDULE_INTERVAL_SECONDS", "CLAIM_INDEX_VACUUM_PAGES", "MAX_SCHEDULES_PER_USER"):
    _bounded(f"STINT_{_key}", SCHEDULER[_key], 0)
for _key, _low, _high in (
    ("LEASE_SECONDS", 1, 86_400),
    ("HEARTBEAT_SECONDS", 0.1, 86_400),  # run_workers' --heartbeat-seconds floor; below the lease, it checks
    ("POLL_SECONDS", 0.01, 7 * 86_400),  # run_workers' --poll-seconds floor: a 0 s poll spins
    ("SHUTDOWN_GRACE_SECONDS", 0, 7 * 86_400),  # run_workers' --grace-seconds range
    # A delay PostgreSQL can add to now() (scheduler.retry.MAX_BACKOFF_SECONDS): 1e15 s failed every
    # rescue batch holding a retried job, and retry.backoff raised on a negative one.
    ("BACKOFF_BASE_SECONDS", 0, 7 * 86_400),
    ("BACKOFF_MAX_SECONDS", 0, 7 * 86_400),
    ("IDEMPOTENCY_TTL_SECONDS", 1, _TEN_YEARS_SECONDS),
    ("MAX_PAYLOAD_BYTES", 1, 64 * 1024 * 1024),
    # Ages subtracted from now() in SQL: 1e13 s was "timestamp out of range" in every query using them.
    ("AGING_SECONDS", 0, _TEN_YEARS_SECONDS),
    ("WORKER_DEAD_AFTER_SECONDS", 1, 7 * 86_400),
    ("QUEUE_RETENTION_DAYS", 0, _RETENTION_DAYS_MAX),
    ("OPERATOR_LOG_RETENTION_DAYS", 0, _RETENTION_DAYS_MAX),
    *((k, 0, _RETENTION_DAYS_MAX) for k in SCHEDULER if k.startswith("RETENTION_")),
):
    _bounded(f"STINT_{_key}", SCHEDULER[_key], _low, _high)
if SCHEDULER["WORKER_DEAD_AFTER_SECONDS"] <= SCHEDULER["HEARTBEAT_SECONDS"]:
    # The console, health and the worker reaper would call every live worker gone between two heartbeats.
    raise ImproperlyConfigured(
        f"STINT_WORKER_DEAD_AFTER_SECONDS ({SCHEDULER['WORKER_DEAD_AFTER_SECONDS']}) must exceed"
        f" STINT_HEARTBEAT_SECONDS ({SCHEDULER['HEARTBEAT_SECONDS']:g})"
    )

# A job's priority column holds -100..100 (scheduler.states.PRIORITY_MIN/MAX, the job_priority_range
# constraint): aging may raise a job to at most the top of it, by at most its whole span per age.
_PRIORITY_MIN, _PRIORITY_MAX = -100, 100
for _key, _low, _high in (
    ("AGING_MAX_PRIORITY", _PRIORITY_MIN, _PRIORITY_MAX),
    ("AGING_STEP", 1, _PRIORITY_MAX - _PRIORITY_MIN),
):
    if not _low <= SCHEDULER[_key] <= _high:
        raise ImproperlyConfigured(f"STINT_{_key} must be from {_low} to {_high} (got {SCHEDULER[_key]})")

# Django's Tasks framework (django.tasks on Django 6, the django-tasks backport on 5.2): every @task
# runs on Stint. Options per task, extra task modules and periodic tasks: stint_tasks/options.py.
TASKS = {
    "default": {
        "BACKEND": "stint_tasks.backend.StintBackend",
        "QUEUES": env.list("STINT_TASK_QUEUES", default=["default"]),
        # Task modules besides each installed app's tasks.py (workers import only these).
        "OPTIONS": {"modules": env.list("STINT_TASK_MODULES", default=[])},
    }
}
if "examples" in INSTALLED_APPS:
    TASKS["default"]["OPTIONS"] |= {
        "tasks": {"examples.tasks.flaky_report": {"max_retries": 2, "backoff_base_seconds": 2}},
        "periodic": {
            "example heartbeat": {"task": "examples.tasks.heartbeat", "interval_seconds": 60, "overlap_policy": "skip"}
        },
    }

# Any case ("debug"): logging itself takes only upper-case names, and refused others deep in
# django.setup() ("Unable to configure root logger").
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO").strip().upper()
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
if LOG_LEVEL not in _LOG_LEVELS:
    raise ImproperlyConfigured(f"LOG_LEVEL must be one of {', '.join(_LOG_LEVELS)} (got {LOG_LEVEL!r})")
# json: one JSON object per line (python-json-logger) for log shippers; plain: for a terminal.
LOG_FORMAT = env.str("LOG_FORMAT", default="json" if PRODUCTION else "plain")
if LOG_FORMAT not in ("json", "plain"):
    raise ImproperlyConfigured("LOG_FORMAT must be json or plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # request_id, job_id, attempt, worker on every line where they apply (core.log_context).
    "filters": {"context": {"()": "core.log_context.ContextFilter"}},
    "formatters": {
        "plain": {"()": "core.log_context.PlainFormatter", "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": True,  # ISO 8601, UTC
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["context"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's default config gives "django" a console handler of its own (DEBUG only) and an
        # AdminEmailHandler (no ADMINS here): naming it drops both, so its lines reach the root's
        # handler alone, once each, with the request id, instead of twice under `make run`.
        "django": {"handlers": []},
        "django.db.backends": {"level": "WARNING"},
    },
}

# Metrics (docs/observability.md). The web process serves /metrics (scheduler.metrics_view); when
# METRICS_RESTRICTED (the production default) only peers in METRICS_ALLOWED_IPS (addresses or
# CIDR networks) or requests bearing METRICS_BEARER_TOKEN may read it. run_workers,
# run_scheduler and run_audit_consumer serve theirs on --metrics-port at METRICS_BIND_ADDRESS.
METRICS_RESTRICTED = env.bool("METRICS_RESTRICTED", default=PRODUCTION)
METRICS_ALLOWED_IPS = env.list("METRICS_ALLOWED_IPS", default=[])
METRICS_BEARER_TOKEN = env.str("METRICS_BEARER_TOKEN", default="")
METRICS_BIND_ADDRESS = env.str("METRICS_BIND_ADDRESS", default="127.0.0.1")
for _entry in METRICS_ALLOWED_IPS:
    try:
        _ip_network(_entry.strip(), strict=False)
    except ValueError:
        raise ImproperlyConfigured(f"METRICS_ALLOWED_IPS: {_entry!r} is not an address or network") from None
if METRICS_BEARER_TOKEN and len(METRICS_BEARER_TOKEN.encode()) < MIN_KEY_BYTES:
    raise ImproperlyConfigured(f"METRICS_BEARER_TOKEN must be at least {MIN_KEY_BYTES} bytes")

# Traces (scheduler.tracing): off by default; on with STINT_OTEL_ENABLED or an OTLP endpoint. The
# OTLP/HTTP exporter reads the standard OTEL_EXPORTER_OTLP_* variables itself.
OTEL_EXPORTER_OTLP_ENDPOINT = env.str(
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", default=env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default="")
)
STINT_TRACING_ENABLED = env.bool("STINT_OTEL_ENABLED", default=bool(OTEL_EXPORTER_OTLP_ENDPOINT))
OTEL_SERVICE_NAME = env.str("OTEL_SERVICE_NAME", default="stint")

EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="stint@localhost")

if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    # RFC 6797's max-age is a non-negative number of seconds: browsers ignore "max-age=-1".
    SECURE_HSTS_SECONDS = _bounded("SECURE_HSTS_SECONDS", env.int("SECURE_HSTS_SECONDS", default=31536000), 0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
    # In-cluster probes and scrapes speak plain HTTP to the pod; everything else is redirected.
    SECURE_REDIRECT_EXEMPT = env.list("SECURE_REDIRECT_EXEMPT", default=[r"^api/health$", r"^metrics$"])
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_REFERRER_POLICY = "same-origin"
    SESSION_COOKIE_HTTPONLY = True
    X_FRAME_OPTIONS = "DENY"
    # Trust X-Forwarded-Proto only when configured: behind a TLS-terminating proxy that always
    # sets it. Set without such a proxy, any client could claim HTTPS.
    if env.bool("SECURE_PROXY_SSL_HEADER", default=False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
