"""The per-row inputs of the lifecycle's batch statements: one JSON document of columns, read back by ``ROWS FROM``."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from django.db import connection
from psycopg.types.json import Jsonb

from scheduler.lifecycle import _from_document, _rows_document

pytestmark = pytest.mark.django_db

COLUMNS = [
    ("id", "uuid"),
    ("n", "bigint"),
    ("t", "text"),
    ("ok", "bool"),
    ("at", "timestamptz"),
    ("x", "float8"),
    ("j", "jsonb"),
]


def read_back(inputs: list[tuple[str, str, list]]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT * FROM ({_from_document((name, kind) for name, kind, _ in inputs)}) v",  # noqa: S608
            {"rows": _rows_document(inputs)},
        )
        # Django's psycopg backend hands jsonb over as its text.
        return [
            tuple(
                json.loads(v) if kind == "jsonb" and v is not None else v
                for v, (_, kind, _) in zip(row, inputs, strict=True)
            )
            for row in cursor.fetchall()
        ]


def test_every_type_and_null_comes_back_in_row_order() -> None:
    ids = [uuid.uuid4(), None, uuid.UUID(int=1)]
    at = dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    values = {
        "id": ids,
        "n": [2**62, None, -1],
        "t": ['é "quoted" \\ \n', None, ""],
        "ok": [True, None, False],
        "at": [at, None, at],
        "x": [0.1, None, 1e-300],
        "j": [Jsonb({"a": [1, None]}), None, Jsonb(None)],  # SQL NULL vs a JSON null
    }
    rows = read_back([(name, kind, values[name]) for name, kind in COLUMNS])

    assert rows == [
        (ids[0], 2**62, 'é "quoted" \\ \n', True, at, 0.1, {"a": [1, None]}),
        (None, None, None, None, None, None, None),
        (ids[2], -1, "", False, at, 1e-300, None),
    ]
    with connection.cursor() as cursor:  # the third row's jsonb is a JSON null, not SQL NULL
        cursor.execute(
            f"SELECT j IS NULL, jsonb_typeof(j) FROM ({_from_document([('j', 'jsonb')])}) v",  # noqa: S608
            {"rows": _rows_document([("j", "jsonb", [None, Jsonb(None)])])},
        )
        assert cursor.fetchall() == [(True, None), (False, "null")]


def test_uuids_travel_as_32_hex_digits_and_anything_else_as_text_for_postgresql_to_judge() -> None:
    job = uuid.uuid4()
    assert _rows_document([("id", "uuid", [job, "not-a-uuid", None])]) == f'{{"id": ["{job.hex}", "not-a-uuid", null]}}'


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="2 values for 3 rows"):
        _rows_document([("a", "text", ["x", "y", "z"]), ("b", "text", ["x", "y"])])
