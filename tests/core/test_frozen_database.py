"""A frozen PostgreSQL (SIGSTOPped, a stalled storage, a paused VM) bounds how long a request waits.

A frozen server accepts TCP connections (the kernel does) and never answers; the kernel still
acknowledges what its buffers hold, so TCP keepalives and ``tcp_user_timeout`` never see a dead
peer, and its ``statement_timeout`` is its own. Measured on the dev stack before the bounds: every
API request waited as long as PostgreSQL was frozen (40.7 s for a 40 s SIGSTOP; gunicorn kills
its worker, and every request it holds, at 60 s), and a new connection waited psycopg's default
130 s.
"""

from __future__ import annotations

import runpy
import time
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config.db_session import DEFAULT_CONNECT_TIMEOUT_SECONDS
from core.pg_connect import pg_connect
from tests.conftest import bearer
from tests.support.factories import UserFactory
from tests.support.net import FreezableProxy, SilentServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def through_proxy():
    """Route Django's connection through a ``FreezableProxy`` to the real test database; yield the proxy."""
    saved = dict(connection.settings_dict)
    host, port = saved["HOST"] or "127.0.0.1", int(saved["PORT"] or 5432)
    with FreezableProxy((host, port)) as proxy:
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port))
        try:
            yield proxy
        finally:
            proxy.thaw()
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)


def test_a_new_connection_to_a_frozen_server_gives_up_within_the_connect_timeout():
    assert connection.get_connection_params()["connect_timeout"] == DEFAULT_CONNECT_TIMEOUT_SECONDS
    with SilentServer() as frozen:
        saved = dict(connection.settings_dict)
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(frozen.port))
        try:
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError, match="timeout"):
                pg_connect()  # the settings' parameters, as every Stint session takes them
            waited = time.monotonic() - started
        finally:
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)
    assert DEFAULT_CONNECT_TIMEOUT_SECONDS - 1 <= waited < DEFAULT_CONNECT_TIMEOUT_SECONDS + 3


def test_an_api_request_on_a_connection_whose_server_froze_is_a_503_within_the_request_bound(
    client, through_proxy, settings
):
    settings.STINT_REQUEST_DB_TIMEOUT_SECONDS = 2.0
    user = UserFactory()
    headers = {"HTTP_AUTHORIZATION": bearer(user)}
    assert client.get("/api/jobs", **headers).status_code == 200  # the connection is open, through the proxy
    through_proxy.freeze()
    started = time.monotonic()
    response = client.get("/api/jobs", **headers)
    waited = time.monotonic() - started
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    assert waited < 2.0 + 2.5
    through_proxy.thaw()
    assert client.get("/api/jobs", **headers).status_code == 200  # the next request reconnects


def test_a_request_that_beats_the_bound_keeps_its_connection(client, through_proxy, settings):
    settings.STINT_REQUEST_DB_TIMEOUT_SECONDS = 2.0
    user = UserFactory()
    headers = {"HTTP_AUTHORIZATION": bearer(user)}
    assert client.get("/api/jobs", **headers).status_code == 200
    backend_pid = connection.connection.info.backend_pid
    time.sleep(2.5)  # past the bound, between requests: nothing is cut
    assert client.get("/api/jobs", **headers).status_code == 200
    assert connection.connection.info.backend_pid == backend_pid


def test_the_default_request_bound_answers_before_gunicorn_kills_its_worker():
    gunicorn_timeout = runpy.run_path(str(Path(settings.BASE_DIR) / "docker" / "gunicorn.conf.py"))["timeout"]
    assert 0 < settings.STINT_REQUEST_DB_TIMEOUT_SECONDS < gunicorn_timeout
