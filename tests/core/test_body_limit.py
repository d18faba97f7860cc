"""Every oversized body gets the 413: DESIGN.md's JSON error on every API endpoint, a readable page elsewhere.

Before, a body over Django's DATA_UPLOAD_MAX_MEMORY_SIZE got Django's HTML "Bad Request (400)" on
auth, schedules and jobs alike, because a middleware read it before the API's bounded parser.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from core.errors import api_exception_handler
from core.parsers import RequestBodyTooLarge, SafeJSONParser, api_body_limit
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

API_POSTS = [
    "/api/auth/login",
    "/api/auth/register",
    "/api/auth/refresh",
    "/api/auth/logout",
    "/api/jobs",
    "/api/schedules",
    "/api/schedules/preview",
    "/api/schedules/1",  # PUT and PATCH below
    "/api/admin/queues/default/pause",
    "/api/jobs/00000000-0000-0000-0000-000000000000/cancel",
]


def _json_body(size: int) -> bytes:
    return b'{"name": "' + b"x" * (size - 12) + b'"}'


@pytest.mark.parametrize("size", [3_000_000, None], ids=["over-django-limit", "just-over-api-limit"])
@pytest.mark.parametrize("path", API_POSTS)
def test_every_api_endpoint_answers_an_oversized_body_with_the_json_413(client, admin_user, path, size):
    body = _json_body(size or api_body_limit() + 1)
    method = client.patch if path == "/api/schedules/1" else client.post

    resp = method(path, body, content_type="application/json", HTTP_AUTHORIZATION=bearer(admin_user))

    assert resp.status_code == 413, (path, resp.content[:200])
    assert resp["Content-Type"] == "application/json"
    error = resp.json()["error"]
    assert error["code"] == "payload_too_large"
    assert f"the limit is {api_body_limit()} bytes" in error["message"]


def test_a_body_at_the_api_limit_is_read(client, user):
    body = _json_body(api_body_limit())
    resp = client.post("/api/auth/login", body, content_type="application/json")
    assert resp.status_code == 400  # read and refused for its fields, not for its size


@pytest.mark.parametrize("path", ["/login/", "/admin/login/", "/jobs/new/"])
def test_a_page_answers_a_body_over_djangos_limit_with_a_readable_413(client, user, settings, path):
    client.force_login(user)
    body = "payload=" + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)

    resp = client.post(path, body, content_type="application/x-www-form-urlencoded")

    assert resp.status_code == 413
    assert resp["Content-Type"].startswith("text/html")
    assert "Too much data" in resp.content.decode()


def test_the_api_limit_is_the_projects_setting(client, user, settings):
    settings.API_MAX_BODY_BYTES = 2000
    assert api_body_limit() == 2000
    resp = client.post("/api/auth/login", _json_body(2001), content_type="application/json")
    assert resp.status_code == 413
    assert "the limit is 2000 bytes" in resp.json()["error"]["message"]


def test_a_streamed_body_over_the_limit_is_the_json_413_without_reading_past_it(settings):
    # A chunked body declares no length: the parser reads at most limit + 1 bytes, then refuses.
    settings.API_MAX_BODY_BYTES = 100
    stream = io.BytesIO(_json_body(10_000))
    request = SimpleNamespace(META={})

    with pytest.raises(RequestBodyTooLarge) as raised:
        SafeJSONParser().parse(stream, "application/json", {"request": request})

    assert stream.tell() == 101
    resp = api_exception_handler(raised.value, {})
    assert resp.status_code == 413
    assert resp.data == {
        "error": {
            "code": "payload_too_large",
            "message": "The request body is over the limit of 100 bytes.",
            "details": None,
        }
    }
