"""Tests for scheduler.workers.pool: a slot survives whatever its handler raises, and a lost thread is replaced.

The thread pool runs in this process with its real ``run_handler``; jobs are ``Claimed`` values
built here (the pool never touches the database itself), and ``on_done`` collects the reports.
"""

from __future__ import annotations

import pickle
import queue
import signal
import subprocess
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connections
from prometheus_client import REGISTRY

from scheduler.leasing import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS, Outcome, Report
from scheduler.registry import JobContext, handler
from scheduler.workers import pool as pool_module
from scheduler.workers.pool import (
    READY_MESSAGE,
    ProcessPool,
    Running,
    ThreadPool,
    decode_message,
    describe_exit,
    died_while_running,
    encode_report,
    killed_while_running,
)
from scheduler.workers.runner import WorkerOptions
from scheduler.workers.supervisor import ISOLATION, Supervisor, SupervisorOptions, _Rescue, process_state
from tests.support.factories import claimed_job
from tests.support.hostile.jobs import ExitOnUnpickle
from tests.support.processes import gone, wait_until
from tests.support.subprocess_env import database_url

WAIT = 10.0  # seconds any one report may take


@handler("TEST_POOL_SYS_EXIT")
def _sys_exit(payload: Any, ctx: JobContext) -> None:
    raise SystemExit(2)


@handler("TEST_POOL_KEYBOARD_INTERRUPT")
def _keyboard_interrupt(payload: Any, ctx: JobContext) -> None:
    raise KeyboardInterrupt


@handler("TEST_POOL_GENERATOR_EXIT")
def _generator_exit(payload: Any, ctx: JobContext) -> None:
    raise GeneratorExit


@handler("TEST_POOL_THREAD_NAME")
def _thread_name(payload: Any, ctx: JobContext) -> str:
    return threading.current_thread().name


def running(job_type: str, payload: Any = None) -> Running:
    job = claimed_job(job_type, max_retries=0, payload=payload or {})
    return Running(job=job, deadline=time.monotonic() + 60, started=time.monotonic())


class Reports:
    """An ``on_done`` callback that collects (entry, report) pairs; ``fail`` makes it raise that once."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.done: queue.SimpleQueue[tuple[Running, Report]] = queue.SimpleQueue()
        self.fail = fail

    def __call__(self, entry: Running, report: Report) -> None:
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        self.done.put((entry, report))

    def next(self) -> tuple[Running, Report]:
        return self.done.get(timeout=WAIT)


def lost_threads() -> float:
    return REGISTRY.get_sample_value("worker_threads_lost_total") or 0.0


def test_whatever_a_handler_raises_is_its_outcome_and_the_one_slot_keeps_serving() -> None:
    reports = Reports()
    pool = ThreadPool(1, reports)
    try:
        for job_type, error in (
            ("TEST_POOL_SYS_EXIT", "SystemExit: 2"),
            ("TEST_POOL_KEYBOARD_INTERRUPT", "KeyboardInterrupt"),
            ("TEST_POOL_GENERATOR_EXIT", "GeneratorExit"),
        ):
            entry = running(job_type)
            pool.submit(entry)
            done, report = reports.next()
            assert done is entry
            assert (report.outcome, report.error) == (Outcome.RETRYABLE, error)
            assert error.split(":")[0] in report.traceback
        pool.submit(running("TEST_POOL_THREAD_NAME"))
        _, report = reports.next()
        assert (report.outcome, report.result) == (Outcome.SUCCEEDED, "stint-slot-0")
        assert pool.busy() == 0
        assert pool.reap_lost() == []  # no thread was lost
    finally:
        pool.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread we kill
def test_a_lost_slot_thread_is_found_its_job_returned_and_its_slot_replaced() -> None:
    # The callback raises KeyboardInterrupt in the slot thread, outside any handler: the thread
    # dies, as one would of an exception raised into it from outside.
    reports = Reports(fail=KeyboardInterrupt())
    pool = ThreadPool(1, reports)
    before = lost_threads()
    try:
        doomed = running("TEST_POOL_THREAD_NAME")
        pool.submit(doomed)
        deadline = time.monotonic() + WAIT
        lost: list[Running] = []
        while not lost and time.monotonic() < deadline:
            time.sleep(0.01)
            lost = pool.reap_lost()

        assert lost == [doomed]
        assert lost_threads() == before + 1
        assert pool.busy() == 0
        assert pool.reap_lost() == []  # replaced once
        pool.submit(running("TEST_POOL_THREAD_NAME"))
        _, report = reports.next()
        assert (report.outcome, report.result) == (Outcome.SUCCEEDED, "stint-slot-0")
    finally:
        pool.close()


# -- the process pool, with real children ------------------------------------------------------


@pytest.fixture
def children(monkeypatch) -> Any:
    """``(ProcessPool, Reports)``: a real one-slot process pool whose child also loads the hostile handlers."""
    monkeypatch.setenv("STINT_EXTRA_APPS", "tests.support.hostile")  # read by the spawned child's settings
    reports = Reports()
    pool = ProcessPool(1, reports)
    try:
        yield pool, reports
    finally:
        pool.close()


def assert_killed_soon(pid: int, seconds: float = 5.0) -> None:
    """Assert that process ``pid`` is gone within ``seconds`` (``wait_until`` would read jobs from a database)."""
    deadline = time.monotonic() + seconds
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid), f"process {pid} still runs after {seconds} s"


def serves_again(pool: ProcessPool, reports: Reports) -> None:
    """Assert that the pool's one slot, replaced, runs the next job."""
    wait_until(lambda: pool.busy() == 0, what="the new pool child is ready")
    pool.submit(running("DEMO_TASK", {"result": "next"}))
    _, report = reports.next()
    assert (report.outcome, report.result) == (Outcome.SUCCEEDED, {"echo": "next", "attempt": 1})


def test_a_pool_child_that_closes_its_pipe_is_killed_at_once_and_its_job_reported(children) -> None:
    # The worker's one reader thread waited for the child's exit code on its sentinel, which the
    # handler had closed too: it blocked in waitpid until the handler returned (an hour here), and
    # no report of any slot was read meanwhile; the child then ran on beside the job's retry.
    pool, reports = children
    child = pool._children[0].process.pid
    doomed = running("HOSTILE_CLOSE_FDS", {"sleep": 3600})

    pool.submit(doomed)
    entry, report = reports.next()

    assert entry is doomed
    assert report.outcome == Outcome.CRASHED
    assert report.error == killed_while_running("closed its pipe to the worker")
    assert report.error == "its pool child closed its pipe to the worker while running this job; the child was killed"
    assert gone(child)
    serves_again(pool, reports)


def test_a_pool_childs_report_of_a_huge_error_crosses_the_pipe_already_cut(children, monkeypatch) -> None:
    # A 100 MB message was sent whole to the worker (the error and the traceback's last line: about
    # 200 MB of JSON), which then held it in its outcome batch until the writer cut it.
    pool, reports = children
    sizes: list[int] = []

    def measured(data: bytes) -> Any:
        sizes.append(len(data))
        return decode_message(data)

    monkeypatch.setattr(pool_module, "decode_message", measured)
    pool.submit(running("HOSTILE_HUGE_ERROR", {"megabytes": 20}))
    _, report = reports.next()

    assert report.outcome == Outcome.RETRYABLE
    assert len(report.error) == MAX_ERROR_CHARS and report.error.startswith("ValueError: xxx")
    assert len(report.traceback) <= MAX_TRACEBACK_CHARS and "huge_error" in report.traceback
    assert max(sizes) < MAX_ERROR_CHARS + MAX_TRACEBACK_CHARS + 1000  # bytes: the report alone, with its JSON


def test_a_pool_child_that_dies_is_reported_even_while_its_own_child_holds_its_pipe(children, tmp_path) -> None:
    # No end-of-file came while the grandchild lived: the job stayed held, its slot lost, until its
    # timeout (300 s by default) reported it TIMED_OUT.
    pool, reports = children
    doomed = running("HOSTILE_FORK_AND_EXIT", {"sleep": 60, "pid_file": str(tmp_path / "fork")})

    pool.submit(doomed)
    entry, report = reports.next()

    assert entry is doomed
    assert (report.outcome, report.error) == (Outcome.CRASHED, died_while_running(1))
    # The fork, in its pool child's process group, slept on (60 s) beside the job's retry.
    fork = int((tmp_path / "fork.1").read_text())
    assert_killed_soon(fork)
    serves_again(pool, reports)


def test_a_pool_child_killed_for_its_job_takes_what_its_handler_forked_with_it(children, tmp_path) -> None:
    # abort() (a timeout, a cancel) killed the child alone: the fork it had started ran on.
    pool, reports = children
    child = pool._children[0].process.pid
    doomed = running("HOSTILE_FORK_AND_EXIT", {"sleep": 60, "pid_file": str(tmp_path / "fork"), "then": "hang"})
    pool.submit(doomed)
    deadline = time.monotonic() + WAIT
    while not (tmp_path / "fork.1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    fork = int((tmp_path / "fork.1").read_text())

    assert pool.abort(doomed)

    assert gone(child)
    assert_killed_soon(fork)
    serves_again(pool, reports)


def test_a_handler_that_signals_its_process_group_ends_only_its_own_pool_child(children) -> None:
    # The child shared its worker's process group: the handler's SIGKILL ended the worker too (here
    # the handler refuses to signal a group it does not lead: this test's own).
    pool, reports = children
    doomed = running("HOSTILE_SIGNAL_GROUP", {"how": "killpg", "signal": "SIGKILL", "only_own_group": True})

    pool.submit(doomed)
    entry, report = reports.next()

    assert entry is doomed
    assert (report.outcome, report.error) == (Outcome.CRASHED, died_while_running(-signal.SIGKILL))
    serves_again(pool, reports)


def test_how_a_process_died_is_said_plainly() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(-signal.SIGSEGV) == "signal 11: SIGSEGV"
    assert describe_exit(-signal.SIGKILL) == "signal 9: SIGKILL"
    assert describe_exit(None) == "exit status unknown"
    assert died_while_running(-11) == "worker process died (signal 11: SIGSEGV) while running this job"


def test_a_child_report_is_json_and_reads_back_as_plain_values() -> None:
    job = claimed_job()
    report = Report(job=job, outcome=Outcome.SUCCEEDED, result=ExitOnUnpickle("hello"), traceback="")

    job_id, outcome, result, error, tb, retry_after = decode_message(encode_report(report))

    assert (job_id, outcome, result, error, tb, retry_after) == (str(job.id), Outcome.SUCCEEDED, "hello", "", "", None)
    assert type(result) is str  # the subclass (and its __reduce__) did not cross the pipe
    assert decode_message(READY_MESSAGE) == "ready"


def test_the_delay_a_handler_asked_for_crosses_the_pipe_with_its_report() -> None:
    job = claimed_job()
    report = Report(job=job, outcome=Outcome.RETRYABLE, error="RetryAfter: busy", traceback="tb", retry_after=2.5)

    assert decode_message(encode_report(report)) == (
        str(job.id),
        Outcome.RETRYABLE,
        None,
        "RetryAfter: busy",
        "tb",
        2.5,
    )


@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps(ExitOnUnpickle("x")),  # a pickle is never unpickled: not JSON
        b"[1, 2]",
        b'["SUCCEEDED", null, "", "", null]',  # no job id
        b'["j", "SUCCEEDED", null, 3, "", null]',  # an error that is not text
        b'["j", "SUCCEEDED", null, null, null, null]',  # null where the database keeps text
        b'["j", "NO_SUCH_OUTCOME", null, "", "", null]',
        b'["j", "SUCCEEDED", null, "", ""]',  # no delay: every report says one, or null
        b'["j", "RETRYABLE", null, "", "", "5"]',  # a delay that is not a number of seconds
        b'["j", "RETRYABLE", null, "", "", true]',
        b'["j", "RETRYABLE", null, "", "", NaN]',
        b'["j", "RETRYABLE", null, "", "", Infinity]',
        b'["j", "RETRYABLE", null, "", "", -1]',  # out of range: run_handler clamped what it sent
        b'["j", "RETRYABLE", null, "", "", 604801]',
        b"\xff\xfe",
    ],
)
def test_a_child_message_that_is_not_a_report_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_message(data)


def test_a_process_state_is_read_from_proc_stopped_included() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])  # noqa: S607 - coreutils' sleep, from PATH
    try:
        wait_for = time.monotonic() + 10
        while (state := process_state(sleeper.pid)) != "S" and time.monotonic() < wait_for:
            time.sleep(0.01)  # R or D while it starts
        assert state == "S"  # sleeping
        sleeper.send_signal(signal.SIGSTOP)
        while (state := process_state(sleeper.pid)) != "T" and time.monotonic() < wait_for:
            time.sleep(0.01)
        assert state == "T"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert process_state(sleeper.pid) is None  # reaped: gone from /proc


def test_a_supervisor_slot_that_has_a_process_is_not_started_twice(monkeypatch) -> None:
    """Rescue and reaping may both ask to start the isolation slot again; the second start would orphan the first."""
    supervisor = Supervisor(SupervisorOptions(processes=1, worker=WorkerOptions()))
    started: list[str] = []

    def start(slot: str) -> None:
        started.append(slot)
        supervisor._children[slot] = object()

    monkeypatch.setattr(supervisor, "_start", start)
    try:
        supervisor._restart(ISOLATION)
        supervisor._restart(ISOLATION)
    finally:
        supervisor._wake_reader.close()
        supervisor._wake_writer.close()

    assert started == [ISOLATION]


@pytest.mark.django_db(transaction=True)
def test_a_supervisor_does_not_wait_behind_a_lock_on_the_job_table(monkeypatch) -> None:
    # A handler's LOCK TABLE stint_job held the supervisor's loop inside its isolation check (and a
    # rescue) for as long as the lock lasted: no reaping, no restart, no SIGTERM handled meanwhile.
    supervisor = Supervisor(SupervisorOptions(processes=1, worker=WorkerOptions()))
    started: list[str] = []
    monkeypatch.setattr(supervisor, "_restart", started.append)
    done = threading.Event()

    def look() -> None:
        try:
            supervisor._start_isolation_if_needed()
            supervisor._rescue(_Rescue(worker_id="gone:1:abc", error="test", isolate=False, since=time.monotonic()))
        finally:
            connections.close_all()
            done.set()

    holder = psycopg.connect(database_url(), autocommit=False)
    try:
        holder.execute("LOCK TABLE stint_job IN ACCESS EXCLUSIVE MODE")
        threading.Thread(target=look, daemon=True).start()
        assert done.wait(WAIT), "the supervisor waited for the lock"
    finally:
        holder.rollback()
        holder.close()
        supervisor._wake_reader.close()
        supervisor._wake_writer.close()
    assert started == []  # nothing seen under the lock: it looks again next poll
    assert [r.worker_id for r in supervisor._rescues] == ["gone:1:abc"]  # retried later
