"""Idempotency keys: the request fingerprint, the insert-once protocol, and the pruning of expired records.

A request with an ``Idempotency-Key`` creates its job once per (owner, key) for
``IDEMPOTENCY_TTL_SECONDS``: the unique (owner, key) index of ``stint_idempotency`` decides
between concurrent first requests, and a repeat with the same fingerprint replays the job the
first one created (Stripe's Idempotency-Key, IETF draft-ietf-httpapi-idempotency-key-header).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, connection, transaction

from scheduler.conf import conf
from scheduler.exceptions import IdempotencyConflict, InvalidJob, JobNotFound
from scheduler.models import Job

IDEMPOTENCY_KEY = re.compile(r"^[\x20-\x7e]{1,255}\Z")
SETTLE_TRIES = 3  # rounds of the protocol before giving up (a record pruned or expired under us)


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
    *, owner_id: int, key: str, digest: str, job_id: uuid.UUID, insert: Callable[[], Job]
) -> tuple[Job, bool]:
    """Create the job of (``owner_id``, ``key``) once; return (the job, whether it was a replay).

    ``insert`` creates the job (id ``job_id``) when this request is the first with the key; a
    repeat whose ``digest`` (``fingerprint``) matches gets the first request's job back. A
    concurrent first request waits on the unique index for the winner's commit, then reads the
    record that names its job. An expired record, or one left without a job, is deleted and the
    protocol starts again. Raises IdempotencyConflict (409: same key, different request),
    JobNotFound (the key's job was deleted since), IntegrityError after ``SETTLE_TRIES`` rounds.
    """
    ttl = conf().idempotency_ttl_seconds
    for _ in range(SETTLE_TRIES):
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
                    [owner_id, key, digest, ttl],
                )
                won = cursor.fetchone()
                if won is not None:
                    job = insert()
                    cursor.execute("UPDATE stint_idempotency SET job_id = %s WHERE id = %s", [job_id, won[0]])
                    return job, False
                cursor.execute(
                    "SELECT fingerprint, job_id, expires_at <= now() FROM stint_idempotency"
                    " WHERE owner_id = %s AND key = %s",
                    [owner_id, key],
                )
                row = cursor.fetchone()
                if row is None:
                    continue  # pruned between our two statements: try again
                stored, existing, expired = row
                if expired or existing is None:
                    cursor.execute(
                        "DELETE FROM stint_idempotency WHERE owner_id = %s AND key = %s AND (expires_at <= now()"
                        " OR job_id IS NULL)",
                        [owner_id, key],
                    )
                    continue
        if stored != digest:
            raise IdempotencyConflict(details={"idempotency_key": [key]})
        job = Job.objects.filter(id=existing).first()
        if job is None:
            raise JobNotFound("The job this Idempotency-Key created no longer exists.")
        return job, True
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
