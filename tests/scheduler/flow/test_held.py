"""Jobs a flow limit holds back (``Job.flow_held``): out of ordinary claims' way, and never stranded.

A limited claim phase that leaves governed jobs waiting marks them held; the claim index keys
on the flag first, so the unlimited phase reads only unheld jobs. These tests run in one
transaction each, as test_limits.py's do.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from scheduler import leasing, lifecycle
from scheduler.enqueuing import enqueue
from scheduler.flow import claim as flow_claim
from scheduler.flow import limits as flow_limits
from scheduler.flow.aging import oldest_waiting
from scheduler.models import Job
from scheduler.registry import handler
from scheduler.states import JobStatus

pytestmark = pytest.mark.django_db

LIMITED = "TEST_HELD_LIMITED"
OTHER = "TEST_HELD_OTHER"


@handler(LIMITED)
def _limited(payload: Any, ctx: Any) -> None:
    """Limited by each test's settings."""


@handler(OTHER)
def _other(payload: Any, ctx: Any) -> None:
    """Never limited."""


@pytest.fixture(autouse=True)
def _fresh_state():
    flow_claim.reset_state()  # the limited phase goes first on the first claim; the first claim releases
    flow_limits.forget_cache()
    yield
    flow_claim.reset_state()
    flow_limits.forget_cache()


def _limit(settings, **limit: Any) -> None:
    settings.SCHEDULER = {**settings.SCHEDULER, "FLOW_LIMITS": [limit]}
    flow_limits.forget_cache()


def _claim(n: int, worker: str = "w1") -> list:
    return leasing.claim_jobs(worker_id=worker, limit=n, queues=None)


def _finish(job) -> None:
    leasing.record_outcomes([leasing.Report(job=job, outcome=leasing.Outcome.SUCCEEDED)])


def _held() -> set:
    return set(Job.objects.filter(status=JobStatus.QUEUED, flow_held=True).values_list("id", flat=True))


def _unlimited_scan(excluded_types: list[str]) -> dict:
    """EXPLAIN ANALYZE of the unlimited phase's candidate scan (lifecycle.claim's WHERE and order), one row.

    Planned on this test's rows with sequential and bitmap scans off, as on a large table where
    reading the index in claim order up to the LIMIT wins: on a few dozen rows the planner's
    choice follows whatever statistics an earlier test or autovacuum left (a bitmap scan and a
    sort once statistics are fresh; a CI run once got no index scan), which says nothing about
    the index.
    """
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE stint_job")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(
            f"""
            EXPLAIN (ANALYZE, FORMAT JSON)
            SELECT id FROM stint_job
            WHERE status = 'QUEUED' AND NOT isolated AND NOT flow_held
              AND NOT (type = ANY(%s::text[]) OR queue = ANY('{{}}'::text[]))
            ORDER BY {lifecycle.CLAIM_ORDER} LIMIT 1
            """,  # noqa: S608 - a constant
            [excluded_types],
        )
        plan = cursor.fetchone()[0]
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _nodes(plan: dict) -> list[dict]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


def test_jobs_a_limit_holds_back_are_marked_held_and_leave_the_unlimited_scan(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    limited = [enqueue(LIMITED, priority="HIGH") for _ in range(40)]
    enqueue(OTHER)
    claimed = _claim(10)
    assert sorted(j.type for j in claimed) == [LIMITED, OTHER]
    running = next(j.id for j in claimed if j.type == LIMITED)
    assert _held() == {j.id for j in limited} - {running}

    enqueue(OTHER)
    scan = next(n for n in _nodes(_unlimited_scan([LIMITED])) if n["Node Type"] == "Index Scan")
    assert scan["Index Name"] == "job_claim_scan_desc"
    assert "flow_held" in scan["Index Cond"]
    assert scan.get("Rows Removed by Filter", 0) == 0  # no held-back job walked past
    assert not any(n["Node Type"] == "Sort" for n in _nodes(_unlimited_scan([LIMITED])))


def test_a_backlog_larger_than_the_marking_window_is_marked_a_window_a_phase(settings, monkeypatch):
    monkeypatch.setattr(flow_claim, "MARK_WINDOW", 40)
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    for _ in range(151):
        enqueue(LIMITED)
    _claim(1)  # claims one; a candidate read holds 100 (max(SCAN_MIN, 8 x 1 slot)) per part
    assert len(_held()) == 40
    for expected in (80, 120, 150):  # later phases read held candidates first, unheld ones behind them
        flow_claim.reset_state()
        assert _claim(1) == []
        assert len(_held()) == expected


def test_a_claim_whose_marking_fails_still_returns_the_jobs_it_claimed(settings, monkeypatch):
    # A window PostgreSQL refuses ("LIMIT must not be negative"): the marking statement fails.
    monkeypatch.setattr(flow_claim, "MARK_WINDOW", -1)
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    first = enqueue(LIMITED)
    enqueue(LIMITED)
    assert [j.id for j in _claim(5)] == [first.id]  # claimed (RUNNING): it must run, marked or not
    assert Job.objects.get(id=first.id).status == JobStatus.RUNNING


def test_a_full_limits_held_backlog_does_not_hide_another_limit_with_room(settings):
    # Found by the flow-limits breaker: 150 held HIGH jobs of a full limit filled the limited
    # phase's candidates, and the LOW job of another limit with room was never looked at.
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [
            {"scope": "type", "name": LIMITED, "concurrency": 1},
            {"scope": "type", "name": OTHER, "concurrency": 1},
        ],
    }
    flow_limits.forget_cache()
    for _ in range(150):
        enqueue(LIMITED, priority="HIGH")
    other = enqueue(OTHER, priority="LOW")
    claimed = []
    for _ in range(2):  # the first claim marks the full limit's backlog held
        flow_claim.reset_state()
        claimed += _claim(5)
    assert other.id in {j.id for j in claimed}


@pytest.mark.parametrize("scope", ["type", "queue"])
def test_a_held_job_of_a_limit_with_room_is_not_hidden_behind_another_limits_held_backlog(settings, scope):
    # Left by stop 36 as a design limit: the limited phase read the first ``scan`` held jobs of all
    # limits together, so 150 held HIGH jobs of a full limit hid the held LOW job of another limit
    # that had room again, until the full limit's backlog shrank below the read.
    other_limit = {"scope": "type", "name": OTHER} if scope == "type" else {"scope": "queue", "name": "held-other"}
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [{"scope": "type", "name": LIMITED, "concurrency": 1}, {**other_limit, "concurrency": 1}],
    }
    flow_limits.forget_cache()
    others = [enqueue(OTHER, priority="LOW", queue="held-other") for _ in range(2)]
    (running_other,) = _claim(5)
    (waiting_other,) = [j for j in others if j.id != running_other.id]
    assert _held() == {waiting_other.id}
    for _ in range(150):
        enqueue(LIMITED, priority="HIGH")
    for _ in range(2):  # one runs; the first claim marks the rest held
        flow_claim.reset_state()
        _claim(5)
    assert len(_held()) == 150  # 149 of the full limit, then the other limit's one in claim order
    _finish(running_other)
    flow_claim.reset_state()
    assert waiting_other.id in {j.id for j in _claim(5)}


@pytest.mark.parametrize("scope", ["type", "queue"])
def test_a_limits_few_held_jobs_are_read_through_the_held_index_of_its_scope(settings, scope):
    # 3,000 held jobs of a full limit come first in claim order; the other limit's one held job is
    # read through its own scope's held index, not found behind them.
    if scope == "type":
        small, full = {"scope": "type", "name": LIMITED}, {"scope": "queue", "name": "held-full"}
        backlog, few = {"type": OTHER, "queue": "held-full"}, {"type": LIMITED, "queue": "default"}
    else:
        small, full = {"scope": "queue", "name": "held-few"}, {"scope": "type", "name": LIMITED}
        backlog, few = {"type": LIMITED, "queue": "default"}, {"type": OTHER, "queue": "held-few"}
    limits = [{**small, "concurrency": 1}, {**full, "concurrency": 1}]
    settings.SCHEDULER = {**settings.SCHEDULER, "FLOW_LIMITS": limits}
    flow_limits.forget_cache()
    first = enqueue(backlog["type"], priority="HIGH", queue=backlog["queue"])
    Job.objects.bulk_create(
        [
            Job(**backlog, status=JobStatus.QUEUED, priority=50, scheduled_at=first.scheduled_at, flow_held=True)
            for _ in range(3000)
        ]
    )
    enqueue(few["type"], priority="LOW", queue=few["queue"])
    Job.objects.filter(status=JobStatus.QUEUED).update(flow_held=True)
    # The few's queue has a history, as a limited queue has, so the planner's choice of the held
    # index is not an accident of a queue with one job in all.
    Job.objects.bulk_create(
        [
            Job(**few, status=JobStatus.SUCCESS, scheduled_at=first.scheduled_at, finished_at=first.scheduled_at)
            for _ in range(1000 if few["queue"] != "default" else 0)
        ]
    )
    types, queues = ([small["name"]], [full["name"]]) if scope == "type" else ([full["name"]], [small["name"]])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE stint_job")
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) "
            + flow_claim._candidates_sql(isolated=False, partitions=0, filters="", held_types=1, held_queues=1),
            {"types": types, "queues": queues, "ht0": types[0], "hq0": queues[0], "scan": 100},
        )
        plan = cursor.fetchone()[0]
    nodes = _nodes((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    scans = [n for n in nodes if "Scan" in n["Node Type"]]
    # The plan's scans go into the failure message: a plan seen once in a full run (not reproduced
    # alone or with the flow tests) read no row through the held index.
    seen = [(n["Node Type"], n.get("Index Name"), n["Actual Rows"], n.get("Index Cond")) for n in scans]
    assert [n["Actual Rows"] for n in scans if n.get("Index Name") == f"job_held_by_{scope}"] == [1], seen
    assert sorted(n["Actual Rows"] for n in scans) == [0, 1, 100]  # unheld part, the few, the first 100 of 3,001
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes)
    assert sum(n.get("Rows Removed by Filter", 0) for n in nodes) == 0


def test_a_held_job_under_a_type_and_a_queue_limit_is_one_candidate(settings):
    # Its type's and its queue's held reads both return it: counted twice, it filled the second
    # slot the limits had room for, and the claim took one job where two were admissible.
    settings.SCHEDULER = {
        **settings.SCHEDULER,
        "FLOW_LIMITS": [
            {"scope": "type", "name": LIMITED, "concurrency": 2},
            {"scope": "queue", "name": "held-both", "concurrency": 2},
        ],
    }
    flow_limits.forget_cache()
    jobs = [enqueue(LIMITED, queue="held-both", priority=p) for p in (30, 20, 10)]
    Job.objects.filter(id__in=[j.id for j in jobs]).update(flow_held=True)
    assert [j.id for j in _claim(5)] == [j.id for j in jobs[:2]]


def test_held_and_unheld_jobs_of_a_limit_are_claimed_in_claim_order(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    low = enqueue(LIMITED, priority=10)
    high = enqueue(LIMITED, priority=50)
    (first,) = _claim(5)
    assert first.id == high.id
    assert _held() == {low.id}
    middle = enqueue(LIMITED, priority=30)  # unheld, ahead of the held one in claim order
    _finish(first)
    flow_claim.reset_state()
    (second,) = _claim(5)
    assert second.id == middle.id
    _finish(second)
    flow_claim.reset_state()
    (third,) = _claim(5)
    assert third.id == low.id  # the held one, once the limit has room
    assert Job.objects.get(id=low.id).flow_held is False  # a claim clears the flag


def test_a_held_job_whose_limit_is_removed_is_released_and_claimed(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    jobs = [enqueue(LIMITED) for _ in range(3)]
    _claim(5)
    assert len(_held()) == 2
    settings.SCHEDULER = {**settings.SCHEDULER, "FLOW_LIMITS": []}
    flow_limits.forget_cache()
    claimed = _claim(5)  # the limits changed: this claim releases first, then claims them unlimited
    assert _held() == set()
    assert len(claimed) == 2
    assert Job.objects.filter(id__in=[j.id for j in jobs], status=JobStatus.RUNNING).count() == 3


def test_release_keeps_the_jobs_a_limit_still_governs(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    for _ in range(3):
        enqueue(LIMITED)
    _claim(5)
    other = enqueue(OTHER)
    Job.objects.filter(id=other.id).update(flow_held=True)  # marked under a limit since deleted
    assert flow_claim.release_held(batch=1) == 1  # statements repeat until one clears fewer than a batch
    assert Job.objects.get(id=other.id).flow_held is False
    assert len(_held()) == 2


def test_a_claim_releases_every_release_interval_without_a_limit_change(settings, monkeypatch):
    job = enqueue(OTHER)
    assert _claim(0) == []  # the process's first claim releases (nothing held yet)
    Job.objects.filter(id=job.id).update(flow_held=True)  # say, held by a process whose limits differ
    assert _claim(5) == []  # within RELEASE_EVERY of the last release: the held job is not seen
    monkeypatch.setattr(flow_claim, "RELEASE_EVERY", 0.0)
    assert [j.id for j in _claim(5)] == [job.id]


def test_a_transition_clears_the_flag(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    enqueue(LIMITED)
    waiting = enqueue(LIMITED)
    _claim(5)
    assert _held() == {waiting.id}
    lifecycle.cancel(waiting.id)
    assert Job.objects.get(id=waiting.id).flow_held is False


def test_the_oldest_waiting_figure_counts_held_jobs(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    enqueue(LIMITED, priority=20)
    enqueue(LIMITED, priority=7)
    _claim(5)
    assert len(_held()) == 1
    assert [label for label, _ in oldest_waiting()] == ["7"]


def test_isolated_jobs_are_never_marked(settings):
    _limit(settings, scope="type", name=LIMITED, concurrency=1)
    jobs = [enqueue(LIMITED) for _ in range(3)]
    Job.objects.filter(id__in=[j.id for j in jobs]).update(isolated=True)
    assert len(leasing.claim_jobs(worker_id="iso", limit=5, queues=None, isolated=True)) == 1
    assert _held() == set()
