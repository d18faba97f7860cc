"""Tests for scheduler.registry: what ``@handler`` accepts as a job type name."""

from __future__ import annotations

import math

import pytest

from scheduler import jobspec, registry
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


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_retries", 0),
        ("max_retries", 11),
        ("max_retries", -1),
        ("max_retries", True),
        ("max_retries", "3"),
        ("max_retries", 2.5),
        ("timeout_seconds", 0),
        ("timeout_seconds", 3601),
        ("timeout_seconds", True),
        ("timeout_seconds", "30"),
        ("timeout_seconds", 1.5),
    ],
    ids=repr,
)
def test_a_retry_or_timeout_default_no_job_could_have_is_refused_when_the_handler_is_declared(option, value):
    # Once registered, every enqueue of the type that left the option to the handler failed with
    # "Must be an integer from 1 to 10" (or 3600), naming no handler: the default was the fault.
    low, high = {"max_retries": jobspec.MAX_RETRIES_RANGE, "timeout_seconds": jobspec.TIMEOUT_RANGE}[option]
    with pytest.raises(
        ValueError,
        match=rf"^@handler\('TEST_REGISTRY_BAD_BUDGET'\): {option} must be an integer from {low} to {high}, not ",
    ):
        handler("TEST_REGISTRY_BAD_BUDGET", **{option: value})(lambda payload, ctx: None)
    assert "TEST_REGISTRY_BAD_BUDGET" not in registry._REGISTRY


def test_the_handler_ranges_are_the_job_specs():
    # One source: the API, the pages and @handler read the same constants (scheduler.states).
    assert (registry.MAX_RETRIES_RANGE, registry.TIMEOUT_RANGE) == (jobspec.MAX_RETRIES_RANGE, jobspec.TIMEOUT_RANGE)
    assert registry.MAX_RETRIES_RANGE is jobspec.MAX_RETRIES_RANGE and registry.TIMEOUT_RANGE is jobspec.TIMEOUT_RANGE


def test_the_ends_of_the_retry_and_timeout_ranges_register():
    low, high = jobspec.MAX_RETRIES_RANGE, jobspec.TIMEOUT_RANGE
    try:
        handler("TEST_REGISTRY_BUDGET_LOW", max_retries=low[0], timeout_seconds=high[0])(lambda p, c: None)
        handler("TEST_REGISTRY_BUDGET_HIGH", max_retries=low[1], timeout_seconds=high[1])(lambda p, c: None)
        assert (
            registry.resolve("TEST_REGISTRY_BUDGET_LOW").max_retries,
            registry.resolve("TEST_REGISTRY_BUDGET_HIGH").timeout_seconds,
        ) == (low[0], high[1])
    finally:
        registry._REGISTRY.pop("TEST_REGISTRY_BUDGET_LOW", None)
        registry._REGISTRY.pop("TEST_REGISTRY_BUDGET_HIGH", None)


@pytest.mark.parametrize("value", [1, "yes", 0.5], ids=repr)
def test_a_backoff_jitter_that_is_not_true_or_false_is_refused_when_the_handler_is_declared(value):
    with pytest.raises(ValueError, match=r"backoff_jitter must be True or False"):
        handler("TEST_REGISTRY_BAD_JITTER", backoff_jitter=value)(lambda payload, ctx: None)
    assert "TEST_REGISTRY_BAD_JITTER" not in registry._REGISTRY


def test_the_unknown_type_message_names_the_django_tasks_too_sorted_and_capped():
    tasks = [f"app.tasks.t{n:02}" for n in reversed(range(12))]

    message = unknown_type_message("DEMO", ["A", "B"], tasks)

    assert message == (
        "Unknown job type 'DEMO'. Registered types: A, B. Django tasks: "
        + ", ".join(f"app.tasks.t{n:02}" for n in range(10))
        + " and 2 more."
    )


@pytest.fixture
def a_task_type():
    """A Django task path known to the registry (as stint_tasks registers its tasks' paths), sorted first."""
    source = lambda: ["a.tasks.send_receipt"]  # noqa: E731
    registry.add_type_source(source)
    yield "a.tasks.send_receipt"
    registry._TYPE_SOURCES.remove(source)


def test_a_type_no_worker_can_resolve_is_refused_naming_handlers_and_django_tasks(a_task_type):
    # Workers and trusted enqueues run Django tasks too: the error named only the @handler types.
    with pytest.raises(UnknownJobType) as refused:
        registry.resolve("a.tasks.send_reciept")

    message = str(refused.value)
    assert message.startswith("Unknown job type 'a.tasks.send_reciept'. Registered types: ")
    assert "DEMO_TASK" in message and f"Django tasks: {a_task_type}" in message


def test_an_enqueue_by_type_names_the_django_tasks_and_how_they_are_enqueued(a_task_type):
    with pytest.raises(UnknownJobType) as unknown:
        get_handler("DEMO")
    with pytest.raises(UnknownJobType) as a_task:
        get_handler(a_task_type)

    assert f"Django tasks (enqueued with their .enqueue(), never by type): {a_task_type}" in str(unknown.value)
    assert str(a_task.value).startswith(
        f"Unknown job type '{a_task_type}' here: it is a Django task, enqueued with its .enqueue(); by type (the REST"
        " API, schedules, scheduler.enqueue) only the registered types are: DATA_CLEANUP, DEMO_TASK, "
    )
