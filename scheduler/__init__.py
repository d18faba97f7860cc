"""Stint's job scheduler app. ``scheduler.enqueue(...)`` is the Python API for Django code."""

from __future__ import annotations

from typing import Any


def enqueue(type: str, payload: Any = None, **options: Any) -> Any:  # noqa: A002 - DESIGN.md's name
    """Enqueue a job; see ``scheduler.services.enqueue`` for the options, return value and errors."""
    from scheduler.services import enqueue as _enqueue

    return _enqueue(type, payload, **options)
