"""Fixtures shared by the whole suite: API clients authenticated by real JWTs, real processes (``procs``)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import RefreshToken

from tests.support.factories import UserFactory
from tests.support.processes import fast_backoff, procs  # noqa: F401 - fixtures: real worker/scheduler processes


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
