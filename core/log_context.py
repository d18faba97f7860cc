"""Context fields on every log line: ``request_id``, ``job_id``, ``attempt``, ``worker`` where they apply.

A field reaches a record in one of three ways: the call passes it (``logger.info(...,
extra={"job_id": ...})``, as the worker does); the code around the call bound it with
``log_context(...)`` (the request-id middleware binds ``request_id`` for the request, the
executor binds ``job_id`` and ``attempt`` while a handler runs); or, for Django's own
``django.request`` lines, the request passed with the record carries ``request_id``.
``ContextFilter``, installed on the console handler by ``settings.LOGGING``, fills in what a
record does not carry already; fields that do not apply are left out rather than written as null.

Formatters: JSON (python-json-logger, ``LOG_FORMAT=json``, the default in production) writes
every field as a key; ``PlainFormatter`` (``LOG_FORMAT=plain``, the default in development)
appends them as ``[job_id=... attempt=...]``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

CONTEXT_FIELDS = ("request_id", "job_id", "attempt", "worker")

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_bound: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("stint_log_context", default=_EMPTY)


class log_context:  # noqa: N801 - used like a function: ``with log_context(job_id=...):``
    """Bind ``fields`` (None values ignored) to every record logged in this context until the block exits.

    A class rather than a ``@contextmanager`` generator: a worker enters one per job, and the
    generator's machinery cost about three times as much (4 against 1.3 us). One instance may be
    entered again, also inside itself, in one thread or task at a time.
    """

    __slots__ = ("_fields", "_tokens")

    def __init__(self, /, **fields: Any) -> None:
        """Keep ``fields`` (name -> value, any name) to bind on entry."""
        self._fields = fields
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> None:
        """Bind the fields on top of those bound already."""
        bound = _bound.get()
        fields = {k: v for k, v in self._fields.items() if v is not None}
        self._tokens.append(_bound.set(MappingProxyType({**bound, **fields} if bound else fields)))

    def __exit__(self, *exc: object) -> None:
        """Restore the fields bound before this entry."""
        _bound.reset(self._tokens.pop())


def bound_fields() -> Mapping[str, Any]:
    """Return the fields bound in the current context."""
    return _bound.get()


class ContextFilter(logging.Filter):
    """Copy the bound context fields onto each record that does not already carry them; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the missing fields and let the record through."""
        for key, value in _bound.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        if not hasattr(record, "request_id"):
            # Django logs 4xx/5xx responses (django.request) after the middleware has returned,
            # outside its context, but passes the request along.
            request_id = getattr(getattr(record, "request", None), "request_id", None)
            if request_id is not None:
                record.request_id = request_id
        return True


class PlainFormatter(logging.Formatter):
    """The standard one-line format followed by the context fields that apply: ``[job_id=... worker=...]``."""

    def format(self, record: logging.LogRecord) -> str:
        """Format as usual, then append the context fields present on the record."""
        text = super().format(record)
        present = [f"{key}={getattr(record, key)}" for key in CONTEXT_FIELDS if getattr(record, key, None) is not None]
        if not present:
            return text
        head, sep, tail = text.partition("\n")  # keep a traceback below the fields
        return f"{head} [{' '.join(present)}]{sep}{tail}"
