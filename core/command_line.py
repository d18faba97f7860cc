"""What the management commands share besides stop signals: settings that load, ``-v`` to log levels, argparse types.

``manage.py`` loads the settings first (``settings_load_or_exit``). ``run_scheduler``,
``run_workers`` and ``run_audit_consumer`` parse with these ``type=`` validators (a bad value is
a usage error, never a traceback) and set their packages' log level from ``-v``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

STINT_LOGGERS = ("scheduler", "audit", "stint_tasks", "accounts", "core", "pages")  # the project's packages


def settings_load_or_exit() -> None:
    """Import the settings module ``DJANGO_SETTINGS_MODULE`` names; when it cannot load, say why in one line and exit 1.

    A module that does not exist (``DJANGO_SETTINGS_MODULE=nope``), an import inside it that fails,
    or a value it refuses (``ImproperlyConfigured``: ``LOG_LEVEL=loud``) is one line on stderr
    naming the module and the error, where Django printed a traceback (or, for ``help``, only its
    own commands, and exit 0). Any other error of the settings' code keeps its traceback: a bug.
    """
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # noqa: B018 - the first read imports the module
    except (ImportError, ImproperlyConfigured) as exc:
        name = os.environ.get("DJANGO_SETTINGS_MODULE")
        why = " ".join(str(exc).split())  # one line, whatever the message holds
        where = f"the settings module {name!r} (DJANGO_SETTINGS_MODULE)"
        sys.stderr.write(f"manage.py: cannot load {where}: {type(exc).__name__}: {why}\n")
        raise SystemExit(1) from None


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


# Seconds: no interval, period, grace or timeout of these commands needs more than a week, and a wait
# much longer is an error in Python itself (threading's TIMEOUT_MAX, about 292 years: OverflowError).
MAX_SECONDS = 7 * 24 * 3600


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _number(text, int, "an integer", lambda v: v >= 1, "must be >= 1")


def int_range(low: int, high: int) -> Callable[[str], int]:
    """argparse type: an integer from ``low`` to ``high`` (a count of processes or slots: a typo of
    99999999999 must not start that many)."""

    def parse(text: str) -> int:
        return _number(text, int, "an integer", lambda v: low <= v <= high, f"must be from {low} to {high}")

    return parse


def positive_float(text: str) -> float:
    """argparse type: seconds, a number > 0 and at most ``MAX_SECONDS`` ("inf" and "nan" are refused)."""
    return _number(
        text, float, "a number", lambda v: 0 < v <= MAX_SECONDS, f"must be a finite number > 0, at most {MAX_SECONDS}"
    )


def seconds_at_least(low: float) -> Callable[[str], float]:
    """argparse type: seconds from ``low`` to ``MAX_SECONDS``, for a loop's period (a tick of 1e-9 s spins)."""

    def parse(text: str) -> float:
        return _number(
            text, float, "a number", lambda v: low <= v <= MAX_SECONDS, f"must be from {low:g} to {MAX_SECONDS}"
        )

    return parse


def non_negative_float(text: str) -> float:
    """argparse type: seconds, a number >= 0 (0 meaning "at once", e.g. a grace period), at most ``MAX_SECONDS``."""
    return _number(
        text, float, "a number", lambda v: 0 <= v <= MAX_SECONDS, f"must be a finite number >= 0, at most {MAX_SECONDS}"
    )


def port(text: str) -> int:
    """argparse type: a TCP port, 0 meaning off."""
    return _number(text, int, "a port", lambda v: 0 <= v <= 65535, "must be 0-65535")
