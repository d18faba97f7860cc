"""What tests give the real processes they start (workers, schedulers, live servers)."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connection


def database_url() -> str:
    """Return a DATABASE_URL for the database this test runs against (the test database)."""
    d = connection.settings_dict
    user = quote(d.get("USER") or "", safe="")
    password = quote(d.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = quote(d.get("HOST") or "127.0.0.1", safe="")
    port = f":{d['PORT']}" if d.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(d['NAME'], safe='')}"
