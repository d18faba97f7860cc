"""Deeply nested JSON is a 400 everywhere, never a RecursionError (found by the break-it trial)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.parsers import MAX_JSON_DEPTH, json_depth
from scheduler.models import Job

pytestmark = pytest.mark.django_db


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_json_depth_counts_levels_without_recursion():
    assert json_depth(1) == 0
    assert json_depth({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(4999):
        deep = [deep]
    assert json_depth(deep) == 5000


@pytest.mark.parametrize("path", ["/api/auth/login", "/api/auth/register"])
def test_public_endpoints_refuse_deep_json_with_400(api, path):
    body = '{"username": ' + _nested(3000) + "}"
    resp = api.post(path, body, content_type="application/json")
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "validation_error" or resp.json()["error"]["message"]


def test_job_payload_nested_past_the_limit_is_400_and_creates_nothing(user_api):
    for levels in (MAX_JSON_DEPTH + 10, 900):
        body = '{"type": "DEMO_TASK", "payload": ' + _nested(levels) + "}"
        resp = user_api.post("/api/jobs", body, content_type="application/json")
        assert resp.status_code == 400, resp.content
    deep_but_allowed = '{"type": "DEMO_TASK", "payload": {"a": ' + _nested(40) + "}}"
    assert user_api.post("/api/jobs", deep_but_allowed, content_type="application/json").status_code == 400
    assert not Job.objects.exists()
    ok = '{"type": "DEMO_TASK", "payload": {"a": ' + _nested(10) + "}}"
    assert user_api.post("/api/jobs", ok, content_type="application/json").status_code == 201


APPS = ("scheduler", "audit", "accounts", "pages", "stint_tasks", "config", "examples")


def test_core_imports_nothing_of_the_apps():
    # core/ is plumbing the apps import; an arrow back up (core -> scheduler...) would be a cycle.
    core = Path(__file__).resolve().parents[2] / "core"
    arrows = []
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            arrows += [f"{path.name}: {n}" for n in names if n.split(".")[0] in APPS]
    assert arrows == []
