"""factory-boy factories shared by the suite."""

from __future__ import annotations

import datetime as dt
import uuid

import factory
from django.utils import timezone

from accounts.models import Role, User
from scheduler.lifecycle import Claimed
from scheduler.models import Job, OutboxBatch, WorkerNode
from scheduler.states import JobStatus

PASSWORD = "correct-Horse-battery-9"


class UserFactory(factory.django.DjangoModelFactory):
    """A USER with a known password; trait ``admin`` makes an ADMIN (staff)."""

    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.test")
    role = Role.USER
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    class Params:
        admin = factory.Trait(role=Role.ADMIN, is_staff=True, is_superuser=True)

    @factory.post_generation
    def _save(obj: User, create: bool, extracted: object, **kwargs: object) -> None:  # noqa: N805
        if create:
            obj.save()


def _in(seconds: float):
    return factory.LazyFunction(lambda: timezone.now() + dt.timedelta(seconds=seconds))


class JobFactory(factory.django.DjangoModelFactory):
    """A QUEUED DEMO_TASK row written directly: no outbox events (``scheduler.enqueue`` writes those).

    Traits give a consistent row per state: ``scheduled``, ``running``, ``succeeded``, ``failed``,
    ``dead``, ``cancelled``. Test fixtures only: production code moves status through lifecycle.
    """

    class Meta:
        model = Job

    owner = factory.SubFactory(UserFactory)
    type = "DEMO_TASK"
    payload = factory.LazyFunction(dict)
    status = JobStatus.QUEUED
    scheduled_at = factory.LazyFunction(timezone.now)

    class Params:
        scheduled = factory.Trait(status=JobStatus.SCHEDULED, scheduled_at=_in(3600))
        running = factory.Trait(
            status=JobStatus.RUNNING,
            attempts=1,
            lease_owner="test-worker",
            lease_token=factory.LazyFunction(uuid.uuid4),
            lease_expires_at=_in(30),
            started_at=factory.LazyFunction(timezone.now),
        )
        succeeded = factory.Trait(
            status=JobStatus.SUCCESS,
            attempts=1,
            started_at=factory.LazyFunction(timezone.now),
            finished_at=factory.LazyFunction(timezone.now),
        )
        failed = factory.Trait(
            status=JobStatus.FAILED, attempts=1, finished_at=factory.LazyFunction(timezone.now), last_error="boom"
        )
        dead = factory.Trait(
            status=JobStatus.DEAD, attempts=4, finished_at=factory.LazyFunction(timezone.now), last_error="boom"
        )
        cancelled = factory.Trait(status=JobStatus.CANCELLED, finished_at=factory.LazyFunction(timezone.now))


def claimed_job(job_type: str = "DEMO_TASK", **fields) -> Claimed:
    """A ``Claimed`` job as a worker holds it, built here without the database.

    Defaults: attempt 1 of 1 + 3, a fresh id and lease token, a 60 s timeout, queue "default",
    priority 1, due and started now; ``fields`` override any of them (``Claimed``'s names).
    """
    now = timezone.now()
    values = {
        "id": uuid.uuid4(),
        "type": job_type,
        "payload": {},
        "attempt": 1,
        "lease_token": uuid.uuid4(),
        "timeout_seconds": 60,
        "owner_id": None,
        "max_retries": 3,
        "attempts_base": 0,
        "queue": "default",
        "priority": 1,
        "scheduled_at": now,
        "started_at": now,
    }
    return Claimed(**{**values, **fields})


def worker_node(*, last_heartbeat_at: dt.datetime, stopped_at: dt.datetime | None = None) -> WorkerNode:
    """A saved one-slot ``WorkerNode`` that started and last beat at ``last_heartbeat_at``."""
    return WorkerNode.objects.create(
        id=f"host:{uuid.uuid4().hex[:8]}",
        hostname="host",
        pid=1,
        queues=[],
        concurrency=1,
        pool="threads",
        started_at=last_heartbeat_at,
        last_heartbeat_at=last_heartbeat_at,
        stopped_at=stopped_at,
    )


def outbox_row(
    *events: dict[str, object], occurred_at: dt.datetime, published_at: dt.datetime | None = None
) -> OutboxBatch:
    """One outbox row holding ``events`` (entries as ``scheduler.lifecycle`` writes them), written directly.

    Each event dict may leave out keys: ``event_id`` defaults to a new uuid, ``owner_id`` to None,
    ``attempt`` to 0, ``from_status`` to "", ``payload`` to {}; ``event_type``, ``job_id``,
    ``sequence`` and ``to_status`` are required.
    """
    entries = [
        {
            "event_id": str(e.get("event_id") or uuid.uuid4()),
            "event_type": e["event_type"],
            "job_id": str(e["job_id"]),
            "owner_id": e.get("owner_id"),
            "sequence": e["sequence"],
            "attempt": e.get("attempt", 0),
            "from_status": e.get("from_status", ""),
            "to_status": e["to_status"],
            "payload": e.get("payload", {}),
        }
        for e in events
    ]
    return OutboxBatch.objects.create(
        occurred_at=occurred_at, published_at=published_at, event_count=len(entries), events=entries
    )
