"""The validated job spec: the rules every job's fields meet, whether enqueued or templated by a schedule."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from core.parsers import MAX_INT_DIGITS, SURROGATE_MESSAGE, has_long_integer, has_nul, is_storable_text, json_depth
from scheduler.conf import conf
from scheduler.exceptions import InvalidJob, PayloadTooLarge
from scheduler.models import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_SECONDS
from scheduler.registry import get_handler, resolve

# MAX_RETRIES_RANGE and TIMEOUT_RANGE live in states (one source: @handler checks its defaults
# against them, and registry cannot import this module, which imports it); the API's serializers
# and the pages' forms import them from here.
from scheduler.states import MAX_RETRIES_RANGE, PRIORITY_MAX, PRIORITY_MIN, TIMEOUT_RANGE, Priority, priority_value

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}\Z")  # \Z: "$" also matches before a final newline
MAX_PAYLOAD_DEPTH = 32  # levels of nested lists/objects in a payload (handlers and pages walk it)
NAME_MAX = 200  # characters of a job's name
# ``payload_json``'s encoder, made once: ``json.dumps`` with options builds one per call. It holds
# only its options, so threads share it.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What validation settles of a job's fields: its priority as an integer, and its retry and timeout budget."""

    priority: int  # -100..100, higher first
    max_retries: int  # 0..10 (0 for trusted code only)
    timeout_seconds: int  # 1..3600
    payload_json: str  # the payload as compact JSON text, encoded once here for the INSERT to send as it is


def job_spec_validate(
    *,
    type_: str,
    payload: Any,
    priority: str | int,
    queue: str,
    scheduled_at: dt.datetime | None,
    max_retries: int | None,
    timeout_seconds: int | None,
    name: str,
    trusted: bool = False,
) -> JobSpec:
    """Check a job's fields and return its ``JobSpec``; ``max_retries``/``timeout_seconds`` None take the handler's.

    ``type_`` must name a ``@handler`` (``trusted`` project code may also name a Django task
    path: ``registry.resolve``); ``payload`` JSON of at most ``SCHEDULER["MAX_PAYLOAD_BYTES"]``
    (``payload_json``); ``priority`` HIGH/MEDIUM/LOW or an integer from -100 to 100;
    ``max_retries`` 1-10 (0-10 when ``trusted``) and ``timeout_seconds`` 1-3600, defaulting to
    the handler's, then 3 and 300; ``queue`` 1-100 of letters, digits and ``_.:-``;
    ``scheduled_at`` aware or None; ``name`` at most 200 characters of valid Unicode.
    Raises UnknownJobType, PayloadTooLarge (413), or InvalidJob (400) with per-field details.
    """
    # Only trusted code may name a type that is not a @handler (a Django task path): a user's
    # request choosing which of the project's functions to call, with what, is the hole it closes.
    spec = resolve(type_) if trusted else get_handler(type_)
    text, size = payload_json(payload)
    limit = conf().max_payload_bytes
    if size > limit:
        raise PayloadTooLarge(
            f"payload is {size} bytes; the limit is {limit} bytes", details={"payload": [f"At most {limit} bytes."]}
        )
    errors: dict[str, list[str]] = {}
    if max_retries is None:
        max_retries = spec.max_retries if spec.max_retries is not None else DEFAULT_MAX_RETRIES
    if timeout_seconds is None:
        timeout_seconds = spec.timeout_seconds if spec.timeout_seconds is not None else DEFAULT_TIMEOUT_SECONDS
    if not _is_int_in(max_retries, (0, MAX_RETRIES_RANGE[1]) if trusted else MAX_RETRIES_RANGE):
        errors["max_retries"] = [f"Must be an integer from {MAX_RETRIES_RANGE[0]} to {MAX_RETRIES_RANGE[1]}."]
    if not _is_int_in(timeout_seconds, TIMEOUT_RANGE):
        errors["timeout_seconds"] = [f"Must be an integer from {TIMEOUT_RANGE[0]} to {TIMEOUT_RANGE[1]}."]
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        errors["queue"] = ["1-100 characters: letters, digits, '_', '.', ':' or '-'."]
    if scheduled_at is not None and (not isinstance(scheduled_at, dt.datetime) or timezone.is_naive(scheduled_at)):
        errors["scheduled_at"] = ["Must be a datetime with a time zone offset."]
    elif scheduled_at is not None and not _in_utc_range(scheduled_at):
        errors["scheduled_at"] = ["Must be from 0001-01-01 to 9999-12-31 23:59:59 in UTC."]
    if not isinstance(name, str) or len(name) > NAME_MAX or not is_storable_text(name):
        errors["name"] = ["At most 200 characters of valid Unicode, without U+0000."]
    if errors:
        raise InvalidJob(next(iter(errors.values()))[0], details=errors)
    return JobSpec(
        priority=_priority_value(priority), max_retries=max_retries, timeout_seconds=timeout_seconds, payload_json=text
    )


def _priority_value(priority: str | int | Priority) -> int:
    try:
        return priority_value(priority)
    except ValueError as exc:
        message = f"Must be HIGH, MEDIUM, LOW or a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
        raise InvalidJob(str(exc), details={"priority": [message]}) from None


def _in_utc_range(when: dt.datetime) -> bool:
    # 9999-12-31 23:00-05:00 is in year 10000 in UTC: no datetime (nor psycopg) can hold it.
    try:
        when.astimezone(dt.UTC)
    except OverflowError:
        return False
    return True


def _is_int_in(value: Any, bounds: tuple[int, int]) -> bool:
    # bool is an int subclass; True must not pass for 1.
    return isinstance(value, int) and not isinstance(value, bool) and bounds[0] <= value <= bounds[1]


def payload_json(payload: Any) -> tuple[str, int]:
    """Return ``payload`` as compact JSON text (``,``/``:`` separators, non-ASCII kept) and its size in UTF-8 bytes.

    The text is what the job row stores (``JobSpec.payload_json``). Raises InvalidJob when
    ``payload`` is no JSON (NaN included), nests deeper than ``MAX_PAYLOAD_DEPTH``, holds a
    string PostgreSQL cannot store (U+0000, a lone UTF-16 surrogate), or an integer of more than
    ``core.parsers.MAX_INT_DIGITS`` digits, which a process that lifted Python's digit limit can
    write but no worker can read back (it failed every claim that met it). The deep walks run only
    when the text allows the fault: JSON writes U+0000 as the escape ``\\u0000`` and opens each
    level with ``[`` or ``{``, so a text with no such escape, or fewer brackets than the limit,
    cannot hold one.
    """
    too_deep = InvalidJob(
        f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels",
        details={"payload": [f"At most {MAX_PAYLOAD_DEPTH} levels of nesting."]},
    )
    try:
        text = _encode(payload)
    except RecursionError:  # thousands of levels: deeper than the encoder's stack, far past the limit
        raise too_deep from None
    except (TypeError, ValueError) as exc:
        raise InvalidJob("payload must be JSON", details={"payload": [str(exc)]}) from exc
    if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH and json_depth(payload) > MAX_PAYLOAD_DEPTH:
        raise too_deep
    if has_long_integer(text, payload):
        message = f"No integer of more than {MAX_INT_DIGITS} digits."
        raise InvalidJob(
            f"payload holds an integer of more than {MAX_INT_DIGITS} digits", details={"payload": [message]}
        )
    if "\\u0000" in text and has_nul(payload):
        # PostgreSQL's jsonb (and text) cannot hold U+0000.
        raise InvalidJob("payload must not contain U+0000", details={"payload": ["Must not contain U+0000."]})
    try:
        return text, len(text.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800"): no UTF-8 can hold it
        raise InvalidJob(SURROGATE_MESSAGE, details={"payload": [SURROGATE_MESSAGE]}) from exc
