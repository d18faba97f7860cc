"""Fixtures of the scheduler tests: a Redis leadership role of each test's own (tests/support/leadership.py)."""

from tests.support.leadership import leader, leaders, role  # noqa: F401 - fixtures
