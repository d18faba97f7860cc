"""Fuzz every operation of /api/schema/ with schemathesis through the WSGI app, as a real user.

Each operation gets the schema's examples and ``STINT_FUZZ_EXAMPLES`` fuzzed cases (default 20);
``make fuzz`` adds the coverage phase and runs 200.
Every response is checked by schemathesis' default checks: no 5xx, status code, content type,
headers and body conform to the schema, auth is not ignored. The run's request count is printed
at the end of the module.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from config.wsgi import application
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

MAX_EXAMPLES = int(os.environ.get("STINT_FUZZ_EXAMPLES", "20"))  # fuzzing-phase cases per operation
# The coverage phase (every boundary and negative case the schema implies, ~50 per operation) is
# left to `make fuzz`, which keeps the default suite fast.
PHASES = os.environ.get("STINT_FUZZ_PHASES", "examples,fuzzing").split(",")
STATUSES: Counter[str] = Counter()

# Loaded at collection through the app itself: the schema under test is the one /api/schema/ serves.
# (schemathesis.pytest.from_fixture would defer this, but it breaks on pytest 9's node ids.)
schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
schema.config.phases.update(phases=PHASES)


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and STATUSES:
        by_class = ", ".join(f"{k}: {v}" for k, v in sorted(STATUSES.items()))
        reporter.write_line(
            f"schemathesis: {sum(STATUSES.values())} requests over {len(list(schema.get_all_operations()))}"
            f" operations (phases {','.join(PHASES)}; {MAX_EXAMPLES} fuzzed each at most); responses {by_class}"
        )


@pytest.fixture(autouse=True)
def _in_test_transaction(settings):
    """Let WSGI calls run inside the test transaction, with budgets that fuzzing cannot spend.

    Django's test client makes the same two disconnections around each request.
    """
    settings.STINT_RATE_LIMITS = {"user": "100000/min", "auth": "100000/min"}
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def auth(user) -> dict[str, str]:
    """The ``Authorization`` header of ``user``, minted once for every example of an operation.

    Minting a token writes an outstanding-token row; per example (twice: the call and the auth
    check) that was most of the module's database work, and a token valid for the whole test tests
    the same thing.
    """
    return {"Authorization": bearer(user)}


@schema.parametrize()
# One real account serves every example of an operation: that is the point of the fixture.
@hypothesis_settings(
    max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_api_conforms_to_its_schema(case, auth):
    response = case.call(headers=auth)
    STATUSES[f"{response.status_code // 100}xx"] += 1
    case.validate_response(
        response,
        headers=auth,
        # Input strictness, not conformance: a schema cannot say "a registered job type" or "a
        # strong password", so schema-valid bodies are rightly refused with 400
        # (positive_data_acceptance), and DRF's pagination serves the default page size for a
        # malformed page_size rather than refusing it (negative_data_rejection).
        excluded_checks=[positive_data_acceptance, negative_data_rejection],
    )
