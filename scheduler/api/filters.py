"""Query-string filters of the job and schedule lists (django-filter); a bad value is a 400, never ignored."""

from __future__ import annotations

import datetime as dt
import re

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from scheduler.job_search import (
    MAX_PATH_DEPTH,
    MAX_TERMS,
    SEARCH_MAX,
    JobSearch,
    JobSearchField,
    jobs_filter_by_list_search,
)
from scheduler.models import CronSchedule, Job
from scheduler.schedules import NAME_MAX
from scheduler.states import PRIORITY_MAX, PRIORITY_MIN, JobStatus, priority_value

_DECIMAL = re.compile(r"-?[0-9]{1,3}")


class PriorityField(forms.CharField):
    """A priority as the API reads it back: HIGH, MEDIUM, LOW, or a whole number from -100 to 100 ("37")."""

    def to_python(self, value: object) -> int | None:
        """Return the priority's integer (None when empty); raise ValidationError (400) otherwise."""
        text = super().to_python(value)
        if text in (None, ""):
            return None
        try:  # a name, or ASCII digits (not int()'s "1_0" or "٣"), by the rule every writer uses
            return priority_value(int(text) if _DECIMAL.fullmatch(text) else text)
        except ValueError:
            raise ValidationError(
                f"Use HIGH, MEDIUM, LOW or a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}.", code="invalid"
            ) from None


@extend_schema_field(
    {
        "type": "string",
        "description": f"HIGH, MEDIUM, LOW or a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}, as jobs read back",
    }
)
class PriorityFilter(filters.Filter):
    """Match a priority given as it reads back (``states.priority_label``): a name, or its integer."""

    field_class = PriorityField


@extend_schema_field(OpenApiTypes.INT)
class IntegerFilter(filters.NumberFilter):
    """An exact integer (NumberFilter would accept and document a decimal)."""

    field_class = forms.IntegerField


class UtcIsoDateTimeField(filters.IsoDateTimeFilter.field_class):
    """An ISO 8601 datetime converted to UTC here, so PostgreSQL never sees an offset it rejects (> 15:59)."""

    def to_python(self, value: object) -> object:
        """Parse as usual, then normalise to UTC; an instant outside datetime's range is a validation error."""
        parsed = super().to_python(value)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        try:
            return parsed.astimezone(dt.UTC)
        except OverflowError as exc:
            raise ValidationError("Enter a date/time within range.", code="invalid") from exc


class UtcIsoDateTimeFilter(filters.IsoDateTimeFilter):
    """``IsoDateTimeFilter`` whose value reaches the database in UTC."""

    field_class = UtcIsoDateTimeField


SEARCH_HELP = (
    f"At most {SEARCH_MAX} characters of space-separated terms, all of which must hold (at most {MAX_TERMS}): "
    "plain text is the job's id (full, or 8+ hex digits from either end), its exact idempotency key, or part "
    "of its name, type or last error, any case; qualifier names (`args.`, `error:`) are read in any case; "
    "`args.<key>:<value>` a payload value at a key "
    f"(`args.user.plan:pro` for a nested one, at most {MAX_PATH_DEPTH} keys; `args.customer:7` also matches "
    '"7" and [7, 8], a quoted `args.customer:"7"` only text); `error:<text>` part of the last error, any '
    'case (`error:"timed out"` for text with spaces). A term that cannot be read (an unclosed quote, '
    "`args.` without a key or a value) is a 400 that says why."
)


# The schema's description is the override's: drf-spectacular reads no help_text beside one.
@extend_schema_field({"type": "string", "maxLength": SEARCH_MAX, "description": SEARCH_HELP})
class JobSearchFilter(filters.CharFilter):
    """The ``search`` parameter: ``scheduler.job_search``'s syntax, cleaned by ``JobSearchField`` to a ``JobSearch``."""

    field_class = JobSearchField


_STATUS_NAMES = ", ".join(JobStatus.values[:-1]) + " or " + JobStatus.values[-1]
# Django's "Select a valid choice" named none of them; "success" and "SUCCESS,FAILED" are the usual slips.
STATUS_INVALID = (
    f"'%(value)s' is not a status: use {_STATUS_NAMES}, in capitals;"
    " for several, repeat the parameter (status=FAILED&status=DEAD)."
)


class JobFilter(filters.FilterSet):
    """Filters of GET /api/jobs. ``created_after``/``created_before`` form a half-open range [after, before).

    ``search`` takes the console's search (``scheduler.job_search``: qualifiers, and plain text
    that is an id, an idempotency key or part of the name, type or last error, in any case), on
    the jobs the list shows (a USER's own); ``schedule`` the jobs one schedule fired
    (its id). Any other query parameter is a 400 (``core.query_params``).
    """

    status = filters.MultipleChoiceFilter(
        choices=JobStatus.choices,
        help_text="Repeat to match any of several.",
        error_messages={"invalid_choice": STATUS_INVALID},
    )
    type = filters.CharFilter(field_name="type")
    priority = PriorityFilter(field_name="priority")
    queue = filters.CharFilter(field_name="queue")
    schedule = IntegerFilter(field_name="schedule_id", help_text="Only the jobs this schedule fired (its id).")
    search = JobSearchFilter(method="filter_search", help_text=SEARCH_HELP)
    created_after = UtcIsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="Created at or after this ISO 8601 time."
    )
    created_before = UtcIsoDateTimeFilter(
        field_name="created_at", lookup_expr="lt", help_text="Created before this ISO 8601 time."
    )

    class Meta:
        model = Job
        fields = ["status", "type", "priority", "queue", "schedule", "search", "created_after", "created_before"]

    def filter_search(self, queryset: QuerySet[Job], name: str, value: JobSearch | None) -> QuerySet[Job]:
        """The jobs the parsed search finds (``job_search.jobs_filter_by_list_search``); all for a blank one."""
        if value is None:
            return queryset
        return jobs_filter_by_list_search(queryset, value)


class AdminJobFilter(JobFilter):
    """Filters of GET /api/admin/jobs: those of ``JobFilter`` plus ``owner`` (a user id)."""

    owner = IntegerFilter(field_name="owner_id", help_text="Only this user's jobs (a user id).")

    class Meta(JobFilter.Meta):
        fields = [*JobFilter.Meta.fields, "owner"]


class StrictBooleanField(forms.Field):
    """``true`` or ``false``, in any letter case; anything else is a 400.

    django-filter's own ``BooleanFilter`` reads a value it does not know (``enabled=maybe``) as no
    filter at all, and so answers the whole list.
    """

    def to_python(self, value: object) -> bool | None:
        """Return True or False (None when empty: no filter); raise ValidationError (400) otherwise."""
        if value in (None, ""):
            return None
        text = str(value).lower()
        if text not in ("true", "false"):
            raise ValidationError("Use true or false.", code="invalid")
        return text == "true"


# The schema's description is the override's: drf-spectacular reads no help_text beside one.
@extend_schema_field({"type": "boolean", "description": "`true` or `false`, in any letter case."})
class StrictBooleanFilter(filters.Filter):
    """A boolean column matched by ``true`` or ``false`` (``StrictBooleanField``)."""

    field_class = StrictBooleanField


JOB_TYPE_MAX = CronSchedule._meta.get_field("job_type").max_length  # characters


class ScheduleFilter(filters.FilterSet):
    """Filters of GET /api/schedules, on the schedules the list shows (a USER's own; an ADMIN's: all).

    ``name`` matches the whole name exactly, letter case and spaces included: a name is a label,
    not a key (README, Schedules), so it may match several schedules. A value longer than any
    stored one is a 400, as is an ``enabled`` other than true or false; any other query
    parameter is a 400 too (``core.query_params``).
    """

    name = filters.CharFilter(
        field_name="name",
        max_length=NAME_MAX,
        strip=False,
        help_text=f"Only the schedules of this exact name (at most {NAME_MAX} characters; names are not unique).",
    )
    enabled = StrictBooleanFilter(field_name="enabled")
    job_type = filters.CharFilter(
        field_name="job_type",
        max_length=JOB_TYPE_MAX,
        strip=False,
        help_text=f"Only the schedules whose job template has this type (at most {JOB_TYPE_MAX} characters).",
    )

    class Meta:
        model = CronSchedule
        fields = ["name", "enabled", "job_type"]
