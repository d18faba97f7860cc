"""Pure fire-time math for cron and interval schedules: ISC/Debian cron DST rules, misfire plans.

Nothing here reads a clock: every function takes the instant it reasons from (``now``, ``start``)
as an aware datetime and returns aware UTC datetimes.

DST follows ISC/Debian cron (``man 8 cron``). An entry whose minute or hour field starts with
``*`` (``*/15 * * * *``, ``0 * * * *``, ``@hourly``) follows real time: it fires at every instant
whose local wall time matches, so in a fall-back hour it fires in both occurrences and a wall
time that does not exist never fires. Any other entry (``30 2 * * *``) fires once per matching
local date and time: a time skipped by a spring-forward gap fires once, at the first instant
after the gap (several skipped times of one entry are that one fire), and a time repeated by a
fall-back fires only at its first occurrence. As in ISC
cron, a clock change of 3 hours or more is a correction, not DST: its skipped times never fire
and its repeated times fire twice. Interval schedules ignore wall time.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from scheduler.exceptions import InvalidSchedule

UTC = dt.UTC

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MAX_DST_ADJUST = dt.timedelta(hours=3)  # ISC cron: a clock change this large or larger is a correction
SEARCH_LIMIT = 5000  # matching wall times one next_after examines before declaring "never fires"
ENUMERATE_LIMIT = 1000  # missed fires walked one by one before a plan jumps by bisection
MAX_INTERVAL_SECONDS = 366 * 86400  # seconds
MAX_EXPRESSION_LENGTH = 200  # characters
MISFIRE_POLICIES = ("skip", "catch_up", "none")
FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
FIELD_SIZES = (60, 24, 31, 12, 7)  # values each field holds (day of week: 0-6, 7 is 0 again)
_FIELD_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ*/,-#")
_ONE_SECOND = dt.timedelta(seconds=1)

_local = threading.local()


class FireSpec(Protocol):
    """When a schedule fires: strictly increasing UTC instants."""

    def next_after(self, t: dt.datetime) -> dt.datetime | None:
        """Return the first fire time strictly after ``t`` (aware), or None if there is none."""
        ...

    def latest_before(self, t: dt.datetime, *, floor: dt.datetime) -> dt.datetime | None:
        """Return the last fire time in [``floor``, ``t``); ``floor`` must itself be a fire time."""
        ...


def zone_for(name: str) -> ZoneInfo:
    """Return the IANA zone ``name``; raise InvalidSchedule for anything else."""
    if not isinstance(name, str) or name not in _zone_names():
        raise InvalidSchedule(f"Unknown time zone {name!r}.", details={"timezone": ["Not an IANA time zone."]})
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(f"Unknown time zone {name!r}.", details={"timezone": ["Not an IANA time zone."]}) from exc


# Files in a system's zoneinfo directory that are not IANA zones: ``localtime`` is whatever the
# host is set to (two hosts could fire one schedule at different instants), ``Factory`` a
# placeholder zone, ``posixrules`` a template for POSIX TZ strings.
NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})


@lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    return frozenset((available_timezones() | {"UTC"}) - NOT_ZONES)


# The names a field may use (month 3: jan=1..., day of week 4: sun=0...), as croniter reads them.
_FIELD_NAMES: dict[int, dict[str, int]] = {
    index: {name: n for name, n in names.items() if isinstance(n, int)}
    for index, names in enumerate(croniter.ALPHACONV)
}


def _reversed_range(field: str, *, names: dict[str, int]) -> str | None:
    """Return the first range of ``field`` whose start is after its end (``5-4``, ``sat-mon``), or None.

    ISC cron refuses such a range ("bad minute"); croniter reads it as wrapping round, so
    ``5-4 * * * *`` would fire every minute. Bounds that are neither numbers nor ``names`` (``L``,
    ``#`` forms) are left to croniter's own checks.
    """
    for part in field.split(","):
        bounds = part.split("/")[0].split("-")
        if len(bounds) != 2:
            continue
        low, high = (int(b) if b.isdigit() else names.get(b.lower()) for b in bounds)
        if low is not None and high is not None and low > high:
            return part.split("/")[0]
    return None


def _collapse_single_ranges(field: str, *, names: dict[str, int]) -> str:
    """Return ``field`` with each range of one value (``5-5``, ``mon-mon``, ``5-5/2``) written as that value.

    ISC cron reads ``5-5`` as 5; croniter 7 reads it as the whole field, so ``5-5 * * * *``
    fired every minute and ``0 0 * * 7-7`` daily. A step after such a range reaches no second
    value, so it goes too. Bounds that are neither numbers nor ``names`` are left as they are.
    """
    parts = []
    for part in field.split(","):
        bounds = part.split("/")[0].split("-")
        if len(bounds) == 2:
            low, high = (int(b) if b.isdigit() else names.get(b.lower()) for b in bounds)
            if low is not None and low == high:
                part = bounds[0]
        parts.append(part)
    return ",".join(parts)


def _step_too_large(field: str, *, size: int) -> tuple[str, int] | None:
    """Return the first ``(part, step)`` of ``field`` whose step exceeds the field's ``size`` values, or None.

    Such a step reaches no second value: ``*/1000`` in the minute field is minute 0 alone and
    ``0 */99 * * *`` midnight alone, never "every 1000 minutes" or "every 99 hours" (cron cannot
    say that; ``interval_seconds`` can). Vixie cron and Celery take it silently, Oban refuses
    steps over 99; we refuse it. A step equal to the size (``*/60``, ``0 */24``) is kept: its one
    value per cycle is what it says.
    """
    for part in field.split(","):
        _, _, step = part.partition("/")
        if step.isdigit() and int(step) > size:
            return part, int(step)
    return None


def _has_star_in_list(field: str) -> bool:
    """True when ``field`` is a list one of whose elements is a bare ``*`` (``*,15``, ``1,*``)."""
    parts = field.split(",")
    return len(parts) > 1 and "*" in parts


def _star_list_problem(fields: list[str]) -> str | None:
    """Return why a new expression's list holding ``*`` is refused (``_has_star_in_list``), or None.

    ``*`` in a list is the whole field, but cron calls a field unrestricted only when it starts
    with ``*`` (``DOM_STAR``/``DOW_STAR``, ``MIN_STAR``/``HR_STAR`` in ISC cron's entry.c): ``0 0
    *,15 * 1`` is Mondays, ``0 0 15,* * 1`` every day, and ``5,* * * * *`` keeps the fixed-time DST
    rule that ``*,5`` does not. Nobody means that; a new expression says ``*`` or the values.
    """
    for index, field in enumerate(fields):
        if _has_star_in_list(field):
            return (
                f"The {FIELD_NAMES[index]} list {field!r} holds * beside other values: write * alone for every "
                "value, or only the values (cron reads such a list differently as * comes first or not)."
            )
    return None


def _widen_star_lists(fields: list[str]) -> list[str]:
    """Return ``fields`` with each list holding ``*`` written as cron reads it: ``*``, or the field's whole range.

    For a stored expression (``normalize_cron``). A list that starts with ``*`` is unrestricted
    (``*``); any other is restricted to every value (``0-59``, ``1-31``, ``0-6``...), which for
    the day fields makes ``0 0 15,* * 1`` fire every day (either day field matching), as ISC cron
    does. croniter read any list holding ``*`` as ``*``, so that one fired on Mondays only.
    """
    ranges = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
    return [
        ("*" if field.startswith("*") else "{}-{}".format(*ranges[index])) if _has_star_in_list(field) else field
        for index, field in enumerate(fields)
    ]


def _dow_start_step_problem(dow: str, *, names: dict[str, int]) -> str | None:
    """Return why a day-of-week ``start/step`` (``1/2``) is refused, or None.

    Cron has no ``start/step`` form (ISC and cronie refuse ``1/2``); croniter reads it as
    ``start-6/step``, whereas cron's day of week runs to 7, which is Sunday again: ``1/2`` would be
    Mon, Wed, Fri as croniter computes it, or Sun too as ``1-7/2``. Refused only when the two
    readings differ (``0/2``, ``6/2`` are the same either way); ``1-7/2`` says which is meant.
    """
    for part in dow.split(","):
        start, slash, step = part.partition("/")
        if not slash or "-" in start or start == "*" or not step.isdigit() or int(step) == 0:
            continue
        n = int(start) if start.isdigit() else names.get(start.lower())
        if n is None or n > 7:
            continue
        if n == 7:  # 7-7/step is Sunday alone, and croniter read 7 as 0: 7-6/step would be a reversed range
            return (
                f"{part!r} in the day of week is ambiguous (7 is Sunday too): write 7 for Sunday alone, or 0-6/{step}."
            )
        if set(range(n % 7, 7, int(step))) != {v % 7 for v in range(n, 8, int(step))}:
            return (
                f"{part!r} in the day of week is ambiguous (7 is Sunday too): write {start}-7/{step} "
                f"to include Sunday, or {start}-6/{step}."
            )
    return None


def _day_extension_problem(dom: str, dow: str) -> str | None:
    """Return why the day fields use a croniter extension that we do not compute correctly, or None.

    ``W`` (nearest weekday, Quartz) is refused: croniter moves ``31W`` to the 28th or 29th in short
    months, which no documented rule says. An nth (``1#2``) or last (``L5``) weekday is refused
    beside a day of month other than ``*``: croniter then finds no date at all (``0 0 1 * 1#2``)
    or drops the day of month (``0 0 L * L5`` fired on last Fridays only).
    """
    if "w" in dom.lower():
        return "'W' (nearest weekday) is not supported: name the days, e.g. 1-5 in the day-of-week field."
    nth = any("#" in part or part.lower().startswith("l") for part in dow.split(","))
    if nth and dom != "*":
        return (
            f"An nth or last weekday ({dow!r}) cannot be combined with a day of month ({dom!r}): "
            "use * as the day of month, or a second schedule."
        )
    return None


def normalize_cron(expression: str, *, stored: bool = False) -> str:
    """Return ``expression`` as five space-separated fields (macros expanded); raise InvalidSchedule.

    Accepts Vixie cron's 5 fields (numbers, names, ``*``, ``/``, ``,``, ``-``), the ``@hourly``-style
    macros, and croniter's ``L`` (last day of the month; ``L5``: last Friday) and ``n#k`` (k-th
    weekday n of the month, k 1-5) extensions (README "Schedules"). Refuses seconds/year fields,
    ``@reboot``, croniter's hashed (``H``), random (``R``) and nearest-weekday (``W``) extensions,
    a step larger than its field (``_step_too_large``), an nth or last weekday beside a day of
    month (``_day_extension_problem``), a list holding ``*`` (``_star_list_problem``), a day-of-week
    ``start/step`` whose end is ambiguous (``_dow_start_step_problem``), and reversed ranges
    (``_reversed_range``), as ISC cron does. A range of one value is written as that value
    (``_collapse_single_ranges``).

    ``stored`` True (a schedule read back from the database) skips the step, day-extension,
    ``*``-list and ``start/step`` refusals, which came after such rows could be written: a stored
    ``*/1000 * * * *`` keeps the timetable croniter gave it (minute 0 of every hour), so an upgrade
    stops no schedule. A stored list holding ``*`` is read as cron reads it (``_widen_star_lists``).
    """
    bad = InvalidSchedule
    if not isinstance(expression, str) or not expression.strip():
        raise bad("A cron expression is required.", details={"cron": ["This field may not be blank."]})
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise bad("The cron expression is too long.", details={"cron": ["At most 200 characters."]})
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise bad(f"Unknown cron macro {text!r}.", details={"cron": [f"Use one of {', '.join(MACROS)}."]})
        text = MACROS[text.lower()]
    fields = text.split(" ")
    if len(fields) != 5:
        raise bad("A cron expression has exactly 5 fields.", details={"cron": ["Exactly 5 fields: m h dom mon dow."]})
    for field in fields:
        tokens = field.replace("/", ",").replace("-", ",").replace("#", ",").split(",")
        if set(field) - _FIELD_CHARS or any(t.upper() in ("H", "R") for t in tokens):
            raise bad(f"Invalid cron field {field!r}.", details={"cron": [f"Invalid field {field!r}."]})
    for index, field in enumerate(fields):
        too_large = None if stored else _step_too_large(field, size=FIELD_SIZES[index])
        if too_large is not None:
            part, step = too_large
            name, size = FIELD_NAMES[index], FIELD_SIZES[index]
            raise bad(
                f"The step {step} in {part!r} is larger than the {name} field's {size} values.",
                details={
                    "cron": [
                        f"The step in {part!r} is larger than the {name} field's {size} values: it would fire "
                        "only at the start of its range. For a fixed period, use interval_seconds."
                    ]
                },
            )
    problem = (
        None
        if stored
        else (
            _day_extension_problem(fields[2], fields[4])
            or _star_list_problem(fields)
            or _dow_start_step_problem(fields[4], names=_FIELD_NAMES[4])
        )
    )
    if problem is not None:
        raise bad(f"Invalid cron expression: {problem}", details={"cron": [problem]})
    fields = _widen_star_lists(fields)
    for index, field in enumerate(fields):
        reversed_range = _reversed_range(field, names=_FIELD_NAMES[index])
        if reversed_range is not None:
            raise bad(
                f"The cron range {reversed_range!r} is reversed.",
                details={"cron": [f"The range {reversed_range!r} is reversed: write it from low to high."]},
            )
    text = " ".join(_collapse_single_ranges(field, names=_FIELD_NAMES[i]) for i, field in enumerate(fields))
    try:
        croniter(text, dt.datetime(2000, 1, 1))  # croniter walks naive wall times
    except (CroniterError, ValueError, KeyError) as exc:
        raise bad(f"Invalid cron expression: {exc}", details={"cron": [str(exc)]}) from exc
    return text


def _day_or(expression: str) -> bool:
    """True when a day matches by day of month OR day of week, as Vixie/ISC cron decides it.

    Both fields must be restricted, and cron calls a field unrestricted when it starts with ``*``
    (``DOM_STAR``/``DOW_STAR`` in its entry.c), steps included: ``0 0 */2 * 1`` is odd days that
    are Mondays. croniter reads ``*/2`` as restricted and would OR them (odd days, and Mondays).
    """
    _, _, dom, _, dow = expression.split(" ")
    return not (dom.startswith("*") or dow.startswith("*"))


def _next_wall(expression: str, wall: dt.datetime) -> dt.datetime | None:
    """Return the first naive wall time strictly after ``wall`` that matches ``expression``, or None.

    None when there is none, or none before year 10000: near year 9999 croniter's date arithmetic
    raises ValueError or OverflowError ("year 10000 is out of range", from dateutil) instead of
    returning (seen with "0 0 29 2 *" from 9997, "@yearly" from mid-9999). The expression itself
    was validated by ``normalize_cron``, so these errors mean only the end of the calendar.
    """
    cache = _local.__dict__.setdefault("iters", {})
    it = cache.get(expression)
    if it is None:
        if len(cache) > 512:
            cache.clear()
        it = cache[expression] = croniter(expression, wall, day_or=_day_or(expression))
    else:
        it.set_current(wall, force=True)
    try:
        return it.get_next(dt.datetime)
    except (CroniterBadDateError, CroniterBadCronError, ValueError, OverflowError):
        return None


def _offset_at(t: dt.datetime, zone: ZoneInfo) -> dt.timedelta:
    return t.astimezone(zone).utcoffset() or dt.timedelta(0)


def _transition(lo: dt.datetime, hi: dt.datetime, zone: ZoneInfo) -> dt.datetime:
    """Return the first instant in (``lo``, ``hi``] whose UTC offset differs from ``lo``'s, to the second."""
    base = _offset_at(lo, zone)
    a, b = int(lo.timestamp()), int(hi.timestamp())
    while b - a > 1:
        mid = (a + b) // 2
        if _offset_at(dt.datetime.fromtimestamp(mid, UTC), zone) == base:
            a = mid
        else:
            b = mid
    return dt.datetime.fromtimestamp(b, UTC)


def _folds(wall: dt.datetime, zone: ZoneInfo) -> tuple[dt.datetime, dt.datetime]:
    """Return the UTC instants of ``wall`` read with fold=0 and fold=1 (PEP 495)."""
    return (
        wall.replace(tzinfo=zone, fold=0).astimezone(UTC),
        wall.replace(tzinfo=zone, fold=1).astimezone(UTC),
    )


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A normalized 5-field expression in a zone; ``real_time`` when minute or hour starts with ``*``."""

    expression: str
    zone: ZoneInfo
    real_time: bool

    def _instants(self, wall: dt.datetime) -> list[dt.datetime]:
        """Return the UTC instants at which matching wall time ``wall`` fires, ascending."""
        u0, u1 = _folds(wall, self.zone)
        if u0 == u1:
            return [u0]
        if u0 < u1:  # repeated by a fall-back: fold 0 is the first occurrence
            if self.real_time or u1 - u0 >= MAX_DST_ADJUST:
                return [u0, u1]
            return [u0]
        # Skipped by a spring-forward gap: fold 1 reads it before the change, fold 0 after.
        if self.real_time or u0 - u1 >= MAX_DST_ADJUST:
            return []
        return [_transition(u1, u0, self.zone)]

    def next_after(self, t: dt.datetime) -> dt.datetime | None:
        """Return the first fire time strictly after ``t``, or None if it never fires again (or past year 9999)."""
        try:
            return self._next_after(t)
        except OverflowError:
            return None

    def _first_fire(self) -> dt.datetime | None:
        """Return the first fire time of a zone whose calendar starts after UTC's (one west of UTC in year 1).

        Its first wall time is 0001-01-01 00:00 (``datetime.min``): ``Pacific/Kiritimati``, UTC-10:29:20
        then (local mean time), reaches it at 0001-01-01 10:29:20 UTC, and no earlier instant has a
        local time. croniter cannot say whether ``datetime.min`` itself matches (it steps back from
        it), so that is read at 0401-01-01, the same weekday and day of the 400-year Gregorian cycle.
        """
        first = dt.datetime.min.replace(tzinfo=self.zone).astimezone(UTC)
        same = dt.datetime.min.replace(year=401)
        if _next_wall(self.expression, same - _ONE_SECOND) == same:
            return first
        return self._next_after(first)

    def _next_after(self, t: dt.datetime) -> dt.datetime | None:
        t = t.astimezone(UTC)
        if self.zone.key == "UTC":
            wall = _next_wall(self.expression, t.replace(tzinfo=None))
            return wall.replace(tzinfo=UTC) if wall is not None else None
        try:
            local = t.astimezone(self.zone)
        except OverflowError:
            if t.year > 1:
                raise  # past year 9999 in this zone: no more fire times
            return self._first_fire()  # before year 1 in this zone
        wall = local.replace(tzinfo=None, fold=0)
        nxt = _next_wall(self.expression, wall)
        if local.fold == 0:
            u0, u1 = _folds(wall, self.zone)
            if u0 < u1 and (self.real_time or u1 - u0 >= MAX_DST_ADJUST):
                # ``t`` is in the first pass of a repeated hour whose second pass also fires: a match
                # later in the first pass comes first, then the earliest match of the second pass.
                change = _transition(u0, u1, self.zone)
                start = (change + _offset_at(u1, self.zone)).replace(tzinfo=None)
                end = (change + _offset_at(u0, self.zone)).replace(tzinfo=None)
                if nxt is not None and nxt < end:
                    return _folds(nxt, self.zone)[0]
                first = _next_wall(self.expression, start - _ONE_SECOND)
                if first is not None and first < end:
                    return _folds(first, self.zone)[1]
        for _ in range(SEARCH_LIMIT):
            if nxt is None:
                return None
            for instant in self._instants(nxt):
                if instant > t:
                    return instant
            nxt = _next_wall(self.expression, nxt)
        return None

    def latest_before(self, t: dt.datetime, *, floor: dt.datetime) -> dt.datetime | None:
        """Return the last fire time in [``floor``, ``t``) by bisection on ``next_after`` (to the second)."""
        return _latest_before(self, t, floor=floor)


@dataclass(frozen=True, slots=True)
class IntervalSpec:
    """Every ``seconds`` seconds on the grid through ``anchor`` (a UTC fire time)."""

    seconds: int
    anchor: dt.datetime

    def next_after(self, t: dt.datetime) -> dt.datetime | None:
        """Return the first grid point strictly after ``t`` (None past year 9999)."""
        step = dt.timedelta(seconds=self.seconds)
        if t < self.anchor:
            return self.anchor
        try:
            return self.anchor + ((t - self.anchor) // step + 1) * step
        except OverflowError:
            return None

    def latest_before(self, t: dt.datetime, *, floor: dt.datetime) -> dt.datetime | None:
        """Return the last grid point in [``floor``, ``t``)."""
        if t <= floor:
            return None
        step = dt.timedelta(seconds=self.seconds)
        k = -((self.anchor - t) // step) - 1  # largest k with anchor + k*step < t
        latest = self.anchor + k * step
        return latest if latest >= floor else None


def _latest_before(spec: FireSpec, t: dt.datetime, *, floor: dt.datetime) -> dt.datetime | None:
    if floor >= t:
        return None
    nxt = spec.next_after(floor)
    if nxt is None or nxt >= t:
        return floor
    # next_after(x) >= t holds exactly for x at or after the answer: bisect on whole seconds.
    a, b = nxt, t
    while b - a > _ONE_SECOND:
        mid = a + (b - a) / 2
        probe = spec.next_after(mid)
        if probe is None or probe >= t:
            b = mid
        else:
            a = mid
    latest = a
    while (probe := spec.next_after(latest)) is not None and probe < t:
        latest = probe
    return latest


def cron_spec(expression: str, timezone: str = "UTC", *, stored: bool = False) -> CronSpec:
    """Parse ``expression`` (5 fields or a macro) in IANA zone ``timezone``; raise InvalidSchedule.

    ``stored``: ``expression`` was read from a stored schedule (``normalize_cron``).
    """
    return _cron_spec(normalize_cron(expression, stored=stored), timezone)


@lru_cache(maxsize=4096)
def _cron_spec(normalized: str, timezone: str) -> CronSpec:
    minute, hour = normalized.split(" ")[:2]
    return CronSpec(
        expression=normalized,
        zone=zone_for(timezone),
        real_time=minute.startswith("*") or hour.startswith("*"),
    )


def interval_spec(seconds: int, *, anchor: dt.datetime) -> IntervalSpec:
    """Return the interval grid of ``seconds`` (1 to 366 days) through ``anchor``; raise InvalidSchedule."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= MAX_INTERVAL_SECONDS:
        raise InvalidSchedule(
            "interval_seconds must be an integer from 1 to 31622400.",
            details={"interval_seconds": ["An integer from 1 to 31622400."]},
        )
    return IntervalSpec(seconds=seconds, anchor=anchor.astimezone(UTC))


def spec_of(
    *, cron: str | None, interval_seconds: int | None, timezone: str, anchor: dt.datetime, stored: bool = False
) -> FireSpec:
    """Return the fire-time spec of a schedule: its cron expression, or its interval grid through ``anchor``.

    ``stored``: the schedule was read from the database, not written now (``normalize_cron``).
    Raises InvalidSchedule.
    """
    if cron is not None:
        return cron_spec(cron, timezone, stored=stored)
    if interval_seconds is None:
        raise InvalidSchedule(
            "A schedule needs cron or interval_seconds.", details={"cron": ["Give cron or interval_seconds."]}
        )
    return interval_spec(interval_seconds, anchor=anchor)


def fire_times(spec: FireSpec, *, start: dt.datetime, count: int) -> list[dt.datetime]:
    """Return up to ``count`` fire times strictly after ``start``, ascending, in UTC."""
    out: list[dt.datetime] = []
    t = start
    while len(out) < count and (t := spec.next_after(t)) is not None:
        out.append(t)
    return out


def smallest_gap(spec: FireSpec, *, start: dt.datetime, count: int) -> dt.timedelta | None:
    """Return the shortest time between two consecutive fires among the ``count`` after ``start``.

    None when fewer than two fires follow ``start``. A sample, not a proof: a timetable whose
    shortest gap first occurs later than ``count`` fires (say, once a year) is judged by the gaps
    it shows first. Pure: ``start`` is an aware datetime the caller took from its clock.
    """
    times = fire_times(spec, start=start, count=count)
    return min((b - a for a, b in zip(times, times[1:], strict=False)), default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class FirePlan:
    """What one tick materializes for one schedule.

    ``fires``: fire times to create jobs for, ascending; ``dropped``: missed fire times the
    misfire policy discarded (at least this many); ``next_fire_at``: the first fire time after
    ``now`` (None: the schedule never fires again).
    """

    fires: tuple[dt.datetime, ...]
    dropped: int
    next_fire_at: dt.datetime | None


def plan_fires(
    spec: FireSpec,
    *,
    next_fire_at: dt.datetime,
    now: dt.datetime,
    missed_before: dt.datetime,
    misfire_policy: str,
    catch_up_limit: int,
) -> FirePlan:
    """Return the fires due at ``now`` for a schedule whose earliest unfired time is ``next_fire_at``.

    Due fire times are those in [``next_fire_at``, ``now``]. Those before ``missed_before`` were
    missed (no leader was firing then) and follow ``misfire_policy`` (``MISFIRE_POLICIES``):
    ``skip`` keeps only the latest missed time, ``catch_up`` the latest ``catch_up_limit``,
    ``none`` none. The rest are on time and all fire. Cost is bounded: a long outage is crossed
    by bisection, not by walking every missed time. Raises KeyError for an unknown policy.
    """
    keep = {"skip": 1, "catch_up": max(0, catch_up_limit), "none": 0}[str(misfire_policy)]
    cutoff = min(missed_before, now + dt.timedelta(microseconds=1))
    missed: deque[dt.datetime] = deque(maxlen=keep)
    seen = 0
    f: dt.datetime | None = next_fire_at
    while f is not None and f < cutoff:
        if seen >= ENUMERATE_LIMIT:
            # A long outage: collect the last ``keep`` missed times backwards from the cutoff.
            tail: list[dt.datetime] = []
            point = cutoff
            while len(tail) < max(keep, 1) and (latest := spec.latest_before(point, floor=f)) is not None:
                tail.append(latest)
                point = latest
            missed.extend(reversed(tail[:keep]))
            seen += len(tail)
            f = spec.next_after(tail[0]) if tail else None
            break
        seen += 1
        missed.append(f)
        f = spec.next_after(f)
    fires = list(missed)
    dropped = seen - len(fires)
    while f is not None and f <= now and len(fires) < keep + ENUMERATE_LIMIT:
        fires.append(f)
        f = spec.next_after(f)
    if f is not None and f <= now:  # more on-time fires than one plan holds: the rest are dropped
        f = spec.next_after(now)
    return FirePlan(fires=tuple(fires), dropped=dropped, next_fire_at=f)
