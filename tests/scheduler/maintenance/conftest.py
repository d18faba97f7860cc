"""Fixtures of the maintenance tests."""

from tests.support.jobs import maintenance_settings  # noqa: F401 - fixture
