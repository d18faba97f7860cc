"""core/errors.py: the JSON 404 of an unknown /api/ path names the path it meant when only a slash differs."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.django_db

HINT = "Stint's API paths end without a slash, except /api/schema/ and /api/docs/."


@pytest.mark.parametrize(
    ("path", "meant"),
    [
        ("/api/jobs/", "/api/jobs"),  # DRF's routers add a slash: the habit of its users
        ("/api/auth/login/", "/api/auth/login"),
        ("/api/schedules/", "/api/schedules"),
        ("/api/health/", "/api/health"),
        ("/api/docs", "/api/docs/"),  # drf-spectacular's pages keep theirs
        ("/api/schema", "/api/schema/"),
    ],
)
def test_a_path_that_differs_only_by_its_trailing_slash_is_a_404_naming_the_path_meant(api, path, meant):
    for method in (api.get, api.post, api.delete):
        response = method(path)
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "not_found"
        assert error["message"] == f"Not found. Did you mean {meant}? {HINT}"
        assert error["details"] == {"path": meant}


def test_a_jobs_path_with_a_slash_names_the_same_job_without_it(api):
    job_id = uuid.uuid4()
    error = api.get(f"/api/jobs/{job_id}/attempts/").json()["error"]
    assert error["details"] == {"path": f"/api/jobs/{job_id}/attempts"}


@pytest.mark.parametrize(
    "path", ["/api/no-such-thing", "/api/no-such-thing/", "/api/", "/api", "/api/jobs/not-a-uuid/"]
)
def test_a_path_with_no_twin_stays_a_plain_404(api, path):
    response = api.get(path)
    assert response.status_code == 404
    assert response.json()["error"] == {"code": "not_found", "message": "Not found.", "details": None}
