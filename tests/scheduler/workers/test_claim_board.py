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
from scheduler.workers.claim_board import ClaimBoard, Note, NoteLog, State, Verdict, parse_payload, paused_key
from scheduler.workers.runner import Worker, WorkerOptions
from tests.scheduler.workers.test_runner import claims  # noqa: F401 - a fixture
from tests.support.processes import WAIT, wait_until

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
        ("#9223372036854775808,a", (None, ["a"])),  # 2**63: 19 digits, one past it
        ("#9223372036854775807,a", (2**63 - 1, ["a"])),
        ("#12", (12, [])),
    ],
)
def test_a_payload_splits_into_its_token_and_queue_names(payload, parsed):
    assert parse_payload(payload) == parsed


def test_the_note_log_keeps_the_first_arrival_of_the_last_tokens():
    log = NoteLog(size=3)
    for token in (10, 11, None, 12, 13):
        log.append(token, received_ns=token or 0)
    assert log.latest == Note(13, 5, 13)
    assert log.first(10) is None  # fell out: only the last three tokens are kept
    assert [log.first(t) for t in (11, 12, 13)] == [(2, 11), (4, 12), (5, 13)]
    log.append(11, received_ns=99)  # again (a transaction's second NOTIFY, or one sent by hand)
    assert log.first(11) == (2, 11)  # its first arrival is what orders it
    assert log.latest == Note(11, 6, 99)


@pytest.fixture
def board():
    return ClaimBoard(3, multiprocessing.get_context("spawn"))


def finished(view, *, started_ns, token=0, short=True, paused=0):
    """Make ``view`` publish a claim that started at ``started_ns`` having last seen ``token``, and ended."""
    assert view.begin_claim(Note(token or None, 0, 0), NoteLog(), paused=paused, notified_only=False) is Verdict.CLAIM
    view._mine = (State.RUNNING, token, started_ns, paused)
    view.claim_finished(short=short)


def running(view, *, started_ns, token=0, paused=0):
    assert view.begin_claim(Note(token or None, 0, 0), NoteLog(), paused=paused, notified_only=False) is Verdict.CLAIM
    view._mine = (State.RUNNING, token, started_ns, paused)
    view._write(*view._mine)


def test_a_notify_without_token_is_always_claimed(board):
    me, sibling = board.view(0), board.view(1)
    finished(sibling, started_ns=10 * MS)
    assert me.verdict(Note(None, 7, 1 * MS), NoteLog(), paused=0, now_ns=20 * MS) is Verdict.CLAIM


def test_a_sibling_claim_started_after_the_notify_arrived_here_serves_it_once_it_came_back_short(board):
    me, sibling = board.view(0), board.view(1)
    note = Note(500, 1, 5 * MS)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=6 * MS) is Verdict.CLAIM  # no sibling has claimed yet
    running(sibling, started_ns=5 * MS + 1)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=6 * MS) is Verdict.WAIT
    sibling.claim_finished(short=True)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.SKIP


def test_a_sibling_claim_that_filled_every_slot_it_asked_for_may_have_left_jobs(board):
    me, sibling = board.view(0), board.view(1)
    finished(sibling, started_ns=6 * MS, short=False)
    assert me.verdict(Note(500, 1, 5 * MS), NoteLog(), paused=0, now_ns=7 * MS) is Verdict.CLAIM


def test_a_sibling_claim_that_left_out_other_paused_queues_did_not_look_for_our_jobs(board):
    me, sibling = board.view(0), board.view(1)
    note = Note(500, 1, 5 * MS)
    # It had not yet seen that queue "pq" was resumed: its short claim found no job of "pq".
    finished(sibling, started_ns=6 * MS, paused=paused_key(["pq"]))
    assert me.verdict(note, NoteLog(), paused=paused_key([]), now_ns=7 * MS) is Verdict.CLAIM
    assert me.verdict(note, NoteLog(), paused=paused_key(["pq"]), now_ns=7 * MS) is Verdict.SKIP
    assert paused_key([]) == 0
    assert paused_key(["b", "a", "a"]) == paused_key(["a", "b"]) != paused_key(["a"])


def test_a_sibling_claim_that_started_earlier_serves_the_notify_only_if_it_had_received_it(board):
    me, sibling = board.view(0), board.view(1)
    log = NoteLog()
    for token in (400, 500, 600):
        log.append(token, received_ns=token * MS)
    # The sibling received 500 before its claim; we received it later (our clock says 500 ms).
    finished(sibling, started_ns=450 * MS, token=500)
    assert me.verdict(Note(500, 2, 500 * MS), log, paused=0, now_ns=700 * MS) is Verdict.SKIP
    assert me.verdict(Note(400, 1, 400 * MS), log, paused=0, now_ns=700 * MS) is Verdict.SKIP
    # A NOTIFY that came after the sibling's latest: its job may be younger than that claim.
    assert me.verdict(Note(600, 3, 600 * MS), log, paused=0, now_ns=700 * MS) is Verdict.CLAIM
    # A token we never received (or forgot) proves nothing either way.
    finished(sibling, started_ns=450 * MS, token=999)
    assert me.verdict(Note(500, 2, 500 * MS), log, paused=0, now_ns=700 * MS) is Verdict.CLAIM


def test_an_old_token_sent_again_by_hand_proves_nothing(board):
    me, sibling = board.view(0), board.view(1)
    log = NoteLog()
    log.append(100, received_ns=100 * MS)  # a real enqueue, long ago
    finished(sibling, started_ns=150 * MS, token=100)  # the claim that served it
    log.append(200, received_ns=5000 * MS)  # a new job's NOTIFY...
    log.append(100, received_ns=5001 * MS)  # ...then `SELECT pg_notify('stint_jobs', '#100,default')`
    assert me.verdict(Note(200, 2, 5000 * MS), log, paused=0, now_ns=5002 * MS) is Verdict.CLAIM


def test_a_token_seen_here_long_after_the_sibling_claimed_is_not_the_one_it_meant(board):
    me, sibling = board.view(0), board.view(1)
    log = NoteLog(size=1)
    log.append(100, received_ns=100 * MS)
    finished(sibling, started_ns=150 * MS, token=100)
    log.append(200, received_ns=5000 * MS)  # 100 is forgotten...
    log.append(100, received_ns=5001 * MS)  # ...and arrives again: a first arrival, by our log
    assert log.first(100) == (3, 5001 * MS)
    assert me.verdict(Note(200, 2, 5000 * MS), log, paused=0, now_ns=5002 * MS) is Verdict.CLAIM


def test_a_sibling_claim_running_too_long_is_not_waited_for(board):
    me, sibling = board.view(0), board.view(1)
    note = Note(500, 1, 5 * MS)
    running(sibling, started_ns=6 * MS)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=6 * MS + claim_board.RUNNING_TRUST_NS - 1) is Verdict.WAIT
    # Killed mid-claim, or stuck: its row says RUNNING for ever.
    assert me.verdict(note, NoteLog(), paused=0, now_ns=6 * MS + claim_board.RUNNING_TRUST_NS) is Verdict.CLAIM


def test_one_short_sibling_claim_is_enough_and_the_own_row_never_counts(board):
    me, other, short = board.view(0), board.view(1), board.view(2)
    note = Note(500, 1, 5 * MS)
    finished(me, started_ns=6 * MS)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.CLAIM
    running(other, started_ns=6 * MS)
    finished(short, started_ns=6 * MS)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.SKIP


def test_of_two_processes_woken_by_one_notify_the_later_intent_withdraws_and_waits(board):
    first, second = board.view(0), board.view(1)
    log = NoteLog()
    log.append(500, received_ns=time.monotonic_ns())
    assert first.begin_claim(log.latest, log, paused=0, notified_only=True) is Verdict.CLAIM
    assert first._read(0)[0] is State.RUNNING  # published before it looked
    finished(second, started_ns=1, short=True)  # the second's previous claim, long done
    assert second.begin_claim(log.latest, log, paused=0, notified_only=True) is Verdict.WAIT
    assert second._read(1)[:3] == (State.SHORT, 0, 1)  # withdrawn: its row says what it said before
    # The earlier intent does not wait for the later one, even while that one is published.
    running(second, started_ns=time.monotonic_ns())
    assert first.verdict(log.latest, log, paused=0, now_ns=time.monotonic_ns(), mine=first._mine[2]) is Verdict.CLAIM
    second._mine = (State.SHORT, 0, 1, 0)
    second._write(*second._mine)
    first.claim_finished(short=True)
    assert second.begin_claim(log.latest, log, paused=0, notified_only=True) is Verdict.SKIP
    # A poll or a backlog claims whatever the board says.
    assert second.begin_claim(log.latest, log, paused=0, notified_only=False) is Verdict.CLAIM
    assert second._read(1)[0] is State.RUNNING


def test_a_row_being_written_or_left_by_a_restarted_process_proves_nothing(board):
    me, sibling = board.view(0), board.view(1)
    note = Note(500, 1, 5 * MS)
    finished(sibling, started_ns=6 * MS)
    board.array[1 * claim_board.FIELDS] += 1  # odd: a write in progress (or a writer killed in it)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.CLAIM
    board.array[1 * claim_board.FIELDS] += 1
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.SKIP
    board.array[1 * claim_board.FIELDS] += 1  # its writer was killed mid-write: odd for good
    sibling = board.view(1)  # until the slot's replacement process starts, with an empty row
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.CLAIM
    finished(sibling, started_ns=6 * MS)
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.SKIP
    sibling = board.view(1)
    board.array[1 * claim_board.FIELDS + 1] = 77  # no state of ours
    assert me.verdict(note, NoteLog(), paused=0, now_ns=7 * MS) is Verdict.CLAIM
    assert board.view(2)._read(1) is None
    with pytest.raises(ValueError, match="row 3"):
        board.view(3)


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
            wait_until(lambda job=job: Job.objects.get(id=job.id).status == JobStatus.SUCCESS, what="job done")
            time.sleep(0.01)  # the other worker's look at the board, and its claim if it makes one
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(WAIT)
        wait_until(
            lambda: not [t for t in set(threading.enumerate()) - earlier if t.name.startswith("stint-")],
            what="worker threads ended",
        )

    assert sum(claims) == jobs  # every job claimed once
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    skipped = skipped_claims() - skipped_before
    # Without the board each NOTIFY woke both workers and each claimed: 2 claims per job.
    assert skipped >= 1
    assert len(claims) + skipped == 2 * jobs, (claims, skipped)
    assert len(claims) < 2 * jobs
