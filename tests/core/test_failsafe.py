"""The last guards before a 500: bad text in parameters (400) and a database that is down (503)."""

from __future__ import annotations

import socket

import pytest
from django.db import connection

from core.pg_connect import pg_connect

pytestmark = pytest.mark.django_db(transaction=True)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens here once the socket is closed


@pytest.fixture
def database_down():
    """Point Django's connection at a port where no PostgreSQL listens (a real refused connection)."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(_closed_port()))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def test_an_api_call_while_the_database_is_down_is_a_json_503(client, database_down):
    response = client.post(
        "/api/auth/login", {"username": "alice", "password": "x" * 12}, content_type="application/json"
    )
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "database is unavailable" in response.json()["error"]["message"]
    assert response["Retry-After"] == "5"


def test_the_503_does_not_promise_that_nothing_changed(client, database_down):
    """A connection cut after its COMMIT was sent (the deadline, a lost link) may have committed it.

    So the answer says the request may have taken effect and how to retry safely: the same
    ``Idempotency-Key`` (DESIGN.md, POST /api/jobs) makes a retried submission the same job.
    """
    response = client.post(
        "/api/auth/login", {"username": "alice", "password": "x" * 12}, content_type="application/json"
    )
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    assert "nothing was changed" not in message
    assert "may or may not have taken effect" in message
    assert "same Idempotency-Key" in message


def test_a_page_while_the_database_is_down_is_a_503_that_says_so(client, database_down):
    response = client.post("/login/", {"username": "alice", "password": "x" * 12})
    assert response.status_code == 503
    assert "database is unavailable" in response.content.decode()


def test_a_lock_timeout_in_a_view_is_a_503_logged_as_a_lock_timeout_not_as_the_database_down(client, caplog):
    """A server that answers (another session holds a lock past ``lock_timeout``) is not "unavailable" in the log."""
    with pg_connect(autocommit=False) as other:
        other.execute("LOCK TABLE accounts_user IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '50ms'")
        try:
            response = client.post(
                "/api/auth/login", {"username": "alice", "password": "x" * 12}, content_type="application/json"
            )
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert "waiting for a lock timed out (SQLSTATE 55P03" in caplog.text
    assert "database unavailable" not in caplog.text


@pytest.mark.parametrize("query", ["status=%00", "a%00=1", "search=ab%00"])
def test_a_nul_in_an_api_query_string_is_a_json_400(client, query):
    response = client.get(f"/api/jobs?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize(
    ("query", "named"),
    [("status=%00", "status"), ("a%00=1", "a\\x00"), ("search=ab%00&type=x", "search")],
)
def test_a_nul_or_lone_surrogate_400_names_the_parameter_in_its_details(client, query, named):
    """The 400 says which parameter holds the NUL or the surrogate, as every other 400 of the API does."""
    response = client.get(f"/api/jobs?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith(f"{named}: ")
    assert list(error["details"]) == [named]
