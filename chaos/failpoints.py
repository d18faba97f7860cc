"""Failpoints: kill this process (SIGKILL) at an exact instruction when the chaos runner arms one.

The runner arms failpoint NAME by creating the file ``<directory>/NAME``. The first process that
reaches the failpoint claims it by renaming the file to ``NAME.taken.<pid>`` (an atomic rename,
so exactly one process fires per arming) and kills itself with SIGKILL, which no handler can
catch: the state it leaves is what a power cut at that instruction would leave.

- ``relay-after-produce``: in ``OutboxRelay._produce``, after Kafka confirmed the batch and before
  the relay marks the rows published.
- ``audit-before-commit``: in ``AuditConsumer._commit``, after the batch is stored, before its
  offsets are committed.
- ``audit-after-commit``: in ``AuditConsumer._commit``, right after the offsets are committed.

When a hooked method does not exist (the code it wraps changed), ``install`` writes
``<directory>/missing-<name>`` so the runner fails the scenario instead of passing it unfaulted.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HOOKS = {
    "relay-after-produce": ("scheduler.maintenance.relay", "OutboxRelay", "_produce", "after"),
    "audit-before-commit": ("audit.consumer", "AuditConsumer", "_commit", "before"),
    "audit-after-commit": ("audit.consumer", "AuditConsumer", "_commit", "after"),
}


def claim(directory: Path, name: str) -> bool:
    """Return True if this process took the armed failpoint ``name`` (renamed its file), else False."""
    try:
        os.rename(directory / name, directory / f"{name}.taken.{os.getpid()}")
    except OSError:
        return False
    return True


def _fire(directory: Path, name: str) -> None:
    if claim(directory, name):
        logger.warning("failpoint %s: killing process %d", name, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)


def install(directory: str) -> list[str]:
    """Wrap the hooked methods so that each checks its failpoint; return the names installed.

    A hook whose module, class or method is missing is reported in ``missing-<name>``.
    """
    import importlib

    base = Path(directory)
    installed = []
    by_method: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for name, (module, cls, method, when) in HOOKS.items():
        by_method.setdefault((module, cls, method), []).append((name, when))
    for (module, cls, method), points in by_method.items():
        try:
            owner = getattr(importlib.import_module(module), cls)
            original = getattr(owner, method)
        except (ImportError, AttributeError):
            for name, _ in points:
                (base / f"missing-{name}").write_text(f"{module}.{cls}.{method} not found\n")
            continue
        before = [n for n, w in points if w == "before"]
        after = [n for n, w in points if w == "after"]

        def wrapper(*args: Any, _original=original, _before=before, _after=after, **kwargs: Any) -> Any:
            for name in _before:
                _fire(base, name)
            result = _original(*args, **kwargs)
            if _after and (not isinstance(result, tuple) or result[0]):  # _produce: only once something was delivered
                for name in _after:
                    _fire(base, name)
            return result

        setattr(owner, method, functools.wraps(original)(wrapper))
        installed += [n for n, _ in points]
    return installed
