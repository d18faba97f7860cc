"""Idempotency keys: the request fingerprint, the insert-once protocol, and the pruning of expired records.

A request with an ``Idempotency-Key`` creates its job (POST /api/jobs) or its schedule (POST
/api/schedules) once per (owner, key) for ``IDEMPOTENCY_TTL_SECONDS``: the unique (owner, key)
index of ``stint_idempotency`` decides between concurrent first requests, and a repeat with the
same fingerprint replays what the first one created (Stripe's Idempotency-Key, IETF
draft-ietf-httpapi-idempotency-key-header). The two creates share the owner's keys, as Stripe's
endpoints do: a key that made a job is a 409 on a schedule create and the other way round.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import IntegrityError, connection, models, transaction

from scheduler.conf import conf
from scheduler.exceptions import IdempotencyConflict, InvalidJob, JobNotFound, ScheduleNotFound, StintError
from scheduler.models import CronSchedule, Job

IDEMPOTENCY_KEY = re.compile(r"^[\x20-\x7e]{1,255}\Z")
SETTLE_TRIES = 3  # rounds of the protocol before giving up (a record pruned or expired under us)

T = TypeVar("T", bound=models.Model)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyTarget:
    """What a key creates: the record's column naming it, its model, its endpoint, and the 404 of a gone one."""

    column: str  # "job_id" or "schedule_id" of stint_idempotency (a constant: it is put in SQL)
    model: type[models.Model]
    endpoint: str  # as messages name it
    gone: Callable[[], StintError]  # raised on a replay whose object no longer exists


JOB_TARGET = KeyTarget(
    column="job_id",
    model=Job,
    endpoint="POST /api/jobs",
    gone=lambda: JobNotFound("The job this Idempotency-Key created no longer exists."),
)
SCHEDULE_TARGET = KeyTarget(
    column="schedule_id",
    model=CronSchedule,
    endpoint="POST /api/schedules",
    gone=lambda: ScheduleNotFound(
        "The schedule this Idempotency-Key created was deleted; the key stays used until it expires. "
        "To make the schedule again, send the create with a new key."
    ),
)
TARGETS = (JOB_TARGET, SCHEDULE_TARGET)


def fingerprint(fields: dict[str, Any]) -> str:
    """Return the SHA-256 hex digest of ``fields`` as canonical JSON (sorted keys, compact)."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotency_key_check(key: str | None, *, owner_id: int | None) -> None:
    """Refuse (InvalidJob, 400) a key that is not 1-255 printable ASCII characters, or a key without an owner."""
    if key is None:
        return
    if not IDEMPOTENCY_KEY.match(key):
        raise InvalidJob(
            "Idempotency-Key must be 1-255 printable ASCII characters",
            details={"idempotency_key": ["1-255 printable ASCII characters."]},
        )
    if owner_id is None:
        raise InvalidJob("an idempotency key needs an owner", details={"idempotency_key": ["Needs an owner."]})


def insert_once(
    *, owner_id: int, key: str, digest: str, insert: Callable[[], T], target: KeyTarget = JOB_TARGET
) -> tuple[T, bool]:
    """Create the object of (``owner_id``, ``key``) once; return (the object, whether it was a replay).

    ``insert`` creates the ``target`` object (a Job, or a CronSchedule) when this request is the
    first with the key, in this function's transaction; a repeat whose ``digest``
    (``fingerprint``) matches gets the first request's object back, as it is now. A concurrent
    first request waits on the unique index for the winner's commit (or rollback: then it
    inserts), then reads the record that names the object. An expired record, or one left naming
    nothing, is deleted and the protocol starts again. Raises IdempotencyConflict (409: same key,
    different request, or a key that created the other target), ``target.gone()`` (404: the key's
    object was deleted since; the key stays used until it expires), IntegrityError after
    ``SETTLE_TRIES`` rounds.
    """
    ttl = conf().idempotency_ttl_seconds
    for _ in range(SETTLE_TRIES):
        with transaction.atomic():
            with connection.cursor() as cursor:
                # ON CONFLICT waits for a concurrent inserter of the same key to commit, so the loser
                # then reads a record that already names its object.
                cursor.execute(
                    """
                    INSERT INTO stint_idempotency (owner_id, key, fingerprint, job_id, schedule_id, created_at,
                                                   expires_at)
                    VALUES (%s, %s, %s, NULL, NULL, now(), now() + make_interval(secs => %s))
                    ON CONFLICT (owner_id, key) DO NOTHING
                    RETURNING id
                    """,
                    [owner_id, key, digest, ttl],
                )
                won = cursor.fetchone()
                if won is not None:
                    made = insert()
                    cursor.execute(
                        f"UPDATE stint_idempotency SET {target.column} = %s WHERE id = %s",  # noqa: S608 - a constant
                        [made.pk, won[0]],
                    )
                    return made, False
                cursor.execute(
                    "SELECT fingerprint, job_id, schedule_id, expires_at <= now() FROM stint_idempotency"
                    " WHERE owner_id = %s AND key = %s",
                    [owner_id, key],
                )
                row = cursor.fetchone()
                if row is None:
                    continue  # pruned between our two statements: try again
                stored, job_id, schedule_id, expired = row
                if expired or (job_id is None and schedule_id is None):
                    cursor.execute(
                        "DELETE FROM stint_idempotency WHERE owner_id = %s AND key = %s AND (expires_at <= now()"
                        " OR (job_id IS NULL AND schedule_id IS NULL))",
                        [owner_id, key],
                    )
                    continue
        named = {"job_id": job_id, "schedule_id": schedule_id}
        existing = named[target.column]
        if existing is None:  # the key created the other target
            other = next(t for t in TARGETS if named[t.column] is not None)
            raise IdempotencyConflict(
                f"This Idempotency-Key was already used with {other.endpoint}; use another key.",
                details={"idempotency_key": [key]},
            )
        if stored != digest:
            raise IdempotencyConflict(details={"idempotency_key": [key]})
        made = target.model.objects.filter(pk=existing, owner_id=owner_id).first()
        if made is None:
            raise target.gone()
        return made, True
    raise IntegrityError(f"could not settle the idempotency key after {SETTLE_TRIES} tries")


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
