"""Claim index upkeep (scheduler.maintenance.claim_index): VACUUM once claims read past too many dead entries."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from bench.claim_dead_entries import queue_jobs
from scheduler import leasing, metrics
from scheduler.enqueuing import enqueue
from scheduler.maintenance import claim_index, default_services
from scheduler.maintenance.claim_index import ClaimIndexUpkeep, pages_read_by_a_claim
from scheduler.models import Job
from scheduler.states import JobStatus
from tests.support.processes import WAIT, wait_until
from tests.support.subprocess_env import database_url

# VACUUM cannot run inside a transaction block: these tests commit.
pytestmark = pytest.mark.django_db(transaction=True)

FINISHED = 20_000  # finished jobs: their dead entries fill about a hundred index pages


@pytest.fixture(autouse=True)
def no_autovacuum_on_the_job_table():
    """Autovacuum off for ``stint_job`` during each test: one it starts after the test's 2,000
    updates would remove the dead entries a test counts (the dev stack's PostgreSQL has it on)."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE stint_job SET (autovacuum_enabled = false)")
        # One that started before (after an earlier test's updates) goes on and holds the lock a
        # VACUUM takes: a test's own VACUUM (SKIP_LOCKED) would then be skipped. Wait it out.
        wait_until(lambda: _autovacuum_workers(cursor) == 0, what="the job table's autovacuum ended")
    yield
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE stint_job RESET (autovacuum_enabled)")


def _autovacuum_workers(cursor) -> int:
    cursor.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE backend_type = 'autovacuum worker' AND datname = current_database()"
    )
    return cursor.fetchone()[0]


def finish_jobs(count: int, *, first: int = 0, held: bool = False) -> None:
    """Queue ``count`` jobs (``queue_jobs``), then move them on: each leaves a dead claim-index entry.

    ``held``: the jobs are marked held (``flow_held``) first and a VACUUM removes the entries that
    left in the index's unheld part, so the dead entries are all in its held part, the one only
    the limited phase of a flow-limited claim reads.

    Returns once every transaction that began before the jobs finished has ended, in any database
    of the server: transaction ids are server-wide, so a snapshot taken while an older one runs (a
    parallel test worker's, in its own database) has an xmin below the update, and neither that
    snapshot nor a VACUUM meanwhile could treat the jobs' old rows as dead to everyone.
    """
    queue_jobs(count, first=first)
    if held:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE stint_job SET flow_held = true WHERE status = 'QUEUED'")
        _wait_for_older_transactions()
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (INDEX_CLEANUP ON) stint_job")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE stint_job SET status = 'SUCCESS', finished_at = now() WHERE status = 'QUEUED'")
    _wait_for_older_transactions()


def _wait_for_older_transactions() -> None:
    """Return once every transaction older than now has ended (``finish_jobs``: why)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current()")  # a transaction id newer than the update's
        (after,) = cursor.fetchone()
        deadline = time.monotonic() + WAIT
        while True:
            cursor.execute("SELECT txid_snapshot_xmin(txid_current_snapshot())")  # the oldest still running
            if cursor.fetchone()[0] >= after or time.monotonic() > deadline:
                return
            time.sleep(0.01)


def vacuums() -> float:
    return metrics.claim_index_vacuums_total._value.get()


def test_a_claim_reads_past_finished_jobs_until_the_upkeep_vacuums_them_away() -> None:
    finish_jobs(FINISHED)
    waiting = enqueue("DEMO_TASK")  # the next claim's job, behind every dead entry
    before = pages_read_by_a_claim()
    assert before >= 50  # ~200 entries a page
    runs = vacuums()

    assert ClaimIndexUpkeep(vacuum_pages=before // 2).run_once() == 1

    after = pages_read_by_a_claim()
    assert after < 10
    assert vacuums() - runs == 1
    assert metrics.claim_index_pages_read._value.get() == after
    # Nothing but the dead entries went: the queued job is claimed as before.
    (claimed,) = leasing.claim_jobs(worker_id="w-test", limit=5, queues=None)
    assert claimed.id == waiting.id
    assert Job.objects.filter(status=JobStatus.SUCCESS).count() == FINISHED


def test_the_held_part_a_limited_claim_reads_past_counts_too() -> None:
    # A held-back backlog drained by its limit after a VACUUM: the claims of its jobs left their
    # entries in the index's held part, which the limited phase reads from its start.
    finish_jobs(FINISHED, held=True)
    waiting = enqueue("DEMO_TASK")
    Job.objects.filter(id=waiting.id).update(flow_held=True)  # the next limited claim's job, behind them
    before = pages_read_by_a_claim()
    assert before >= 50

    assert ClaimIndexUpkeep(vacuum_pages=before // 2).run_once() == 1

    assert pages_read_by_a_claim() < 10
    assert Job.objects.get(id=waiting.id).status == JobStatus.QUEUED


def test_below_the_threshold_it_only_reports_what_a_claim_reads() -> None:
    finish_jobs(2_000)
    pages = pages_read_by_a_claim()
    runs = vacuums()

    assert ClaimIndexUpkeep(vacuum_pages=pages + 1000).run_once() == 0

    assert vacuums() == runs
    assert metrics.claim_index_pages_read._value.get() == pages
    assert pages_read_by_a_claim() == pages  # still there: no VACUUM ran


def test_zero_pages_turns_it_off_and_the_scheduler_runs_it_with_the_setting(settings) -> None:
    finish_jobs(2_000)
    pages = pages_read_by_a_claim()

    assert ClaimIndexUpkeep(vacuum_pages=0).run_once() == 0
    assert pages_read_by_a_claim() == pages

    settings.SCHEDULER = {**settings.SCHEDULER, "CLAIM_INDEX_VACUUM_PAGES": 7}
    (service,) = [s for s in default_services() if s.name == "claim_index_upkeep"]
    assert service.vacuum_pages == 7
    assert service.leader_only is False


def test_a_vacuum_that_another_one_holds_off_is_reported_not_counted(caplog) -> None:
    finish_jobs(2_000)
    pages = pages_read_by_a_claim()
    runs = vacuums()
    # Another session holds the lock a VACUUM takes (as autovacuum or another scheduler's would):
    # SKIP_LOCKED makes PostgreSQL skip the table with a warning instead of waiting.
    upkeep = ClaimIndexUpkeep(vacuum_pages=pages // 2)
    with psycopg.connect(database_url()) as other:
        other.execute("LOCK TABLE stint_job IN SHARE UPDATE EXCLUSIVE MODE")

        assert upkeep.run_once() == 0
        assert caplog.text.count("VACUUM stint_job left") == 1
        # Not again at the next check: only once claims read another threshold of pages.
        assert upkeep.run_once() == 0
        assert caplog.text.count("VACUUM stint_job left") == 1

    assert vacuums() == runs
    assert pages_read_by_a_claim() == pages
    finish_jobs(2_000, first=2_000)  # about as many pages again: past the threshold above what it could not remove
    assert upkeep.run_once() == 1
    assert pages_read_by_a_claim() < 10


def test_after_a_vacuum_that_removed_nothing_one_by_someone_else_starts_the_count_over(caplog) -> None:
    finish_jobs(2_000)
    pages = pages_read_by_a_claim()
    upkeep = ClaimIndexUpkeep(vacuum_pages=pages // 3)
    with psycopg.connect(database_url()) as other:
        other.execute("LOCK TABLE stint_job IN SHARE UPDATE EXCLUSIVE MODE")
        assert upkeep.run_once() == 0  # held off: remembers the pages it could not remove
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (INDEX_CLEANUP ON) stint_job")  # as autovacuum would, meanwhile

    finish_jobs(1_500, first=2_000)  # past the threshold from a clean index, not above the old pages
    assert upkeep.vacuum_pages <= pages_read_by_a_claim() < pages

    assert upkeep.run_once() == 1


def test_a_vacuum_that_left_most_entries_to_an_old_snapshot_is_reported_not_counted(caplog) -> None:
    finish_jobs(2_000)
    with psycopg.connect(database_url()) as old:
        # A transaction that began before the next jobs finished still sees their QUEUED rows.
        old.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        old.execute("SELECT count(*) FROM stint_job").fetchone()
        finish_jobs(4_000, first=2_000)
        pages = pages_read_by_a_claim()
        runs = vacuums()
        upkeep = ClaimIndexUpkeep(vacuum_pages=pages // 4)

        assert upkeep.run_once() == 0  # the first jobs' entries went, the later ones' stayed

        left = pages_read_by_a_claim()
        assert upkeep.vacuum_pages <= left < pages
        assert vacuums() == runs
        assert caplog.text.count(f"VACUUM stint_job left {left} of them") == 1
        assert upkeep.run_once() == 0  # and not again at the next check
        assert caplog.text.count("VACUUM stint_job left") == 1

    assert upkeep.run_once() == 0  # the snapshot is gone, but claims have not read another threshold


def test_the_vacuum_runs_whatever_statement_timeout_the_session_has() -> None:
    finish_jobs(FINISHED)
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '1ms'")  # shorter than any VACUUM of this table
        try:
            claim_index._vacuum_job_table()
            cursor.execute("SHOW statement_timeout")
            assert cursor.fetchone() == ("1ms",)  # the session's own again afterwards
        finally:
            cursor.execute("RESET statement_timeout")
    assert pages_read_by_a_claim() < 10
