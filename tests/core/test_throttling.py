"""The Redis sliding-window throttle: exact limits under concurrency, headers, fail-open, client address."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import RequestFactory
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from core import throttling
from core.throttling import Rate, client_address, rate_parse
from tests.conftest import bearer
from tests.support.factories import UserFactory
from tests.support.redis_server import RedisServer

ME = "/api/auth/me"
LOGIN = "/api/auth/login"
READY_ATTEMPTS = 200  # readiness polls of 0.02 s for a fresh redis-server


@pytest.fixture
def private_redis(settings):
    """This test's own Redis as the default cache: budgets no other test (or xdist worker) touches."""
    server = RedisServer()
    server.start()
    caches = {"default": dict(settings.CACHES["default"])}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{server.port}/0"
    settings.CACHES = caches
    throttling.backend_state_reset()
    yield server
    server.close()
    throttling.backend_state_reset()


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _rate_headers(resp) -> dict[str, str]:
    return {k: resp[k] for k in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset") if k in resp}


@pytest.mark.django_db(transaction=True)  # request threads use their own database connections
def test_300_concurrent_requests_from_one_user_accept_exactly_the_limit(private_redis, settings):
    settings.STINT_RATE_LIMITS = {"user": "100/min", "auth": "10/min"}
    user = UserFactory()
    threads, per_thread = 30, 10
    start = threading.Barrier(threads)
    responses: list = []
    lock = threading.Lock()

    def client_thread() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=bearer(user))
        start.wait()
        try:
            got = [client.get(ME) for _ in range(per_thread)]
        finally:
            connection.close()
        with lock:
            responses.extend(got)

    rejected_before = _metric("rate_limit_rejections_total", scope="user")
    workers = [threading.Thread(target=client_thread) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert len(responses) == 300
    by_status = Counter(resp.status_code for resp in responses)
    assert by_status == {200: 100, 429: 200}
    accepted = [resp for resp in responses if resp.status_code == 200]
    rejected = [resp for resp in responses if resp.status_code == 429]
    # Each accepted request took its own slot: remaining counts down 99..0 with no repeats.
    assert sorted(int(resp["X-RateLimit-Remaining"]) for resp in accepted) == list(range(100))
    for resp in accepted:
        assert resp["X-RateLimit-Limit"] == "100"
        assert 1 <= int(resp["X-RateLimit-Reset"]) <= 60
        assert "Retry-After" not in resp
    for resp in rejected:
        assert _rate_headers(resp)["X-RateLimit-Limit"] == "100"
        assert resp["X-RateLimit-Remaining"] == "0"
        assert resp["Retry-After"] == resp["X-RateLimit-Reset"]
        assert 1 <= int(resp["Retry-After"]) <= 60
        assert resp.json()["error"]["code"] == "rate_limited"
        assert set(resp.json()["error"]) == {"code", "message", "details"}
    assert _metric("rate_limit_rejections_total", scope="user") - rejected_before == 200


@pytest.mark.django_db
def test_budgets_are_per_user_and_per_scope(private_redis, settings, user_api, other_api, api, user):
    settings.STINT_RATE_LIMITS = {"user": "2/min", "auth": "1/min"}
    assert [user_api.get(ME).status_code for _ in range(3)] == [200, 200, 429]
    assert other_api.get(ME).status_code == 200  # another user: a budget of its own
    login = api.post(LOGIN, {"username": user.username, "password": "wrong-password"}, format="json")
    assert login.status_code == 401  # the auth scope is counted apart from the user scope
    assert _rate_headers(login) == {"X-RateLimit-Limit": "1", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60"}


@pytest.mark.django_db
def test_redis_outage_fails_open_then_limiting_resumes(private_redis, settings, user_api, caplog):
    settings.STINT_RATE_LIMITS = {"user": "3/min", "auth": "10/min"}
    assert [user_api.get(ME).status_code for _ in range(4)] == [200, 200, 200, 429]

    private_redis.stop()
    errors_before = _metric("rate_limit_backend_errors_total")
    with caplog.at_level(logging.WARNING, logger="core.throttling"):
        during = [user_api.get(ME) for _ in range(5)]
    assert [resp.status_code for resp in during] == [200] * 5
    assert all(not _rate_headers(resp) for resp in during)  # no budget known, none claimed
    assert _metric("rate_limit_backend_errors_total") - errors_before == 5
    warnings = [r for r in caplog.records if r.name == "core.throttling" and r.levelno == logging.WARNING]
    assert len(warnings) == 1  # at most one a minute, however many requests fail open

    private_redis.start()  # an empty Redis: the budget starts afresh
    # Redis is skipped for BACKEND_RETRY_SECONDS after a failure; poll until it is consulted again.
    for _ in range(READY_ATTEMPTS):
        resp = user_api.get(ME)
        assert resp.status_code == 200
        if _rate_headers(resp):
            break
        time.sleep(0.02)
    else:
        pytest.fail("rate limiting did not resume after Redis came back")
    assert resp["X-RateLimit-Remaining"] == "2"
    assert [user_api.get(ME).status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.django_db
@pytest.mark.parametrize("trusted_proxies", [0, 1])
def test_forged_forwarded_for_never_buys_a_fresh_login_budget(private_redis, settings, api, user, trusted_proxies):
    settings.STINT_RATE_LIMITS = {"user": "100/min", "auth": "3/min"}
    settings.TRUSTED_PROXY_COUNT = trusted_proxies

    def login(attempt: int, client: str = "198.51.100.7"):
        forged = f"203.0.113.{attempt}, 10.{attempt}.0.1"  # whatever the attacker puts in the header
        if trusted_proxies:  # our proxy (the socket peer) appends the address it saw
            meta = {"REMOTE_ADDR": "192.0.2.1", "HTTP_X_FORWARDED_FOR": f"{forged}, {client}"}
        else:
            meta = {"REMOTE_ADDR": client, "HTTP_X_FORWARDED_FOR": forged}
        body = {"username": user.username, "password": f"guess-{attempt}"}
        return api.post(LOGIN, body, format="json", **meta)

    assert [login(attempt).status_code for attempt in range(5)] == [401, 401, 401, 429, 429]
    assert login(99, client="198.51.100.8").status_code == 401  # another client has its own budget


@pytest.mark.parametrize(
    ("trusted_proxies", "peer", "forwarded", "expected"),
    [
        (0, "198.51.100.7", "203.0.113.9", "198.51.100.7"),  # no proxies: the header is ignored
        (1, "192.0.2.1", "203.0.113.9, 198.51.100.7", "198.51.100.7"),  # rightmost = our proxy's view
        (2, "192.0.2.2", "203.0.113.9, 198.51.100.7, 192.0.2.1", "198.51.100.7"),
        (2, "192.0.2.2", "198.51.100.7", "192.0.2.2"),  # fewer hops than proxies: the peer
        (1, "192.0.2.1", "203.0.113.9, not-an-ip", "192.0.2.1"),  # garbage: the peer, never the left part
        (1, "192.0.2.1", "", "192.0.2.1"),
        (0, "2001:db8:1:2:3:4:5:6", "", "2001:db8:1:2::/64"),  # one IPv6 host owns its /64
        (0, "::ffff:198.51.100.7", "", "198.51.100.7"),
    ],
)
def test_client_address(settings, trusted_proxies, peer, forwarded, expected):
    settings.TRUSTED_PROXY_COUNT = trusted_proxies
    request = RequestFactory().get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/min", Rate(limit=100, window_seconds=60)),
        ("10/s", Rate(limit=10, window_seconds=1)),
        ("5/hour", Rate(limit=5, window_seconds=3600)),
        ("1/day", Rate(limit=1, window_seconds=86400)),
    ],
)
def test_rate_parse(text, rate):
    assert rate_parse(text) == rate


@pytest.mark.parametrize("text", ["100", "0/min", "ten/min", "10/month", "10/fortnight", "10/", "1/2/min"])
def test_rate_parse_refuses_nonsense(text):
    with pytest.raises(ImproperlyConfigured):
        rate_parse(text)


@pytest.mark.django_db
def test_every_view_that_takes_a_password_spends_one_budget_per_address(settings, client, api, admin_user):
    # The hole: /admin/login/ had no limit, so 25 wrong passwords for an ADMIN, then the right one, got in.
    settings.STINT_RATE_LIMITS = {"user": "100/min", "auth": "4/min"}
    wrong = {"username": admin_user.username, "password": "not-the-password"}

    assert api.post(LOGIN, wrong, format="json").status_code == 401
    assert client.post("/login/", wrong).status_code == 200  # the form again, with its error
    assert client.post("/admin/login/", wrong).status_code == 200
    assert client.post("/admin/login/", wrong).status_code == 200
    refused = [
        client.post("/admin/login/", {**wrong, "password": "correct-Horse-battery-9"}),
        client.post("/login/", wrong),
        api.post(LOGIN, wrong, format="json"),
        api.post("/api/auth/register", {"username": "newcomer", "password": "a-long-passphrase-1"}, format="json"),
    ]

    assert [r.status_code for r in refused] == [429] * 4
    assert all(int(r["Retry-After"]) >= 1 for r in refused)
    assert "_auth_user_id" not in client.session  # the right password did not get in past the limit


@pytest.mark.django_db
def test_the_admin_password_change_spends_the_budget_too(settings, client, admin_user):
    settings.STINT_RATE_LIMITS = {"user": "100/min", "auth": "1/min"}
    client.force_login(admin_user)
    guess = {"old_password": "guess", "new_password1": "x-long-passphrase-2", "new_password2": "x-long-passphrase-2"}

    assert client.post("/admin/password_change/", guess).status_code == 200  # wrong old password: the form
    assert client.post("/admin/password_change/", guess).status_code == 429
