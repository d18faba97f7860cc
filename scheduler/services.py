"""Job services: enqueue (with idempotency), cancel, retry, recover. Views, admin and commands call these."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.parsers import SURROGATE_MESSAGE, has_lone_surrogate, json_depth
from scheduler import lifecycle, metrics, selectors, tracing
from scheduler.conf import conf
from scheduler.exceptions import (
    IdempotencyConflict,
    IllegalTransition,
    InvalidJob,
    JobNotFound,
    PayloadTooLarge,
)
from scheduler.lifecycle import NewJob
from scheduler.models import DEFAULT_MAX_RETRIES, DEFAULT_QUEUE, DEFAULT_TIMEOUT_SECONDS, Job
from scheduler.notify import notify_queued
from scheduler.registry import get_handler, resolve
from scheduler.states import CANCELLABLE, PRIORITY_MAX, PRIORITY_MIN, JobStatus, Priority, priority_value

logger = logging.getLogger(__name__)

MAX_RETRIES_RANGE = (1, 10)
TIMEOUT_RANGE = (1, 3600)  # seconds
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
MAX_PAYLOAD_DEPTH = 32  # levels of nested lists/objects in a payload (handlers and pages walk it)
IDEMPOTENCY_KEY = re.compile(r"^[\x20-\x7e]{1,255}$")
# A cancel that races a job's own moves (e.g. RUNNING -> RETRYING between our two statements) retries.
CANCEL_TRIES = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueOutcome:
    """The job an enqueue produced and whether it was an idempotent replay of an earlier request."""

    job: Job
    replayed: bool
    duplicate: bool = False  # a unique job's live duplicate was returned (scheduler.flow.unique)


def _priority_value(priority: str | int | Priority) -> int:
    try:
        return priority_value(priority)
    except ValueError as exc:
        message = f"Must be HIGH, MEDIUM, LOW or a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
        raise InvalidJob(str(exc), details={"priority": [message]}) from None


def payload_size(payload: Any) -> int:
    """Return the size in bytes of ``payload`` as compact UTF-8 JSON.

    Raises InvalidJob when it is no JSON, nests deeper than ``MAX_PAYLOAD_DEPTH``, or holds a
    string PostgreSQL cannot store (U+0000, a lone UTF-16 surrogate).
    """
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob("payload must be JSON", details={"payload": [str(exc)]}) from exc
    if json_depth(payload) > MAX_PAYLOAD_DEPTH:
        raise InvalidJob(
            f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels",
            details={"payload": [f"At most {MAX_PAYLOAD_DEPTH} levels of nesting."]},
        )
    if has_nul(payload):
        # PostgreSQL's jsonb (and text) cannot hold U+0000.
        raise InvalidJob("payload must not contain U+0000", details={"payload": ["Must not contain U+0000."]})
    try:
        return len(text.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800"): no UTF-8 can hold it
        raise InvalidJob(SURROGATE_MESSAGE, details={"payload": [SURROGATE_MESSAGE]}) from exc


def has_nul(value: Any) -> bool:
    """True when any string (key or value) inside ``value`` contains U+0000."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _validated(
    *,
    type_: str,
    payload: Any,
    priority: str | int,
    queue: str,
    scheduled_at: dt.datetime | None,
    max_retries: int | None,
    timeout_seconds: int | None,
    name: str,
    trusted: bool = False,
) -> dict[str, Any]:
    # Only trusted code may name a type that is not a @handler (a Django task path): a user's
    # request choosing which of the project's functions to call, with what, is the hole it closes.
    spec = resolve(type_) if trusted else get_handler(type_)
    size = payload_size(payload)
    limit = conf().max_payload_bytes
    if size > limit:
        raise PayloadTooLarge(
            f"payload is {size} bytes; the limit is {limit} bytes", details={"payload": [f"At most {limit} bytes."]}
        )
    errors: dict[str, list[str]] = {}
    if max_retries is None:
        max_retries = spec.max_retries if spec.max_retries is not None else DEFAULT_MAX_RETRIES
    if timeout_seconds is None:
        timeout_seconds = spec.timeout_seconds if spec.timeout_seconds is not None else DEFAULT_TIMEOUT_SECONDS
    if not _is_int_in(max_retries, (0, MAX_RETRIES_RANGE[1]) if trusted else MAX_RETRIES_RANGE):
        errors["max_retries"] = ["Must be an integer from 1 to 10."]
    if not _is_int_in(timeout_seconds, TIMEOUT_RANGE):
        errors["timeout_seconds"] = ["Must be an integer from 1 to 3600."]
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        errors["queue"] = ["1-100 characters: letters, digits, '_', '.', ':' or '-'."]
    if scheduled_at is not None and (not isinstance(scheduled_at, dt.datetime) or timezone.is_naive(scheduled_at)):
        errors["scheduled_at"] = ["Must be a datetime with a time zone offset."]
    if not isinstance(name, str) or len(name) > 200 or "\x00" in name or has_lone_surrogate(name):
        errors["name"] = ["At most 200 characters of valid Unicode, without U+0000."]
    if errors:
        raise InvalidJob(next(iter(errors.values()))[0], details=errors)
    return {
        "priority": _priority_value(priority),
        "max_retries": max_retries,
        "timeout_seconds": timeout_seconds,
    }


def _is_int_in(value: Any, bounds: tuple[int, int]) -> bool:
    # bool is an int subclass; True must not pass for 1.
    return isinstance(value, int) and not isinstance(value, bool) and bounds[0] <= value <= bounds[1]


def fingerprint(fields: dict[str, Any]) -> str:
    """Return the SHA-256 hex digest of ``fields`` as canonical JSON (sorted keys, compact)."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def enqueue_request(
    type_: str,
    payload: Any = None,
    *,
    priority: str | int = "MEDIUM",
    queue: str = DEFAULT_QUEUE,
    scheduled_at: dt.datetime | None = None,
    max_retries: int | None = None,
    timeout_seconds: int | None = None,
    idempotency_key: str | None = None,
    owner: Any = None,
    name: str = "",
    trusted: bool = False,
    unique: Any = None,
) -> EnqueueOutcome:
    """Create a job (QUEUED now, or SCHEDULED for a future ``scheduled_at``) and say if it was a replay.

    ``payload`` is any JSON value of at most ``SCHEDULER["MAX_PAYLOAD_BYTES"]`` bytes (10 KB);
    ``scheduled_at`` an aware datetime or None; ``max_retries`` 1-10 and ``timeout_seconds``
    1-3600 default to the handler's, then 3 and 300. With ``idempotency_key`` (1-255 printable
    ASCII characters, unique per owner for ``IDEMPOTENCY_TTL_SECONDS``), a repeat of the same
    request returns the original job with ``replayed=True``; the unique (owner, key) index
    decides between concurrent first requests, and the loser waits for and reads the winner.

    ``trusted`` (project code only, never a request's choice) also accepts the job types of
    ``registry.resolve`` (Django task paths) and ``max_retries`` 0.

    ``unique`` (``{"keys": [...], "period": s, "states": [...]}``, ``scheduler.flow.unique``):
    when a job with the same content is live, return it with ``duplicate=True`` instead of
    creating one. Not combinable with ``idempotency_key``.

    Raises UnknownJobType, InvalidJob (400), InvalidUnique (400), PayloadTooLarge (413),
    IdempotencyConflict (409: same key, different request).
    """
    payload = {} if payload is None else payload
    valid = _validated(
        trusted=trusted,
        type_=type_,
        payload=payload,
        priority=priority,
        queue=queue,
        scheduled_at=scheduled_at,
        max_retries=max_retries,
        timeout_seconds=timeout_seconds,
        name=name,
    )
    owner_id = getattr(owner, "pk", owner)
    if idempotency_key is not None and not IDEMPOTENCY_KEY.match(idempotency_key):
        raise InvalidJob(
            "Idempotency-Key must be 1-255 printable ASCII characters",
            details={"idempotency_key": ["1-255 printable ASCII characters."]},
        )
    if idempotency_key is not None and owner_id is None:
        raise InvalidJob("an idempotency key needs an owner", details={"idempotency_key": ["Needs an owner."]})
    new = NewJob(
        id=uuid.uuid4(),
        owner_id=owner_id,
        name=name,
        type=type_,
        payload=payload,
        priority=valid["priority"],
        queue=queue,
        scheduled_at=scheduled_at,
        max_retries=valid["max_retries"],
        timeout_seconds=valid["timeout_seconds"],
        idempotency_key=idempotency_key,
        trace_context=tracing.current_context(),  # None while tracing is off
    )
    # --- flow control (issue 17): unique jobs ---
    if unique is not None:
        from scheduler.exceptions import InvalidUnique
        from scheduler.flow import unique as flow_unique

        spec = flow_unique.parse(unique)
        if spec.keys and not isinstance(payload, dict):
            raise InvalidUnique(
                "unique keys name payload fields, and this payload is not an object",
                details={"unique.keys": ["Use keys only with an object payload, or leave them out (whole payload)."]},
            )
        if idempotency_key is not None:
            raise InvalidUnique(
                "unique and an Idempotency-Key cannot be combined",
                details={"unique": ["Send either unique or an Idempotency-Key, not both."]},
            )
        job, duplicate = flow_unique.enqueue_unique(new, spec, insert=_insert)
        return EnqueueOutcome(job=job, replayed=False, duplicate=duplicate)
    # --- end flow control ---
    if idempotency_key is None:
        # One statement: in autocommit its own transaction, one round trip; in the caller's
        # transaction.atomic() its NOTIFY and on-commit metrics wait for that commit.
        (row,) = _insert([new])
        return EnqueueOutcome(job=_job_from(new, row), replayed=False)

    digest = fingerprint(
        {
            "type": type_,
            "payload": payload,
            "priority": valid["priority"],
            "queue": queue,
            # One instant, one fingerprint, whatever offset the caller wrote it in.
            "scheduled_at": scheduled_at.astimezone(dt.UTC).isoformat() if scheduled_at else None,
            "max_retries": valid["max_retries"],
            "timeout_seconds": valid["timeout_seconds"],
            "name": name,
        }
    )
    ttl = conf().idempotency_ttl_seconds
    for _ in range(3):
        with transaction.atomic():
            with connection.cursor() as cursor:
                # ON CONFLICT waits for a concurrent inserter of the same key to commit, so the loser
                # then reads a record that already names its job.
                cursor.execute(
                    """
                    INSERT INTO stint_idempotency (owner_id, key, fingerprint, job_id, created_at, expires_at)
                    VALUES (%s, %s, %s, NULL, now(), now() + make_interval(secs => %s))
                    ON CONFLICT (owner_id, key) DO NOTHING
                    RETURNING id
                    """,
                    [owner_id, idempotency_key, digest, ttl],
                )
                won = cursor.fetchone()
                if won is not None:
                    (row,) = _insert([new])
                    cursor.execute("UPDATE stint_idempotency SET job_id = %s WHERE id = %s", [new.id, won[0]])
                    return EnqueueOutcome(job=_job_from(new, row), replayed=False)
                cursor.execute(
                    "SELECT fingerprint, job_id, expires_at <= now() FROM stint_idempotency"
                    " WHERE owner_id = %s AND key = %s",
                    [owner_id, idempotency_key],
                )
                row = cursor.fetchone()
                if row is None:
                    continue  # pruned between our two statements: try again
                stored, job_id, expired = row
                if expired or job_id is None:
                    cursor.execute(
                        "DELETE FROM stint_idempotency WHERE owner_id = %s AND key = %s AND (expires_at <= now()"
                        " OR job_id IS NULL)",
                        [owner_id, idempotency_key],
                    )
                    continue
        if stored != digest:
            raise IdempotencyConflict(details={"idempotency_key": [idempotency_key]})
        job = Job.objects.filter(id=job_id).first()
        if job is None:
            raise JobNotFound("The job this Idempotency-Key created no longer exists.")
        return EnqueueOutcome(job=job, replayed=True)
    raise IntegrityError("could not settle the idempotency key after 3 tries")


def _insert(jobs: Sequence[NewJob]) -> list[lifecycle.Inserted]:
    # One statement: queue rows, jobs, their events and the NOTIFY (lifecycle.insert_jobs).
    created = lifecycle.insert_jobs(jobs, ensure_queues=True, notify=True)
    metrics.jobs_created_on_commit(jobs, (row.id for row in created))
    return created


def _job_from(new: NewJob, row: lifecycle.Inserted) -> Job:
    """The ``Job`` that ``row`` inserted for ``new``, built without reading it back."""
    job = Job(
        id=new.id,
        owner_id=new.owner_id,
        name=new.name,
        type=new.type,
        payload=new.payload,
        status=row.status,
        priority=new.priority,
        queue=new.queue,
        scheduled_at=row.scheduled_at,
        attempts=0,
        attempts_base=0,
        max_retries=new.max_retries,
        timeout_seconds=new.timeout_seconds,
        cancel_requested=False,
        idempotency_key=new.idempotency_key,
        schedule_id=new.schedule_id,
        fire_time=new.fire_time,
        event_sequence=2,
        created_at=row.created_at,
        updated_at=row.created_at,
        last_error="",
        isolated=False,
        trace_context=new.trace_context,
    )
    job._state.adding = False
    job._state.db = connection.alias
    return job


def enqueue(type_: str, payload: Any = None, **options: Any) -> Job:
    """Create a job and return it (the original one on an idempotent replay).

    Options and errors as ``enqueue_request``: ``priority`` ("HIGH", "MEDIUM", "LOW", or a whole
    number from -100 to 100, higher first; the names are 50, 0 and -50),
    ``queue``, ``scheduled_at`` (aware datetime), ``max_retries``, ``timeout_seconds``,
    ``idempotency_key``, ``owner`` (a user or user id), ``name``, ``unique`` (a live duplicate
    is returned instead of a new job: ``scheduler.flow.unique``).
    """
    return enqueue_request(type_, payload, **options).job


def enqueue_many(jobs: Sequence[dict[str, Any]], *, owner: Any = None) -> list[uuid.UUID]:
    """Create many jobs in one transaction and one statement, with one NOTIFY; return their ids.

    Each item has ``type`` and optionally ``payload``, ``priority``, ``queue``, ``scheduled_at``,
    ``max_retries``, ``timeout_seconds``, ``name`` (no idempotency keys). Raises as ``enqueue``.
    """
    owner_id = getattr(owner, "pk", owner)
    trace_context = tracing.current_context()  # None while tracing is off
    rows = []
    for item in jobs:
        payload = item.get("payload")
        payload = {} if payload is None else payload
        valid = _validated(
            type_=item["type"],
            payload=payload,
            priority=item.get("priority", "MEDIUM"),
            queue=item.get("queue", DEFAULT_QUEUE),
            scheduled_at=item.get("scheduled_at"),
            max_retries=item.get("max_retries"),
            timeout_seconds=item.get("timeout_seconds"),
            name=item.get("name", ""),
        )
        rows.append(
            NewJob(
                id=uuid.uuid4(),
                owner_id=owner_id,
                name=item.get("name", ""),
                type=item["type"],
                payload=payload,
                priority=valid["priority"],
                queue=item.get("queue", DEFAULT_QUEUE),
                scheduled_at=item.get("scheduled_at"),
                max_retries=valid["max_retries"],
                timeout_seconds=valid["timeout_seconds"],
                trace_context=trace_context,
            )
        )
    created = _insert(rows)  # one statement: its own transaction in autocommit
    return [row.id for row in created]


def _current_status(job_id: uuid.UUID) -> str:
    status = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
    if status is None:
        raise JobNotFound()
    return status


def _authorize(*, job_id: uuid.UUID, actor: Any, admin_only: bool = False) -> None:
    """Check that ``actor`` may act on the job; None is a trusted caller (admin site, command, code).

    A job the actor cannot see raises JobNotFound (404, never 403, so ids cannot be probed);
    an ``admin_only`` action on a job they can see raises PermissionDenied (403).
    """
    if actor is None:
        return
    if not selectors.job_visible_to(actor=actor).filter(id=job_id).exists():
        raise JobNotFound()
    if admin_only and not getattr(actor, "is_admin", False):
        raise PermissionDenied("Only an ADMIN may do this.")


@transaction.atomic
def job_cancel(*, job_id: uuid.UUID, actor: Any = None) -> Job:
    """Cancel a job: CREATED/SCHEDULED/QUEUED/RETRYING move to CANCELLED at once; RUNNING gets
    ``cancel_requested`` and moves to CANCELLED when its handler stops (DESIGN.md).

    ``actor`` (a User, or None for a trusted caller) must own the job or be an ADMIN. Returns the
    job as it is now: still RUNNING (with ``cancel_requested``) when the stop is up to its worker.
    Raises JobNotFound, or IllegalTransition (409) from a finished state.
    """
    _authorize(job_id=job_id, actor=actor)
    for _ in range(CANCEL_TRIES):
        if lifecycle.cancel(job_id) is not None:
            break
        # The worker that holds the lease makes the RUNNING -> CANCELLED move.
        if lifecycle.request_cancel(job_id):
            break
        status = _current_status(job_id)
        if status not in CANCELLABLE and status != JobStatus.RUNNING:
            raise IllegalTransition(f"A {status} job cannot be cancelled.", details={"status": status})
        # The job moved between our two statements into a state we can act on: go again.
    else:
        status = _current_status(job_id)
        raise IllegalTransition(f"The job kept changing state ({status}); try again.", details={"status": status})
    return Job.objects.get(id=job_id)


DEAD_RECOVERY_MESSAGE = (
    "This job is DEAD: it used every attempt of its budget (dead-lettered). Only an ADMIN can recover it "
    "(POST /api/jobs/{id}/recover, or the operator console); ask one."
)


def dead_retry_allowed() -> bool:
    """True when owners may retry their own DEAD jobs (``STINT_OWNERS_MAY_RETRY_DEAD``; default off)."""
    return conf().owners_may_retry_dead


@transaction.atomic
def job_retry(*, job_id: uuid.UUID, actor: Any = None) -> Job:
    """Retry a FAILED job now with a fresh attempt budget (FAILED -> RETRYING, due immediately).

    ``actor`` (a User, or None for a trusted caller) must own the job or be an ADMIN. A stale
    ``cancel_requested`` from the failed run is cleared so the new run is not cancelled at once.
    A DEAD job is recovery, an ADMIN's action (DESIGN.md); when an ADMIN has set
    ``STINT_OWNERS_MAY_RETRY_DEAD``, its owner's retry makes the same move as ``job_recover``
    (DEAD -> QUEUED with a fresh budget, JOB_RECOVERED with reason ``owner_retry``). Raises
    JobNotFound, or IllegalTransition (409) from any other state, whose message says who may
    recover a DEAD job, or UniqueConflict (409) for a unique job whose live duplicate exists.
    """
    _authorize(job_id=job_id, actor=actor)
    from scheduler.flow.unique import guard  # a unique job's live duplicate: 409, not a database error

    with guard():
        moved = lifecycle.retry_failed(job_id, reason="manual_retry")
    if moved is None and dead_retry_allowed():
        return _recover(job_id=job_id, reason="owner_retry")
    if moved is None:
        status = _current_status(job_id)
        message = f"Only a FAILED job can be retried; this one is {status}."
        if status == JobStatus.DEAD:
            message = f"{message} {DEAD_RECOVERY_MESSAGE}"
        raise IllegalTransition(message, details={"status": status})
    return Job.objects.get(id=job_id)


@transaction.atomic
def job_recover(*, job_id: uuid.UUID, actor: Any = None) -> Job:
    """Put a DEAD job back on its queue with a fresh attempt budget (DEAD -> QUEUED).

    ``actor`` (a User, or None for a trusted caller) must be an ADMIN: a USER gets JobNotFound
    for another's job and PermissionDenied (403) for their own. Raises JobNotFound, or
    IllegalTransition (409) from any state but DEAD.
    """
    _authorize(job_id=job_id, actor=actor, admin_only=True)
    return _recover(job_id=job_id, reason=None)


def _recover(*, job_id: uuid.UUID, reason: str | None) -> Job:
    """DEAD -> QUEUED (the table's recover transition) with a fresh budget; raise IllegalTransition otherwise."""
    from scheduler.flow.unique import guard  # a unique job's live duplicate: 409, not a database error

    with guard():
        moved = lifecycle.recover(job_id, reason=reason)
    if moved is None:
        status = _current_status(job_id)
        raise IllegalTransition(
            f"Only a FAILED or DEAD job can be retried; this one is {status}."
            if reason
            else f"Only a DEAD job can be recovered; this one is {status}.",
            details={"status": status},
        )
    job = Job.objects.get(id=job_id)
    notify_queued([job.queue])
    return job


def idempotency_prune(*, now: dt.datetime | None = None, limit: int = 10_000) -> int:
    """Delete up to ``limit`` expired idempotency records; return how many. ``now`` defaults to the DB clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            DELETE FROM stint_idempotency WHERE id IN (
                SELECT id FROM stint_idempotency WHERE expires_at <= coalesce(%s, now()) LIMIT %s
            )
            """,
            [now, limit],
        )
        return cursor.rowcount
