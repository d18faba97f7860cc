"""Fire-time math: the ISC/Debian cron DST rules, written out by hand in UTC, and misfire plans."""

from __future__ import annotations

import calendar
import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cron import (
    ENUMERATE_LIMIT,
    cron_spec,
    fire_times,
    interval_spec,
    normalize_cron,
    plan_fires,
)
from scheduler.exceptions import InvalidSchedule

UTC = dt.UTC


def utc(text: str) -> dt.datetime:
    """``"2024-03-10 07:00"`` as an aware UTC datetime."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def local(text: str, zone: str) -> dt.datetime:
    """A wall time in ``zone`` (first occurrence if repeated)."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone))


def fires(expr: str, zone: str, start: dt.datetime, count: int) -> list[str]:
    return [t.strftime("%Y-%m-%d %H:%M") for t in fire_times(cron_spec(expr, zone), start=start, count=count)]


# Transitions used below (all 2024):
#   America/New_York  spring 03-10 02:00 EST(-5) -> 03:00 EDT(-4), at 07:00Z; walls 02:00-02:59 skipped
#                     autumn 11-03 02:00 EDT(-4) -> 01:00 EST(-5), at 06:00Z; walls 01:00-01:59 twice
#   Europe/London     spring 03-31 01:00 GMT(+0) -> 02:00 BST(+1), at 01:00Z; walls 01:00-01:59 skipped
#                     autumn 10-27 02:00 BST(+1) -> 01:00 GMT(+0), at 01:00Z; walls 01:00-01:59 twice
#   Australia/Lord_Howe spring 10-06 02:00 +10:30 -> 02:30 +11:00, at 10-05 15:30Z; walls 02:00-02:29 skipped
#                       autumn 04-07 02:00 +11:00 -> 01:30 +10:30, at 04-06 15:00Z; walls 01:30-01:59 twice
DST_TABLE = [
    # -- fixed entries: once per local date and time; a skipped time fires at the gap's end, a
    #    repeated time at its first occurrence.
    (
        "30 2 * * *",
        "America/New_York",
        "2024-03-09 00:00",
        ["2024-03-09 07:30", "2024-03-10 07:00", "2024-03-11 06:30"],
    ),
    (
        "30 2 * * *",
        "America/New_York",
        "2024-11-02 00:00",
        ["2024-11-02 06:30", "2024-11-03 07:30", "2024-11-04 07:30"],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2024-03-09 00:00",
        ["2024-03-09 06:30", "2024-03-10 06:30", "2024-03-11 05:30"],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2024-11-02 00:00",
        ["2024-11-02 05:30", "2024-11-03 05:30", "2024-11-04 06:30"],
    ),
    ("30 2 * * *", "Europe/London", "2024-03-30 00:00", ["2024-03-30 02:30", "2024-03-31 01:30", "2024-04-01 01:30"]),
    ("30 2 * * *", "Europe/London", "2024-10-26 00:00", ["2024-10-26 01:30", "2024-10-27 02:30", "2024-10-28 02:30"]),
    ("30 1 * * *", "Europe/London", "2024-03-30 00:00", ["2024-03-30 01:30", "2024-03-31 01:00", "2024-04-01 00:30"]),
    ("30 1 * * *", "Europe/London", "2024-10-26 00:00", ["2024-10-26 00:30", "2024-10-27 00:30", "2024-10-28 01:30"]),
    (
        "0 2 * * *",
        "Australia/Lord_Howe",
        "2024-10-05 00:00",
        ["2024-10-04 15:30", "2024-10-05 15:30", "2024-10-06 15:00"],
    ),
    (
        "0 2 * * *",
        "Australia/Lord_Howe",
        "2024-04-06 00:00",
        ["2024-04-05 15:00", "2024-04-06 15:30", "2024-04-07 15:30"],
    ),
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2024-10-05 00:00",
        ["2024-10-04 15:15", "2024-10-05 15:15", "2024-10-06 14:45"],
    ),
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2024-04-06 00:00",
        ["2024-04-05 14:45", "2024-04-06 14:45", "2024-04-07 15:15"],
    ),
    # Two skipped times of one entry are one fire at the gap's end; the next day is normal.
    (
        "0,30 2 * * *",
        "America/New_York",
        "2024-03-10 00:00",
        ["2024-03-10 07:00", "2024-03-11 06:00", "2024-03-11 06:30"],
    ),
    # -- real-time entries (minute or hour starts with *): every instant whose wall time matches.
    (
        "0 * * * *",
        "America/New_York",
        "2024-03-09 23:00",
        ["2024-03-10 05:00", "2024-03-10 06:00", "2024-03-10 07:00", "2024-03-10 08:00", "2024-03-10 09:00"],
    ),
    (
        "0 * * * *",
        "America/New_York",
        "2024-11-02 23:00",
        ["2024-11-03 04:00", "2024-11-03 05:00", "2024-11-03 06:00", "2024-11-03 07:00", "2024-11-03 08:00"],
    ),
    (
        "*/30 * * * *",
        "America/New_York",
        "2024-03-10 00:30",
        ["2024-03-10 06:00", "2024-03-10 06:30", "2024-03-10 07:00", "2024-03-10 07:30", "2024-03-10 08:00"],
    ),
    (
        "*/30 * * * *",
        "America/New_York",
        "2024-11-03 00:00",
        [
            "2024-11-03 04:30",
            "2024-11-03 05:00",
            "2024-11-03 05:30",
            "2024-11-03 06:00",  # 01:00 EST, the second 01:00
            "2024-11-03 06:30",  # 01:30 EST, the second 01:30
            "2024-11-03 07:00",
        ],
    ),
    (
        "0 * * * *",
        "Europe/London",
        "2024-03-30 23:00",
        ["2024-03-31 00:00", "2024-03-31 01:00", "2024-03-31 02:00", "2024-03-31 03:00", "2024-03-31 04:00"],
    ),
    (
        "0 * * * *",
        "Europe/London",
        "2024-10-26 23:00",
        ["2024-10-26 23:00", "2024-10-27 00:00", "2024-10-27 01:00", "2024-10-27 02:00", "2024-10-27 03:00"],
    ),
    (
        "*/30 * * * *",
        "Europe/London",
        "2024-03-31 00:00",
        ["2024-03-31 00:30", "2024-03-31 01:00", "2024-03-31 01:30", "2024-03-31 02:00", "2024-03-31 02:30"],
    ),
    (
        "*/30 * * * *",
        "Europe/London",
        "2024-10-27 00:00",
        [
            "2024-10-26 23:30",
            "2024-10-27 00:00",
            "2024-10-27 00:30",
            "2024-10-27 01:00",  # 01:00 GMT, the second 01:00
            "2024-10-27 01:30",  # 01:30 GMT, the second 01:30
            "2024-10-27 02:00",
        ],
    ),
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2024-10-06 01:30",
        ["2024-10-05 15:15", "2024-10-05 15:30", "2024-10-05 15:45", "2024-10-05 16:00"],
    ),
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2024-04-07 01:15",
        [
            "2024-04-06 14:30",  # 01:30 +11:00
            "2024-04-06 14:45",  # 01:45 +11:00
            "2024-04-06 15:00",  # 01:30 +10:30, the second 01:30
            "2024-04-06 15:15",  # 01:45 +10:30, the second 01:45
            "2024-04-06 15:30",  # 02:00 +10:30
        ],
    ),
    # @hourly is "0 * * * *": real time.
    ("@hourly", "Europe/London", "2024-03-31 00:30", ["2024-03-31 01:00", "2024-03-31 02:00"]),
    # @daily is "0 0 * * *": fixed.
    ("@daily", "America/New_York", "2024-11-02 12:00", ["2024-11-03 04:00", "2024-11-04 05:00"]),
]


@pytest.mark.parametrize(("expr", "zone", "start", "expected"), DST_TABLE)
def test_dst_fire_times_match_the_hand_written_utc_instants(expr, zone, start, expected):
    assert fires(expr, zone, local(start, zone), len(expected)) == expected


def test_fixed_entry_started_in_the_second_pass_of_a_repeated_hour_waits_for_the_next_day():
    # 06:00Z is 01:00 EST, the second 01:00 of 2024-11-03; "30 1" already fired at 05:30Z (EDT).
    assert fires("30 1 * * *", "America/New_York", utc("2024-11-03 06:00"), 1) == ["2024-11-04 06:30"]
    # From the first pass (05:10Z = 01:10 EDT) it still fires at the first occurrence only.
    assert fires("30 1 * * *", "America/New_York", utc("2024-11-03 05:10"), 2) == [
        "2024-11-03 05:30",
        "2024-11-04 06:30",
    ]


def test_real_time_entry_started_late_in_the_first_pass_fires_the_second_pass_next():
    # 05:45Z is 01:45 EDT; the next "*/30" instant is 01:00 EST (06:00Z), then 01:30 EST.
    assert fires("*/30 * * * *", "America/New_York", utc("2024-11-03 05:45"), 3) == [
        "2024-11-03 06:00",
        "2024-11-03 06:30",
        "2024-11-03 07:00",
    ]
    # "0 1 * * *"-like minute with a wildcard hour: "0 * ..." from 05:30Z (01:30 EDT) -> 06:00Z (01:00 EST).
    assert fires("0 * * * *", "America/New_York", utc("2024-11-03 05:30"), 1) == ["2024-11-03 06:00"]
    # From inside the second pass only the second pass and later remain.
    assert fires("*/30 * * * *", "America/New_York", utc("2024-11-03 06:10"), 2) == [
        "2024-11-03 06:30",
        "2024-11-03 07:00",
    ]


def test_a_real_time_entry_fires_nothing_for_a_skipped_hour():
    # "30 * * * *" is real time (hour *): 02:30 EST does not exist on 2024-03-10.
    assert fires("30 * * * *", "America/New_York", utc("2024-03-10 06:00"), 2) == [
        "2024-03-10 06:30",
        "2024-03-10 07:30",  # 03:30 EDT
    ]


def test_a_clock_change_of_three_hours_or_more_is_a_correction_not_dst():
    # Samoa skipped 2011-12-30 entirely (-10 -> +14). ISC cron runs nothing for a jump >= 3 h.
    assert fires("0 12 * * *", "Pacific/Apia", local("2011-12-29 00:00", "Pacific/Apia"), 2) == [
        "2011-12-29 22:00",  # 12:00 -10:00
        "2011-12-30 22:00",  # 12:00 +14:00 on the 31st; the 30th never happened
    ]


def test_interval_schedules_ignore_wall_time():
    spec = interval_spec(3600, anchor=utc("2024-11-03 04:00"))
    assert [t.strftime("%H:%M") for t in fire_times(spec, start=utc("2024-11-03 04:00"), count=4)] == [
        "05:00",
        "06:00",
        "07:00",
        "08:00",
    ]
    assert spec.next_after(utc("2024-11-03 05:30")) == utc("2024-11-03 06:00")
    assert spec.next_after(utc("2024-11-03 03:00")) == utc("2024-11-03 04:00")
    assert spec.latest_before(utc("2024-11-03 07:00"), floor=utc("2024-11-03 04:00")) == utc("2024-11-03 06:00")
    assert spec.latest_before(utc("2024-11-03 04:00"), floor=utc("2024-11-03 04:00")) is None


def test_utc_is_plain_cron():
    assert fires("*/20 9-10 * * 1-5", "UTC", utc("2024-01-05 10:30"), 3) == [
        "2024-01-05 10:40",
        "2024-01-08 09:00",
        "2024-01-08 09:20",
    ]


@pytest.mark.parametrize(
    ("expression", "normalized"),
    [("@hourly", "0 * * * *"), ("@DAILY", "0 0 * * *"), ("  0   5 * *   MON-FRI ", "0 5 * * MON-FRI")],
)
def test_normalize_cron(expression, normalized):
    assert normalize_cron(expression) == normalized


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("5-4 * * * *", "5-4"),
        ("0 23-1 * * *", "23-1"),
        ("0 0 * DEC-JAN *", "DEC-JAN"),
        ("0 0 * * sat-mon", "sat-mon"),
        ("0 0 20-10/2 * *", "20-10/2"),
    ],
)
def test_a_reversed_range_is_refused_as_iscs_cron_refuses_it(expression, field):
    # croniter read 5-4 as wrapping round the hour: the schedule fired every minute.
    with pytest.raises(InvalidSchedule, match=f"range {field.split('/')[0]!r} is reversed"):
        cron_spec(expression, "UTC")
    for fine in ("0 0 * * MON-FRI", "0 0 * * 5-7", "0-59/5 * * * *", "0 0 * JAN-DEC *", "3-3 * * * *"):
        cron_spec(fine, "UTC")


@pytest.mark.parametrize(
    "expression",
    ["", "61 * * * *", "* * * *", "* * * * * *", "0 0 1 1 * 2030", "@reboot", "H * * * *", "R 0 * * *", "0 0 ? * *"],
)
def test_bad_expressions_are_refused(expression):
    with pytest.raises(InvalidSchedule) as exc:
        cron_spec(expression, "UTC")
    assert "cron" in exc.value.details


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus", "../../etc/passwd", "", "utc+1", "localtime", "Factory", "posixrules"]
)
def test_bad_zones_are_refused(zone):
    with pytest.raises(InvalidSchedule) as exc:
        cron_spec("0 * * * *", zone)
    assert "timezone" in exc.value.details


def test_an_expression_that_never_fires_has_no_next_time():
    assert cron_spec("0 0 30 2 *", "UTC").next_after(utc("2024-01-01 00:00")) is None


# -- an independent oracle: walk every UTC minute and apply the rules as stated ----------------


def matcher(expr: str):
    """Return wall -> bool for a 5-field expression with ``*`` day-of-month (croniter parses, we match)."""
    minutes, hours, doms, months, dows = croniter(normalize_cron(expr)).expanded
    assert doms == ["*"] and months == ["*"]

    def match(wall: dt.datetime) -> bool:
        return (
            (minutes == ["*"] or wall.minute in minutes)
            and (hours == ["*"] or wall.hour in hours)
            and (dows == ["*"] or (wall.weekday() + 1) % 7 in dows)
        )

    return match


def oracle(expr: str, zone_name: str, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """Fire times in (start, end] by brute force over UTC minutes, straight from the issue's wording."""
    fields = normalize_cron(expr).split(" ")
    real_time = fields[0].startswith("*") or fields[1].startswith("*")
    return walk_minutes(matcher(expr), real_time=real_time, zone_name=zone_name, start=start, end=end)


def walk_minutes(match, *, real_time: bool, zone_name: str, start: dt.datetime, end: dt.datetime) -> list:
    """The UTC minutes in (start, end] at which ``match`` (wall -> bool) fires under the README's DST rules.

    Real time (minute or hour field starting with ``*``): every matching wall time, both passes of
    a repeated hour. Otherwise: the first pass only, and a wall time skipped by a gap fires at the
    first instant after it.
    """
    zone = ZoneInfo(zone_name)
    minute = dt.timedelta(minutes=1)
    u = start.replace(second=0, microsecond=0) + minute
    out = []
    while u <= end:
        here = u.astimezone(zone)
        wall = here.replace(tzinfo=None, fold=0)
        if real_time:
            fire = match(wall)
        else:
            fire = match(wall) and here.fold == 0
            jump = here.utcoffset() - (u - minute).astimezone(zone).utcoffset()
            if not fire and jump > dt.timedelta(0):  # u is the first instant after a gap of `jump`
                fire = any(match(wall - jump + k * minute) for k in range(int(jump / minute)))
        if fire:
            out.append(u)
        u += minute
    return out


EXPRESSIONS = [
    "*/15 * * * *",
    "0 * * * *",
    "30 * * * *",
    "30 2 * * *",
    "30 1 * * *",
    "45 1 * * *",
    "0 2 * * *",
    "0,30 1-3 * * *",
    "*/7 2 * * *",
    "0 0-3 * * *",
    "15 2 * * 0",
]
TRANSITIONS = [
    ("America/New_York", utc("2024-03-10 07:00")),
    ("America/New_York", utc("2024-11-03 06:00")),
    ("Europe/London", utc("2024-03-31 01:00")),
    ("Europe/London", utc("2024-10-27 01:00")),
    ("Australia/Lord_Howe", utc("2024-10-05 15:30")),
    ("Australia/Lord_Howe", utc("2024-04-06 15:00")),
]


@settings(max_examples=150, deadline=None)
@given(
    expr=st.sampled_from(EXPRESSIONS),
    where=st.sampled_from(TRANSITIONS),
    offset_minutes=st.integers(min_value=-36 * 60, max_value=12 * 60),
    seconds=st.integers(min_value=0, max_value=59),
)
def test_next_fire_times_agree_with_a_minute_by_minute_oracle(expr, where, offset_minutes, seconds):
    zone, change = where
    start = change + dt.timedelta(minutes=offset_minutes, seconds=seconds)
    got = fire_times(cron_spec(expr, zone), start=start, count=5)
    assert len(got) == 5
    assert got == oracle(expr, zone, start, got[-1])


@settings(max_examples=60, deadline=None)
@given(
    expr=st.sampled_from(EXPRESSIONS),
    where=st.sampled_from(TRANSITIONS),
    offset_minutes=st.integers(min_value=-30 * 60, max_value=30 * 60),
)
def test_latest_before_inverts_next_after(expr, where, offset_minutes):
    zone, change = where
    spec = cron_spec(expr, zone)
    floor = spec.next_after(change - dt.timedelta(days=3))
    t = change + dt.timedelta(minutes=offset_minutes, seconds=7)
    expected = [f for f in oracle(expr, zone, floor - dt.timedelta(minutes=1), t) if f < t]
    assert spec.latest_before(t, floor=floor) == (expected[-1] if expected else None)


# -- misfire plans ----------------------------------------------------------------------------


EVERY_MINUTE = cron_spec("* * * * *", "UTC")


def plan(policy: str, *, next_fire_at: str, now: str, missed_before: str, limit: int = 100):
    return plan_fires(
        EVERY_MINUTE,
        next_fire_at=utc(next_fire_at),
        now=utc(now),
        missed_before=utc(missed_before),
        misfire_policy=policy,
        catch_up_limit=limit,
    )


def hhmm(p) -> list[str]:
    return [t.strftime("%H:%M") for t in p.fires]


def test_on_time_fires_all_fire_whatever_the_policy():
    for policy in ("skip", "catch_up", "none"):
        p = plan(policy, next_fire_at="2024-01-01 10:00", now="2024-01-01 10:02:30", missed_before="2024-01-01 09:00")
        assert hhmm(p) == ["10:00", "10:01", "10:02"]
        assert p.next_fire_at == utc("2024-01-01 10:03")
        assert p.dropped == 0


def test_skip_fires_once_for_the_latest_missed_time_then_the_on_time_ones():
    # Leader since 10:05:30; missed 10:00-10:05, on time 10:06-10:07.
    p = plan("skip", next_fire_at="2024-01-01 10:00", now="2024-01-01 10:07:10", missed_before="2024-01-01 10:05:30")
    assert hhmm(p) == ["10:05", "10:06", "10:07"]
    assert p.dropped == 5
    assert p.next_fire_at == utc("2024-01-01 10:08")


def test_none_fires_nothing_missed():
    p = plan("none", next_fire_at="2024-01-01 10:00", now="2024-01-01 10:07:10", missed_before="2024-01-01 10:05:30")
    assert hhmm(p) == ["10:06", "10:07"]
    assert p.dropped == 6


def test_catch_up_fires_every_missed_time_up_to_its_bound():
    p = plan("catch_up", next_fire_at="2024-01-01 10:00", now="2024-01-01 10:03:00", missed_before="2024-01-01 10:02")
    assert hhmm(p) == ["10:00", "10:01", "10:02", "10:03"]
    bounded = plan(
        "catch_up",
        next_fire_at="2024-01-01 10:00",
        now="2024-01-01 10:09:00",
        missed_before="2024-01-01 10:08",
        limit=3,
    )
    assert hhmm(bounded) == ["10:05", "10:06", "10:07", "10:08", "10:09"]  # the latest 3 missed + on time
    assert bounded.dropped == 5


def test_a_long_outage_is_crossed_without_walking_every_missed_minute():
    # 60 days of minutes is far beyond ENUMERATE_LIMIT: the plan jumps by bisection.
    assert 60 * 24 * 60 > ENUMERATE_LIMIT
    skip = plan("skip", next_fire_at="2024-01-01 00:00", now="2024-03-01 12:00:30", missed_before="2024-03-01 11:59:30")
    assert [t.isoformat() for t in skip.fires] == ["2024-03-01T11:59:00+00:00", "2024-03-01T12:00:00+00:00"]
    assert skip.next_fire_at == utc("2024-03-01 12:01")
    catch_up = plan(
        "catch_up", next_fire_at="2024-01-01 00:00", now="2024-03-01 12:00:30", missed_before="2024-03-01 11:59:30"
    )
    assert len(catch_up.fires) == 101
    assert catch_up.fires[0] == utc("2024-03-01 10:20")
    assert catch_up.fires[-1] == utc("2024-03-01 12:00")
    assert all(b - a == dt.timedelta(minutes=1) for a, b in zip(catch_up.fires, catch_up.fires[1:], strict=False))
    none = plan("none", next_fire_at="2024-01-01 00:00", now="2024-03-01 12:00:30", missed_before="2024-03-01 11:59:30")
    assert hhmm(none) == ["12:00"]


def test_a_plan_for_an_expression_that_stops_firing_ends_with_no_next_time():
    once = cron_spec("0 0 29 2 *", "UTC")  # leap days only: the next one after 2024 is 2028
    p = plan_fires(
        once,
        next_fire_at=utc("2024-02-29 00:00"),
        now=utc("2024-02-29 00:00:05"),
        missed_before=utc("2024-02-29 00:00"),
        misfire_policy="skip",
        catch_up_limit=10,
    )
    assert hhmm(p) == ["00:00"]
    assert p.next_fire_at == utc("2028-02-29 00:00")


@pytest.mark.parametrize(
    ("expr", "zone", "start"),
    [
        ("0 0 29 2 *", "UTC", "9997-01-01 00:00"),  # the next leap day would be in year 10000
        ("0 0 1 1 *", "UTC", "9999-06-01 00:00"),
        ("@yearly", "Asia/Tokyo", "9999-06-01 00:00"),
        ("0 0 1 */7 *", "UTC", "9999-09-01 00:00"),
    ],
)
def test_no_fire_time_past_year_9999(expr, zone, start):
    spec = cron_spec(expr, zone)
    assert spec.next_after(utc(start)) is None or spec.next_after(utc(start)).year == 9999
    assert all(t.year == 9999 for t in fire_times(spec, start=utc(start), count=5))


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # Pacific/Kiritimati kept local mean time, UTC-10:29:20, until 1901: its 0001-01-01 00:00 is 10:29:20 UTC.
        ("0 0 * * *", ["0001-01-01T10:29:20", "0001-01-02T10:29:20", "0001-01-03T10:29:20"]),
        ("0 0 1 1 *", ["0001-01-01T10:29:20", "0002-01-01T10:29:20", "0003-01-01T10:29:20"]),
        ("0 0 * * mon", ["0001-01-01T10:29:20", "0001-01-08T10:29:20", "0001-01-15T10:29:20"]),  # a Monday
        ("0 0 * * tue", ["0001-01-02T10:29:20", "0001-01-09T10:29:20", "0001-01-16T10:29:20"]),
        ("30 12 * * *", ["0001-01-01T22:59:20", "0001-01-02T22:59:20", "0001-01-03T22:59:20"]),
    ],
)
def test_a_zone_west_of_utc_in_year_1_fires_from_its_first_local_midnight(expr, expected):
    # Its local calendar starts 10 h after UTC's: fire times from 0001-01-01 UTC used to be none at all.
    spec = cron_spec(expr, "Pacific/Kiritimati")
    got = fire_times(spec, start=dt.datetime(1, 1, 1, tzinfo=dt.UTC), count=3)
    assert [t.replace(tzinfo=None).isoformat() for t in got] == expected


# -- croniter's day extensions (L, n#k, Ln) and Vixie's day rule, against their own oracle ------

DOW_NAMES = {name: n for n, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}


def values(part: str, low: int, high: int) -> set[int]:
    """The values of one plain list element (``*``, ``a``, ``a-b``, each with an optional ``/step``)."""
    span, _, step = part.partition("/")
    if span == "*":
        a, b = low, high
    elif "-" in span:
        a, b = (int(DOW_NAMES.get(x, x)) for x in span.split("-"))
    else:
        a = int(DOW_NAMES.get(span, span))
        b = high if step else a
    return set(range(a, b + 1, int(step or 1)))


def day_matcher(dom: str, month: str, dow: str):
    """Return date -> bool, written from the README's words and Vixie's rule, not from croniter.

    ``L`` in day of month: the month's last day. ``n#k``: the k-th weekday n of the month. ``Ln``:
    the last weekday n of the month. Both day fields restricted (neither starts with ``*``): either
    matches; otherwise both must.
    """
    months = set().union(*(values(p, 1, 12) for p in month.split(",")))

    def dom_match(d: dt.date, last: int) -> bool:
        return any(d.day == last if p == "L" else d.day in values(p, 1, 31) for p in dom.split(","))

    def dow_match(d: dt.date, last: int) -> bool:
        weekday = (d.weekday() + 1) % 7
        for p in dow.lower().split(","):
            if "#" in p:
                n, k = p.split("#")
                if weekday == int(DOW_NAMES.get(n, n)) % 7 and (d.day - 1) // 7 + 1 == int(k):
                    return True
            elif p.startswith("l"):
                if weekday == int(p[1:]) % 7 and d.day + 7 > last:
                    return True
            elif weekday in {v % 7 for v in values(p, 0, 7)}:
                return True
        return False

    either = not (dom.startswith("*") or dow.startswith("*"))

    def match(d: dt.date) -> bool:
        last = calendar.monthrange(d.year, d.month)[1]
        a, b = dom_match(d, last), dow_match(d, last)
        return d.month in months and ((a or b) if either else (a and b))

    return match


def day_oracle(expr: str, zone_name: str, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """Fire times in (start, end]: the minute-by-minute oracle's DST rules, on the days ``day_matcher`` picks."""
    minute_field, hour_field, dom, month, dow = expr.split(" ")
    on_day = day_matcher(dom, month, dow)
    real_time = minute_field.startswith("*") or hour_field.startswith("*")
    minutes = set().union(*(values(p, 0, 59) for p in minute_field.split(",")))
    hours = set().union(*(values(p, 0, 23) for p in hour_field.split(",")))

    def match(wall: dt.datetime) -> bool:
        return wall.minute in minutes and wall.hour in hours and on_day(wall.date())

    return walk_minutes(match, real_time=real_time, zone_name=zone_name, start=start, end=end)


@pytest.mark.parametrize(
    ("expr", "zone", "start"),
    [
        ("30 2 * * 0#2", "America/New_York", "2024-02-20 00:00"),  # US DST starts on the 2nd Sunday of March
        ("30 2 * * sun#2", "America/New_York", "2024-02-20 00:00"),
        ("30 1 * * L0", "Europe/London", "2024-09-20 00:00"),  # Europe's ends on the last Sunday of October
        ("*/30 1 * * L0", "Europe/London", "2024-10-26 00:00"),  # real time: both passes of 01:xx
        ("0 0 L * *", "Europe/London", "2023-12-15 00:00"),  # 31, 29 (leap), 31
        ("0 0 15,L * *", "UTC", "2024-01-20 00:00"),
        ("0 9 * * 1#1,5#3", "Australia/Lord_Howe", "2024-03-25 00:00"),
        ("0 0 * * 1#5", "UTC", "2024-01-02 00:00"),  # months without a 5th Monday are skipped
        ("0 18 * * L5", "America/New_York", "2024-01-01 00:00"),
        ("0 12 L * 5", "UTC", "2024-01-20 00:00"),  # both restricted: the last day or a Friday
        ("0 0 */2 * 1", "UTC", "2024-01-01 00:00"),  # a day field starting with *: odd days AND Mondays
        ("0 0 1 * */3", "UTC", "2024-01-01 00:00"),  # the 1st, when a Sunday, Wednesday or Saturday
        ("0 0 1,15 * mon-wed", "UTC", "2024-01-01 00:00"),  # both restricted: either
        ("0 0 * 2 L0", "UTC", "2024-01-01 00:00"),
    ],
)
def test_day_extensions_and_vixies_day_rule_agree_with_their_oracle(expr, zone, start):
    got = fire_times(cron_spec(expr, zone), start=utc(start), count=4)
    assert len(got) == 4
    assert got == day_oracle(expr, zone, utc(start), got[-1])


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("*/1000 * * * *", "larger than the minute field's 60 values"),
        ("0 */99 * * *", "larger than the hour field's 24 values"),
        ("5/61 * * * *", "larger than the minute field's 60 values"),
        ("10-20/100 * * * *", "larger than the minute field's 60 values"),
        ("0 0 */32 * *", "larger than the day-of-month field's 31 values"),
        ("0 0 1 */13 *", "larger than the month field's 12 values"),
        ("0 0 * * */8", "larger than the day-of-week field's 7 values"),
        ("0 0 15W * *", "'W' (nearest weekday) is not supported"),
        ("0 0 1 * 1#2", "cannot be combined with a day of month"),  # croniter found no date at all
        ("0 0 L * L5", "cannot be combined with a day of month"),  # croniter fired on last Fridays only
        ("0 0 1-7 * mon#2", "cannot be combined with a day of month"),
    ],
)
def test_what_we_do_not_compute_as_cron_means_it_is_refused_with_the_reason(expression, says):
    with pytest.raises(InvalidSchedule) as exc:
        cron_spec(expression, "UTC")
    assert says in exc.value.details["cron"][0]


@pytest.mark.parametrize(
    "expression", ["*/60 * * * *", "0 */24 * * *", "0 0 */31 * *", "0 0 1 */12 *", "0 0 * * */7", "0 0 * * 7#1"]
)
def test_a_step_as_large_as_its_field_is_kept(expression):
    assert cron_spec(expression, "UTC").next_after(utc("2024-01-01 00:00")) is not None


@pytest.mark.parametrize(
    ("expr", "same_as"),
    [
        ("5-5 * * * *", "5 * * * *"),
        ("0-0 * * * *", "0 * * * *"),
        ("0 3-3 * * *", "0 3 * * *"),
        ("0 0 2-2 * *", "0 0 2 * *"),
        ("0 0 * jan-jan *", "0 0 * 1 *"),
        ("0 0 * * 7-7", "0 0 * * 0"),
        ("0 0 * * mon-mon", "0 0 * * 1"),
        ("5-5/2 * * * *", "5 * * * *"),
        ("1,5-5 * * * *", "1,5 * * * *"),
    ],
)
def test_a_range_of_one_value_is_that_value(expr, same_as):
    # croniter reads "n-n" as the whole field: "5-5 * * * *" fired every minute, "0 0 * * 7-7" daily.
    start = utc("2030-01-01 00:00")

    assert fires(expr, "UTC", start, 6) == fires(same_as, "UTC", start, 6)


# -- a list holding *, and day-of-week steps that reach 7 (Sunday again) --------------------------


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("0 0 *,15 * 1", "day-of-month list '*,15'"),
        ("0 0 1,* * *", "day-of-month list '1,*'"),
        ("0 0 1 * 1,*", "day-of-week list '1,*'"),
        ("0 0 * * *,mon", "day-of-week list '*,mon'"),
        ("5,* * * * *", "minute list '5,*'"),
        ("0 *,3 * * *", "hour list '*,3'"),
        ("0 0 1 1,* *", "month list '1,*'"),
    ],
)
def test_a_new_list_holding_a_star_is_refused_with_the_reason(expression, field):
    # Cron reads '*,15' as unrestricted and '15,*' as restricted: the same days, two timetables.
    with pytest.raises(InvalidSchedule) as exc:
        cron_spec(expression, "UTC")
    message = exc.value.details["cron"][0]
    assert f"The {field} holds * beside other values" in message
    assert "write * alone" in message
    for fine in ("0 0 */2,15 * *", "0 0 15,*/2 * 1", "*/15,7 * * * *"):
        cron_spec(fine, "UTC")


@pytest.mark.parametrize(
    ("expr", "start"),
    [
        ("0 0 *,15 * 1", "2024-01-01 00:00"),  # starts with *: unrestricted, so Mondays
        ("0 0 15,* * 1", "2024-01-01 00:00"),  # restricted to every day, OR Mondays: every day
        ("0 0 1 * 1,*", "2024-01-01 00:00"),  # the 1st OR every weekday: every day
        ("0 0 1 * *,1", "2024-01-01 00:00"),  # the 1st AND any weekday: the 1st
        ("0 0 1,* * */2", "2024-01-01 00:00"),  # the other starts with *: every day AND Sun/Tue/Thu/Sat
    ],
)
def test_a_stored_list_holding_a_star_keeps_firing_as_cron_reads_it(expr, start):
    # croniter read any list holding * as *: '0 0 15,* * 1' fired on Mondays only, ISC cron every day.
    got = fire_times(cron_spec(expr, "UTC", stored=True), start=utc(start), count=8)
    assert len(got) == 8
    assert got == day_oracle(expr, "UTC", utc(start), got[-1])


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 * * 1-7/2",  # Mon, Wed, Fri and 7: Sunday
        "0 0 * * 3-7/2",  # Wed, Fri, Sun
        "0 0 * * 1-7/3",  # Mon, Thu, Sun
        "0 0 * * 1-7/6",  # Mon, Sun
        "0 0 * * 2-7/2",  # Tue, Thu, Sat: 8 is past the field
        "0 0 * * 6-7/2",  # Sat alone
        "0 0 * * */2",  # * is 0-7: Sun, Tue, Thu, Sat
        "0 0 * * */3",  # Sun, Wed, Sat
        "0 0 * * 0-7/7",  # 0 and 7: Sunday alone
        "0 0 * * 0-7/2",
        "0 0 * * 5-7",  # Fri, Sat, Sun
        "0 0 * * fri-7",
        "0 0 * * sun-7",  # every day
        "0 0 1 * 5-7/2",  # both restricted: the 1st, Fridays or Sundays
        "0 0 */2 * 1-7/2",  # odd days that are Mon, Wed, Fri or Sun
        "30 1 * * 5-7/2",  # London: Sunday 2024-03-31 01:30 is in the spring-forward gap
    ],
)
def test_a_day_of_week_reaching_7_fires_on_sunday_as_cron_says(expr):
    london = expr.startswith("30 1")
    start, zone = (utc("2024-03-01 00:00"), "Europe/London") if london else (utc("2024-01-01 00:00"), "UTC")
    got = fire_times(cron_spec(expr, zone), start=start, count=12)
    assert len(got) == 12
    assert got == day_oracle(expr, zone, start, got[-1])


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("0 0 * * 1/2", "'1/2' in the day of week is ambiguous (7 is Sunday too): write 1-7/2"),
        ("0 0 * * mon/3", "write mon-7/3 to include Sunday, or mon-6/3"),
        ("0 0 * * 7/2", "'7/2' in the day of week is ambiguous"),
        ("0 0 * * 1,3/2", "'3/2' in the day of week is ambiguous"),
    ],
)
def test_a_day_of_week_start_and_step_that_could_end_at_6_or_7_is_refused(expression, says):
    # Cron has no 'start/step' form; croniter ends it at 6 (Saturday), cron's day of week at 7 (Sunday).
    with pytest.raises(InvalidSchedule) as exc:
        cron_spec(expression, "UTC")
    assert says in exc.value.details["cron"][0]
    for same_either_way in ("0 0 * * 0/2", "0 0 * * 6/2", "0 0 * * 2/2"):
        cron_spec(same_either_way, "UTC")
    stored = fire_times(cron_spec("0 0 * * 1/2", "UTC", stored=True), start=utc("2024-01-01 00:00"), count=4)
    assert [t.strftime("%a") for t in stored] == ["Wed", "Fri", "Mon", "Wed"]  # kept as croniter read it


@pytest.mark.parametrize(
    ("expression", "suggestions", "days"),
    [
        ("0 0 * * 1/2", ("1-7/2", "1-6/2"), ({"Mon", "Wed", "Fri", "Sun"}, {"Mon", "Wed", "Fri"})),
        ("0 0 * * 7/2", ("7", "0-6/2"), ({"Sun"}, {"Sun", "Tue", "Thu", "Sat"})),
        ("0 0 * * 7/1", ("7", "0-6/1"), ({"Sun"}, {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"})),
    ],
)
def test_the_refusal_of_a_day_of_week_start_and_step_suggests_fields_that_are_accepted(expression, suggestions, days):
    # '7/2' used to suggest '7-7/2' and '7-6/2', a reversed range that is itself refused.
    with pytest.raises(InvalidSchedule) as exc:
        cron_spec(expression, "UTC")
    message = exc.value.details["cron"][0]
    for suggestion, weekdays in zip(suggestions, days, strict=True):
        assert f"write {suggestion} " in message or f"or {suggestion}." in message, message
        fires = fire_times(cron_spec(f"0 0 * * {suggestion}", "UTC"), start=utc("2024-01-01 00:00"), count=14)
        assert {t.strftime("%a") for t in fires} == weekdays
