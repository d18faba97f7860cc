"""Tests for scheduler.flow.limits and scheduler.flow.claim in one process: what a claim admits under limits.

Each test runs in one transaction: the advisory locks a claim takes are this session's (so
re-taken freely), and ``now()`` does not move, so a rate window never slides here; the
multi-process tests (test_flow_processes.py) cover concurrency across workers and time.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from scheduler import leasing, registry
from scheduler.enqueuing import enqueue
from scheduler.exceptions import InvalidLimit
from scheduler.flow import claim as flow_claim
from scheduler.flow import limits as flow_limits
from scheduler.flow.explain import Explainer
from scheduler.flow.models import FlowAdmission, FlowLimit
from scheduler.models import Job
from scheduler.registry import handler
from scheduler.states import JobStatus

pytestmark = pytest.mark.django_db

LIMITED = "TEST_FLOW_LIMITED"
OTHER = "TEST_FLOW_OTHER"
PER_CUSTOMER = "TEST_FLOW_PER_CUSTOMER"


@handler(LIMITED)
def _limited(payload: Any, ctx: Any) -> None:
    """Limited by the tests' settings."""


@handler(OTHER)
def _other(payload: Any, ctx: Any) -> None:
    """Never limited."""


def _per_customer(payload: Any, ctx: Any) -> None:
    """At most 3 at once, 1 per customer: limits from the decorator (registered only during a test)."""


@pytest.fixture(autouse=True)
def _fresh_limits():
    # Registered per test and removed after: a handler's limit would otherwise route every claim of
    # the rest of the suite through the flow path.
    handler(PER_CUSTOMER, concurrency=3, concurrency_key="customer")(_per_customer)
    flow_limits.forget_cache()
    yield
    registry._REGISTRY.pop(PER_CUSTOMER, None)
    flow_limits.forget_cache()


def _limit(settings, **limit: Any) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "FLOW_LIMITS": [limit]}


def _claim(n: int, worker: str = "w1") -> list:
    return leasing.claim_jobs(worker_id=worker, limit=n, queues=None)


def test_concurrency_limit_admits_only_the_room_left(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=3)
    for _ in range(5):
        enqueue(LIMITED)
    for _ in range(4):
        enqueue(OTHER)
    first = _claim(10)
    assert sorted(j.type for j in first) == [LIMITED] * 3 + [OTHER] * 4
    assert _claim(10, "w2") == []  # 3 RUNNING: no room, and the OTHER jobs are all claimed
    assert Job.objects.filter(type=LIMITED, status=JobStatus.QUEUED).count() == 2


def test_a_finished_job_frees_its_unit(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    for _ in range(2):
        enqueue(LIMITED)
    (job,) = _claim(5)
    assert _claim(5) == []
    leasing.record_outcomes([leasing.Report(job=job, outcome=leasing.Outcome.SUCCEEDED)])
    assert len(_claim(5)) == 1


def test_a_claim_says_when_a_concurrency_limit_alone_held_jobs_back(settings):
    """The worker claims again when one of its jobs ends only after such a claim (``leasing.claim_held_for_units``)."""
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    for _ in range(2):
        enqueue(LIMITED)
    (job,) = _claim(5)
    assert leasing.claim_held_for_units()  # the second waits for the one unit
    leasing.record_outcomes([leasing.Report(job=job, outcome=leasing.Outcome.SUCCEEDED)])
    assert len(_claim(5)) == 1
    assert not leasing.claim_held_for_units()  # nothing left waiting


def test_a_claim_a_rate_limit_or_want_of_slots_held_back_does_not_wait_for_a_unit(settings):
    _limit(settings, scope="type", name=LIMITED, rate_limit=4, rate_period_seconds=60)
    for _ in range(7):
        enqueue(LIMITED)
    assert len(_claim(5)) == 2  # the pacing's burst: a finished job frees nothing the rate limit counts
    assert not leasing.claim_held_for_units()
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [
            {"scope": "type", "name": LIMITED, "rate_limit": 4, "rate_period_seconds": 60},
            {"scope": "type", "name": OTHER, "concurrency": 5},
        ],
    }
    flow_limits.forget_cache()
    for _ in range(3):
        enqueue(OTHER)
    assert [j.type for j in _claim(2)] == [OTHER] * 2  # the slots, not the limit, left the third behind
    assert not leasing.claim_held_for_units()


def test_a_held_back_job_is_no_attempt(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    enqueue(LIMITED)
    held = enqueue(LIMITED)
    _claim(5)
    _claim(5)
    held.refresh_from_db()
    assert (held.status, held.attempts, held.attempt_set.count()) == (JobStatus.QUEUED, 0, 0)


def test_partition_limit_admits_one_per_customer_within_the_global_cap(settings):
    for customer in ["a", "a", "b", "b", "c", "d"]:
        enqueue(PER_CUSTOMER, {"customer": customer})
    claimed = _claim(10)
    customers = sorted(j.payload["customer"] for j in claimed)
    assert customers == ["a", "b", "c"]  # 1 per customer, 3 at most


def test_queue_limit_counts_every_type_in_the_queue(settings):
    _limit(settings, scope="queue", name="slow", concurrency=2)
    enqueue(LIMITED, queue="slow")
    enqueue(OTHER, queue="slow")
    enqueue(OTHER, queue="slow")
    enqueue(OTHER, queue="default")
    claimed = _claim(10)
    assert sorted(j.queue for j in claimed) == ["default", "slow", "slow"]


def test_rate_limit_paces_claims_and_logs_admissions(settings):
    _limit(settings, scope="type", name=LIMITED, rate_limit=4, rate_period_seconds=60)
    for _ in range(7):
        enqueue(LIMITED)
    assert len(_claim(5)) == 2  # a burst of 2, then one each 15 s (the clock stands still in this test)
    assert _claim(5) == []
    assert FlowAdmission.objects.filter(key=f"type:{LIMITED}").count() == 2
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM tat - now()) FROM stint_flow_pace WHERE key = %s", [f"type:{LIMITED}"]
        )
        # 30 s after the claim's statement (now() is this test's start, a moment before it).
        assert 30 <= cursor.fetchone()[0] < 31


def test_rate_limit_caps_every_window_whatever_the_pacing_allows(settings):
    _limit(settings, scope="type", name=LIMITED, rate_limit=4, rate_period_seconds=60)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO stint_flow_admission (key, admitted_at) SELECT %s, now() - interval '50 seconds'"
            " FROM generate_series(1, 3)",
            [f"type:{LIMITED}"],
        )
        cursor.execute(
            "INSERT INTO stint_flow_admission (key, admitted_at) VALUES (%s, now() - interval '61 seconds')",
            [f"type:{LIMITED}"],
        )
    for _ in range(5):
        enqueue(LIMITED)
    assert len(_claim(5)) == 1  # 3 of 4 in the window (the 61 s old one is out of it, and pruned)
    assert FlowAdmission.objects.filter(key=f"type:{LIMITED}").count() == 4


@pytest.mark.parametrize(("pace_in", "wait"), [(None, 10.0), (30.0, 15.0)])
def test_a_job_held_by_a_full_rate_window_is_told_how_long_until_the_next_start(settings, pace_in, wait):
    # The message said how many had started in the window, not when the next could. The window (4 per
    # 60 s) frees when its oldest start is 60 s old: in 10 s; pacing (15 s apart) may say later.
    _limit(settings, scope="type", name=LIMITED, rate_limit=4, rate_period_seconds=60)
    with connection.cursor() as cursor:  # one transaction: now() stands still for the whole test
        cursor.execute(
            "INSERT INTO stint_flow_admission (key, admitted_at) SELECT %s, now() - make_interval(secs => s)"
            " FROM unnest(ARRAY[50, 50, 20, 5]) AS s",
            [f"type:{LIMITED}"],
        )
        if pace_in is not None:
            cursor.execute(
                "INSERT INTO stint_flow_pace (key, tat) VALUES (%s, now() + make_interval(secs => %s))",
                [f"type:{LIMITED}", pace_in],
            )
    waiting = enqueue(LIMITED)

    reason = Explainer().reason(Job.objects.get(id=waiting.id))

    assert reason == {
        "code": "rate_limit",
        "message": f"Rate limit of type {LIMITED}: 4 of 4 started in the last 60 s; the next start it admits is in "
        f"about {wait:.1f} s.",
    }


@pytest.mark.parametrize(
    "tat_in,expected",
    [
        (None, (2, 0.0)),  # no state yet: a burst
        (-100.0, (2, 0.0)),  # idle for long: a burst, no more
        (0.0, (2, 0.0)),
        (10.0, (1, 10.0)),  # one interval (15 s) of tolerance: one more now
        (15.0, (1, 15.0)),
        (15.5, (0, 15.5)),  # ahead by more than the tolerance: wait
    ],
)
def test_pacing_is_gcra(tat_in, expected):
    limit = flow_limits.Limit(scope="type", name="X", rate_limit=4, rate_period_seconds=60.0)
    assert flow_claim.paced_allowance(limit, tat_in) == expected


def test_an_arrival_time_beyond_what_the_limit_can_reach_counts_as_the_furthest_it_can():
    limit = flow_limits.Limit(scope="type", name="X", rate_limit=4, rate_period_seconds=60.0)
    # Left by a limit of 1 per day: 4 per minute reaches at most a burst (2) of 15 s ahead, so
    # this counts as the tolerance (15 s): one claim now, the next 15 s later.
    assert flow_claim.paced_allowance(limit, 86_389.8) == (1, 15.0)
    assert flow_claim.paced_allowance(limit, 30.0) == (0, 30.0)  # within reach: waits as before


def test_a_relaxed_rate_limit_holds_its_jobs_one_new_interval_not_the_rest_of_the_old_one():
    flow_limits.limit_set(scope="type", name=LIMITED, data={"rate_limit": 1, "rate_period_seconds": 86400})
    first, second = enqueue(LIMITED), enqueue(LIMITED)
    assert [j.id for j in _claim(5)] == [first.id]
    assert Explainer().reason(Job.objects.get(id=second.id))["code"] == "rate_limit"

    flow_limits.limit_set(scope="type", name=LIMITED, data={"rate_limit": 1000, "rate_period_seconds": 1000})
    flow_limits.forget_cache()
    assert Explainer().reason(Job.objects.get(id=second.id)) is None  # nothing holds it any more
    assert [j.id for j in _claim(5)] == [second.id]
    third = enqueue(LIMITED)
    assert _claim(5) == []  # then the new pace: 1 s apart
    assert Explainer().reason(Job.objects.get(id=third.id))["message"].endswith("the next in about 1.0 s.")


def test_a_claim_records_its_admissions_and_starts_at_its_statements_time_not_its_transactions_start():
    # A flow claim's transaction may wait for a limit's lock before it admits anything. Stamped with
    # now() (the transaction's start), its admissions aged out of the rate window early by that wait,
    # letting a later claim admit more than the limit in a real window, and its jobs' started_at lied.
    flow_limits.limit_set(scope="type", name=LIMITED, data={"rate_limit": 5, "rate_period_seconds": 60})
    job = enqueue(LIMITED)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() + interval '0.2 s' FROM pg_sleep(0.2)")  # the test's transaction ages
        after_wait = cursor.fetchone()[0]
    assert [j.id for j in _claim(5)] == [job.id]
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(admitted_at), min(tat) FROM stint_flow_admission, stint_flow_pace")
        admitted_at, tat = cursor.fetchone()
    assert admitted_at >= after_wait
    assert tat > after_wait
    assert Job.objects.get(id=job.id).started_at >= after_wait


def test_a_partition_value_that_is_an_object_is_explained_as_postgresql_compares_it():
    enqueue(PER_CUSTOMER, {"customer": {"b": 1, "a": "é"}})
    waiting = enqueue(PER_CUSTOMER, {"customer": {"a": "é", "b": 1}})  # the same customer to jsonb
    assert len(_claim(10)) == 1
    reason = Explainer().reason(Job.objects.get(id=waiting.id))
    assert reason["code"] == "partition_limit"
    assert '({"a": "é", "b": 1})' in reason["message"]


def test_a_partition_limit_stored_without_its_concurrency_is_explained_as_the_claim_counts_it():
    # A row written by hand may hold NULL; the claim counts it as 1, and so does the explanation.
    flow_limits.limit_set(scope="type", name=LIMITED, data={"partition_key": "customer"})
    FlowLimit.objects.filter(scope="type", name=LIMITED).update(partition_concurrency=None)
    flow_limits.forget_cache()
    enqueue(LIMITED, {"customer": "a"})
    waiting = enqueue(LIMITED, {"customer": "a"})
    assert len(_claim(10)) == 1
    reason = Explainer().reason(Job.objects.get(id=waiting.id))
    assert reason["code"] == "partition_limit"
    assert reason["message"].endswith("(a): 1 of 1 running.")


def test_database_limit_wins_over_the_handler_and_is_removable(settings):
    flow_limits.limit_set(scope="type", name=PER_CUSTOMER, data={"concurrency": 1})
    for customer in ["a", "b"]:
        enqueue(PER_CUSTOMER, {"customer": customer})
    assert len(_claim(10)) == 1
    flow_limits.limit_delete(scope="type", name=PER_CUSTOMER)
    assert len(_claim(10)) == 1  # the decorator's limit again: 3, 1 per customer


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"concurrency": 0},
        {"concurrency": True},
        {"concurrency": "3"},
        {"concurrency": 10**7},
        {"rate_limit": 5},
        {"rate_period_seconds": 5},
        {"rate_limit": 5, "rate_period_seconds": 0},
        {"rate_limit": 5, "rate_period_seconds": float("nan")},
        {"partition_key": "a b"},
        {"partition_concurrency": 2},
        {"concurrency": 1, "bogus": 1},
        [],
    ],
)
def test_invalid_limits_are_refused(data):
    with pytest.raises(InvalidLimit):
        flow_limits.validated(data, scope="queue", name="q")


def test_invalid_scope_or_name_is_refused():
    with pytest.raises(InvalidLimit):
        flow_limits.validated({"concurrency": 1}, scope="host", name="q")
    with pytest.raises(InvalidLimit):
        flow_limits.validated({"concurrency": 1}, scope="queue", name="a/b")


def test_handler_with_a_bad_limit_fails_at_import():
    with pytest.raises(ValueError, match="concurrency"):
        handler("TEST_FLOW_BAD", concurrency=0)(lambda payload, ctx: None)


def test_the_pruner_removes_admissions_older_than_the_longest_window():
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.flow.pruner import AdmissionPruner

    now = timezone.now()
    FlowAdmission.objects.create(key="type:GONE", admitted_at=now - timedelta(days=2))
    FlowAdmission.objects.create(key="type:GONE", admitted_at=now - timedelta(hours=1))
    assert AdmissionPruner().run_once(now=now) == 1
    assert FlowAdmission.objects.count() == 1


def test_the_pruner_removes_pacing_rows_a_day_in_the_past_and_keeps_the_rest():
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.flow.models import FlowPace
    from scheduler.flow.pruner import AdmissionPruner

    now = timezone.now()
    FlowPace.objects.create(key="type:GONE", tat=now - timedelta(days=2))
    FlowPace.objects.create(key="type:RECENT", tat=now - timedelta(hours=1))
    FlowPace.objects.create(key="type:AHEAD", tat=now + timedelta(seconds=30))
    assert AdmissionPruner().run_once(now=now) == 1
    assert sorted(FlowPace.objects.values_list("key", flat=True)) == ["type:AHEAD", "type:RECENT"]


def test_a_bad_settings_entry_or_row_is_skipped_not_fatal(settings):
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [
            {"scope": "type", "name": LIMITED, "concurrency": 0},
            "junk",
            {"scope": "queue", "name": "q", "concurrency": 2},
        ],
    }
    FlowLimit.objects.create(scope="type", name=OTHER, concurrency=0)  # as if edited by hand
    assert set(flow_limits.effective_limits(fresh=True)) == {"queue:q", f"type:{PER_CUSTOMER}"}
    enqueue(LIMITED)
    assert len(_claim(5)) == 1


def test_a_saturated_unlimited_backlog_does_not_starve_limited_jobs(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=5)
    limited = enqueue(LIMITED)  # first in claim order (oldest at the same priority)
    for _ in range(20):
        enqueue(OTHER)
    flow_claim._state.last_first = flow_claim.time.monotonic()  # the limited phase just ran first
    assert {j.type for j in _claim(3)} == {OTHER}  # every slot went to the unlimited backlog
    flow_claim._state.last_first -= flow_claim.LIMITED_FIRST_EVERY  # a second later
    claimed = _claim(3)
    assert limited.id in {j.id for j in claimed}  # the limited phase went first


def test_an_admissible_limited_backlog_does_not_jump_ahead_of_higher_priority_unlimited_jobs(settings):
    # The limited phase goes first while it last left admissible jobs behind; it took every slot
    # each time, so 5 HIGH unlimited jobs waited behind 50 LOW limited ones whose limit had room.
    _limit(settings, scope="type", name=LIMITED, concurrency=1000)
    for _ in range(50):
        enqueue(LIMITED, priority="LOW")
    high = {enqueue(OTHER, priority="HIGH").id for _ in range(5)}
    flow_claim.reset_state()  # the limited phase goes first
    first = _claim(10)
    assert {j.id for j in first} >= high  # claim order across both phases: the HIGH ones first
    assert sorted(j.type for j in first) == [LIMITED] * 5 + [OTHER] * 5


def test_a_higher_priority_limited_job_still_goes_before_unlimited_ones_when_its_phase_goes_first(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=5)
    for _ in range(20):
        enqueue(OTHER, priority="LOW")
    urgent = enqueue(LIMITED, priority="HIGH")
    flow_claim.reset_state()  # the limited phase goes first
    claimed = _claim(3)
    assert claimed[0].id == urgent.id
    assert [j.type for j in claimed[1:]] == [OTHER, OTHER]
