"""Request and response shapes of the jobs API (DESIGN.md, "Field names"); validation only, no logic."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.serializers import StrictSerializer
from core.stored_json import UnreadableJSON
from scheduler.exceptions import UnknownJobType
from scheduler.jobspec import MAX_RETRIES_RANGE, QUEUE_NAME, TIMEOUT_RANGE
from scheduler.models import DEFAULT_QUEUE, Attempt, Job
from scheduler.registry import get_handler
from scheduler.selectors import Cancellation, job_cancellation
from scheduler.states import AttemptStatus, JobStatus, Priority


def _named_enum(name: str, choices: list[str]) -> Any:
    # Several models have a ``status``: give each choice set its own schema component name.
    return extend_schema_field({"type": "string", "enum": choices}, component_name=name)


@_named_enum("JobStatus", JobStatus.values)
class JobStatusField(serializers.ChoiceField):
    """A job's status (read only)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=JobStatus.choices, read_only=True, **kwargs)


@_named_enum("AttemptStatus", AttemptStatus.values)
class AttemptStatusField(serializers.ChoiceField):
    """An attempt's or result's status (read only)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=AttemptStatus.choices, read_only=True, **kwargs)


@_named_enum("Priority", Priority.names)
class PriorityNameField(serializers.ChoiceField):
    """HIGH, MEDIUM or LOW; anything else is a 400 that names them."""

    default_error_messages = {"invalid_choice": '"{input}" is not a priority: send HIGH, MEDIUM or LOW.'}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=Priority.names, **kwargs)


@extend_schema_field(
    {
        "type": "string",
        "pattern": r"^(HIGH|MEDIUM|LOW|-?[0-9]{1,3})$",
        "description": "HIGH, MEDIUM or LOW; a job created from Python code (e.g. a Django task) with a priority"
        " between the named points reads as that integer, as a string: '37', '-5' (scale -100..100,"
        " higher first; HIGH = 50, MEDIUM = 0, LOW = -50).",
    }
)
class PriorityLabelField(serializers.CharField):
    """A stored priority as it reads back (``states.priority_label``): a name, or the integer as a string."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(read_only=True, **kwargs)


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime that must carry its UTC offset: a naive one is refused, not assumed UTC."""

    default_error_messages = {"naive": "Must carry a time zone offset, e.g. 2030-01-01T09:00:00+00:00."}

    def to_internal_value(self, value: Any) -> dt.datetime:
        """Refuse naive input, then parse as DRF does (the result is aware, in the current zone)."""
        parsed = value
        if isinstance(value, str):
            try:
                parsed = parse_datetime(value)
            except ValueError:
                parsed = None  # not a datetime at all: DRF's own message says so
        if isinstance(parsed, dt.datetime) and timezone.is_naive(parsed):
            self.fail("naive")
        return super().to_internal_value(value)


UNREADABLE_NOTE = (
    ' Null, and named with why in an extra `unreadable` object of this object ({"payload": "it holds a number'
    ' of more than 4300 digits"}, present only then), when the stored value cannot be read: a row edited by hand'
    " to a number past 4,300 digits or nesting past Python's limit, which PostgreSQL's jsonb holds."
)


class StoredJSONField(serializers.JSONField):
    """A stored JSON value, read only; one Python cannot read (``core.stored_json.UnreadableJSON``) shows as null.

    Its serializer (``ReportsUnreadable``) names it, with why, under ``unreadable``.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs["help_text"] = kwargs.get("help_text", "") + UNREADABLE_NOTE
        super().__init__(read_only=True, **kwargs)

    def to_representation(self, value: Any) -> Any:
        """The value, or None for an ``UnreadableJSON``."""
        return None if isinstance(value, UnreadableJSON) else super().to_representation(value)


def unreadable_fields(instance: Any, fields: dict[str, str]) -> dict[str, str] | None:
    """The fields (API name: attribute of ``instance``) whose value is an ``UnreadableJSON``, with why; None if none."""
    values = {name: getattr(instance, attr) for name, attr in fields.items()}
    found = {name: value.why for name, value in values.items() if isinstance(value, UnreadableJSON)}
    return found or None


class ReportsUnreadable:
    """Serializer mixin: ``unreadable`` (API name: why) is added only when a stored JSON field cannot be read.

    Only then: the documented shapes (DESIGN.md) stay exact for every readable row, and a
    schedule's job template read back can be sent back as it is (its serializer refuses unknown
    fields). ``unreadable_sources`` maps each API name to the instance attribute it reads.
    """

    unreadable_sources: ClassVar[dict[str, str]] = {}

    def to_representation(self, instance: Any) -> Any:
        """The representation, with ``unreadable`` when ``unreadable_fields`` finds any."""
        data = super().to_representation(instance)  # type: ignore[misc]
        found = unreadable_fields(instance, self.unreadable_sources)
        if found:
            data["unreadable"] = found
        return data


class JobFieldsSerializer(StrictSerializer):
    """The job fields of DESIGN.md that a job request and a schedule's job template share."""

    type = serializers.CharField(max_length=100, help_text="A registered handler name, e.g. DEMO_TASK.")
    payload = serializers.JSONField(allow_null=True, default=dict, help_text="Any JSON value, at most 10 KB.")
    priority = PriorityNameField(default=Priority.MEDIUM.name)
    queue = serializers.RegexField(
        QUEUE_NAME,
        max_length=100,
        default=DEFAULT_QUEUE,
        error_messages={"invalid": "1-100 characters: letters, digits, '_', '.', ':' or '-'."},
    )
    max_retries = serializers.IntegerField(
        min_value=MAX_RETRIES_RANGE[0], max_value=MAX_RETRIES_RANGE[1], required=False
    )
    timeout_seconds = serializers.IntegerField(min_value=TIMEOUT_RANGE[0], max_value=TIMEOUT_RANGE[1], required=False)


class JobCreateSerializer(JobFieldsSerializer):
    """Body of POST /api/jobs. Any other key (``status``, ``owner``, ``attempts``, lease fields...) is a 400.

    ``max_retries`` and ``timeout_seconds`` left out take the handler's defaults, then 3 and 300.
    The payload's 10 KB limit (413) is the service's to enforce: it is one rule for every caller.
    """

    name = serializers.CharField(max_length=200, allow_blank=True, default="")
    scheduled_at = AwareDateTimeField(
        allow_null=True, default=None, help_text="ISO 8601 with offset; null or past runs now."
    )
    unique = serializers.JSONField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Unique job: {keys: [payload fields], period: seconds, states: [statuses]}. A live duplicate "
        "is returned with 200 and `Unique-Duplicate: true` instead of a new job.",
    )

    def validate_type(self, value: str) -> str:
        """Refuse a type no handler is registered for."""
        try:
            get_handler(value)
        except UnknownJobType as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value


class JobSerializer(ReportsUnreadable, serializers.ModelSerializer):
    """A job as the API shows it: priority by name, owner and schedule by id."""

    status = JobStatusField()
    priority = PriorityLabelField(source="priority_name")
    owner = serializers.IntegerField(source="owner_id", read_only=True, allow_null=True)
    schedule = serializers.IntegerField(source="schedule_id", read_only=True, allow_null=True)
    payload = StoredJSONField()
    progress = StoredJSONField(help_text="The handler's last ctx.progress: {percent, message, at}; null if none.")
    waiting = serializers.SerializerMethodField()
    cancellation = serializers.SerializerMethodField()
    unreadable_sources: ClassVar[dict[str, str]] = {"payload": "payload", "progress": "progress"}

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "type",
            "payload",
            "status",
            "priority",
            "queue",
            "scheduled_at",
            "attempts",
            "max_retries",
            "timeout_seconds",
            "cancel_requested",
            "cancellation",
            "owner",
            "schedule",
            "fire_time",
            "created_at",
            "updated_at",
            "started_at",
            "finished_at",
            "last_error",
            "progress",
            "waiting",
        ]
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "Why a QUEUED job is not running yet: {code, message} (queue_paused, "
            "concurrency_limit, partition_limit, rate_limit); null otherwise.",
        }
    )
    def get_waiting(self, job: Job) -> dict[str, str] | None:
        """Why a QUEUED job waits (``scheduler.flow.explain``), else None."""
        from scheduler.flow.explain import Explainer

        if job.status != JobStatus.QUEUED:
            return None
        explainer = self.context.setdefault("flow_explainer", Explainer()) if self.context is not None else None
        return (explainer or Explainer()).reason(job)

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "What became of a requested cancellation: {code, message}, code `requested` (RUNNING: "
            "its worker stops it) or `finished_first` (it ended SUCCESS or FAILED before its handler stopped; "
            "`cancel_requested` stays true); null when none was requested or the job was CANCELLED.",
        }
    )
    def get_cancellation(self, job: Job) -> Cancellation | None:
        """What became of a requested cancellation (``scheduler.selectors.job_cancellation``), else None."""
        return job_cancellation(job)


class JobAttemptSerializer(serializers.ModelSerializer):
    """One execution of a job; ``traceback`` is the handler's Python traceback ("" when it raised none)."""

    status = AttemptStatusField()

    class Meta:
        model = Attempt
        fields = ["attempt_number", "status", "worker", "started_at", "finished_at", "error", "traceback"]
        read_only_fields = fields


class JobResultSerializer(ReportsUnreadable, serializers.Serializer):
    """The outcome of a job's latest finished attempt."""

    # Serializes a ``scheduler.models.JobResult``, a value read from the job row rather than a
    # model, so each field is declared here for the OpenAPI schema.

    status = AttemptStatusField()
    result = StoredJSONField(allow_null=True)
    attempt = serializers.IntegerField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    unreadable_sources: ClassVar[dict[str, str]] = {"result": "result"}
