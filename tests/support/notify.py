"""Listening on the workers' NOTIFY channel from a test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from core.pg_connect import pg_connect
from scheduler.notify import CHANNEL


@pytest.fixture
def listener() -> Iterator[psycopg.Connection]:
    """A separate autocommit connection listening on the workers' channel."""
    with pg_connect() as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn


def notifications(conn: psycopg.Connection) -> list[str]:
    """Return the queue names of the payloads received so far (their "#token," head cut off), up to a
    sentinel we send last (commit order is delivery order)."""
    return [payload.split(",", 1)[1] for payload in raw_notifications(conn)]


def raw_notifications(conn: psycopg.Connection) -> list[str]:
    """Return the payloads received so far, whole, up to a sentinel we send last."""
    sentinel = f"sentinel-{uuid.uuid4()}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, sentinel])
    payloads = []
    for note in conn.notifies(timeout=10):
        if note.payload == sentinel:
            return payloads
        payloads.append(note.payload)
    raise AssertionError(f"sentinel notification not received; got {payloads}")
