"""Schedule services: create, update, delete, trigger and preview cron/interval schedules.

The API (``scheduler.api.schedules``), the admin and code call these. Visibility follows the job
rule: a USER sees and changes their own schedules, an ADMIN every schedule, and a schedule the
actor may not see is ``ScheduleNotFound`` (404), never forbidden. Fire-time math is
``scheduler.cron``; firing is ``scheduler.maintenance.cron_firer``. Every time here comes from
the database clock.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from django.contrib.admin.models import ADDITION, CHANGE, DELETION
from django.db import transaction
from django.db.models import Count, OuterRef, QuerySet, Subquery

from core.db_clock import db_now
from core.parsers import has_nul, is_storable_text
from core.stored_json import UnreadableJSON
from scheduler import idempotency, lifecycle, tracing
from scheduler.action_log import action_record, changes_text
from scheduler.conf import conf
from scheduler.cron import (
    MISFIRE_POLICIES,
    FireSpec,
    cron_spec,
    fire_times,
    interval_spec,
    smallest_gap,
    spec_of,
    zone_for,
)
from scheduler.exceptions import InvalidJob, InvalidSchedule, ScheduleNotFound, UnknownJobType
from scheduler.ids import new_job_id
from scheduler.jobspec import job_spec_validate
from scheduler.lifecycle import NewJob
from scheduler.models import CronSchedule, Job, MisfirePolicy, OverlapPolicy
from scheduler.notify import notify_queued
from scheduler.queues import queue_ensure
from scheduler.states import JobStatus, Priority

logger = logging.getLogger(__name__)

NEXT_FIRE_TIMES = 5  # fire times shown with a schedule
# A schedule's runs newest fire first (manual triggers have fire times too); the partial unique
# index on (schedule, fire_time) serves it.
RUN_ORDER = ("-fire_time", "-id")
PREVIEW_COUNT_RANGE = (1, 100)
NAME_MAX = 200  # characters
JOB_KEYS = frozenset({"type", "payload", "priority", "queue", "max_retries", "timeout_seconds"})
# Changing any of these recomputes next_fire_at from now (DESIGN.md: edits apply at the next tick).
TIMING_FIELDS = frozenset({"cron", "interval_seconds", "timezone", "enabled"})
GAP_SAMPLE_FIRES = 200  # fires of a cron expression examined for its shortest gap (about 30 ms at worst)
NEVER_FIRES = "This expression never fires."  # create, update and preview refuse it alike
ONE_TIMING = "Give exactly one of cron and interval_seconds."  # create, update and preview alike
# What a create writes besides the owner: an Idempotency-Key's replay must match every one of them.
FINGERPRINTED = (
    "name",
    "cron",
    "interval_seconds",
    "timezone",
    "enabled",
    "misfire_policy",
    "overlap_policy",
    "job_type",
    "job_payload",
    "job_priority",
    "job_queue",
    "job_max_retries",
    "job_timeout_seconds",
)
WRITABLE = frozenset(
    {"name", "cron", "interval_seconds", "timezone", "enabled", "misfire_policy", "overlap_policy", "job"}
)
# Columns whose change an actor's update records with old and new values (scheduler.action_log);
# the payload is named, not shown (it can be 10 KB).
RECORDED_FIELDS = (
    "name",
    "cron",
    "interval_seconds",
    "timezone",
    "misfire_policy",
    "overlap_policy",
    "job_type",
    "job_priority",
    "job_queue",
    "job_max_retries",
    "job_timeout_seconds",
)


# -- reads ------------------------------------------------------------------------------------


def schedule_visible_to(*, actor: Any) -> QuerySet[CronSchedule]:
    """Return the schedules ``actor`` may see (every one for an ADMIN or None, their own otherwise), by id."""
    schedules = CronSchedule.objects.order_by("id")
    if actor is None or getattr(actor, "is_admin", False):
        return schedules
    return schedules.filter(owner_id=actor.pk)


def schedule_get(*, schedule_id: int, actor: Any = None) -> CronSchedule:
    """Return schedule ``schedule_id`` if ``actor`` may see it; raise ``ScheduleNotFound`` otherwise."""
    schedule = schedule_visible_to(actor=actor).filter(id=schedule_id).first()
    if schedule is None:
        raise ScheduleNotFound()
    return schedule


def schedule_spec(schedule: CronSchedule) -> FireSpec:
    """Return the fire-time spec of a stored schedule (an interval's grid runs through ``next_fire_at``)."""
    anchor = schedule.next_fire_at or schedule.created_at
    return spec_of(
        cron=schedule.cron,
        interval_seconds=schedule.interval_seconds,
        timezone=schedule.timezone,
        anchor=anchor,
        stored=True,
    )


def schedule_next_fire_times(schedule: CronSchedule, *, count: int = NEXT_FIRE_TIMES) -> list[dt.datetime]:
    """Return the next ``count`` fire times of ``schedule`` from its ``next_fire_at`` (UTC); [] while disabled."""
    if not schedule.enabled or schedule.next_fire_at is None:
        return []
    try:
        spec = schedule_spec(schedule)
    except InvalidSchedule:
        return []
    return [schedule.next_fire_at, *fire_times(spec, start=schedule.next_fire_at, count=count - 1)]


def schedule_runs(*, schedule_id: int, actor: Any = None) -> QuerySet[Job]:
    """Return every job schedule ``schedule_id`` fired (its runs), newest fire first.

    Visible to whoever may see the schedule (``schedule_get``; raises ``ScheduleNotFound``).
    Runs are the jobs whose ``schedule`` is this one, timetabled fires and manual triggers
    alike; the partial unique index on (schedule, fire_time) serves the order, so a page costs
    the same however many runs the schedule has (the retention pruner bounds them anyway).
    """
    schedule_get(schedule_id=schedule_id, actor=actor)
    return Job.objects.filter(schedule_id=schedule_id).order_by(*RUN_ORDER)


def with_last_run(schedules: QuerySet[CronSchedule]) -> QuerySet[CronSchedule]:
    """Annotate each schedule with its last run: ``last_run_id``, ``last_run_status``, ``last_run_fire_time``.

    One correlated probe of the (schedule, fire_time) index per schedule; None where it never fired.
    """
    latest = Job.objects.filter(schedule_id=OuterRef("pk")).order_by(*RUN_ORDER)
    return schedules.annotate(
        last_run_id=Subquery(latest.values("id")[:1]),
        last_run_status=Subquery(latest.values("status")[:1]),
        last_run_fire_time=Subquery(latest.values("fire_time")[:1]),
    )


def schedule_run_counts(*, schedule_id: int) -> dict[str, int]:
    """Return {status: number of runs} of schedule ``schedule_id`` over its kept jobs, zeros left out.

    No visibility check: callers have passed ``schedule_get`` (or ``schedule_runs``) already.
    """
    rows = Job.objects.filter(schedule_id=schedule_id).order_by().values_list("status").annotate(n=Count("id"))
    return {status: n for status, n in rows}


def run_duration_seconds(job: Job) -> float | None:
    """Return how long ``job``'s last attempt ran, in seconds; None until it finished.

    From ``started_at`` to ``finished_at``, rounded to the millisecond and at least 0.
    """
    if job.started_at is None or job.finished_at is None:
        return None
    return round(max(0.0, (job.finished_at - job.started_at).total_seconds()), 3)


def schedule_history_context(*, schedule: CronSchedule, runs: Any) -> dict[str, Any]:
    """Return what a schedule's history shows (``templates/stint/_schedule_runs.html``).

    ``runs`` is the page of runs to list (jobs, newest fire first, e.g. a slice of
    ``schedule_runs``); each gets ``duration_seconds``. Adds the counts by status over every
    kept run and the last run: two queries besides ``runs`` (one grouped count, one for the
    last run).
    """
    listed = list(runs)
    for job in listed:
        job.duration_seconds = run_duration_seconds(job)
    counts = schedule_run_counts(schedule_id=schedule.id)
    last = Job.objects.filter(schedule_id=schedule.id).order_by(*RUN_ORDER).first()
    if last is not None:
        last.duration_seconds = run_duration_seconds(last)
    return {
        "runs": listed,
        "run_counts": sorted(counts.items()),
        "run_total": sum(counts.values()),
        "last_run": last,
    }


# -- validation -------------------------------------------------------------------------------


def _invalid(field: str, message: str) -> InvalidSchedule:
    return InvalidSchedule(message, details={field: [message]})


def _check_choice(field: str, value: Any, choices: Any) -> str:
    allowed = [str(c) for c in choices]
    if value not in allowed:
        raise _invalid(field, f"Must be one of {', '.join(allowed)}.")
    return value


def _validated_job(job: Mapping[str, Any], *, trusted: bool = False) -> dict[str, Any]:
    """Return the job template as model fields; raise InvalidSchedule (details under ``job``) or PayloadTooLarge."""
    if not isinstance(job, Mapping):
        raise _invalid("job", "Must be an object with type, payload, priority, queue, max_retries, timeout_seconds.")
    unknown = sorted(set(job) - JOB_KEYS)
    if unknown:
        raise InvalidSchedule("Unknown job field.", details={"job": {k: ["Unknown field."] for k in unknown}})
    if not job.get("type"):
        raise InvalidSchedule("job.type is required.", details={"job": {"type": ["This field is required."]}})
    payload = job.get("payload")
    payload = {} if payload is None else payload
    if isinstance(payload, UnreadableJSON):  # the stored template's, kept by a change that sent none
        message = f"The stored payload {payload}: send job.payload with the change."
        raise InvalidSchedule(message, details={"job": {"payload": [message]}})
    if has_nul(payload):  # PostgreSQL's jsonb cannot store U+0000
        raise InvalidSchedule(
            "job.payload may not contain U+0000.", details={"job": {"payload": ["Strings may not contain U+0000."]}}
        )
    priority = job.get("priority", Priority.MEDIUM.name)
    queue = job.get("queue") or "default"
    try:
        spec = job_spec_validate(
            type_=job["type"],
            payload=payload,
            priority=priority,
            queue=queue,
            scheduled_at=None,
            max_retries=job.get("max_retries"),
            timeout_seconds=job.get("timeout_seconds"),
            name="",
            trusted=trusted,
        )
    except (InvalidJob, UnknownJobType) as exc:
        details = exc.details if isinstance(exc.details, dict) else {"type": [str(exc)]}
        raise InvalidSchedule(str(exc), details={"job": details}) from exc
    return {
        "job_type": job["type"],
        "job_payload": payload,
        "job_priority": spec.priority,
        "job_queue": queue,
        "job_max_retries": spec.max_retries,
        "job_timeout_seconds": spec.timeout_seconds,
    }


def _job_template(schedule: CronSchedule) -> dict[str, Any]:
    return {
        "type": schedule.job_type,
        "payload": schedule.job_payload,
        "priority": schedule.job_priority,
        "queue": schedule.job_queue,
        "max_retries": schedule.job_max_retries,
        "timeout_seconds": schedule.job_timeout_seconds,
    }


def _validate(schedule: CronSchedule, *, stored_cron: str | None = None) -> None:
    """Check every field of ``schedule`` (normalizing ``cron``); raise InvalidSchedule.

    ``stored_cron``: the expression stored before this write; kept as it is, it is checked as a
    stored one (``normalize_cron``), so a schedule in a form refused since can still be renamed
    or disabled.
    """
    name = schedule.name
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX or not is_storable_text(name):
        raise _invalid("name", "1-200 characters of valid Unicode, without U+0000.")
    if (schedule.cron is None) == (schedule.interval_seconds is None):
        raise _invalid("cron", ONE_TIMING)
    zone_for(schedule.timezone)
    if schedule.cron is not None:
        stored = stored_cron is not None and schedule.cron == stored_cron
        schedule.cron = cron_spec(schedule.cron, schedule.timezone, stored=stored).expression
    else:
        interval_spec(schedule.interval_seconds, anchor=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    if not isinstance(schedule.enabled, bool):
        raise _invalid("enabled", "Must be true or false.")
    _check_choice("misfire_policy", schedule.misfire_policy, MISFIRE_POLICIES)
    _check_choice("overlap_policy", schedule.overlap_policy, OverlapPolicy.values)


def _check_min_interval(schedule: CronSchedule, *, now: dt.datetime) -> None:
    """Refuse a USER's schedule that fires more often than ``SCHEDULER["MIN_SCHEDULE_INTERVAL_SECONDS"]``.

    ADMINs' schedules are exempt; 0 turns the rule off. An interval is compared as it is; a cron
    expression by the shortest gap among its next ``GAP_SAMPLE_FIRES`` fires after ``now`` (in
    its zone, so daylight-saving repeats count). Like the schedule quota, this bounds the jobs a
    single user can make the scheduler create (issue 12: 100 one-second schedules were 8.6 M jobs
    a day). Raises InvalidSchedule (400) naming the field.
    """
    from accounts.models import Role, User

    minimum = conf().min_schedule_interval_seconds
    if not minimum:
        return
    if User.objects.filter(pk=schedule.owner_id).values_list("role", flat=True).first() == Role.ADMIN:
        return
    message = f"A schedule may fire at most once every {minimum} seconds."
    if schedule.interval_seconds is not None:
        if schedule.interval_seconds < minimum:
            raise _invalid("interval_seconds", message)
        return
    gap = smallest_gap(cron_spec(schedule.cron, schedule.timezone, stored=True), start=now, count=GAP_SAMPLE_FIRES)
    if gap is not None and gap < dt.timedelta(seconds=minimum):
        raise _invalid("cron", f"{message} This expression fires {int(gap.total_seconds())} seconds apart.")


def _next_fire_at(schedule: CronSchedule, *, now: dt.datetime) -> dt.datetime | None:
    """Return the first fire time after ``now`` (None while disabled); raise InvalidSchedule if it never fires."""
    if schedule.cron is not None:
        nxt = cron_spec(schedule.cron, schedule.timezone, stored=True).next_after(now)
        if nxt is None:
            raise _invalid("cron", NEVER_FIRES)
    else:  # a new interval grid starts at this whole second
        nxt = now.replace(microsecond=0) + dt.timedelta(seconds=schedule.interval_seconds)
    return nxt if schedule.enabled else None


# -- writes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleCreated:
    """The schedule a create produced and whether it was an idempotent replay of an earlier request."""

    schedule: CronSchedule
    replayed: bool


def schedule_create(*, owner: Any, name: str, job: Mapping[str, Any], **options: Any) -> CronSchedule:
    """Create a schedule for ``owner`` (a User or user id); its first fire is the first due time after now.

    ``options`` are ``schedule_create_request``'s keyword arguments (its defaults: UTC, enabled,
    misfire SKIP, overlap ALLOW), whose schedule this returns (a replay's, with an ``idempotency_key``).
    ``cron`` (5 fields or an ``@hourly``-style macro, in IANA zone ``timezone``) or
    ``interval_seconds`` (1 s to 366 days, a grid starting now); ``job`` is the template of the
    jobs it fires (``type``, ``payload``, ``priority``, ``queue``, ``max_retries``,
    ``timeout_seconds``, validated as a job create is; ``trusted``, for project code only, also
    accepts Django task paths: ``enqueuing.enqueue_request``). ``actor`` (the requesting User; None
    for project code) is recorded as its creator (``scheduler.action_log``) in the create's
    transaction. Raises InvalidSchedule (400) or PayloadTooLarge (413).
    """
    return schedule_create_request(owner=owner, name=name, job=job, **options).schedule


def schedule_create_request(
    *,
    owner: Any,
    name: str,
    job: Mapping[str, Any],
    cron: str | None = None,
    interval_seconds: int | None = None,
    timezone: str = "UTC",
    enabled: bool = True,
    misfire_policy: str = MisfirePolicy.SKIP,
    overlap_policy: str = OverlapPolicy.ALLOW,
    trusted: bool = False,
    idempotency_key: str | None = None,
    actor: Any = None,
) -> ScheduleCreated:
    """Create a schedule as ``schedule_create`` describes, once per ``idempotency_key``; say if it replayed.

    With ``idempotency_key`` (1-255 printable ASCII characters, unique per owner for
    ``IDEMPOTENCY_TTL_SECONDS``, shared with job creates), a repeat of the same request returns the
    first request's schedule, as it is now, with ``replayed=True`` (``idempotency.insert_once``).
    "The same request" is the same schedule once validated: defaults written out or left out, keys
    in any order and a job template's handler defaults compare equal (``schedule_fingerprint``). A
    request refused (400, 413) uses up no key. Raises what ``schedule_create`` raises, InvalidJob
    (400: a malformed key), IdempotencyConflict (409: the key was used with a different request, or
    to create a job), ScheduleNotFound (404: the key's schedule was deleted since; the key stays
    used until it expires, so a late retry cannot bring a deleted schedule back).
    """
    new = CronSchedule(
        owner_id=getattr(owner, "pk", owner),
        name=name,
        cron=cron,
        interval_seconds=interval_seconds,
        timezone=timezone,
        enabled=enabled,
        misfire_policy=misfire_policy,
        overlap_policy=overlap_policy,
        **_validated_job(job, trusted=trusted),
    )
    _validate(new)
    idempotency.idempotency_key_check(idempotency_key, owner_id=new.owner_id)
    if idempotency_key is None:
        schedule, replayed = _schedule_insert(new, actor=actor), False
    else:
        schedule, replayed = idempotency.insert_once(
            owner_id=new.owner_id,
            key=idempotency_key,
            digest=schedule_fingerprint(new),
            insert=lambda: _schedule_insert(new, actor=actor),
            target=idempotency.SCHEDULE_TARGET,
        )
    if not replayed:
        logger.info("schedule %s created", schedule.id, extra={"schedule_id": schedule.id})
    return ScheduleCreated(schedule=schedule, replayed=replayed)


def schedule_fingerprint(schedule: CronSchedule) -> str:
    """Return the ``idempotency.fingerprint`` of a validated, unsaved schedule: every field a create writes."""
    return idempotency.fingerprint({field: getattr(schedule, field) for field in FINGERPRINTED})


def _schedule_insert(schedule: CronSchedule, *, actor: Any) -> CronSchedule:
    """Save a new ``schedule`` (quota, minimum interval, first fire time) with its action-log entry; return it."""
    with transaction.atomic():
        queue_ensure(name=schedule.job_queue)  # in the schedule's transaction: see queue_ensure
        _check_quota(schedule.owner_id)
        now = db_now()
        _check_min_interval(schedule, now=now)
        schedule.next_fire_at = _next_fire_at(schedule, now=now)
        schedule.save()
        action_record(actor=actor, objects=[schedule], flag=ADDITION, message=f"Created: {_summary(schedule)}.")
    return schedule


def _summary(schedule: CronSchedule) -> str:
    """ "cron '0 * * * *' (UTC), fires REPORT on queue default" for a change message; ", disabled" when so."""
    timing = f"cron '{schedule.cron}'" if schedule.cron is not None else f"every {schedule.interval_seconds} s"
    disabled = "" if schedule.enabled else ", disabled"
    return f"{timing} ({schedule.timezone}), fires {schedule.job_type} on queue {schedule.job_queue}{disabled}"


def _update_message(before: dict[str, Any], schedule: CronSchedule) -> str:
    """The change message of an update: "Disabled." / "Enabled.", then the other fields' old and new values."""
    after = {field: getattr(schedule, field) for field in before}
    parts = []
    if before["enabled"] != after["enabled"]:
        parts.append("Enabled" if after["enabled"] else "Disabled")
    changed = changes_text(
        {f: v for f, v in before.items() if f in RECORDED_FIELDS},
        {f: v for f, v in after.items() if f in RECORDED_FIELDS},
    )
    if changed:
        parts.append(f"changed {changed}" if parts else f"Changed {changed}")
    if before["job_payload"] != after["job_payload"]:
        parts.append("changed job_payload" if parts else "Changed job_payload")
    return f"{'; '.join(parts)}." if parts else ""


def _check_quota(owner_id: int) -> None:
    """Refuse a USER's schedule beyond ``SCHEDULER["MAX_SCHEDULES_PER_USER"]`` (0: no limit; ADMINs exempt).

    Each schedule is a standing source of jobs that no per-request rate limit covers, so the
    number a user may hold is bounded. The owner's row is locked so concurrent creates count
    one after another, until the create's transaction ends. The lock is ``FOR NO KEY UPDATE``,
    not ``FOR UPDATE``: it conflicts with itself, which is all the count needs, but not with the
    ``FOR KEY SHARE`` that PostgreSQL's foreign-key check takes on the user row, so the owner's
    other writes that reference it (jobs, idempotency records, tokens) do not wait for the
    create. Raises InvalidSchedule (400).
    """
    from accounts.models import Role, User

    limit = conf().max_schedules_per_user
    if not limit:
        return
    role = User.objects.select_for_update(no_key=True).filter(pk=owner_id).values_list("role", flat=True).first()
    if role == Role.ADMIN:
        return
    if CronSchedule.objects.filter(owner_id=owner_id).count() >= limit:
        raise InvalidSchedule(
            f"A user may hold at most {limit} schedules.", details={"schedules": [f"At most {limit} per user."]}
        )


# Every column ``schedule_update`` may write but the template's payload (see there).
_FIELDS_BUT_PAYLOAD = tuple(
    f.name for f in CronSchedule._meta.concrete_fields if not f.primary_key and f.name != "job_payload"
)


def schedule_update(
    *, schedule_id: int, actor: Any = None, changes: Mapping[str, Any], trusted: bool = False
) -> CronSchedule:
    """Apply ``changes`` (any of ``WRITABLE``; ``job`` merges into the template) and return the schedule.

    Setting ``cron`` clears ``interval_seconds`` and the other way round. A change of timing
    (cron, interval, zone, enabled) sets ``next_fire_at`` to the first due time after now, so it
    applies at the scheduler's next tick and re-enabling fires nothing for the disabled span;
    other changes leave the fire times alone. ``trusted`` as ``schedule_create``. ``actor`` (a
    User, or None for a trusted caller) must own the schedule or be an ADMIN; what changed is
    recorded for them (``scheduler.action_log``) in the update's transaction. Raises
    ScheduleNotFound, InvalidSchedule, PayloadTooLarge.
    """
    unknown = sorted(set(changes) - WRITABLE)
    if unknown:
        raise InvalidSchedule("Unknown field.", details={k: ["Unknown field."] for k in unknown})
    with transaction.atomic():
        schedule = schedule_visible_to(actor=actor).select_for_update().filter(id=schedule_id).first()
        if schedule is None:
            raise ScheduleNotFound()
        before = {field: getattr(schedule, field) for field in TIMING_FIELDS}
        recorded = {field: getattr(schedule, field) for field in (*RECORDED_FIELDS, "enabled", "job_payload")}
        for field, value in changes.items():
            if field != "job":
                setattr(schedule, field, value)
        if changes.get("cron") is not None and "interval_seconds" not in changes:
            schedule.interval_seconds = None
        if changes.get("interval_seconds") is not None and "cron" not in changes:
            schedule.cron = None
        if "job" in changes:
            job = changes["job"]
            if not isinstance(job, Mapping):
                raise _invalid("job", "Must be an object.")
            for field, value in _validated_job({**_job_template(schedule), **job}, trusted=trusted).items():
                setattr(schedule, field, value)
        _validate(schedule, stored_cron=before["cron"])
        queue_ensure(name=schedule.job_queue)
        if any(getattr(schedule, field) != before[field] for field in TIMING_FIELDS):
            now = db_now()
            # Checked only when the timing changes: an older schedule can still be renamed or disabled.
            _check_min_interval(schedule, now=now)
            schedule.next_fire_at = _next_fire_at(schedule, now=now)
        payload_sent = isinstance(changes.get("job"), Mapping) and "payload" in changes["job"]
        # A change that sends no payload leaves the stored one as it is: jsonb keeps numbers
        # exactly, Python reads 0.10000000000000000001 as 0.1 (and 1e-400 as 0.0), and writing
        # that back would alter the template on a rename or a disable.
        schedule.save(update_fields=None if payload_sent else _FIELDS_BUT_PAYLOAD)
        message = _update_message(recorded, schedule)
        if message:  # saving the values it had is no change to record
            action_record(actor=actor, objects=[schedule], flag=CHANGE, message=message)
    return schedule


def schedule_delete(*, schedule_id: int, actor: Any = None) -> None:
    """Delete the schedule: it fires nothing more; its jobs stay, with ``schedule`` null. Raises ScheduleNotFound.

    ``actor`` (a User, or None for a trusted caller) must own it or be an ADMIN; the deletion is
    recorded for them (``scheduler.action_log``) in its transaction.
    """
    with transaction.atomic():
        schedule = schedule_visible_to(actor=actor).select_for_update().filter(id=schedule_id).first()
        if schedule is None:
            raise ScheduleNotFound()
        action_record(actor=actor, objects=[schedule], flag=DELETION, message=f"Deleted: {_summary(schedule)}.")
        schedule.delete()


class ScheduleTemplate(Protocol):
    """What a fire reads from its schedule: a ``CronSchedule``, or the cron firer's row of its columns."""

    id: int
    owner_id: int | None
    name: str
    job_type: str
    job_priority: int
    job_queue: str
    job_max_retries: int
    job_timeout_seconds: int


def schedule_job(
    schedule: ScheduleTemplate, *, payload: Any, fire_time: dt.datetime, scheduled_at: dt.datetime | None
) -> NewJob:
    """Return the job row one fire of ``schedule`` creates (for ``lifecycle.create_jobs``): the one builder.

    The cron firer (``maintenance.cron_firer``, ``scheduled_at`` = the fire time) and
    ``schedule_trigger`` (``scheduled_at`` None: due now) both build fires here. ``payload`` is
    the decoded job payload (the firer decodes a text shared by many schedules once). The job
    carries ``schedule`` and ``fire_time``: the unique (schedule, fire_time) makes a fire once.
    """
    return NewJob(
        id=new_job_id(),
        owner_id=schedule.owner_id,
        name=schedule.name,
        type=schedule.job_type,
        payload=payload,
        priority=schedule.job_priority,
        queue=schedule.job_queue,
        scheduled_at=scheduled_at,
        max_retries=schedule.job_max_retries,
        timeout_seconds=schedule.job_timeout_seconds,
        schedule_id=schedule.id,
        fire_time=fire_time,
    )


def schedule_trigger(*, schedule_id: int, actor: Any = None) -> Job:
    """Fire the schedule now, once, outside its timetable; return the job.

    The job carries ``schedule`` and ``fire_time`` = the database's now. It works on a disabled
    schedule too and ignores the overlap policy (an explicit request), and it leaves
    ``next_fire_at`` alone. A new fire is recorded for ``actor`` (``scheduler.action_log``) in its
    transaction. Raises ScheduleNotFound, and InvalidSchedule when its stored payload cannot be read
    (``core.stored_json.UnreadableJSON``).
    """
    with transaction.atomic():
        schedule = schedule_visible_to(actor=actor).filter(id=schedule_id).first()
        if schedule is None:
            raise ScheduleNotFound()
        if isinstance(schedule.job_payload, UnreadableJSON):  # a row edited by hand: as the cron firer, no fire
            message = f"The stored payload {schedule.job_payload}: it cannot fire until job.payload is replaced."
            raise InvalidSchedule(message, details={"job": {"payload": [message]}})
        now = db_now()
        new = schedule_job(schedule, payload=schedule.job_payload, fire_time=now, scheduled_at=None)
        created = lifecycle.create_jobs([new])
        tracing.attach_current(created)  # the requesting trace travels with the job
        if not created:  # a fire at this very microsecond exists already: that one is the answer
            return Job.objects.get(schedule_id=schedule.id, fire_time=now)
        if created[0][1] == JobStatus.QUEUED:
            notify_queued([schedule.job_queue])
        CronSchedule.objects.filter(id=schedule.id).update(last_fired_at=now)
        action_record(actor=actor, objects=[schedule], flag=CHANGE, message=f"Triggered now: job {new.id}.")
    logger.info("schedule %s triggered", schedule.id, extra={"schedule_id": schedule.id, "job_id": str(new.id)})
    return Job.objects.get(id=new.id)


def schedule_preview(
    *,
    cron: str | None = None,
    interval_seconds: int | None = None,
    timezone: str = "UTC",
    start: dt.datetime | None = None,
    count: int = NEXT_FIRE_TIMES,
) -> list[dt.datetime]:
    """Return the ``count`` (1-100) fire times that follow ``start`` (default: now), in UTC.

    Exactly one of ``cron`` and ``interval_seconds``; an interval previews ``start + k *
    interval``. Raises InvalidSchedule for a bad expression, zone, interval or count, and for a
    cron expression that never fires after now (February 30th), as creating it would. A list
    cut short by year 9999 is no error.
    """
    if (cron is None) == (interval_seconds is None):
        raise _invalid("cron", ONE_TIMING)
    if (
        isinstance(count, bool)
        or not isinstance(count, int)
        or not (PREVIEW_COUNT_RANGE[0] <= count <= PREVIEW_COUNT_RANGE[1])
    ):
        raise _invalid("count", "An integer from 1 to 100.")
    if start is None:
        start = db_now()
    elif start.tzinfo is None:
        raise _invalid("start", "Must carry a time zone offset.")
    zone_for(timezone)
    spec = spec_of(cron=cron, interval_seconds=interval_seconds, timezone=timezone, anchor=start)
    times = fire_times(spec, start=start, count=count)
    # An empty list after a start near year 9999 is a real answer; only the create rule's test
    # (no fire after now: _next_fire_at) makes it the create's 400.
    if not times and cron is not None and spec.next_after(db_now()) is None:
        raise _invalid("cron", NEVER_FIRES)
    return times
