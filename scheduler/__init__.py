"""Stint's job scheduler app. ``scheduler.enqueue(...)`` and ``scheduler.enqueue_many(...)``: the Python API."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any


def enqueue(type: str, payload: Any = None, **options: Any) -> Any:  # noqa: A002 - DESIGN.md's name
    """Enqueue a job; see ``scheduler.enqueuing.enqueue`` for the options, return value and errors."""
    from scheduler.enqueuing import enqueue as _enqueue

    return _enqueue(type, payload, **options)


def enqueue_many(jobs: Sequence[dict[str, Any]], *, owner: Any = None) -> list[uuid.UUID]:
    """Enqueue many jobs in one statement; see ``scheduler.enqueuing.enqueue_many`` for items, result and errors."""
    from scheduler.enqueuing import enqueue_many as _enqueue_many

    return _enqueue_many(jobs, owner=owner)
