"""Pure data: job statuses, priorities, retry and timeout ranges, the allowed transitions and their events."""

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
    """Named points on the integer priority scale: a higher value is claimed first.

    A job's priority is any whole number from ``PRIORITY_MIN`` to ``PRIORITY_MAX`` (Django's
    Tasks range, -100..100, where its default 0 is MEDIUM). The REST API, pages and schedules
    write these three names; Python code (``scheduler.enqueue``, the Django Tasks backend) may
    write any value in the range.
    """

    HIGH = 50
    MEDIUM = 0
    LOW = -50


PRIORITY_MIN = -100
PRIORITY_MAX = 100
# A job's retry and time budget (DESIGN.md, Field names): what the API, the pages, ``@handler``'s
# defaults and a Django task's OPTIONS are checked against. Trusted code may also give max_retries 0.
MAX_RETRIES_RANGE = (1, 10)  # retries after the first run
TIMEOUT_RANGE = (1, 3600)  # seconds
_PRIORITY_BY_NAME = {member.name: int(member) for member in Priority}  # Priority.names builds a list per call
_PRIORITY_NAME_BY_VALUE = {int(member): member.name for member in Priority}


def priority_label(value: int) -> str:
    """Return how a stored priority reads: its name at a named point, else its decimal string ("37", "-5").

    One rule for the API, the pages, the admin, metrics labels and event payloads (the SQL twin
    is the function ``stint_outbox_entries`` of migration 0014, which renders event payloads), so a
    reader that knows only the names keeps working for every job created with a name.
    """
    name = _PRIORITY_NAME_BY_VALUE.get(value)  # a dict: Priority(value) costs an enum lookup per job
    return name if name is not None else str(int(value))


def priority_value(value: object) -> int:
    """Return the stored integer for ``value``: a ``Priority``, a name, or a whole number in range.

    Raises ValueError for anything else (a bool, a float, an unknown name, an out-of-range number).
    """
    if isinstance(value, Priority):
        return int(value)
    if isinstance(value, str) and value in _PRIORITY_BY_NAME:
        return _PRIORITY_BY_NAME[value]
    if isinstance(value, int) and not isinstance(value, bool) and PRIORITY_MIN <= value <= PRIORITY_MAX:
        return value
    raise ValueError(f"priority must be HIGH, MEDIUM, LOW or a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}")


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

FINISHED: frozenset[JobStatus] = frozenset({S.SUCCESS, S.FAILED, S.DEAD, S.CANCELLED})
CANCELLABLE: frozenset[JobStatus] = frozenset(f for (f, t) in TRANSITIONS if t == S.CANCELLED and f != S.RUNNING)


def sources_of(to_status: JobStatus) -> frozenset[JobStatus]:
    """Return every status from which ``to_status`` may be reached."""
    return frozenset(f for (f, t) in TRANSITIONS if t == to_status)
