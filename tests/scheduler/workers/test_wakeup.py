"""What the claim loop waits on: the waker, the LISTEN connection read without a thread, and its reopening."""

from __future__ import annotations

import logging
import select
import threading
import time

import pytest
from django.db import connection

from core.db_role import application_name_for
from core.pg_connect import pg_connection_params
from scheduler.enqueuing import enqueue
from scheduler.models import Job
from scheduler.notify import CHANNEL
from scheduler.states import JobStatus
from scheduler.workers import runner
from scheduler.workers.runner import Worker, WorkerOptions
from scheduler.workers.wakeup import Listener, WaitSet, Waker
from tests.support.net import SilentServer
from tests.support.processes import WAIT, wait_until


def start_in_a_thread(worker: Worker) -> threading.Thread:
    """Run ``worker`` in a daemon thread (a failed test leaves no thread that blocks the exit)."""

    def run() -> None:
        worker.run()
        connection.close()  # the thread plays the worker process's main thread

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def readable(waker: Waker) -> bool:
    return bool(select.select([waker.fileno()], [], [], 0)[0])


def test_a_set_waker_is_readable_until_cleared_and_a_second_set_sends_nothing_more() -> None:
    waker = Waker()
    waker.open()
    try:
        assert not waker.is_set() and not readable(waker)
        waker.set()
        waker.set()
        assert waker.is_set() and readable(waker)
        waker.clear()
        assert not waker.is_set() and not readable(waker)  # one clear read every byte the sets sent
    finally:
        waker.close()


def test_a_waker_set_before_open_is_readable_once_open_and_set_after_close_is_harmless() -> None:
    waker = Waker()
    waker.set()
    waker.open()
    assert readable(waker)
    waker.close()
    waker.clear()
    waker.set()  # a stop() that comes after the worker closed its waker
    assert waker.is_set()


def test_a_wait_returns_when_another_thread_sets_the_waker() -> None:
    waker = Waker()
    waker.open()
    listener = Listener(
        {}, CHANNEL, on_notify=lambda _: None, on_connect=lambda: None, wake=waker.set, retry_seconds=1, name="t"
    )
    waits = WaitSet(waker, listener)
    try:
        threading.Timer(0.05, waker.set).start()
        started = time.monotonic()
        waits.wait(WAIT)
        assert time.monotonic() - started < WAIT
        assert waker.is_set()
    finally:
        waker.close()


@pytest.mark.django_db(transaction=True)
def test_a_wait_reads_the_notifications_on_the_listen_connection_in_the_waiting_thread() -> None:
    got: list[str] = []
    connects: list[int] = []
    waker = Waker()
    waker.open()
    listener = Listener(
        pg_connection_params(),
        CHANNEL,
        on_notify=got.append,
        on_connect=lambda: connects.append(1),
        wake=waker.set,
        retry_seconds=1,
        name="t",
    )
    waits = WaitSet(waker, listener)
    try:
        assert not listener.ensure()  # a thread opens it and sets the waker, either way
        waits.wait(WAIT)
        assert waker.is_set() and listener.ensure() and connects == [1]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, 'a,b')", [CHANNEL])
        deadline = time.monotonic() + WAIT
        while not got and time.monotonic() < deadline:
            waits.wait(1.0)
        assert got == ["a,b"]
    finally:
        listener.shut()
        waker.close()


def listen_backends(*, listening: bool = False) -> list[int]:
    """The pids of the worker's LISTEN sessions; ``listening``: only those whose LISTEN has finished.

    A session shows in ``pg_stat_activity`` once connected, before its ``LISTEN`` ran: killed
    then, the worker logs "cannot LISTEN", not "LISTEN connection lost" (seen once in CI).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()"
            " AND (NOT %s OR (state = 'idle' AND query LIKE 'LISTEN %%'))",
            [application_name_for("listen"), listening],
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_listen_connection_was_killed_listens_again_and_picks_up_a_notified_job(caplog) -> None:
    ready = threading.Event()
    # No poll falls due during the test: once LISTEN is back, only a NOTIFY can start the claim.
    worker = Worker(WorkerOptions(concurrency=2, poll_seconds=3600, heartbeat_seconds=3600), ready=ready.set)
    thread = start_in_a_thread(worker)
    try:
        assert ready.wait(WAIT)
        wait_until(lambda: len(listen_backends(listening=True)) == 1, what="LISTEN connection open and listening")
        (first,) = listen_backends()
        with caplog.at_level(logging.WARNING, logger="scheduler.workers.wakeup"):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [first])
            wait_until(lambda: (pids := listen_backends()) and first not in pids, what="LISTEN reopened")
            time.sleep(0.1)  # the start-up claim after LISTEN began is done: the next one needs a NOTIFY
            job = enqueue("DEMO_TASK")
            wait_until(lambda: Job.objects.get(id=job.id).status == JobStatus.SUCCESS, what="job done")
        assert "LISTEN connection lost" in caplog.text
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert listen_backends() == []  # closed with the worker


@pytest.fixture
def unanswering_server():
    """A TCP port that accepts connections (the kernel's backlog) and never answers: a stalled connect."""
    with SilentServer() as server:
        yield server.port


@pytest.mark.django_db(transaction=True)
def test_a_listen_connection_that_never_opens_leaves_the_worker_polling_timing_out_and_stopping(
    monkeypatch, unanswering_server
) -> None:
    # A pooler queueing new clients or a dropped SYN: the LISTEN connect hangs (here for 60 s).
    conninfo = {"host": "127.0.0.1", "port": unanswering_server, "dbname": "x", "user": "x", "connect_timeout": 60}
    monkeypatch.setattr(runner, "pg_connection_params", lambda **_: conninfo)
    ready = threading.Event()
    worker = Worker(WorkerOptions(concurrency=2, poll_seconds=0.2, heartbeat_seconds=3600), ready=ready.set)
    thread = start_in_a_thread(worker)
    try:
        assert ready.wait(WAIT)
        job = enqueue("DEMO_TASK")
        wait_until(lambda: Job.objects.get(id=job.id).status == JobStatus.SUCCESS, what="job done")  # by a poll
        hung = enqueue("DEMO_TASK", {"sleep_seconds": 30}, timeout_seconds=1)
        wait_until(
            lambda: Job.objects.get(id=hung.id).attempts >= 1 and Job.objects.get(id=hung.id).last_error != "",
            what="hung job timed out",
        )
        assert "timed out" in Job.objects.get(id=hung.id).last_error.lower()
    finally:
        worker.stop(force=True)
        thread.join(WAIT)
    assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
def test_a_stop_that_lands_just_before_the_claim_loop_clears_its_waker_still_ends_the_loop(monkeypatch) -> None:
    worker = Worker(WorkerOptions(concurrency=2, poll_seconds=3600, heartbeat_seconds=3600))
    real_clear = worker._wake.clear
    calls = []

    def clear_after_a_stop() -> None:
        if not calls:
            worker.stop()  # the interleaving a signal can produce: stop() between the loop's look and the clear
        calls.append(1)
        real_clear()

    monkeypatch.setattr(worker._wake, "clear", clear_after_a_stop)
    thread = start_in_a_thread(worker)
    thread.join(WAIT)
    assert not thread.is_alive()
