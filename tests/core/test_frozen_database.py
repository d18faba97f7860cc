"""A frozen PostgreSQL (SIGSTOPped, a stalled storage, a paused VM) bounds how long a request waits.

A frozen server accepts TCP connections (the kernel does) and never answers. Measured before the
bound: a new connection waited psycopg's default 130 s.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from config.db_session import DEFAULT_CONNECT_TIMEOUT_SECONDS
from core.pg_connect import pg_connect
from tests.support.net import SilentServer

pytestmark = pytest.mark.django_db(transaction=True)


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
