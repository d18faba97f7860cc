"""Shared shutdown wiring for the long-running commands: first signal stops gently, second forces."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


def install_stop_handlers(stop: Callable[..., None], *, name: str) -> None:
    """On SIGTERM/SIGINT call ``stop()``; on a second signal call ``stop(force=True)`` if accepted."""
    state = {"count": 0}

    def handle(signum: int, frame: Any) -> None:
        state["count"] += 1
        if state["count"] == 1:
            logger.info("%s: %s received, shutting down gracefully", name, signal.Signals(signum).name)
            stop()
        else:
            logger.warning("%s: second signal, forcing shutdown", name)
            try:
                stop(force=True)
            except TypeError:
                stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def configure_verbosity(verbosity: int) -> None:
    """Map ``-v`` to the root log level: 0 WARNING, 1 INFO, 2+ DEBUG."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logging.getLogger().setLevel(level)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def port(text: str) -> int:
    """argparse type: a TCP port, 0 meaning off."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be 0-65535")
    return value
