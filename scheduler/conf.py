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
    min_schedule_interval_seconds: int = 0  # a USER schedule fires at most this often (0: no minimum)
    # Days a finished job (with its attempts, result, outbox and audit events) is kept; 0 keeps it forever.
    retention_success_days: int = 0
    retention_cancelled_days: int = 0
    retention_failed_days: int = 0
    retention_dead_days: int = 0
    # Days an unused queue row is kept after it was last written or seen in use; 0 keeps it forever.
    queue_retention_days: int = 0
    # Days an operator action history entry (django_admin_log, scheduler.action_log) is kept; 0 keeps it forever.
    operator_log_retention_days: int = 0
    # Owners may retry their own DEAD jobs (DEAD -> QUEUED, the recover transition); off: ADMINs only.
    owners_may_retry_dead: bool = False
    # The job path's statements as named prepared statements (scheduler.prepared); False behind a
    # pooler in transaction mode that cannot keep them (PgBouncer < 1.21).
    prepared_statements: bool = True
    # run_scheduler VACUUMs stint_job once a claim reads this many pages of dead index entries
    # (scheduler.maintenance.claim_index); 0: never.
    claim_index_vacuum_pages: int = 0


_cache: tuple[object, SchedulerConf] | None = None


def conf() -> SchedulerConf:
    """Return the current settings as a ``SchedulerConf``.

    Built once per ``settings.SCHEDULER`` object: overriding the setting (``override_settings``,
    pytest-django's ``settings`` fixture) installs a new dict and is seen at the next call, while
    the enqueue, claim and outcome paths that call this per job pay a lookup, not a rebuild.
    """
    global _cache
    raw = settings.SCHEDULER
    if _cache is None or _cache[0] is not raw:
        built = SchedulerConf(**{k.lower(): v for k, v in raw.items() if k.lower() in SchedulerConf.__slots__})
        _cache = (raw, built)
    return _cache[1]
