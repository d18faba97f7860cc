"""The enqueue entry points: ``enqueue_request`` (API, pages, tasks), ``enqueue`` and ``enqueue_many`` (Python code).

Each validates its jobs (``jobspec``), inserts them with their events and NOTIFY in one statement
(``lifecycle.insert_jobs``), and counts them once committed. An ``Idempotency-Key`` goes through
``idempotency.insert_once``; a ``unique`` job through ``scheduler.flow.unique``. (Named
``enqueuing`` because ``scheduler.enqueue`` is the package's public function.)
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import signals
from django.db.models.base import ModelState

from scheduler import idempotency, lifecycle, tracing
from scheduler.exceptions import InvalidJob
from scheduler.ids import new_job_id
from scheduler.jobspec import job_spec_validate
from scheduler.lifecycle import NewJob
from scheduler.models import DEFAULT_QUEUE, Job


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueOutcome:
    """The job an enqueue produced and whether it was an idempotent replay of an earlier request."""

    job: Job
    replayed: bool
    duplicate: bool = False  # a unique job's live duplicate was returned (scheduler.flow.unique)


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
    1-3600 default to the handler's, then 3 and 300 (``jobspec.job_spec_validate``). With
    ``idempotency_key`` (1-255 printable ASCII characters, unique per owner for
    ``IDEMPOTENCY_TTL_SECONDS``), a repeat of the same request returns the original job with
    ``replayed=True`` (``idempotency.insert_once``).

    ``trusted`` (project code only, never a request's choice) also accepts the job types of
    ``registry.resolve`` (Django task paths) and ``max_retries`` 0.

    ``unique`` (``{"keys": [...], "period": s, "states": [...]}``, ``scheduler.flow.unique``):
    when a job with the same content is live, return it with ``duplicate=True`` instead of
    creating one. Not combinable with ``idempotency_key``.

    Raises UnknownJobType, InvalidJob (400), InvalidUnique (400), PayloadTooLarge (413),
    IdempotencyConflict (409: same key, different request).
    """
    owner_id = getattr(owner, "pk", owner)
    new = _new_job(
        type_=type_,
        payload=payload,
        priority=priority,
        queue=queue,
        scheduled_at=scheduled_at,
        max_retries=max_retries,
        timeout_seconds=timeout_seconds,
        name=name,
        owner_id=owner_id,
        trace_context=tracing.current_context(),  # None while tracing is off
        trusted=trusted,
        idempotency_key=idempotency_key,
    )
    idempotency.idempotency_key_check(idempotency_key, owner_id=owner_id)
    # --- flow control (issue 17): unique jobs ---
    if unique is not None:
        from scheduler.exceptions import InvalidUnique
        from scheduler.flow import unique as flow_unique

        unique_spec = flow_unique.parse(unique)
        if unique_spec.keys and not isinstance(new.payload, dict):
            raise InvalidUnique(
                "unique keys name payload fields, and this payload is not an object",
                details={"unique.keys": ["Use keys only with an object payload, or leave them out (whole payload)."]},
            )
        if idempotency_key is not None:
            raise InvalidUnique(
                "unique and an Idempotency-Key cannot be combined",
                details={"unique": ["Send either unique or an Idempotency-Key, not both."]},
            )
        job, duplicate = flow_unique.enqueue_unique(new, unique_spec, insert=jobs_insert)
        return EnqueueOutcome(job=job, replayed=False, duplicate=duplicate)
    # --- end flow control ---
    if idempotency_key is None:
        # One statement: in autocommit its own transaction, one round trip; in the caller's
        # transaction.atomic() its NOTIFY and on-commit metrics wait for that commit.
        (row,) = jobs_insert([new])
        return EnqueueOutcome(job=_job_from(new, row), replayed=False)

    digest = idempotency.fingerprint(
        {
            "type": type_,
            "payload": new.payload,
            "priority": new.priority,
            "queue": queue,
            # One instant, one fingerprint, whatever offset the caller wrote it in.
            "scheduled_at": scheduled_at.astimezone(dt.UTC).isoformat() if scheduled_at else None,
            "max_retries": new.max_retries,
            "timeout_seconds": new.timeout_seconds,
            "name": name,
        }
    )

    def insert_new() -> Job:
        (row,) = jobs_insert([new])
        return _job_from(new, row)

    job, replayed = idempotency.insert_once(owner_id=owner_id, key=idempotency_key, digest=digest, insert=insert_new)
    return EnqueueOutcome(job=job, replayed=replayed)


def jobs_insert(jobs: Sequence[NewJob]) -> list[lifecycle.Inserted]:
    """Insert ``jobs`` as every enqueue does: queue rows, jobs, events and NOTIFY in one statement; metrics on commit.

    Returns ``lifecycle.insert_jobs``' rows (which counts them). Used by the entry points here and
    by ``scheduler.flow.unique`` (which inserts under its own lock).
    """
    return lifecycle.insert_jobs(jobs, ensure_queues=True, notify=True)


def _job_from(new: NewJob, row: lifecycle.Inserted) -> Job:
    """The ``Job`` that ``row`` inserted for ``new``, built without reading it back.

    As ``Model.from_db`` would build it from every column, without its ``Model.__init__``: the
    columns go straight into the instance's ``__dict__`` (where ``__init__``'s ``setattr`` puts
    them; Django's unpickling builds models the same way), 2 us where ``from_db`` took 13. While
    anything listens to ``pre_init``/``post_init`` for ``Job``, ``from_db`` runs, so it hears this
    job as it hears every other.
    """
    names, constants = _job_columns()
    given = {
        "id": new.id,
        "owner_id": new.owner_id,
        "name": new.name,
        "type": new.type,
        "payload": new.payload,
        "status": row.status,
        "priority": new.priority,
        "queue": new.queue,
        "scheduled_at": row.scheduled_at,
        "max_retries": new.max_retries,
        "timeout_seconds": new.timeout_seconds,
        "idempotency_key": new.idempotency_key,
        "schedule_id": new.schedule_id,
        "fire_time": new.fire_time,
        "created_at": row.created_at,
        "updated_at": row.created_at,
        "trace_context": new.trace_context,
    }
    if signals.pre_init.has_listeners(Job) or signals.post_init.has_listeners(Job):
        return Job.from_db(
            DEFAULT_DB_ALIAS, names, [given[name] if name in given else constants[name] for name in names]
        )
    job = Job.__new__(Job)
    state = job._state = ModelState()
    state.adding, state.db = False, DEFAULT_DB_ALIAS
    fields = job.__dict__
    fields.update(constants)
    fields.update(given)
    return job


# What a newly inserted job holds besides ``_job_from``'s given columns (the insert statement's constants).
_INSERTED_CONSTANTS = {
    "attempts": 0,
    "attempts_base": 0,
    "cancel_requested": False,
    "event_sequence": 2,
    "last_error": "",
    "isolated": False,
}


# The columns ``_job_from`` takes from the new job and its inserted row.
_GIVEN_COLUMNS = frozenset(
    {"id", "owner_id", "name", "type", "payload", "status", "priority", "queue", "scheduled_at", "max_retries"}
    | {"timeout_seconds", "idempotency_key", "schedule_id", "fire_time", "created_at", "updated_at", "trace_context"}
)


@functools.cache
def _job_columns() -> tuple[list[str], dict[str, Any]]:
    """``Job``'s column names in order, and the value of each column ``_job_from`` is not given.

    A column with a callable default (a fresh object per row: ``id``, ``payload``) has no
    constant: ``_job_from`` must be given it, and a KeyError naming it fails every enqueue (and
    its tests) until it is; left out, the job would read it back from the database when used.
    """
    fields = Job._meta.concrete_fields
    constants = {f.attname: f.get_default() for f in fields if not (f.has_default() and callable(f.default))}
    missing = sorted({f.attname for f in fields} - constants.keys() - _GIVEN_COLUMNS)
    if missing:
        raise KeyError(f"_job_from is not given the columns {missing}")
    return [f.attname for f in fields], {**constants, **_INSERTED_CONSTANTS}


def enqueue(type_: str, payload: Any = None, **options: Any) -> Job:
    """Create a job and return it (the original one on an idempotent replay).

    Options and errors as ``enqueue_request``: ``priority`` ("HIGH", "MEDIUM", "LOW", or a whole
    number from -100 to 100, higher first; the names are 50, 0 and -50),
    ``queue``, ``scheduled_at`` (aware datetime), ``max_retries``, ``timeout_seconds``,
    ``idempotency_key``, ``owner`` (a user or user id), ``name``, ``unique`` (a live duplicate
    is returned instead of a new job: ``scheduler.flow.unique``).
    """
    return enqueue_request(type_, payload, **options).job


_MANY_FIELDS = frozenset(
    {"type", "payload", "priority", "queue", "scheduled_at", "max_retries", "timeout_seconds", "name"}
)


def enqueue_many(jobs: Sequence[dict[str, Any]], *, owner: Any = None) -> list[uuid.UUID]:
    """Create many jobs in one transaction and one statement, with one NOTIFY; return their ids, in the items' order.

    Each item has ``type`` and optionally ``payload``, ``priority``, ``queue``, ``scheduled_at``,
    ``max_retries``, ``timeout_seconds``, ``name`` (no idempotency keys). Raises as ``enqueue``,
    and InvalidJob for an item that is no mapping, has no ``type`` or names another field.
    """
    owner_id = getattr(owner, "pk", owner)
    trace_context = tracing.current_context()  # None while tracing is off
    jobs = list(jobs)  # read once: a generator is checked and inserted alike
    for index, item in enumerate(jobs):
        if not isinstance(item, Mapping) or "type" not in item or not item.keys() <= _MANY_FIELDS:
            message = f"Each job is a mapping with a type and at most: {', '.join(sorted(_MANY_FIELDS))}."
            raise InvalidJob(f"jobs[{index}] is not a job", details={f"jobs[{index}]": [message]})
    rows = [
        _new_job(
            type_=item["type"],
            payload=item.get("payload"),
            priority=item.get("priority", "MEDIUM"),
            queue=item.get("queue", DEFAULT_QUEUE),
            scheduled_at=item.get("scheduled_at"),
            max_retries=item.get("max_retries"),
            timeout_seconds=item.get("timeout_seconds"),
            name=item.get("name", ""),
            owner_id=owner_id,
            trace_context=trace_context,
        )
        for item in jobs
    ]
    created = {row.id for row in jobs_insert(rows)}  # one statement: its own transaction in autocommit
    return [row.id for row in rows if row.id in created]  # the items' order (the statement's is not promised)


def _new_job(
    *,
    type_: str,
    payload: Any,
    priority: str | int,
    queue: str,
    scheduled_at: dt.datetime | None,
    max_retries: int | None,
    timeout_seconds: int | None,
    name: str,
    owner_id: int | None,
    trace_context: dict[str, str] | None,
    trusted: bool = False,
    idempotency_key: str | None = None,
) -> NewJob:
    """Validate one job's fields (``jobspec.job_spec_validate``'s arguments) and return its row.

    A None payload is ``{}``. The row's payload is the JSON the database stores, read back from
    the validated text: object keys are strings (``{1: "a"}`` is ``{"1": "a"}``; of two keys
    that become one, the last wins, as in jsonb), tuples are lists, and the job never shares an
    object with the caller. Raises what ``job_spec_validate`` raises.
    """
    spec = job_spec_validate(
        type_=type_,
        payload={} if payload is None else payload,
        priority=priority,
        queue=queue,
        scheduled_at=scheduled_at,
        max_retries=max_retries,
        timeout_seconds=timeout_seconds,
        name=name,
        trusted=trusted,
    )
    return NewJob(
        id=new_job_id(),
        owner_id=owner_id,
        name=name,
        type=type_,
        payload=json.loads(spec.payload_json),
        priority=spec.priority,
        queue=queue,
        scheduled_at=scheduled_at,
        max_retries=spec.max_retries,
        timeout_seconds=spec.timeout_seconds,
        idempotency_key=idempotency_key,
        trace_context=trace_context,
        payload_json=spec.payload_json,
    )
