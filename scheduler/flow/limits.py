"""Limits: what they are, where they come from (settings, handlers, the database) and how they are validated.

A ``Limit`` caps the jobs of one queue or one job type, across every worker on every host:
``concurrency`` (RUNNING at once), ``partition_key`` + ``partition_concurrency`` (RUNNING at
once per distinct value of a payload field), ``rate_limit`` per ``rate_period_seconds``
(claims in any sliding window of that length). Sources, later winning over earlier for the
same (scope, name): a handler's ``@handler(concurrency=..., rate_limit=...)``, then
``SCHEDULER["FLOW_LIMITS"]``, then a ``FlowLimit`` row (API and console, ADMIN only).
Enforced by ``scheduler.flow.claim``; shapes of the API in ``scheduler.api.flow``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.contrib.admin.models import ADDITION, CHANGE, DELETION
from django.db import transaction

from core.parsers import is_json_number, json_integer, json_type_name
from scheduler.action_log import action_record, changes_text, value_text
from scheduler.exceptions import InvalidLimit
from scheduler.flow.models import FlowLimit, LimitScope

logger = logging.getLogger(__name__)

CACHE_SECONDS = 1.0  # seconds a process reuses the database's limits before reading them again
MAX_LIMIT = 1_000_000  # the largest concurrency or rate count accepted
MAX_PERIOD_SECONDS = 86_400.0  # a rate window of at most a day
MIN_PERIOD_SECONDS = 0.1
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}\Z")  # a queue name (jobspec.QUEUE_NAME) or a job type
PARTITION_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}\Z")  # a top-level payload field
FIELDS = ("concurrency", "partition_key", "partition_concurrency", "rate_limit", "rate_period_seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limit:
    """One effective limit. ``key`` (``"type:EMAIL"``) names its lock and its rate window's log."""

    scope: str  # "queue" or "type"
    name: str
    concurrency: int | None = None
    partition_key: str | None = None
    partition_concurrency: int | None = None
    rate_limit: int | None = None
    rate_period_seconds: float | None = None
    source: str = "settings"  # "handler", "settings" or "database"

    @property
    def key(self) -> str:
        """``"<scope>:<name>"``: the advisory lock's and the admission log's name."""
        return f"{self.scope}:{self.name}"

    def as_dict(self) -> dict[str, Any]:
        """The limit as JSON (the API's shape), ``key`` included."""
        return {**asdict(self), "key": self.key}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LIMIT


def validated(data: Mapping[str, Any], *, scope: str, name: str, source: str = "database") -> Limit:
    """Return the ``Limit`` that ``data`` (the API's JSON object) describes for (``scope``, ``name``).

    ``data`` may hold ``concurrency`` (1 to 1,000,000), ``partition_key`` (a top-level payload
    field name) with ``partition_concurrency`` (1 to 1,000,000, default 1), ``rate_limit``
    (1 to 1,000,000) with ``rate_period_seconds`` (0.1 to 86,400); null or absent means unset.
    At least one of concurrency, partition or rate must be set. A count given another JSON type
    is refused as the API's serializers refuse it (``An integer is expected, not a string.``);
    ``5.0`` is 5. Raises ``InvalidLimit`` (400) with a per-field ``details`` map for anything
    else, unknown fields included.
    """
    errors: dict[str, list[str]] = {}
    if not isinstance(data, Mapping):
        raise InvalidLimit("A limit is a JSON object.", details={"non_field_errors": ["Expected a JSON object."]})
    if scope not in LimitScope.values:
        errors["scope"] = ["Must be queue or type."]
    if not isinstance(name, str) or not NAME.match(name):
        errors["name"] = ["1-100 characters: letters, digits, '_', '.', ':' or '-'."]
    unknown = sorted(str(k) for k in data if k not in FIELDS)
    if unknown:
        errors["non_field_errors"] = [f"Unknown fields: {', '.join(unknown)[:200]}."]
    values = {f: data.get(f) for f in FIELDS}
    for field in ("concurrency", "partition_concurrency", "rate_limit"):
        value, problem = json_integer(values[field])  # 5.0 is 5, as the API's other integer fields read it
        values[field] = value
        if problem is not None:
            errors[field] = [problem]
        elif value is not None and not _positive_int(value):
            errors[field] = [f"Must be a whole number from 1 to {MAX_LIMIT}, or null."]
    key = values["partition_key"]
    if key is not None and not isinstance(key, str):
        errors["partition_key"] = [f"A string is expected, not {json_type_name(key)}."]
    elif key is not None and not PARTITION_KEY.match(key):
        errors["partition_key"] = ["A payload field name: a letter or '_', then letters, digits or '_' (1-100)."]
    if values["partition_concurrency"] is not None and key is None:
        errors["partition_concurrency"] = ["Needs partition_key."]
    period = values["rate_period_seconds"]
    if period is not None and not is_json_number(period):
        errors["rate_period_seconds"] = [f"A number is expected, not {json_type_name(period)}."]
    elif period is not None and not MIN_PERIOD_SECONDS <= period <= MAX_PERIOD_SECONDS:
        errors["rate_period_seconds"] = [
            f"Must be a number of seconds from {MIN_PERIOD_SECONDS} to {MAX_PERIOD_SECONDS:g}."
        ]
    if (values["rate_limit"] is None) != (period is None) and "rate_period_seconds" not in errors:
        errors.setdefault("rate_limit", []).append("rate_limit and rate_period_seconds go together.")
    if values["concurrency"] is None and key is None and values["rate_limit"] is None and not errors:
        errors["non_field_errors"] = ["Set at least one of concurrency, partition_key or rate_limit."]
    if errors:
        raise InvalidLimit(next(iter(errors.values()))[0], details=errors)
    return Limit(
        scope=scope,
        name=name,
        concurrency=values["concurrency"],
        partition_key=key,
        partition_concurrency=(values["partition_concurrency"] or 1) if key else None,
        rate_limit=values["rate_limit"],
        rate_period_seconds=float(period) if period is not None else None,
        source=source,
    )


def _valid_or_logged(data: Mapping[str, Any], *, scope: str, name: str, source: str) -> Limit | None:
    # One bad entry (a row edited by hand, a typo in settings) is logged and skipped, never fatal:
    # the claim path must go on with the others.
    try:
        return validated(data, scope=scope, name=name, source=source)
    except InvalidLimit as exc:
        logger.warning("flow limit %s %s from %s is invalid and ignored: %s %s", scope, name, source, exc, exc.details)
        return None


def _from_handlers() -> list[Limit]:
    from scheduler.registry import handler_limits

    found = [
        _valid_or_logged(data, scope=LimitScope.TYPE, name=name, source="handler")
        for name, data in handler_limits().items()
    ]
    return [lim for lim in found if lim is not None]


def _from_settings() -> list[Limit]:
    found = []
    for item in settings.SCHEDULER.get("FLOW_LIMITS", ()):
        item = dict(item) if isinstance(item, Mapping) else {}
        scope, name = str(item.pop("scope", "")), str(item.pop("name", ""))
        found.append(_valid_or_logged(item, scope=scope, name=name, source="settings"))
    return [lim for lim in found if lim is not None]


def _from_database() -> list[Limit]:
    found = [
        _valid_or_logged({f: getattr(row, f) for f in FIELDS}, scope=row.scope, name=row.name, source="database")
        for row in FlowLimit.objects.all()
    ]
    return [lim for lim in found if lim is not None]


_cache_lock = threading.Lock()
_cache: tuple[float, object, dict[str, Limit]] | None = None


def effective_limits(*, fresh: bool = False) -> dict[str, Limit]:
    """Return every effective limit by ``key``: handlers', then settings', then the database's.

    The database part is re-read at most every ``CACHE_SECONDS`` per process (``fresh`` forces
    a read): a limit set through the API reaches every worker within about a second, as a
    paused queue does within a poll interval. An entry that does not validate (a row edited by
    hand, a typo in settings) is logged and skipped, never fatal.
    """
    global _cache
    now = time.monotonic()
    raw = settings.SCHEDULER  # a new settings dict (override_settings) is seen at once, as conf() does
    with _cache_lock:
        if not fresh and _cache is not None and now - _cache[0] < CACHE_SECONDS and _cache[1] is raw:
            return _cache[2]
    merged: dict[str, Limit] = {}
    for source in (_from_handlers, _from_settings):
        for limit in source():
            merged[limit.key] = limit
    for limit in _from_database():
        merged[limit.key] = limit
    with _cache_lock:
        _cache = (now, raw, merged)
    return merged


def forget_cache() -> None:
    """Drop this process's cached limits and claim-phase memory (tests; a service that just changed a row)."""
    global _cache
    with _cache_lock:
        _cache = None
    from scheduler.flow import claim

    claim.reset_state()


def _values_text(values: Mapping[str, Any]) -> str:
    """ "concurrency 5, rate_limit 10, rate_period_seconds 60.0": the fields that are set."""
    return ", ".join(f"{f} {value_text(v)}" for f, v in values.items() if v is not None) or "nothing"


def limit_set(*, scope: str, name: str, data: Mapping[str, Any], actor: Any = None) -> Limit:
    """Create or replace the database limit on (``scope``, ``name``) and return it (ADMIN only).

    ``data`` as ``validated``. Raises InvalidLimit (400). Workers apply it within ``CACHE_SECONDS``.
    ``actor`` (a User, or None for a trusted caller) is recorded with the old and new values
    (``scheduler.action_log``) in the write's transaction; setting the values a row already
    holds records nothing.
    """
    limit = validated(data, scope=scope, name=name)
    values = {f: getattr(limit, f) for f in FIELDS}
    with transaction.atomic():
        old = FlowLimit.objects.select_for_update().filter(scope=scope, name=name).first()
        before = {f: getattr(old, f) for f in FIELDS} if old is not None else None
        row, _ = FlowLimit.objects.update_or_create(scope=scope, name=name, defaults=values)
        if before is None:
            action_record(actor=actor, objects=[row], flag=ADDITION, message=f"Set: {_values_text(values)}.")
        elif changes_text(before, values):
            action_record(actor=actor, objects=[row], flag=CHANGE, message=f"Changed: {changes_text(before, values)}.")
    forget_cache()
    logger.info("flow limit %s set: %s", limit.key, values)
    return limit


def limit_delete(*, scope: str, name: str, actor: Any = None) -> bool:
    """Delete the database limit on (``scope``, ``name``); return whether one existed.

    A handler's or the settings' limit on the same name applies again. ``actor`` (a User, or None
    for a trusted caller) is recorded with the values removed (``scheduler.action_log``) in the
    delete's transaction. Raises InvalidLimit for a bad scope or name.
    """
    if scope not in LimitScope.values or not isinstance(name, str) or not NAME.match(name):
        raise InvalidLimit("No such limit scope or name.", details={"name": ["Not a valid scope or name."]})
    with transaction.atomic():
        rows = list(FlowLimit.objects.select_for_update().filter(scope=scope, name=name))
        for row in rows:  # at most one (unique scope and name)
            removed = _values_text({f: getattr(row, f) for f in FIELDS})
            action_record(actor=actor, objects=[row], flag=DELETION, message=f"Removed (was {removed}).")
        deleted, _ = FlowLimit.objects.filter(scope=scope, name=name).delete()
    forget_cache()
    return bool(deleted)
