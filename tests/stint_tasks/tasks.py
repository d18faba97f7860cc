"""Tasks the backend's tests enqueue; workers import this module through ``STINT_TASK_MODULES``."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from decimal import Decimal

from scheduler.errors import RetryAfter
from stint_tasks.compat import TaskContext

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=37, queue_name="default")
def prioritised() -> str:
    return "ran"


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task
async def async_sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "woke"


@task(takes_context=True)
def attempt_of(context: TaskContext, fail_until: int = 0) -> dict[str, object]:
    """Fail while ``context.attempt <= fail_until``; then return what the context says."""
    if context.attempt <= fail_until:
        raise KeyError(f"attempt {context.attempt}")
    return {"attempt": context.attempt, "id": context.task_result.id, "workers": len(context.task_result.worker_ids)}


@task
def fails() -> None:
    raise ValueError("this task fails")


@task
def retries_after(seconds: float) -> None:
    raise RetryAfter(seconds, "the upstream answered 429")


@task
def exits() -> None:
    raise SystemExit(3)


@task
def not_json() -> object:
    return object()


def unstorable(kind: str) -> object:
    """A value Django's ``normalize_json`` refuses, by ``kind``: set, decimal, datetime, object, deep (5,000 levels)."""
    if kind == "deep":
        value: list[object] = []
        for _ in range(5000):
            value = [value]
        return value
    return {"set": {1, 2}, "decimal": Decimal("1.5"), "datetime": dt.datetime(2030, 1, 1), "object": object()}[kind]


def refused_by_the_worker(kind: str) -> object:
    """A value Django's ``normalize_json`` passes and a Stint job cannot keep: nan, nul, surrogate, big (over 1 MB)."""
    big = "x" * 1024 * 1024
    return {"nan": {"x": float("nan")}, "nul": ["a\x00b"], "surrogate": {"k\ud800": 1}, "big": big}[kind]


@task
def returns_unstorable(kind: str) -> object:
    return unstorable(kind)


@task
def returns_refused(kind: str) -> object:
    return refused_by_the_worker(kind)


@task
async def async_returns_unstorable(kind: str) -> object:
    await asyncio.sleep(0)
    return unstorable(kind)


@task
def sleeps(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


class CustomError(Exception):
    """An exception class outside builtins: its path must read back whole."""


@task
def raises_custom() -> None:
    raise CustomError("first line\nsecond line")


class UnreadableExit(BaseException):
    """A ``BaseException`` whose text cannot be read: its ``__str__`` raises ``SystemExit``."""

    def __str__(self) -> str:
        raise SystemExit("no text")


class UnformattableError(Exception):
    """An exception whose traceback cannot be formatted: reading its ``__notes__`` raises."""

    @property
    def __notes__(self) -> list[str]:
        raise RuntimeError("no notes")


@task
def exits_unreadably() -> None:
    raise UnreadableExit


@task
def raises_unformattable() -> None:
    raise UnformattableError("the message")


@task
def raises_huge(megabytes: int) -> None:
    raise ValueError("x" * megabytes * 1024 * 1024)
