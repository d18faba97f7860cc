"""What the long-running management commands share besides stop signals: ``-v`` to log levels, argparse types.

``run_scheduler``, ``run_workers`` and ``run_audit_consumer`` parse with these ``type=``
validators (a bad value is a usage error, never a traceback) and set their packages' log level
from ``-v``.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable
from typing import Any

STINT_LOGGERS = ("scheduler", "audit", "stint_tasks", "accounts", "core", "pages")  # the project's packages


def verbosity_level(verbosity: int) -> int:
    """Return the logging level of ``-v``: 0 WARNING, 1 INFO, 2+ DEBUG."""
    return {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)


def configure_verbosity(verbosity: int, *, loggers: tuple[str, ...] = STINT_LOGGERS) -> int:
    """Set the level of ``-v`` (``verbosity_level``) on the project's package loggers; return it.

    The root logger keeps ``LOG_LEVEL`` (config/settings.py LOGGING): Django's and the libraries'
    lines are not turned up or down by a command's ``-v``.
    """
    level = verbosity_level(verbosity)
    for name in loggers:
        logging.getLogger(name).setLevel(level)
    return level


def _number(text: str, parse: Callable[[str], Any], kind: str, ok: Callable[[Any], bool], rule: str) -> Any:
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(rule)
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _number(text, int, "an integer", lambda v: v >= 1, "must be >= 1")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 ("inf" and "nan" are refused: no interval or TTL is endless)."""
    return _number(text, float, "a number", lambda v: 0 < v < math.inf, "must be a finite number > 0")


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (0 meaning "at once", e.g. a grace period)."""
    return _number(text, float, "a number", lambda v: 0 <= v < math.inf, "must be a finite number >= 0")


def port(text: str) -> int:
    """argparse type: a TCP port, 0 meaning off."""
    return _number(text, int, "a port", lambda v: 0 <= v <= 65535, "must be 0-65535")
