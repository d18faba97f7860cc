"""Pure data: job statuses, priorities, the allowed transitions and the event each one emits."""

from __future__ import annotations

from django.db import models


class JobStatus(models.TextChoices):
    """Where a job is in its life. The comment on each member names who moves a job out of it."""

    CREATED = "CREATED"  # enqueue, in the same transaction (never visible after commit)
    SCHEDULED = "SCHEDULED"  # the scheduler's promoter when scheduled_at is due; cancel
    QUEUED = "QUEUED"  # a worker's claim; cancel
    RUNNING = "RUNNING"  # the worker that holds the lease; the lease rescuer after expiry
    SUCCESS = "SUCCESS"  # nobody: terminal
    FAILED = "FAILED"  # the owner's retry
    RETRYING = "RETRYING"  # the scheduler's promoter when the backoff is due; cancel
    DEAD = "DEAD"  # an admin's recover (dead letter)
    CANCELLED = "CANCELLED"  # nobody: terminal


class Priority(models.IntegerChoices):
    """Claim order: a lower value is claimed first."""

    HIGH = 0
    MEDIUM = 1
    LOW = 2


class EventType(models.TextChoices):
    """Lifecycle event types written to the outbox (DESIGN.md, Events)."""

    JOB_CREATED = "JOB_CREATED"
    JOB_SCHEDULED = "JOB_SCHEDULED"
    JOB_QUEUED = "JOB_QUEUED"
    JOB_STARTED = "JOB_STARTED"
    JOB_COMPLETED = "JOB_COMPLETED"
    JOB_FAILED = "JOB_FAILED"
    JOB_RETRIED = "JOB_RETRIED"
    JOB_DEAD = "JOB_DEAD"
    JOB_CANCELLED = "JOB_CANCELLED"
    JOB_RECOVERED = "JOB_RECOVERED"
    JOB_LEASE_EXPIRED = "JOB_LEASE_EXPIRED"


class AttemptStatus(models.TextChoices):
    """Outcome of one execution attempt."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    LOST = "LOST"
    CANCELLED = "CANCELLED"


S = JobStatus
E = EventType

# The transition table of DESIGN.md, as data: (from, to) -> the event it writes by default.
TRANSITIONS: dict[tuple[JobStatus, JobStatus], EventType] = {
    (S.CREATED, S.QUEUED): E.JOB_QUEUED,
    (S.CREATED, S.SCHEDULED): E.JOB_SCHEDULED,
    (S.CREATED, S.CANCELLED): E.JOB_CANCELLED,
    (S.SCHEDULED, S.CANCELLED): E.JOB_CANCELLED,
    (S.QUEUED, S.CANCELLED): E.JOB_CANCELLED,
    (S.RETRYING, S.CANCELLED): E.JOB_CANCELLED,
    (S.SCHEDULED, S.QUEUED): E.JOB_QUEUED,
    (S.RETRYING, S.QUEUED): E.JOB_QUEUED,
    (S.QUEUED, S.RUNNING): E.JOB_STARTED,
    (S.RUNNING, S.SUCCESS): E.JOB_COMPLETED,
    (S.RUNNING, S.RETRYING): E.JOB_RETRIED,
    (S.RUNNING, S.DEAD): E.JOB_DEAD,
    (S.RUNNING, S.FAILED): E.JOB_FAILED,
    (S.RUNNING, S.CANCELLED): E.JOB_CANCELLED,
    (S.FAILED, S.RETRYING): E.JOB_RETRIED,
    (S.DEAD, S.QUEUED): E.JOB_RECOVERED,
}

TERMINAL: frozenset[JobStatus] = frozenset({S.SUCCESS, S.CANCELLED})
FINISHED: frozenset[JobStatus] = frozenset({S.SUCCESS, S.FAILED, S.DEAD, S.CANCELLED})
CANCELLABLE: frozenset[JobStatus] = frozenset(f for (f, t) in TRANSITIONS if t == S.CANCELLED and f != S.RUNNING)


def sources_of(to_status: JobStatus) -> frozenset[JobStatus]:
    """Return every status from which ``to_status`` may be reached."""
    return frozenset(f for (f, t) in TRANSITIONS if t == to_status)


def is_allowed(from_status: JobStatus, to_status: JobStatus) -> bool:
    """Return True when the table allows ``from_status`` -> ``to_status``."""
    return (JobStatus(from_status), JobStatus(to_status)) in TRANSITIONS
