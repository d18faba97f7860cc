"""Typed accessor over ``settings.SCHEDULER``."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConf:
    """The job system's tunables; units are in the names."""

    lease_seconds: int
    heartbeat_seconds: float
    poll_seconds: float
    shutdown_grace_seconds: float
    idempotency_ttl_seconds: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    backoff_jitter: bool
    worker_dead_after_seconds: int
    max_payload_bytes: int
    max_schedules_per_user: int = 0  # 0: no limit


def conf() -> SchedulerConf:
    """Return the current settings (read on each call so tests can override them)."""
    raw = settings.SCHEDULER
    return SchedulerConf(**{k.lower(): v for k, v in raw.items() if k.lower() in SchedulerConf.__slots__})
