"""Fixtures of the scheduler tests: a Redis leadership role of each test's own (tests/support/leadership.py), and a
test client signed in to the operator console."""

import pytest

from scheduler.flow import limits as flow_limits
from tests.support.leadership import leader, leaders, role  # noqa: F401 - fixtures


@pytest.fixture
def operator(client, admin_user):
    """A test client signed in as an ADMIN (staff), with no flow limit cached before or after."""
    client.force_login(admin_user)
    flow_limits.forget_cache()
    yield client
    flow_limits.forget_cache()
