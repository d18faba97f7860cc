"""Fixtures shared by the whole suite: API clients authenticated by real JWTs, real processes (``procs``)."""

from __future__ import annotations

import os

import pytest
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import RefreshToken

from tests.support.factories import UserFactory
from tests.support.processes import fast_backoff, procs  # noqa: F401 - fixtures: real worker/scheduler processes


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs two workers), give each worker what a lone run has to itself.

    Redis: each worker and every process its tests start use their own database number on the
    one server (``REDIS_URL``'s path): rate-limit budgets (every test client calls from
    127.0.0.1, and ``_fresh_rate_limits`` empties them before each test) and leader locks
    (``run_scheduler`` leads "cron" under one key) of one worker never meet the other's.
    PostgreSQL: pytest-django gives each worker its own test database already. A worker's
    command line is ``python -c ...``, so ``core.db_role`` would name its connections
    ``stint-python``: they are named ``stint-test``, as a lone run's.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    from urllib.parse import urlsplit, urlunsplit

    from django.conf import settings

    from core.db_role import set_process_role

    set_process_role("test")
    url = urlsplit(settings.CACHES["default"]["LOCATION"])
    own = urlunsplit(url._replace(path=f"/{int(worker.removeprefix('gw')) + 1}"))
    os.environ["REDIS_URL"] = settings.REDIS_URL = settings.CACHES["default"]["LOCATION"] = own


# Tables of rows every migrate creates (post_migrate) and no test writes: a transactional test's flush keeps them.
_STATIC_TABLES = frozenset({"django_content_type", "auth_permission"})


def _flush_keeping_static_tables(self) -> None:
    """``TransactionTestCase._fixture_teardown`` for this suite: empty every table but ``_STATIC_TABLES``.

    Django's flush empties the content types and permissions too, then re-creates them through
    the post_migrate signal (about half of each transactional test's 0.3 s teardown here, 157
    such tests). Their rows are the same every time, so they are kept and the signal is not sent;
    every other table is emptied by one TRUNCATE, as Django's flush does.
    """
    from django.core.management.color import no_style
    from django.db import connections

    for db_name in self._databases_names(include_mirrors=False):
        connection = connections[db_name]
        tables = [
            table
            for table in connection.introspection.django_table_names(only_existing=True, include_views=False)
            if table not in _STATIC_TABLES
        ]
        connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables))


def _patch_flush() -> None:
    from django.test import TransactionTestCase

    TransactionTestCase._fixture_teardown = _flush_keeping_static_tables


_patch_flush()


def bearer(user) -> str:
    """Return an ``Authorization`` header value with a fresh access token for ``user``."""
    return f"Bearer {RefreshToken.for_user(user).access_token}"


@pytest.fixture
def api() -> APIClient:
    """An anonymous API client."""
    return APIClient()


@pytest.fixture
def user(db):
    """A USER."""
    return UserFactory()


@pytest.fixture
def other_user(db):
    """A second USER."""
    return UserFactory()


@pytest.fixture
def admin_user(db):
    """An ADMIN."""
    return UserFactory(admin=True)


def _client_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=bearer(user))
    return client


@pytest.fixture
def user_api(user) -> APIClient:
    """An API client authenticated as ``user``."""
    return _client_for(user)


@pytest.fixture
def other_api(other_user) -> APIClient:
    """An API client authenticated as ``other_user``."""
    return _client_for(other_user)


@pytest.fixture
def admin_api(admin_user) -> APIClient:
    """An API client authenticated as ``admin_user``."""
    return _client_for(admin_user)


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    """Start each test with empty rate-limit budgets: every test client calls from 127.0.0.1.

    Tests that exercise the limits set their own rates (``settings.STINT_RATE_LIMITS``).
    """
    from redis.exceptions import RedisError

    from core.throttling import rate_limits_clear

    try:
        rate_limits_clear()
    except (RedisError, OSError):
        pass  # Redis down: the throttle fails open anyway


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings) -> None:
    """Hash test users' passwords with a fast hasher; production keeps Argon2 (tested explicitly)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
