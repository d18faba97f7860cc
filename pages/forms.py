"""Forms of the user pages: they check shapes and types; the services check the rules.

A form turns text into the values a service takes (JSON payloads, aware datetimes, choices);
the service's own validation (``scheduler.jobspec``, ``scheduler.schedules``) is the authority,
and its errors are put back on the form's fields by ``errors_onto_form``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django import forms
from django.contrib.auth.validators import UnicodeUsernameValidator

from accounts.models import User
from core.parsers import json_text_load
from core.stored_json import UnreadableJSON
from scheduler.cron import MAX_INTERVAL_SECONDS, MISFIRE_POLICIES
from scheduler.exceptions import StintError
from scheduler.job_search import JobSearchField
from scheduler.jobspec import MAX_RETRIES_RANGE, TIMEOUT_RANGE
from scheduler.models import DEFAULT_QUEUE, CronSchedule, OverlapPolicy
from scheduler.registry import registered_types
from scheduler.states import JobStatus, Priority, priority_label

PRIORITY_CHOICES = [(p.name, p.name) for p in Priority]
PAYLOAD_ROWS = 5
# Error codes whose ``details`` are {field: [messages]} (DESIGN.md error envelope).
FIELD_ERROR_CODES = frozenset({"validation_error", "payload_too_large"})


def _type_choices() -> list[tuple[str, str]]:
    return [(t, t) for t in registered_types()]


class DateTimeLocalInput(forms.DateTimeInput):
    """``<input type="datetime-local">``; the value is read as UTC (the label says so)."""

    input_type = "datetime-local"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M", **kwargs)


class JSONTextField(forms.CharField):
    """A textarea holding any JSON value; cleans to the parsed value."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": PAYLOAD_ROWS, "spellcheck": "false"}))
        super().__init__(**kwargs)

    #: A stored value Python cannot read (``UnreadableJSON``), shown as its "(cannot be read: why)"
    #: text: that text sent back unchanged cleans to it, so saving the form as shown keeps it.
    kept: UnreadableJSON | None = None

    def clean(self, value: Any) -> Any:
        """Parse the text as JSON (``core.parsers.json_text_load``); empty means ``{}``; ``kept``'s text is it."""
        text = super().clean(value)
        if self.kept is not None and text and text.strip() == str(self.kept):
            return self.kept
        if not text or not text.strip():
            return {}
        try:
            return json_text_load(text)
        except ValueError as exc:  # bad syntax, nesting, a lone surrogate, a 5,000-digit number
            raise forms.ValidationError(str(exc)) from exc


def errors_onto_form(form: forms.Form, exc: StintError, *, prefix_map: dict[str, str] | None = None) -> None:
    """Put a service error on the form: its message at the top, a validation error's details on their fields.

    ``details`` of a domain error is ``{field: [messages]}``, possibly nested one level
    (``{"job": {"type": [...]}}``); ``prefix_map`` maps a nested group to a form-field prefix
    (``{"job": "job_"}``). Anything that names no form field goes to the non-field errors.
    """
    form.add_error(None, str(exc))
    if exc.code not in FIELD_ERROR_CODES:
        return  # e.g. idempotency_conflict: its details name the key, they are no message
    details = exc.details if isinstance(exc.details, dict) else {}
    for key, value in details.items():
        if isinstance(value, dict):
            prefix = (prefix_map or {}).get(key, f"{key}_")
            for inner, messages in value.items():
                _add(form, f"{prefix}{inner}", messages)
        else:
            _add(form, key, value)


def _add(form: forms.Form, field: str, messages: Any) -> bool:
    if field not in form.fields:
        return False
    for message in messages if isinstance(messages, list | tuple) else [messages]:
        form.add_error(field, str(message))
    return True


class RegisterForm(forms.Form):
    """Create an account: username, optional email, password twice."""

    username = forms.CharField(
        max_length=150,
        validators=[UnicodeUsernameValidator()],
        help_text="Letters, digits and @ . + - _ only; at most 150 characters.",
        widget=forms.TextInput(attrs={"autocomplete": "username", "autofocus": True}),
    )
    email = forms.EmailField(required=False, widget=forms.EmailInput(attrs={"autocomplete": "email"}))
    password1 = forms.CharField(
        label="Password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="At least 8 characters, not all digits, not a common password.",
    )
    password2 = forms.CharField(
        label="Password again",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean_username(self) -> str:
        """Refuse a taken name (case-insensitively, as people read names)."""
        username = self.cleaned_data["username"]
        if User.objects.filter(username__iexact=username).exists():
            raise forms.ValidationError("That username is taken.")
        return username

    def clean(self) -> dict[str, Any]:
        """Both passwords must match."""
        data = super().clean()
        if data.get("password1") and data.get("password2") and data["password1"] != data["password2"]:
            self.add_error("password2", "The two passwords differ.")
        return data


class JobFilterForm(forms.Form):
    """Filters of the my-jobs list (all optional; an invalid value is shown, not ignored)."""

    status = forms.ChoiceField(choices=[("", "any status"), *JobStatus.choices], required=False)
    type = forms.ChoiceField(choices=(), required=False)
    priority = forms.ChoiceField(choices=[("", "any priority"), *PRIORITY_CHOICES], required=False)
    queue = forms.CharField(max_length=100, required=False)
    search = JobSearchField(
        help_text=(
            "An id (8+ hex digits from either end), an idempotency key, or part of the name, type or last error; "
            'args.customer:42 (a payload value), error:"timed out" (the last error).'
        ),
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "name, args.customer:42, error:timeout"}),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["type"].choices = [("", "any type"), *_type_choices()]


class JobForm(forms.Form):
    """A new job: the fields of POST /api/jobs, as a form."""

    name = forms.CharField(max_length=200, required=False, help_text="Optional, for you to recognize it.")
    type = forms.ChoiceField(choices=(), help_text="The handler that runs it.")
    payload = JSONTextField(
        required=False,
        initial="{}",
        help_text='JSON, at most 10 KB. DEMO_TASK takes e.g. {"sleep_seconds": 1, "result": "hi"}.',
    )
    priority = forms.ChoiceField(choices=PRIORITY_CHOICES, initial=Priority.MEDIUM.name)
    queue = forms.CharField(max_length=100, initial=DEFAULT_QUEUE)
    scheduled_at = forms.DateTimeField(
        label="Run at (UTC)",
        required=False,
        widget=DateTimeLocalInput(),
        help_text="Leave empty to run as soon as a worker is free.",
    )
    max_retries = forms.IntegerField(
        min_value=MAX_RETRIES_RANGE[0],
        max_value=MAX_RETRIES_RANGE[1],
        required=False,
        help_text="1-10; empty: the type's default (3).",
    )
    timeout_seconds = forms.IntegerField(
        min_value=TIMEOUT_RANGE[0],
        max_value=TIMEOUT_RANGE[1],
        required=False,
        help_text="1-3600 seconds; empty: the type's default (300).",
    )
    idempotency_key = forms.CharField(
        max_length=255,
        required=False,
        help_text="Optional. Sending the same job again with the same key creates nothing new.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["type"].choices = _type_choices()

    def clean_scheduled_at(self) -> dt.datetime | None:
        """Read a time without an offset as UTC (the label says UTC)."""
        value = self.cleaned_data.get("scheduled_at")
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value

    def service_kwargs(self) -> dict[str, Any]:
        """Return the keyword arguments of ``scheduler.enqueuing.enqueue_request`` (besides the owner)."""
        data = self.cleaned_data
        return {
            "type_": data["type"],
            "payload": data["payload"],
            "priority": data["priority"],
            "queue": data["queue"],
            "scheduled_at": data["scheduled_at"],
            "max_retries": data["max_retries"],
            "timeout_seconds": data["timeout_seconds"],
            "idempotency_key": data["idempotency_key"] or None,
            "name": data["name"],
        }


class ScheduleForm(forms.Form):
    """A schedule: cron or interval, zone, policies and the job it fires."""

    KIND_CRON = "cron"
    KIND_INTERVAL = "interval"

    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(
        label="Repeat by",
        choices=[(KIND_CRON, "cron expression"), (KIND_INTERVAL, "fixed interval")],
        initial=KIND_CRON,
        widget=forms.RadioSelect,
    )
    cron = forms.CharField(
        label="Cron expression",
        max_length=200,
        required=False,
        help_text="5 fields (minute hour day-of-month month day-of-week), or @hourly, @daily, @weekly...",
    )
    interval_seconds = forms.IntegerField(
        label="Interval (seconds)", min_value=1, max_value=MAX_INTERVAL_SECONDS, required=False
    )
    timezone = forms.CharField(
        max_length=64, initial="UTC", help_text="IANA time zone, e.g. UTC, Europe/London, America/New_York."
    )
    enabled = forms.BooleanField(required=False, initial=True)
    misfire_policy = forms.ChoiceField(
        choices=[(p, p) for p in MISFIRE_POLICIES],
        initial=MISFIRE_POLICIES[0],
        help_text="What to fire for times missed while no scheduler ran: the latest once (skip), all, or none.",
    )
    overlap_policy = forms.ChoiceField(
        choices=OverlapPolicy.choices,
        initial=OverlapPolicy.ALLOW,
        help_text="skip: do not fire while the previous fire's job is unfinished.",
    )
    job_type = forms.ChoiceField(label="Job type", choices=())
    job_payload = JSONTextField(label="Job payload", required=False, initial="{}", help_text="JSON, at most 10 KB.")
    job_priority = forms.ChoiceField(label="Job priority", choices=PRIORITY_CHOICES, initial=Priority.MEDIUM.name)
    job_queue = forms.CharField(label="Job queue", max_length=100, initial=DEFAULT_QUEUE)
    job_max_retries = forms.IntegerField(
        label="Job max retries", min_value=MAX_RETRIES_RANGE[0], max_value=MAX_RETRIES_RANGE[1], required=False
    )
    job_timeout_seconds = forms.IntegerField(
        label="Job timeout (seconds)", min_value=TIMEOUT_RANGE[0], max_value=TIMEOUT_RANGE[1], required=False
    )

    #: The job template's fields besides its payload, as the form names them.
    JOB_FIELDS = ("job_type", "job_priority", "job_queue", "job_max_retries", "job_timeout_seconds")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["job_type"].choices = _type_choices()
        stored = self.initial.get("job_payload")
        if isinstance(stored, UnreadableJSON):
            self.fields["job_payload"].kept = stored

    @classmethod
    def initial_from(cls, schedule: CronSchedule) -> dict[str, Any]:
        """Return the form's initial values for an existing schedule.

        A stored payload Python cannot read (``core.stored_json.UnreadableJSON``: a row edited by
        hand) shows as "(cannot be read: why)". Saved with that text unchanged, the form keeps the
        stored payload when the rest of the job is unchanged too (a rename, a disable), as the
        API's PATCH without ``job``; a change of the job with it is the service's 400 asking for a
        new payload, on the payload field.
        """
        payload = schedule.job_payload
        return {
            "name": schedule.name,
            "kind": cls.KIND_CRON if schedule.cron is not None else cls.KIND_INTERVAL,
            "cron": schedule.cron or "",
            "interval_seconds": schedule.interval_seconds,
            "timezone": schedule.timezone,
            "enabled": schedule.enabled,
            "misfire_policy": schedule.misfire_policy,
            "overlap_policy": schedule.overlap_policy,
            "job_type": schedule.job_type,
            "job_payload": payload if isinstance(payload, UnreadableJSON) else json.dumps(payload),
            "job_priority": priority_label(schedule.job_priority),
            "job_queue": schedule.job_queue,
            "job_max_retries": schedule.job_max_retries,
            "job_timeout_seconds": schedule.job_timeout_seconds,
        }

    def clean(self) -> dict[str, Any]:
        """Require the field of the chosen kind; drop the other."""
        data = super().clean()
        kind = data.get("kind")
        if kind == self.KIND_CRON:
            if not (data.get("cron") or "").strip():
                self.add_error("cron", "Give a cron expression, or choose a fixed interval.")
            data["interval_seconds"] = None
        elif kind == self.KIND_INTERVAL:
            if not data.get("interval_seconds"):
                self.add_error("interval_seconds", "Give an interval in seconds, or choose a cron expression.")
            data["cron"] = None
        return data

    def timing(self) -> dict[str, Any]:
        """Return ``cron``, ``interval_seconds`` and ``timezone`` as the schedule services take them."""
        data = self.cleaned_data
        return {
            "cron": (data.get("cron") or "").strip() or None,
            "interval_seconds": data.get("interval_seconds"),
            "timezone": data.get("timezone") or "UTC",
        }

    def service_fields(self) -> dict[str, Any]:
        """Return every writable schedule field as ``scheduler.schedules`` takes it."""
        data = self.cleaned_data
        job: dict[str, Any] = {
            "type": data["job_type"],
            "payload": data["job_payload"],
            "priority": data["job_priority"],
            "queue": data["job_queue"],
        }
        if data.get("job_max_retries") is not None:
            job["max_retries"] = data["job_max_retries"]
        if data.get("job_timeout_seconds") is not None:
            job["timeout_seconds"] = data["job_timeout_seconds"]
        fields = {
            "name": data["name"],
            **self.timing(),
            "enabled": bool(data.get("enabled")),
            "misfire_policy": data["misfire_policy"],
            "overlap_policy": data["overlap_policy"],
            "job": job,
        }
        if isinstance(job["payload"], UnreadableJSON):  # the stored one, sent back as shown
            del job["payload"]  # a change of the rest of the job: the service asks for a new payload
            if not any(name in self.changed_data for name in self.JOB_FIELDS):
                del fields["job"]  # the job unchanged: the stored template stays as it is
        return fields
