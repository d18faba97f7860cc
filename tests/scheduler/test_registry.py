"""Tests for scheduler.registry: what ``@handler`` accepts as a job type name."""

from __future__ import annotations

import pytest

from scheduler import registry
from scheduler.registry import handler


@pytest.mark.parametrize(
    "name",
    ["X" * 101, "", "nul\x00type", "surrogate\udc80type", 7],
    ids=["101 chars", "empty", "NUL", "lone surrogate", "not text"],
)
def test_a_name_a_job_row_cannot_hold_is_refused_when_the_handler_is_declared(name):
    with pytest.raises(ValueError, match="job type"):
        handler(name)(lambda payload, ctx: None)
    assert name not in registry._REGISTRY


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
