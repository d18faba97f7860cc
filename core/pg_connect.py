"""Extra PostgreSQL sessions beside Django's: one way to build their connection parameters.

A LISTEN session, the leader's advisory-lock session and tests' side sessions connect with
psycopg directly; they take Django's own parameters for the database alias (host, port, user,
password, libpq ``OPTIONS`` such as ``sslmode``), minus the keys only Django's backend
understands, so they never drift from the settings.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections

# Keys of Django's connection parameters that configure its backend, not libpq.
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")


def pg_connection_params(*, alias: str = "default", application_name: str | None = None) -> dict[str, Any]:
    """Return psycopg ``connect()`` keyword arguments for database ``alias`` (no key with an empty value).

    ``application_name`` (see ``core.db_role.application_name_for``) replaces the settings' one.
    Raises ``django.db.utils.ConnectionDoesNotExist`` for an unknown alias.
    """
    params = connections[alias].get_connection_params()
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    if application_name is not None:
        params["application_name"] = application_name
    return {k: v for k, v in params.items() if v not in (None, "")}


def pg_connect(
    *, alias: str = "default", application_name: str | None = None, autocommit: bool = True, **extra: Any
) -> psycopg.Connection:
    """Open a psycopg connection to database ``alias`` (``pg_connection_params`` plus ``extra``).

    Raises ``psycopg.OperationalError`` when the server cannot be reached.
    """
    return psycopg.connect(
        **pg_connection_params(alias=alias, application_name=application_name), autocommit=autocommit, **extra
    )
