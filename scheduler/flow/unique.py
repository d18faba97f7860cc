"""Unique jobs by content: an enqueue whose duplicate is live returns the existing job instead of a new one.

``enqueue(..., unique={"keys": [...], "period": s, "states": [...]})`` and the REST API's
``unique`` field. The key is a SHA-256 of (owner, type, the named payload fields or the whole
payload, and with a ``period`` the number of the period the database clock is in, counted
from the Unix epoch). The guard is the partial unique index ``job_unique_live`` on
``unique_key`` over rows whose status is one of their own ``unique_states``: two concurrent
enqueues of the same content cannot both commit (the second waits on the first's index entry,
then fails and reads the winner). No read-then-write.

``states`` always holds the live states (SCHEDULED, QUEUED, RUNNING, RETRYING) and may add
finished ones (SUCCESS, FAILED, DEAD, CANCELLED): a job can then only leave the index for
good, except through an owner's retry or an ADMIN's recovery of a finished job that the
states left out, which the API refuses with a 409 while a duplicate is live (River's rule).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from core.parsers import json_integer
from scheduler.exceptions import InvalidUnique, UniqueConflict
from scheduler.flow.limits import PARTITION_KEY
from scheduler.ids import new_job_id
from scheduler.lifecycle import NewJob
from scheduler.models import Job
from scheduler.states import JobStatus

logger = logging.getLogger(__name__)

LIVE_STATES = (JobStatus.SCHEDULED, JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.RETRYING)
OPTIONAL_STATES = (JobStatus.SUCCESS, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED)
MAX_KEYS = 20  # payload fields in a unique key
# The partial index's predicate: a row in one of its own unique states holds its key.
HOLDS_ITS_KEY = RawSQL("stint_job.status = ANY(stint_job.unique_states)", [], output_field=BooleanField())
MAX_PERIOD_SECONDS = 366 * 86_400  # a year
INDEX = "job_unique_live"
TRIES = 3  # a blocking job may finish between our insert and our read: then insert again


@dataclass(frozen=True, slots=True, kw_only=True)
class UniqueSpec:
    """Validated unique options: payload fields (None: the whole payload), period in seconds, statuses."""

    keys: tuple[str, ...] | None
    period: int | None
    states: tuple[str, ...]


def parse(raw: Any) -> UniqueSpec:
    """Validate the ``unique`` option (a JSON object) and return it as a ``UniqueSpec``.

    ``keys``: a list of 1-20 top-level payload field names, or absent for the whole payload;
    ``period``: whole seconds from 1 to a year (``60.0`` is 60; another JSON type is refused by
    name, as the API's integer fields refuse it), or absent/null for no period; ``states``:
    statuses in which a job blocks a duplicate, default and minimum the live ones (SCHEDULED,
    QUEUED, RUNNING, RETRYING), plus any of SUCCESS, FAILED, DEAD, CANCELLED. Raises
    ``InvalidUnique`` (400) with per-field details.
    """
    if not isinstance(raw, Mapping):
        raise InvalidUnique("unique must be a JSON object.", details={"unique": ["Expected a JSON object."]})
    errors: dict[str, list[str]] = {}
    unknown = sorted(str(k) for k in raw if k not in ("keys", "period", "states"))
    if unknown:
        errors["unique"] = [f"Unknown fields: {', '.join(unknown)[:200]}."]
    keys = raw.get("keys")
    if keys is not None and (
        not isinstance(keys, list)
        or not 1 <= len(keys) <= MAX_KEYS
        or not all(isinstance(k, str) and PARTITION_KEY.match(k) for k in keys)
    ):
        errors["unique.keys"] = [
            f"A list of 1-{MAX_KEYS} payload field names (a letter or '_', then letters, digits, '_')."
        ]
    period = raw.get("period")
    period, problem = json_integer(period)  # 60.0 is 60, as the API's integer fields and the flow limits read it
    if problem is not None:
        errors["unique.period"] = [problem]
    elif period is not None and (not isinstance(period, int) or not 1 <= period <= MAX_PERIOD_SECONDS):
        errors["unique.period"] = [f"Whole seconds from 1 to {MAX_PERIOD_SECONDS}, or null."]
    states = raw.get("states")
    allowed = {str(s) for s in (*LIVE_STATES, *OPTIONAL_STATES)}
    if states is None:
        states = [str(s) for s in LIVE_STATES]
    elif not isinstance(states, list) or not all(isinstance(s, str) and s in allowed for s in states):
        errors["unique.states"] = [f"A list of statuses among {', '.join(sorted(allowed))}."]
    elif not {str(s) for s in LIVE_STATES} <= set(states):
        errors["unique.states"] = ["Must include SCHEDULED, QUEUED, RUNNING and RETRYING (a live job always blocks)."]
    if errors:
        raise InvalidUnique(next(iter(errors.values()))[0], details=errors)
    return UniqueSpec(
        keys=tuple(dict.fromkeys(keys)) if keys is not None else None,
        period=period,
        states=tuple(sorted(set(states))),
    )


def unique_key(new: NewJob, spec: UniqueSpec, *, epoch_seconds: float) -> str:
    """Return the 64-hex-digit content key of ``new`` under ``spec`` at ``epoch_seconds`` (database clock).

    A payload that is not an object reads every named field as missing (null).
    """
    payload = new.payload
    if spec.keys is None:
        content: Any = payload
    else:
        content = {k: payload.get(k) if isinstance(payload, dict) else None for k in spec.keys}
    bucket = int(epoch_seconds // spec.period) if spec.period else None
    canonical = json.dumps([new.owner_id, new.type, content, spec.period, bucket], sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Turn the unique index's refusal of a transition (a retry or recovery) into ``UniqueConflict`` (409).

    Wraps the statement in a savepoint so the caller's transaction stays usable.
    """
    try:
        with transaction.atomic():
            yield
    except IntegrityError as exc:
        if INDEX in str(exc):
            raise UniqueConflict() from exc
        raise


def enqueue_unique(new: NewJob, spec: UniqueSpec, *, insert: Callable[[Sequence[NewJob]], Any]) -> tuple[Job, bool]:
    """Insert ``new`` unless a job with its content key holds it; return (job, duplicate).

    A job holds its key while its status is one of the states it was itself enqueued with (the
    index's predicate), whatever states this enqueue names.

    ``insert`` is the enqueue path's own insert (``enqueuing.jobs_insert``): the job is inserted as
    any other, then given its key in the same transaction, which is where the unique index
    decides. On a duplicate the new row rolls back with its events and the existing job is
    returned with ``duplicate=True``. Raises IntegrityError if a key stayed contested after
    ``TRIES`` rounds, and what ``insert`` raises.
    """
    for _ in range(TRIES):
        job_id = new_job_id()
        candidate = NewJob(**{**{f: getattr(new, f) for f in new.__dataclass_fields__}, "id": job_id})
        key = ""
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT extract(epoch FROM now())::float8")
                    key = unique_key(candidate, spec, epoch_seconds=cursor.fetchone()[0])
                    insert([candidate])
                    cursor.execute(
                        "UPDATE stint_job SET unique_key = %s, unique_states = %s WHERE id = %s",
                        [key, list(spec.states), job_id],
                    )
            return Job.objects.get(id=job_id), False
        except IntegrityError as exc:
            if INDEX not in str(exc):
                raise
        # The job the index refused us for: the states that count are its own, not this enqueue's.
        existing = Job.objects.filter(unique_key=key).filter(HOLDS_ITS_KEY).order_by("-created_at").first()
        if existing is not None:
            logger.info("unique job %s: duplicate enqueue returned it", existing.id, extra={"job_id": str(existing.id)})
            return existing, True
    raise IntegrityError(f"unique key {key} stayed contested after {TRIES} tries")
