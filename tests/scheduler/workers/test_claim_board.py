"""One claim per NOTIFY among a supervisor's processes (scheduler.workers.claim_board)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
from django.db import connection

from scheduler import metrics
from scheduler.enqueuing import enqueue
from scheduler.models import Job
from scheduler.states import JobStatus
from scheduler.workers import claim_board
from scheduler.workers.claim_board import ClaimBoard, Note, NoteLog, State, Verdict, parse_payload
from scheduler.workers.runner import Worker, WorkerOptions
from tests.scheduler.workers.test_runner import WAIT, claims, wait_until  # noqa: F401 - a fixture

MS = 1_000_000  # nanoseconds


@pytest.mark.parametrize(
    ("payload", "parsed"),
    [
        ("#7042,a,b", (7042, ["a", "b"])),
        ("#7042,default", (7042, ["default"])),
        ("a,b", (None, ["a", "b"])),  # a sender without a token (an older version)
        ("", (None, [])),
        ("#x,a", (None, ["a"])),
        ("#,a", (None, ["a"])),
        ("#-1,a", (None, ["a"])),
        ("#\u0661\u0662,a", (None, ["a"])),  # Arabic-Indic digits: isdigit() but not a token we send
        ("#99999999999999999999,a", (None, ["a"])),  # past int64: no shared-memory slot holds it
        ("#12", (12, [])),
    ],
)
def test_a_payload_splits_into_its_token_and_queue_names(payload, parsed):
    assert parse_payload(payload) == parsed


def test_the_note_log_keeps_arrival_positions_of_the_last_tokens():
    log = NoteLog(size=3)
    for token in (10, 11, None, 12, 13):
        log.append(token, received_ns=token or 0)
    assert log.latest == Note(13, 5, 13)
    assert log.position_of(10) is None  # fell out: only the last three tokens are kept
    assert [log.position_of(t) for t in (11, 12, 13)] == [2, 4, 5]
    log.append(11, received_ns=1)  # received again: its newest position counts
    assert log.position_of(11) == 6


@pytest.fixture
def board():
    return ClaimBoard(3, multiprocessing.get_context("spawn"))


def test_a_notify_without_token_is_always_claimed(board):
    me, sibling = board.view(0), board.view(1)
    sibling.claim_started(Note(None, 1, 0), started_ns=10 * MS)
    sibling.claim_finished(short=True)
    assert me.verdict(Note(None, 7, 1 * MS), NoteLog(), now_ns=20 * MS) is Verdict.CLAIM


def test_a_sibling_claim_started_after_the_notify_arrived_here_serves_it_once_it_came_back_short(board):
    me, sibling = board.view(0), board.view(1)
    note = Note(500, 1, 5 * MS)
    assert me.verdict(note, NoteLog(), now_ns=6 * MS) is Verdict.CLAIM  # no sibling has claimed yet
    sibling.claim_started(Note(None, 0, 0), started_ns=5 * MS + 1)
    assert me.verdict(note, NoteLog(), now_ns=6 * MS) is Verdict.WAIT
    sibling.claim_finished(short=True)
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.SKIP


def test_a_sibling_claim_that_filled_every_slot_it_asked_for_may_have_left_jobs(board):
    me, sibling = board.view(0), board.view(1)
    sibling.claim_started(Note(None, 0, 0), started_ns=6 * MS)
    sibling.claim_finished(short=False)
    assert me.verdict(Note(500, 1, 5 * MS), NoteLog(), now_ns=7 * MS) is Verdict.CLAIM


def test_a_sibling_claim_that_started_earlier_serves_the_notify_only_if_it_had_received_it(board):
    me, sibling = board.view(0), board.view(1)
    log = NoteLog()
    for token in (400, 500, 600):
        log.append(token, received_ns=token * MS)
    # The sibling received 500 before its claim; we received it later (our clock says 500 ms).
    sibling.claim_started(Note(500, 9, 0), started_ns=450 * MS)
    sibling.claim_finished(short=True)
    assert me.verdict(Note(500, log.position_of(500), 500 * MS), log, now_ns=700 * MS) is Verdict.SKIP
    assert me.verdict(Note(400, log.position_of(400), 400 * MS), log, now_ns=700 * MS) is Verdict.SKIP
    # A NOTIFY that came after the sibling's latest: its job may be younger than that claim.
    assert me.verdict(Note(600, log.position_of(600), 600 * MS), log, now_ns=700 * MS) is Verdict.CLAIM
    # A token we never received (or forgot) proves nothing either way.
    sibling.claim_started(Note(999, 9, 0), started_ns=450 * MS)
    sibling.claim_finished(short=True)
    assert me.verdict(Note(500, log.position_of(500), 500 * MS), log, now_ns=700 * MS) is Verdict.CLAIM


def test_a_sibling_claim_running_too_long_is_not_waited_for(board):
    me, sibling = board.view(0), board.view(1)
    note = Note(500, 1, 5 * MS)
    sibling.claim_started(Note(None, 0, 0), started_ns=6 * MS)
    assert me.verdict(note, NoteLog(), now_ns=6 * MS + claim_board.RUNNING_TRUST_NS - 1) is Verdict.WAIT
    # Killed mid-claim, or stuck: its row says RUNNING for ever.
    assert me.verdict(note, NoteLog(), now_ns=6 * MS + claim_board.RUNNING_TRUST_NS) is Verdict.CLAIM


def test_one_short_sibling_claim_is_enough_and_the_own_row_never_counts(board):
    me, running, short = board.view(0), board.view(1), board.view(2)
    note = Note(500, 1, 5 * MS)
    me.claim_started(Note(None, 0, 0), started_ns=6 * MS)
    me.claim_finished(short=True)
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.CLAIM
    running.claim_started(Note(None, 0, 0), started_ns=6 * MS)
    short.claim_started(Note(None, 0, 0), started_ns=6 * MS)
    short.claim_finished(short=True)
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.SKIP


def test_a_row_being_written_or_left_by_a_restarted_process_proves_nothing(board):
    me, sibling = board.view(0), board.view(1)
    note = Note(500, 1, 5 * MS)
    sibling.claim_started(Note(None, 0, 0), started_ns=6 * MS)
    sibling.claim_finished(short=True)
    board.array[1 * claim_board.FIELDS] += 1  # odd: a write in progress (or a writer killed in it)
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.CLAIM
    board.array[1 * claim_board.FIELDS] += 1
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.SKIP
    board.array[1 * claim_board.FIELDS] += 1  # its writer was killed mid-write: odd for good
    sibling = board.view(1)  # until the slot's replacement process starts, with an empty row
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.CLAIM
    sibling.claim_started(Note(None, 0, 0), started_ns=6 * MS)
    sibling.claim_finished(short=True)
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.SKIP
    sibling = board.view(1)
    board.array[1 * claim_board.FIELDS + 1] = 77  # no state of ours
    assert me.verdict(note, NoteLog(), now_ns=7 * MS) is Verdict.CLAIM
    assert board.view(2)._read(1) is None
    with pytest.raises(ValueError, match="row 3"):
        board.view(3)
    assert State.NONE == 0


def test_a_claim_is_decided_and_published_in_one_turn_and_only_a_notified_one_can_be_skipped(board):
    me, sibling = board.view(0), board.view(1)
    log = NoteLog()
    log.append(500, received_ns=time.monotonic_ns())
    assert me.begin_claim(log.latest, log, notified_only=True) is Verdict.CLAIM  # nobody else claims
    assert me._read(0)[0] is State.RUNNING  # published: a sibling woken by the same NOTIFY waits for it
    assert sibling.begin_claim(log.latest, log, notified_only=True) is Verdict.WAIT
    me.claim_finished(short=True)
    assert sibling.begin_claim(log.latest, log, notified_only=True) is Verdict.SKIP
    assert sibling._read(1)[0] is State.NONE  # nothing published for a claim not made
    # A poll or a backlog claims whatever the board says.
    assert sibling.begin_claim(log.latest, log, notified_only=False) is Verdict.CLAIM
    assert sibling._read(1)[0] is State.RUNNING


def test_a_lock_kept_by_a_killed_sibling_costs_claims_nothing_but_the_board(board, caplog):
    me, sibling = board.view(0), board.view(1)
    log = NoteLog()
    log.append(500, received_ns=time.monotonic_ns())
    sibling.claim_started(Note(None, 0, 0), started_ns=time.monotonic_ns())
    sibling.claim_finished(short=True)  # would serve our NOTIFY...
    assert board.lock.acquire(timeout=1)  # ...but it was killed holding the lock
    for _ in range(claim_board.TURN_MISSES_TO_GIVE_UP):
        assert not me.given_up
        assert me.begin_claim(log.latest, log, notified_only=True) is Verdict.CLAIM
    assert me.given_up
    assert "claims on every NOTIFY" in caplog.text

    class Untouchable:
        def acquire(self, *args, **kwargs):
            raise AssertionError("a given-up board is not locked again")

    me._lock = Untouchable()
    assert me.begin_claim(log.latest, log, notified_only=True) is Verdict.CLAIM
    assert me._read(0)[0] is State.RUNNING  # still published: siblings may skip for our claims


def skipped_claims() -> float:
    (family,) = metrics.worker_claims_skipped_total.collect()
    return next(s.value for s in family.samples if s.name == "worker_claims_skipped_total")


@pytest.mark.django_db(transaction=True)
def test_two_workers_on_one_board_run_each_job_once_with_fewer_claims_than_two_per_job(claims):  # noqa: F811
    board = ClaimBoard(2, multiprocessing.get_context("spawn"))
    earlier = set(threading.enumerate())
    skipped_before = skipped_claims()
    workers = []
    threads = []
    for row in range(2):
        ready = threading.Event()
        worker = Worker(
            WorkerOptions(concurrency=4, poll_seconds=3600, heartbeat_seconds=3600),
            ready=ready.set,
            board=board.view(row),
        )

        def run(worker=worker) -> None:
            worker.run()
            connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        assert ready.wait(WAIT)
        workers.append(worker)
        threads.append(thread)
    jobs = 20
    try:
        time.sleep(0.2)  # both are listening: their start-up claims are done
        claims.clear()
        for _ in range(jobs):
            job = enqueue("DEMO_TASK")
            wait_until(lambda job=job: Job.objects.get(id=job.id).status == JobStatus.SUCCESS)
            time.sleep(0.01)  # the other worker's look at the board, and its claim if it makes one
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(WAIT)
        wait_until(lambda: not [t for t in set(threading.enumerate()) - earlier if t.name.startswith("stint-")])

    assert sum(claims) == jobs  # every job claimed once
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    skipped = skipped_claims() - skipped_before
    # Without the board each NOTIFY woke both workers and each claimed: 2 claims per job.
    assert skipped >= 1
    assert len(claims) + skipped == 2 * jobs, (claims, skipped)
    assert len(claims) < 2 * jobs
