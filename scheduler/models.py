"""Tables of the job system: jobs (with their results), attempts, idempotency, schedules, outbox, workers, queues.

Models hold data and constraints only; every status change goes through ``scheduler.lifecycle``.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import connection, models
from django.db.models import Q

from core.stored_json import StoredJSONField
from scheduler import retry
from scheduler.events import ENTRY_SQL, EVENTS_OF
from scheduler.ids import new_job_id
from scheduler.states import (
    MAX_RETRIES_RANGE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TIMEOUT_RANGE,
    AttemptStatus,
    EventType,
    JobStatus,
    Priority,
    priority_label,
)

DEFAULT_QUEUE = "default"
DEFAULT_MAX_RETRIES = 3
DEFAULT_TIMEOUT_SECONDS = 300  # seconds


class Job(models.Model):
    """One unit of work. ``scheduled_at`` is when it becomes due (creation time for immediate jobs)."""

    id = models.UUIDField(primary_key=True, default=new_job_id, editable=False)
    # No single-column indexes on the two foreign keys: every job row version (insert, claim,
    # outcome: none can be HOT, status is in the partial indexes' predicates) writes an entry in
    # each index, and job_owner_recent (owner, created_at) and job_unique_schedule_fire
    # (schedule, fire_time) already serve lookups and cascades by owner and by schedule.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs", db_index=False
    )
    name = models.CharField(max_length=200, blank=True, default="")
    type = models.CharField(max_length=100)
    payload = StoredJSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.CREATED)
    # -100..100, higher first; HIGH/MEDIUM/LOW are named points (scheduler.states.Priority).
    priority = models.SmallIntegerField(default=Priority.MEDIUM)
    queue = models.CharField(max_length=100, default=DEFAULT_QUEUE)
    scheduled_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    # Attempts made before the last manual retry/recover: the budget counts from here.
    attempts_base = models.PositiveIntegerField(default=0)
    max_retries = models.PositiveSmallIntegerField(default=DEFAULT_MAX_RETRIES)
    timeout_seconds = models.PositiveIntegerField(default=DEFAULT_TIMEOUT_SECONDS)
    lease_owner = models.CharField(max_length=100, null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    schedule = models.ForeignKey(
        "scheduler.CronSchedule",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        db_index=False,
    )
    fire_time = models.DateTimeField(null=True, blank=True)
    # Last lifecycle event sequence written for this job; incremented by the same UPDATE.
    event_sequence = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # Its last run killed the process it ran in (or it was running in a worker process that died):
    # only a supervisor's isolation slot claims it, in a process of its own, until a run of it
    # ends without killing its process (README, Operations / crashes). A database default too:
    # create_jobs inserts with SQL that does not name it.
    isolated = models.BooleanField(default=False, db_default=False)
    # Held by a flow limit (``scheduler.flow.claim``): a QUEUED job a flow limit governs, marked by
    # the limited claim phase that found it waiting. The claim index keys on it first, so ordinary
    # claims read only unheld jobs and never walk past a held-back backlog; the limited phase reads
    # both parts. Every transition and the claim clear it; a job whose limit is gone is cleared by
    # ``flow.claim.release_held`` (each worker process, when its limits change and every
    # ``RELEASE_EVERY`` seconds). Meaningless outside QUEUED.
    flow_held = models.BooleanField(default=False, db_default=False)
    # The W3C trace context (``traceparent``, ``tracestate``) of the request or cron fire that
    # created the job, while tracing is on (``scheduler.tracing``); each attempt's span links to it.
    trace_context = StoredJSONField(null=True, blank=True)
    # Flow control (scheduler.flow): the handler's last ``ctx.progress`` ({"percent", "message", "at"}),
    # and a unique job's content key with the statuses in which it blocks a duplicate (the partial
    # unique index ``job_unique_live``, created by migration 0008, is the race-free guard).
    progress = StoredJSONField(null=True, blank=True)
    unique_key = models.CharField(max_length=64, null=True, blank=True)
    unique_states = ArrayField(models.CharField(max_length=10), null=True, blank=True)
    # The result: the outcome of the job's latest attempt that a worker finished (complete, fail,
    # dead_letter, cancel_running write it in the outcome's own UPDATE; a rescue or a retry does
    # not). ``result_attempt`` NULL: none yet. ``result`` is the handler's JSON (JSON null for a
    # handler that returned None), SQL NULL for an attempt that did not succeed. Kept in the job
    # row rather than a table of its own: a separate row cost about 240 WAL bytes per job (issue 13).
    result_at = models.DateTimeField(null=True, blank=True)
    result_attempt = models.PositiveIntegerField(null=True, blank=True)
    result_status = models.CharField(max_length=10, choices=AttemptStatus.choices, null=True, blank=True)
    result = StoredJSONField(null=True, blank=True)

    class Meta:
        db_table = "stint_job"
        indexes = [
            # The claim index: QUEUED jobs, unheld first, each part in claim order. Ordinary claims
            # read the unheld part (``flow_held = false``, an index condition), the limited phase of
            # a flow-limited claim both parts, counts by status the whole.
            models.Index(
                fields=["flow_held", "-priority", "scheduled_at", "created_at"],
                name="job_claim_scan_desc",
                condition=Q(status=JobStatus.QUEUED),
            ),
            # Held jobs by type and by queue, each in claim order: the limited phase reads each limit's
            # held jobs on their own (scheduler.flow.claim). Only held jobs have entries.
            models.Index(
                fields=["type", "-priority", "scheduled_at", "created_at"],
                name="job_held_by_type",
                condition=Q(status=JobStatus.QUEUED, flow_held=True),
            ),
            models.Index(
                fields=["queue", "-priority", "scheduled_at", "created_at"],
                name="job_held_by_queue",
                condition=Q(status=JobStatus.QUEUED, flow_held=True),
            ),
            models.Index(
                fields=["scheduled_at"],
                name="job_due_scan",
                condition=Q(status__in=[JobStatus.SCHEDULED, JobStatus.RETRYING]),
            ),
            models.Index(fields=["lease_expires_at"], name="job_lease_scan", condition=Q(status=JobStatus.RUNNING)),
            # The isolation slots' claim scan: tiny, written only while an isolated job is QUEUED.
            models.Index(
                fields=["-priority", "scheduled_at", "created_at"],
                name="job_isolated_claim_scan",
                condition=Q(status=JobStatus.QUEUED, isolated=True),
            ),
            # Partial: jobs without an owner (enqueued by code: ``scheduler.enqueue``, cron without
            # one) are never listed by owner, and each of their row versions skips this index.
            models.Index(fields=["owner", "-created_at"], name="job_owner_recent", condition=Q(owner__isnull=False)),
            # Every owner's jobs newest first (the operator console and GET /api/admin/jobs page by it).
            models.Index(fields=["-created_at", "-id"], name="job_recent"),
            # The retention pruner's scan (oldest finished jobs of one status) and the dashboard's dead jobs.
            models.Index(
                fields=["status", "finished_at"],
                name="job_finished_scan",
                condition=Q(status__in=[JobStatus.SUCCESS, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED]),
            ),
        ]
        constraints = [
            # Partial, so the many jobs without a schedule never touch this index.
            models.UniqueConstraint(
                fields=["schedule", "fire_time"],
                name="job_unique_schedule_fire",
                condition=Q(schedule__isnull=False),
            ),
            # 0: trusted code's (a Django task's) opt-out of retries.
            models.CheckConstraint(
                condition=Q(max_retries__gte=0, max_retries__lte=MAX_RETRIES_RANGE[1]), name="job_max_retries_range"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX), name="job_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(timeout_seconds__gte=TIMEOUT_RANGE[0], timeout_seconds__lte=TIMEOUT_RANGE[1]),
                name="job_timeout_range",
            ),
            # A result is whole (attempt, status, time) or absent, and no handler value without one.
            models.CheckConstraint(
                condition=Q(result_attempt__isnull=False, result_status__isnull=False, result_at__isnull=False)
                | Q(
                    result_attempt__isnull=True, result_status__isnull=True, result_at__isnull=True, result__isnull=True
                ),
                name="job_result_whole",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id} ({self.status})"

    @property
    def priority_name(self) -> str:
        """HIGH, MEDIUM or LOW at a named point, else the decimal integer (``states.priority_label``)."""
        return priority_label(self.priority)

    @property
    def attempts_left(self) -> int:
        """Attempts remaining in the current budget of 1 + max_retries."""
        return retry.attempts_left(
            attempts=self.attempts, attempts_base=self.attempts_base, max_retries=self.max_retries
        )

    @property
    def stored_result(self) -> JobResult | None:
        """The job's result (``JobResult``), or None while it has none."""
        if self.result_attempt is None:
            return None
        return JobResult(
            job_id=self.id,
            attempt=self.result_attempt,
            status=self.result_status,
            result=self.result,
            created_at=self.result_at,
        )


class JobAttempt(models.Model):
    """One execution of a job by a worker that did not succeed (or succeeded before migration 0016).

    Written once, at the attempt's outcome, by ``lifecycle._ATTEMPT_ROW`` only. A successful
    attempt is kept in its job row instead; ``Attempt`` reads both.
    """

    # No index of its own: the unique (job, attempt_number) index serves every lookup by job.
    # No database constraint either (migration 0013): the one statement that inserts attempt rows
    # (``lifecycle._ATTEMPT_ROW``) takes their jobs from the rows it has just locked and updated, so
    # the constraint's per-row check (a trigger and a ``FOR KEY SHARE`` lookup of the job at commit)
    # could never fail there, and it cost about 5% of a drain. Deletes keep cascading: the pruner
    # deletes a job's attempts in the statement that deletes the job, Django's collector elsewhere.
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="attempt_set", db_index=False, db_constraint=False
    )
    attempt_number = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING)
    worker = models.CharField(max_length=100, blank=True, default="")
    lease_token = models.UUIDField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")

    class Meta:
        db_table = "stint_job_attempt"
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt_number"], name="attempt_unique_number"),
        ]
        ordering = ["job", "attempt_number"]

    def __str__(self) -> str:
        return f"{self.job_id} #{self.attempt_number} {self.status}"


class Attempt(models.Model):
    """One attempt a worker ended, however it is kept: what people read (API, pages, console).

    A read-only model of the view ``stint_attempt`` (migration 0016): the rows of ``JobAttempt``
    (attempts that did not succeed, and successful ones finished before 0016), and the successful
    attempt of each SUCCESS job without such a row, made up from the job row (``result_attempt``,
    ``started_at``, ``finished_at``, ``lease_owner`` as the worker, ``lease_token``; no error or
    traceback), which ``lifecycle.complete`` writes instead of a row. ``id`` is the row's id as
    text, or the job's id for an attempt kept in the job row. A RUNNING job's current attempt is
    not here (``selectors.job_running_attempt``).
    """

    id = models.TextField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.DO_NOTHING, related_name="attempts_made", db_constraint=False)
    attempt_number = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=AttemptStatus.choices)
    worker = models.CharField(max_length=100)
    lease_token = models.UUIDField(null=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    error = models.TextField()
    traceback = models.TextField()

    class Meta:
        managed = False
        db_table = "stint_attempt"
        ordering = ["job", "attempt_number"]

    def __str__(self) -> str:
        return f"{self.job_id} #{self.attempt_number} {self.status}"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """The outcome of a job's latest finished attempt, as ``GET /api/jobs/{id}/result`` shows it.

    Read from the job row (``Job.stored_result``): ``attempt`` (its number), ``status`` (an
    ``AttemptStatus``: SUCCEEDED, FAILED, TIMED_OUT, LOST or CANCELLED), ``result`` (the handler's
    JSON when it succeeded, else None) and ``created_at`` (aware datetime, database clock).
    """

    job_id: uuid.UUID
    attempt: int
    status: str
    result: Any
    created_at: dt.datetime


class IdempotencyRecord(models.Model):
    """An owner's ``Idempotency-Key``, the fingerprint of the request that first used it, and what it created.

    A key creates one job (POST /api/jobs) or one schedule (POST /api/schedules), never both: the
    two creates share the owner's keys (``scheduler.idempotency``).
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # No database constraint and no cascade, on purpose: the record outlives a deletion of its
    # schedule, so a late retry of the create answers 404 instead of making the schedule again
    # (ids are never reused). Nothing looks records up by schedule: no index.
    schedule = models.ForeignKey(
        "CronSchedule",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "stint_idempotency"
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="idempotency_unique_owner_key"),
            models.CheckConstraint(
                condition=models.Q(job__isnull=True) | models.Q(schedule__isnull=True),
                name="idempotency_one_target",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.owner_id}:{self.key}"


class MisfirePolicy(models.TextChoices):
    """What to fire for times missed while no leader ran."""

    SKIP = "skip"  # fire once, for the latest missed time
    CATCH_UP = "catch_up"  # fire every missed time, up to a bound
    NONE = "none"  # fire nothing missed


class OverlapPolicy(models.TextChoices):
    """Whether a fire may start while the previous fire's job is unfinished."""

    ALLOW = "allow"
    SKIP = "skip"


class CronSchedule(models.Model):
    """A recurring job: a cron expression or a fixed interval, in an IANA time zone."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=200)
    cron = models.CharField(max_length=200, null=True, blank=True)
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    job_type = models.CharField(max_length=100)
    job_payload = StoredJSONField(default=dict, blank=True)
    job_priority = models.SmallIntegerField(default=Priority.MEDIUM)
    job_queue = models.CharField(max_length=100, default=DEFAULT_QUEUE)
    job_max_retries = models.PositiveSmallIntegerField(default=DEFAULT_MAX_RETRIES)
    job_timeout_seconds = models.PositiveIntegerField(default=DEFAULT_TIMEOUT_SECONDS)
    enabled = models.BooleanField(default=True)
    misfire_policy = models.CharField(max_length=10, choices=MisfirePolicy.choices, default=MisfirePolicy.SKIP)
    overlap_policy = models.CharField(max_length=10, choices=OverlapPolicy.choices, default=OverlapPolicy.ALLOW)
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "stint_schedule"
        indexes = [models.Index(fields=["next_fire_at"], name="schedule_due_scan", condition=Q(enabled=True))]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron__isnull=False) & Q(interval_seconds__isnull=True))
                | (Q(cron__isnull=True) & Q(interval_seconds__isnull=False)),
                name="schedule_cron_xor_interval",
            ),
            models.CheckConstraint(
                condition=Q(job_priority__gte=PRIORITY_MIN, job_priority__lte=PRIORITY_MAX),
                name="schedule_job_priority_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def job_priority_label(self) -> str:
        """The job template's priority: HIGH, MEDIUM or LOW at a named point, else the integer."""
        return priority_label(self.job_priority)


class LeaderFence(models.Model):
    """The newest fencing token the database has accepted for a leadership role."""

    role = models.CharField(max_length=50, primary_key=True)
    token = models.BigIntegerField(default=0)
    holder = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)
    # The database time ``token``'s holder last showed it led: its claim, each leader write
    # (``fence_check``) and the end of its term when it saw the end (a release, a lost lock).
    alive_at = models.DateTimeField(null=True, blank=True)
    # When the unbroken leadership this term continues began: a term claimed within half a lock TTL of
    # its predecessor's ``alive_at`` (a handover) inherits it; otherwise its own claim time.
    led_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "stint_leader_fence"

    def __str__(self) -> str:
        return f"{self.role}@{self.token}"


class OutboxBatch(models.Model):
    """The lifecycle events one statement wrote, as one row, relayed to Kafka (one message per event).

    A transition batch, a claim, an outcome batch or an enqueue writes its N events as ONE row,
    packed: the column ``packed_events`` (an array of N values of the composite type
    ``stint_packed_event``, migration 0014; not a model field, Django has no such type), in the
    order the relay produces them (a job's events in sequence order); ``occurred_at`` and
    ``schema_version`` are the statement's, shared by its events. Rows written before that
    migration, and the reconciler's repair copies, hold a JSON array of entries (``EVENT_KEYS``;
    docs/events.md) in ``events`` instead; exactly one of the two is set. Read the events with
    ``scheduler.events.EVENTS_OF``, ``entries()`` or ``OutboxEvent``, which render either form as
    those JSON entries. One heap row and two index entries per statement instead of per event:
    the outbox's share of the WAL of a job falls by more than half (bench/side_by_side.py,
    ``WAL B/job``). The relay marks a row published only when every one of its events was delivered.
    """

    id = models.BigAutoField(primary_key=True)
    schema_version = models.PositiveSmallIntegerField(default=1)
    occurred_at = models.DateTimeField()
    event_count = models.PositiveIntegerField()
    events = StoredJSONField(null=True)  # the JSON form, or NULL: see the docstring
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "stint_outbox"
        indexes = [
            models.Index(fields=["id"], name="outbox_unpublished", condition=Q(published_at__isnull=True)),
            models.Index(fields=["published_at"], name="outbox_published_at", condition=Q(published_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"outbox row {self.id}: {self.event_count} events"

    def entries(self) -> list[dict[str, Any]]:
        """This row's events as JSON objects (``EVENT_KEYS``), in the relay's order, from either form (one query)."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {ENTRY_SQL} FROM stint_outbox o {EVENTS_OF} WHERE o.id = %s ORDER BY e.position",  # noqa: S608
                [self.id],
            )
            return [json.loads(ev) if isinstance(ev, str) else ev for (ev,) in cursor.fetchall()]


# The keys of one entry of ``OutboxBatch.events`` (the rest of an event is its row's).
EVENT_KEYS = (
    "event_id",
    "event_type",
    "job_id",
    "owner_id",
    "sequence",
    "attempt",
    "from_status",
    "to_status",
    "payload",
)
# ``OutboxEvent.id`` = outbox row id * EVENT_ID_STRIDE + the event's position (1-based) in the row.
EVENT_ID_STRIDE = 1 << 20


class OutboxEvent(models.Model):
    """One lifecycle event of the outbox: a read-only view (``stint_outbox_event``) over ``OutboxBatch`` rows.

    ``id`` orders events as the relay produces them (row id, then position in the row);
    ``outbox_id`` is the row holding it. Reading one job's events this way scans the outbox
    (no index by job): tests, the admin and the chaos checks use it; the timeline reads a bounded
    range (``audit.timeline``). Writes go to ``OutboxBatch`` (``scheduler.lifecycle``).
    """

    id = models.BigIntegerField(primary_key=True)
    outbox_id = models.BigIntegerField()
    position = models.IntegerField()
    event_id = models.UUIDField()
    event_type = models.CharField(max_length=32, choices=EventType.choices)
    job_id = models.UUIDField()
    owner_id = models.BigIntegerField(null=True, blank=True)
    sequence = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(default=0)
    from_status = models.CharField(max_length=10, blank=True, default="")
    to_status = models.CharField(max_length=10)
    schema_version = models.PositiveSmallIntegerField(default=1)
    payload = StoredJSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        managed = False
        db_table = "stint_outbox_event"

    def __str__(self) -> str:
        return f"{self.event_type} {self.job_id} #{self.sequence}"


class OutboxReconcile(models.Model):
    """The audit reconciler's progress and record (``scheduler.maintenance.reconciler``): one row per check.

    Every outbox event published before (``checked_published_at``, ``checked_id``) has been
    compared with the audit table; the reconciler scans on from there in publication order.
    """

    name = models.CharField(max_length=32, primary_key=True)
    checked_published_at = models.DateTimeField(null=True, blank=True)
    checked_id = models.BigIntegerField(default=0)
    last_run_at = models.DateTimeField(null=True, blank=True)  # the database clock
    last_repair_at = models.DateTimeField(null=True, blank=True)
    repaired_total = models.BigIntegerField(default=0)  # events re-published since the row was created

    class Meta:
        db_table = "stint_outbox_reconcile"

    def __str__(self) -> str:
        return f"{self.name} through {self.checked_published_at}"


class WorkerNode(models.Model):
    """A worker process of a ``run_workers`` supervisor, alive while it heartbeats."""

    id = models.CharField(max_length=100, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    # The ``run_workers`` supervisor (on ``hostname``) that started and watches this process.
    supervisor_pid = models.PositiveIntegerField(null=True, blank=True)
    # An isolation slot: claims only isolated jobs, each in a process of its own.
    isolation = models.BooleanField(default=False, db_default=False)
    queues = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField()
    pool = models.CharField(max_length=10)
    busy_slots = models.PositiveIntegerField(default=0)
    # Jobs whose outcome this process recorded since it started (written with each heartbeat).
    jobs_done = models.PositiveBigIntegerField(default=0, db_default=0)
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "stint_worker_node"
        indexes = [models.Index(fields=["last_heartbeat_at"], name="worker_heartbeat")]

    def __str__(self) -> str:
        return self.id


class Queue(models.Model):
    """A named queue, created on first use; a paused queue is not leased from.

    Deleted once unused for ``QUEUE_RETENTION_DAYS`` (``scheduler.maintenance.queue_pruner``).
    """

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # Last created, paused or resumed, or found with jobs by the queue pruner (its retention's clock).
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "stint_queue"

    def __str__(self) -> str:
        return self.name


from scheduler.flow.models import FlowAdmission, FlowLimit, FlowPace  # noqa: E402,F401 - models of this app
