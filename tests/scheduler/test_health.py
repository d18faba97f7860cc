"""GET /api/health reports each component, the live workers and the cron leader from background probes."""

from __future__ import annotations

import datetime as dt
import socket
import threading
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from scheduler import health
from tests.support.processes import wait_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def throwaway_redis() -> Iterator[RedisServer]:
    """A real redis-server of our own on a free port, so the test can stop it."""
    server = RedisServer()
    server.start()
    yield server
    server.close()


def _caches(port: int) -> dict:
    from django.conf import settings

    caches = {"default": dict(settings.CACHES["default"])}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{port}/0"
    return caches


@pytest.fixture(autouse=True)
def _fresh_monitor():
    """Each test starts with no readings, so its first request probes afresh."""
    health.monitor.reset()
    health.kafka_client_reset()
    yield
    health.monitor.reset()
    health.kafka_client_reset()


def test_health_reports_all_components_up(api):
    resp = api.get("/api/health")
    assert resp.status_code == 200
    body = resp.json()
    assert (body["status"], body["components"]) == ("ok", {"database": "up", "redis": "up", "kafka": "up"})
    assert body["workers"] == {"alive": 0, "slots": 0, "busy": 0}


def test_health_reports_stopped_redis_as_down_and_still_answers(api, throwaway_redis):
    with override_settings(CACHES=_caches(throwaway_redis.port)):
        assert api.get("/api/health").json()["components"]["redis"] == "up"
        throwaway_redis.stop()
        health.monitor.reset()  # rather than waiting out the probe interval
        resp = api.get("/api/health")
    assert resp.status_code == 200
    body = resp.json()
    assert body["components"]["redis"] == "down"
    assert body["components"]["database"] == "up"
    assert body["status"] == "degraded"


@pytest.mark.django_db(transaction=True)  # the probe reads on its own connection: rows must be committed
def test_health_reports_the_live_workers_and_the_cron_leader(api):
    from django.utils import timezone
    from django_redis import get_redis_connection

    from scheduler.leadership import advisory_key, lock_key
    from scheduler.models import LeaderFence, WorkerNode
    from tests.support.subprocess_env import database_url

    now = timezone.now()
    for name, heartbeat in (("alive", now), ("silent", now - dt.timedelta(hours=1))):
        WorkerNode.objects.create(
            id=name,
            hostname="h",
            pid=1,
            concurrency=4,
            busy_slots=3,
            pool="threads",
            started_at=heartbeat,
            last_heartbeat_at=heartbeat,
        )
    LeaderFence.objects.create(role="cron", token=7, holder="host:42:abcd")
    redis_client = get_redis_connection("default")
    redis_client.set(lock_key("cron"), "host:42:abcd:7", px=60_000)
    try:
        held_in_redis = api.get("/api/health").json()
    finally:
        redis_client.delete(lock_key("cron"))
    health.monitor.reset()
    nobody = api.get("/api/health").json()
    with psycopg.connect(database_url()) as fallback:  # the leader's PostgreSQL fallback lock
        fallback.execute("SELECT pg_advisory_lock(%s)", [advisory_key("cron")])
        health.monitor.reset()
        held_in_postgres = api.get("/api/health").json()

    assert held_in_redis["workers"] == {"alive": 1, "slots": 4, "busy": 3}
    leader = held_in_redis["cron_leader"]
    assert (leader["holder"], leader["token"], leader["lock"]) == ("host:42:abcd", 7, "redis")
    assert nobody["cron_leader"] is None  # the fence remembers a term, but no lock holds it now
    assert held_in_postgres["cron_leader"]["lock"] == "postgres"


@pytest.fixture
def hung_kafka(settings, monkeypatch):
    """A real TCP server that accepts connections and never answers: a broker hung or blackholed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    settings.KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setattr(health, "KAFKA_TIMEOUT", 60.0)  # the probe outlives the test: it stays in flight
    yield
    server.close()


def test_requests_never_wait_on_a_hung_kafka_and_it_is_probed_once(hung_kafka, monkeypatch):
    monkeypatch.setattr(health.monitor, "first_wait_seconds", 0.5)
    monkeypatch.setattr(health.monitor, "hung_after_seconds", 60.0)  # still "unknown", not yet "down"
    first = APIClient().get("/api/health")  # the process's first request: waits at most 0.5 s
    answers: list = []

    def call() -> None:
        try:
            answers.append(APIClient().get("/api/health"))
        finally:
            connection.close()

    threads = [threading.Thread(target=call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    # All 17 answered while the one Kafka probe is still waiting on the hung broker.
    assert health.monitor.probing("kafka")
    assert health.monitor.probes_started["kafka"] == 1
    assert [a.status_code for a in [first, *answers]] == [200] * 17
    assert {a.json()["components"]["kafka"] for a in [first, *answers]} == {"unknown"}
    assert {a.json()["status"] for a in answers} == {"degraded"}


def test_a_component_that_stops_answering_after_it_was_up_is_reported_down_not_up(settings, monkeypatch):
    # Found with the dev stack's PostgreSQL SIGSTOPped: its probe hung on a server that accepts
    # and never answers (a statement_timeout is the server's own, so it never fires), and every
    # request kept reading the probe from before the freeze, "database": "up", for the whole
    # freeze. The same holds for any component; a hung broker is the one a test can make.
    def kafka_state() -> str:
        return APIClient().get("/api/health").json()["components"]["kafka"]

    wait_until(lambda: kafka_state() == "up", what="the real broker reported up")
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    try:
        settings.KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{hung.getsockname()[1]}"
        health.kafka_client_reset()
        monkeypatch.setattr(health, "KAFKA_TIMEOUT", 60.0)  # the probe stays in flight past the test
        monkeypatch.setattr(health.monitor, "interval_seconds", 0.1)  # the next request probes again
        monkeypatch.setattr(health.monitor, "hung_after_seconds", 0.5)

        wait_until(lambda: kafka_state() == "down", what="the hung broker reported down")
        assert health.monitor.probing("kafka")  # it is the probe in flight that says so
        resp = APIClient().get("/api/health")
    finally:
        hung.close()
    assert resp.status_code == 200
    assert resp.json()["status"] == "degraded"


def test_schema_and_docs_are_served(api):
    schema = api.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/auth/login" in schema.content
    docs = api.get("/api/docs/")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower()


@pytest.mark.parametrize("method", ["options", "post", "put", "patch", "delete"])
def test_the_docs_page_answers_only_get_and_head_and_other_methods_are_a_405_not_a_500(api, method):
    resp = getattr(api, method)("/api/docs/")
    assert resp.status_code == 405
    # The error envelope as JSON, as everywhere under /api/ (it was the text "405 Method Not Allowed").
    assert resp["Content-Type"] == "application/json"
    assert resp.json()["error"]["code"] == "method_not_allowed"
    assert api.head("/api/docs/").status_code == 200


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_the_schema_answers_an_error_as_json_not_yaml(api, method):
    resp = getattr(api, method)("/api/schema/")
    assert resp.status_code == 405
    assert resp["Content-Type"] == "application/json"
    assert resp.json()["error"]["code"] == "method_not_allowed"


def test_unknown_api_path_is_json_404(api):
    resp = api.get("/api/no-such-thing")
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("path", ["/api/jobs/not-a-uuid", "/api/nothing/here", "/api/schedules/abc", "/api/"])
def test_unknown_api_paths_answer_json_404_even_in_debug(settings, path):
    from rest_framework.test import APIClient

    settings.DEBUG = True
    api = APIClient(enforce_csrf_checks=True)
    for method in (api.get, api.post, api.put, api.delete):
        resp = method(path)
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "not_found"
