"""Tests for scheduler.registry: what ``@handler`` accepts as a job type name."""

from __future__ import annotations

import math

import pytest

from scheduler import registry
from scheduler.exceptions import UnknownJobType
from scheduler.registry import get_handler, handler, unknown_type_message


@pytest.mark.parametrize(
    "name",
    ["X" * 101, "", "nul\x00type", "surrogate\udc80type", 7],
    ids=["101 chars", "empty", "NUL", "lone surrogate", "not text"],
)
def test_a_name_a_job_row_cannot_hold_is_refused_when_the_handler_is_declared(name):
    with pytest.raises(ValueError, match="job type"):
        handler(name)(lambda payload, ctx: None)
    assert name not in registry._REGISTRY


@pytest.mark.parametrize("field", ["backoff_base_seconds", "backoff_max_seconds"])
@pytest.mark.parametrize("value", [-1, math.nan, math.inf, 1e15, 604_801, "5", True], ids=repr)
def test_a_backoff_the_database_cannot_schedule_is_refused_when_the_handler_is_declared(field, value):
    # A type whose retries were due 1e15 s on (timestamp out of range) failed every rescue batch that
    # held one of its jobs: the supervisor's rescue of a dead process's jobs and the lease rescuer's
    # oldest-first batch, innocent neighbours included, and its own retries ended FAILED.
    with pytest.raises(ValueError, match=f"{field} must be a number of seconds from 0 to 604800"):
        handler("TEST_REGISTRY_BAD_BACKOFF", **{field: value})(lambda payload, ctx: None)
    assert "TEST_REGISTRY_BAD_BACKOFF" not in registry._REGISTRY


def test_a_backoff_from_0_to_a_week_registers():
    try:
        handler("TEST_REGISTRY_BACKOFF", backoff_base_seconds=0, backoff_max_seconds=604_800.0)(lambda p, c: None)
        spec = registry.resolve("TEST_REGISTRY_BACKOFF")
        assert (spec.backoff_base_seconds, spec.backoff_max_seconds) == (0, 604_800.0)
    finally:
        registry._REGISTRY.pop("TEST_REGISTRY_BACKOFF", None)


def test_the_length_limit_is_the_job_rows():
    from scheduler.models import Job

    assert registry.MAX_TYPE_LENGTH == Job._meta.get_field("type").max_length


def test_a_name_of_100_characters_registers():
    name = "Y" * 100
    try:
        handler(name)(lambda payload, ctx: None)
        assert registry.resolve(name).name == name
    finally:
        registry._REGISTRY.pop(name, None)


def test_an_unknown_type_is_refused_with_the_registered_types_named():
    with pytest.raises(UnknownJobType) as refused:
        get_handler("DEMO")
    assert str(refused.value).startswith("Unknown job type 'DEMO'. Registered types: ")
    assert "DEMO_TASK" in str(refused.value)
    assert refused.value.details == {"type": [str(refused.value)]}


def test_the_unknown_type_message_names_at_most_ten_types():
    message = unknown_type_message("DEMO", [f"T{n:02}" for n in range(25)])
    assert message == (
        "Unknown job type 'DEMO'. Registered types: T00, T01, T02, T03, T04, T05, T06, T07, T08, T09 and 15 more."
    )
    assert unknown_type_message("DEMO", []) == "Unknown job type 'DEMO'. No job type is registered."
