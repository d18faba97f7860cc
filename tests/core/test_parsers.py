"""Deeply nested JSON is a 400 everywhere, never a RecursionError (found by the break-it trial)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from core.parsers import MAX_JSON_DEPTH, JSONTextError, json_bytes_load, json_depth, json_text_load
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


DIGITS = "9" * 5000
JOB = '{"type": "DEMO_TASK", "payload": %s}'


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (JOB % DIGITS, None, "JSON parse error: a number has more than 4300 digits."),
        (JOB % ("-" + DIGITS), None, "JSON parse error: a number has more than 4300 digits."),
        (
            f'{{"type": "DEMO_TASK", "max_retries": {DIGITS}}}',
            None,
            "JSON parse error: a number has more than 4300 digits.",
        ),
        (
            b'\xef\xbb\xbf{"type": "DEMO_TASK"}',
            None,
            "JSON parse error: the body starts with a UTF-8 byte order mark; send it without one.",
        ),
        (
            b"\xef\xbb\xbf",
            None,
            "JSON parse error: the body starts with a UTF-8 byte order mark; send it without one.",
        ),
        (JOB % '{"a": 1e999}', None, "JSON parse error: a number is too large (over 1.8e308)."),
        (JOB % '{"a": -1e999}', None, "JSON parse error: a number is too large (over 1.8e308)."),
        ('{"type": "DEMO_TASK", "priority": 1e999}', None, "JSON parse error: a number is too large (over 1.8e308)."),
        (JOB % '{"a": NaN}', None, "JSON parse error: NaN is not a JSON number."),
        (JOB % '{"a": -Infinity}', None, "JSON parse error: -Infinity is not a JSON number."),
        (
            JOB.encode() % b'{"a": "\xff"}',
            None,
            "JSON parse error: the body is not valid UTF-8 (byte 0xff at offset 40).",
        ),
        (
            '{"type": "DEMO_TASK"}'.encode("utf-16"),
            None,
            "JSON parse error: the body is not valid UTF-8 (byte 0xff at offset 0).",
        ),
        (
            JOB.encode() % b'{"a": "\xe9"}',
            "application/json; charset=ascii",
            "JSON parse error: the body is not valid ASCII (byte 0xe9 at offset 40).",
        ),
        (
            JOB % '{"a": "x\x00y"}',
            None,
            "JSON parse error: a control character in a string must be escaped (line 1, column 42).",
        ),
        (JOB % '{"a": "x', None, "JSON parse error: unterminated string (line 1, column 40)."),
        ('{"type": "DEMO_TASK"} x', None, "JSON parse error: extra data after the JSON value (line 1, column 23)."),
        ('{"type": ', None, "JSON parse error: expecting a value (line 1, column 10)."),
    ],
    ids=[
        "huge-int",
        "huge-negative-int",
        "huge-int-in-a-field",
        "bom",
        "bom-alone",
        "huge-float",
        "huge-negative-float",
        "huge-float-in-a-field",
        "nan",
        "infinity",
        "not-utf8",
        "utf16",
        "not-the-declared-charset",
        "raw-nul",
        "unterminated",
        "extra-data",
        "truncated",
    ],
)
def test_bad_json_is_a_400_that_says_what_is_wrong_without_quoting_python(user_api, body, content_type, message):
    resp = user_api.post("/api/jobs", body, content_type=content_type or "application/json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"] == {"code": "validation_error", "message": message, "details": None}
    assert not Job.objects.exists()


# What Python's json module and codecs say, which no API message should repeat.
PYTHON_WORDS = ("sys.", "set_int_max_str_digits", "codec", "utf-8-sig", "char ", "ordinal", "JSON compliant", 'inf"')
HOSTILE = [
    JOB % DIGITS,
    f'{{"type": "DEMO_TASK", "name": {DIGITS}}}',
    "\ufeff" + JOB % "{}",
    JOB % '{"a": "\\u0000"}',
    JOB % '{"a": "x\x00"}',
    '{"type": "DEMO_TASK", "name": "a\\u0000"}',
    JOB % '{"a": "\\ud800"}',
    '{"type": "\\udfff"}',
    JOB % ("[" * 5000 + "]" * 5000),
    JOB % "1e999",
    '{"type": "DEMO_TASK", "priority": 1e999, "timeout_seconds": 1e999}',
    JOB % "NaN",
]


@pytest.mark.parametrize("path", ["/api/jobs", "/api/schedules", "/api/schedules/preview", "/api/auth/register"])
@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_json_is_never_a_500_nor_a_python_message(user_api, path, body):
    resp = user_api.post(path, body, content_type="application/json")
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    text = error["message"] + str(error["details"])
    assert not [word for word in PYTHON_WORDS if word in text], text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (DIGITS, "Not valid JSON: a number has more than 4300 digits."),
        ('{"n": -' + DIGITS + "}", "Not valid JSON: a number has more than 4300 digits."),
        ("[1e400]", "Not valid JSON: a number is too large (over 1.8e308)."),
        ("[NaN]", "Not valid JSON: NaN is not a JSON number."),
        ("\ufeff{}", "Not valid JSON: the text starts with a byte order mark (line 1, column 1)."),
        ("[1,", "Not valid JSON: expecting a value (line 1, column 4)."),
        ("[" * 5000, f"JSON nested deeper than {MAX_JSON_DEPTH} levels."),
    ],
)
def test_the_form_reader_says_what_is_wrong_without_quoting_python(text, message):
    with pytest.raises(ValueError) as caught:
        json_text_load(text)
    assert str(caught.value) == message


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


@pytest.mark.parametrize("charset", ["rot13", "base64", "bz2_codec", "hex", "nope", "latin-2000", "BOGUS"])
def test_a_body_declared_in_a_charset_that_is_no_text_encoding_we_know_is_a_415_that_names_it(user_api, charset):
    # An unknown charset used to be read as UTF-8 (Django drops it): a body in the encoding the client
    # meant was then misread, or refused as "not valid UTF-8". As Express's body-parser does, refuse it.
    resp = user_api.post("/api/jobs", b'{"type": "DEMO_TASK"}', content_type=f"application/json; charset={charset}")
    assert resp.status_code == 415, resp.content
    assert resp.json()["error"] == {
        "code": "unsupported_media_type",
        "message": f"Unsupported charset {charset!r} in Content-Type: send UTF-8, or name a text encoding "
        "such as latin-1.",
        "details": None,
    }
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("charset", "codec", "name"),
    [
        ("utf-8", "utf-8", "caf\u00e9"),
        ('"UTF8"', "utf-8", "caf\u00e9"),
        ("latin-1", "latin-1", "caf\u00e9"),
        ("iso-8859-1", "latin-1", "caf\u00e9"),
        ("ascii", "ascii", "cafe"),
    ],
)
def test_a_body_in_a_declared_text_encoding_is_read_in_it(user_api, charset, codec, name):
    body = json.dumps({"type": "DEMO_TASK", "name": name}, ensure_ascii=False).encode(codec)
    resp = user_api.post("/api/jobs", body, content_type=f"application/json; charset={charset}")
    assert resp.status_code == 201, resp.content
    assert resp.json()["name"] == name


def test_a_body_that_a_codecs_own_check_refuses_is_said_to_be_not_valid_in_it(user_api):
    with pytest.raises(JSONTextError, match="^the body is not valid IDNA$"):
        json_bytes_load(b"xn--", encoding="idna")  # UnicodeError, not UnicodeDecodeError
    resp = user_api.post("/api/jobs", b"xn--", content_type="application/json; charset=idna")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["message"] == "JSON parse error: the body is not valid IDNA."


@pytest.mark.parametrize(
    "body",
    [
        '{"type": "DEMO_TASK", "type": "FAILING"}',
        '{"type": "DEMO_TASK", "payload": {"a": 1, "a": 2}}',
        '{"type": "DEMO_TASK", "payload": [{"x": {"k": 1, "k": 1}}]}',
    ],
)
def test_a_body_that_names_a_key_twice_in_one_object_is_a_400_that_names_the_key(user_api, body):
    # RFC 8259, 4: with duplicate names "the behavior of software that receives such an object is
    # unpredictable"; Python's json keeps the last silently, so a FAILING job came of the first body.
    resp = user_api.post("/api/jobs", body, content_type="application/json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["message"].startswith("JSON parse error: the key ")
    assert "appears twice in one object" in resp.json()["error"]["message"]
    assert not Job.objects.exists()


def test_the_form_reader_refuses_a_key_named_twice_too():
    with pytest.raises(ValueError, match="Not valid JSON: the key 'a' appears twice in one object"):
        json_text_load('{"a": 1, "a": 2}')
