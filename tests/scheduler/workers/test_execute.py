"""Tests for scheduler.workers.execute: what a handler's return value and database use make of its run.

``run_handler`` runs here, in this process, on ``Claimed`` values built without the database;
the handlers are registered by this module.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone, translation

from core import db_threads
from scheduler import leasing
from scheduler.enqueuing import enqueue
from scheduler.errors import JobCancelled, RetryAfter
from scheduler.leasing import Outcome, Report
from scheduler.registry import JobContext, handler
from scheduler.retry import MAX_BACKOFF_SECONDS
from scheduler.states import AttemptStatus, EventType, JobStatus
from scheduler.workers import execute
from scheduler.workers.execute import run_handler
from scheduler.workers.pool import encode_report
from tests.support.factories import claimed_job
from tests.support.jobs import attempts, events
from tests.support.subprocess_env import database_url

_RESULTS: dict[str, Any] = {}


@handler("TEST_EXECUTE_RETURNS")
def _returns(payload: Any, ctx: JobContext) -> Any:
    return _RESULTS[payload["key"]]


@handler("TEST_EXECUTE_LEAVES_A_TRANSACTION")
def _leaves_a_transaction(payload: Any, ctx: JobContext) -> None:
    """Open a transaction with raw SQL, write in it, and return without COMMIT."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("CREATE TABLE IF NOT EXISTS test_execute_left (n int)")
        cursor.execute("INSERT INTO test_execute_left VALUES (1)")


@handler("TEST_EXECUTE_LEAVES_AN_ATOMIC_BLOCK")
def _leaves_an_atomic_block(payload: Any, ctx: JobContext) -> None:
    """Enter ``transaction.atomic()`` and a savepoint inside it, write, and return without leaving either."""
    transaction.atomic().__enter__()
    transaction.atomic().__enter__()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS test_execute_left (n int)")
        cursor.execute("INSERT INTO test_execute_left VALUES (1)")


@handler("TEST_EXECUTE_ACTIVATES_A_ZONE_AND_A_LANGUAGE")
def _activates_a_zone_and_a_language(payload: Any, ctx: JobContext) -> str:
    """Activate a time zone and a language for its thread (Django's ``activate``) and never deactivate them."""
    timezone.activate("Asia/Kathmandu")
    translation.activate("de")
    return f"{timezone.get_current_timezone_name()} {translation.get_language()}"


@handler("TEST_EXECUTE_ZONE_AND_LANGUAGE")
def _zone_and_language(payload: Any, ctx: JobContext) -> str:
    return f"{timezone.get_current_timezone_name()} {translation.get_language()}"


@handler("TEST_EXECUTE_CLOSES_ITS_RAW_CONNECTION")
def _closes_its_raw_connection(payload: Any, ctx: JobContext) -> None:
    """Close the psycopg connection under Django's wrapper (its transaction status reads UNKNOWN)."""
    connection.ensure_connection()
    connection.connection.close()


@handler("TEST_EXECUTE_TRANSACTION_STATUS")
def _transaction_status(payload: Any, ctx: JobContext) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('test_execute_left') IS NOT NULL")
        (left,) = cursor.fetchone()
    return f"{connection.connection.info.transaction_status.name} table={left}"


@handler("TEST_EXECUTE_QUERIES")
def _queries(payload: Any, ctx: JobContext) -> int:
    """Use this thread's connection, then make it older than CONN_MAX_AGE allows."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        (one,) = cursor.fetchone()
    connection.close_at = time.monotonic() - 1
    return one


@handler("TEST_EXECUTE_SPOILS_ITS_SESSION")
def _spoils_its_session(payload: Any, ctx: JobContext) -> None:
    """Change the session the thread's next jobs will share: settings, a lock, a LISTEN, a temp table, a role."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(4242)")
        cursor.execute("LISTEN test_execute_spoiled")
        cursor.execute("SET search_path = nowhere")
        cursor.execute("SET TIME ZONE 'Pacific/Kiritimati'")
        # A temporary table hides the real one of the same name.
        cursor.execute("CREATE TEMP TABLE stint_job AS SELECT * FROM public.stint_job WITH NO DATA")
        cursor.execute("PREPARE test_execute_left_prepared AS SELECT 1")
        cursor.execute("SET ROLE test_execute_nobody")
        cursor.execute("SET statement_timeout = 1")


@handler("TEST_EXECUTE_SESSION_STATE")
def _session_state(payload: Any, ctx: JobContext) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('statement_timeout'), current_setting('search_path'), current_setting('TimeZone'),"
            " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),"
            " (SELECT count(*) FROM pg_listening_channels()),"
            " (SELECT count(*) FROM pg_prepared_statements WHERE name = 'test_execute_left_prepared'),"
            " current_user = session_user, to_regclass('pg_temp.stint_job') IS NULL"
        )
        timeout, path, zone, advisory, listening, prepared, own_role, no_temp = cursor.fetchone()
    return {
        "timeout": timeout,
        "path": path,
        "zone": zone,
        "advisory": advisory,
        "listening": listening,
        "prepared": prepared,
        "own_role": own_role,
        "no_temp": no_temp,
    }


@handler("TEST_EXECUTE_ENDS_ITS_BACKEND")
def _ends_its_backend(payload: Any, ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


_FORKED: list[int] = []


@handler("TEST_EXECUTE_FORKS")
def _forks(payload: Any, ctx: JobContext) -> str:
    _FORKED.append(os.fork())  # both processes return
    return "returned"


def _nested(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def returning(key: str, value: Any) -> Report:
    _RESULTS[key] = value
    return run_handler(claimed_job("TEST_EXECUTE_RETURNS", payload={"key": key}), threading.Event())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("nan", math.nan),
        ("infinity", {"x": [math.inf]}),
        ("object", {"x": object()}),
        ("set", [{1, 2}]),
        ("deep", _nested(100_000)),  # json's encoder recurses: RecursionError, not a retryable failure
    ],
)
def test_a_result_json_cannot_hold_fails_the_run_for_good(key: str, value: Any) -> None:
    report = returning(key, value)

    assert report.outcome == Outcome.PERMANENT
    assert report.error.startswith("result is not JSON: ")
    assert report.result is None


def test_a_result_over_the_size_limit_fails_the_run_for_good() -> None:
    # A 300 MB result held a worker at 2 GB and its batch of outcomes retried forever (adversarial check).
    report = returning("big", "x" * execute.MAX_RESULT_BYTES)  # with its quotes, 2 bytes over

    assert report.outcome == Outcome.PERMANENT
    limit = execute.MAX_RESULT_BYTES
    assert report.error == f"result is {limit + 2:,} bytes of JSON, over the {limit:,} a job keeps"
    assert report.result is None
    assert returning("fits", "x" * (execute.MAX_RESULT_BYTES - 2)).outcome == Outcome.SUCCEEDED


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("nul", {"text": "a\x00b"}, "result holds U+0000, which PostgreSQL cannot store"),
        ("nul_key", {"a\x00": 1}, "result holds U+0000, which PostgreSQL cannot store"),
        ("surrogate", ["\udc00"], "result holds a lone UTF-16 surrogate, which PostgreSQL cannot store"),
    ],
)
def test_a_result_postgresql_cannot_store_fails_the_run_for_good_before_it_is_written(key, value, error) -> None:
    # Found before the outcome batch: jsonb's refusal used to fail the worker's whole batch first.
    report = returning(key, value)

    assert (report.outcome, report.error, report.result) == (Outcome.PERMANENT, error, None)
    assert returning("pair", {"emoji": "\U0001f600", "escaped": "\\u0000"}).outcome == Outcome.SUCCEEDED


_LONG_NUMBERS = {
    "4301 digits": 10**4300,
    "5001 digits, nested": {"n": [-(10**5000)]},
    "4300 digits": 10**4299,
    "a string of digits": "1" * 5000,
}


@handler("TEST_EXECUTE_LIFTS_THE_DIGIT_LIMIT")
def _lifts_the_digit_limit(payload: Any, ctx: JobContext) -> Any:
    """Lift its process's limit on integer digits (``sys.set_int_max_str_digits(0)``), then return a long number."""
    sys.set_int_max_str_digits(0)
    return _LONG_NUMBERS[payload["key"]]


@pytest.mark.parametrize(
    ("key", "outcome", "error"),
    [
        (
            "4301 digits",
            Outcome.PERMANENT,
            "result holds an integer of more than 4,300 digits, which Python cannot read",
        ),
        (
            "5001 digits, nested",
            Outcome.PERMANENT,
            "result holds an integer of more than 4,300 digits, which Python cannot read",
        ),
        ("4300 digits", Outcome.SUCCEEDED, ""),
        ("a string of digits", Outcome.SUCCEEDED, ""),  # text, not a number
    ],
)
def test_a_result_with_an_integer_other_processes_cannot_read_fails_the_run_for_good(key, outcome, error) -> None:
    # PostgreSQL stored it, but every process keeping Python's default limit (4,300 digits, CVE-2020-10735)
    # failed to read the job back: its page and its API answers were a 500, for good.
    default = sys.get_int_max_str_digits()
    try:
        report = run_handler(claimed_job("TEST_EXECUTE_LIFTS_THE_DIGIT_LIMIT", payload={"key": key}), threading.Event())
    finally:
        sys.set_int_max_str_digits(default)

    assert (report.outcome, report.error) == (outcome, error)
    assert report.result == (_LONG_NUMBERS[key] if outcome == Outcome.SUCCEEDED else None)


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@handler("TEST_EXECUTE_UNPRINTABLE")
def _unprintable(payload: Any, ctx: JobContext) -> None:
    raise _UnprintableError


def test_an_exception_whose_text_cannot_be_read_is_still_the_runs_error() -> None:
    # Its str() raising killed the pool thread and lost the exception's type (adversarial check).
    report = run_handler(claimed_job("TEST_EXECUTE_UNPRINTABLE"), threading.Event())

    assert report.outcome == Outcome.RETRYABLE
    assert report.error == "_UnprintableError (its message could not be read: RuntimeError)"


class _HostileText(str):
    """Text whose formatting and truth value raise: what a handler's ``__str__`` may return."""

    def __format__(self, spec: str) -> str:
        raise RuntimeError("no format")

    def __bool__(self) -> bool:
        raise RuntimeError("no truth")


class _HostileTextError(Exception):
    def __str__(self) -> str:
        return _HostileText("the message")


class _NamelessMeta(type):
    @property
    def __name__(cls) -> str:  # read by type(exc).__name__
        raise SystemExit("no name")


class _NamelessError(Exception, metaclass=_NamelessMeta):
    pass


@handler("TEST_EXECUTE_HOSTILE_TEXT")
def _hostile_text(payload: Any, ctx: JobContext) -> None:
    raise _HostileTextError


@handler("TEST_EXECUTE_NAMELESS")
def _nameless(payload: Any, ctx: JobContext) -> None:
    raise _NamelessError("the message")


def test_an_exception_whose_text_is_a_hostile_str_subclass_is_still_the_runs_error() -> None:
    # str(exc) may return a str subclass: formatting it or testing its truth raised out of
    # run_handler, so the pool thread died (or the pool child was killed) and the job's error
    # read "its pool thread died while running it" (adversarial check).
    report = run_handler(claimed_job("TEST_EXECUTE_HOSTILE_TEXT"), threading.Event())

    assert report.outcome == Outcome.RETRYABLE
    assert (report.error, type(report.error)) == ("_HostileTextError: the message", str)


def test_an_exception_whose_class_name_cannot_be_read_is_still_the_runs_error() -> None:
    # A metaclass's __name__ property raising SystemExit escaped run_handler the same way.
    report = run_handler(claimed_job("TEST_EXECUTE_NAMELESS"), threading.Event())

    assert report.outcome == Outcome.RETRYABLE
    assert report.error == "_NamelessError: the message"


class _Shifting(dict):
    """A result that encodes as checked once, then as something else (the json encoder calls ``items``)."""

    def __init__(self) -> None:
        super().__init__(checked=True)
        self.calls = 0

    def items(self) -> Any:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("encoded a second time, in the worker's flusher")
        return super().items()


def test_the_result_kept_is_the_json_that_was_checked_not_the_handlers_object() -> None:
    # The flusher encoded the handler's own object again when it wrote the outcome: a dict subclass
    # could then raise, hang the flusher (every later outcome of the worker waiting) or grow past
    # the size limit, and a dict that the handler's thread went on filling was stored as it was then.
    shifting = _Shifting()
    report = returning("shifting", shifting)
    assert (report.outcome, report.result, type(report.result)) == (Outcome.SUCCEEDED, {"checked": True}, dict)
    assert execute._encode_result(report.result) == '{"checked": true}'

    growing = {"n": [1]}
    report = returning("growing", growing)
    growing["n"].append(2)
    growing["more"] = "x" * execute.MAX_RESULT_BYTES
    assert report.result == {"n": [1]}


class _NotesRaiseError(Exception):
    @property
    def __notes__(self) -> list[str]:  # read by traceback.format_exc()
        raise RuntimeError("no notes")


@handler("TEST_EXECUTE_NOTES_RAISE")
def _notes_raise(payload: Any, ctx: JobContext) -> None:
    raise _NotesRaiseError("the message")


def test_an_exception_whose_traceback_cannot_be_formatted_is_still_the_runs_error() -> None:
    # traceback.format_exc() raised out of run_handler: the pool thread died (its job reported only
    # as "its pool thread died"), and a pool child exited, its job reported as a crash (adversarial check).
    report = run_handler(claimed_job("TEST_EXECUTE_NOTES_RAISE"), threading.Event())

    assert report.outcome == Outcome.RETRYABLE
    assert report.error == "_NotesRaiseError: the message"
    assert report.traceback == "its traceback could not be formatted: RuntimeError"


@pytest.mark.parametrize("value", [None, "text", 0, False, {"a": [1, 2.5, None, "\u00e9"]}, _nested(30)])
def test_a_json_result_succeeds_and_is_kept_as_returned(value: Any) -> None:
    report = returning("ok", value)

    assert (report.outcome, report.error) == (Outcome.SUCCEEDED, "")
    assert report.result == value


@pytest.mark.django_db(transaction=True)
def test_a_transaction_a_handler_left_open_is_rolled_back_before_the_threads_next_job(caplog) -> None:
    reports = in_a_new_thread("TEST_EXECUTE_LEAVES_A_TRANSACTION", "TEST_EXECUTE_TRANSACTION_STATUS")

    assert [r.outcome for r in reports] == [Outcome.SUCCEEDED] * 2
    assert reports[1].result == "IDLE table=False"  # not inside the first job's transaction, which is gone
    assert "left a database transaction open (INTRANS)" in caplog.text


def test_a_time_zone_and_a_language_a_handler_activated_end_with_its_run() -> None:
    # They were the thread's own (Django keeps them per thread): every later job of that slot ran
    # in them, its local times in another zone and its translated texts in another language.
    reports = in_a_new_thread("TEST_EXECUTE_ACTIVATES_A_ZONE_AND_A_LANGUAGE", "TEST_EXECUTE_ZONE_AND_LANGUAGE")

    assert [r.result for r in reports] == ["Asia/Kathmandu de", "UTC en-us"]


@pytest.mark.django_db(transaction=True)
def test_an_atomic_block_a_handler_left_open_in_a_pool_slot_is_rolled_back_before_the_slots_next_job(caplog) -> None:
    # Django closed the connection (its autocommit was off) but kept it inside the atomic block:
    # every later job of that slot failed with "the connection is closed", for good.
    reports = in_a_new_thread(
        "TEST_EXECUTE_LEAVES_AN_ATOMIC_BLOCK", "TEST_EXECUTE_TRANSACTION_STATUS", "TEST_EXECUTE_TRANSACTION_STATUS"
    )

    assert [r.outcome for r in reports] == [Outcome.SUCCEEDED] * 3, reports[1].error
    assert [r.result for r in reports[1:]] == ["IDLE table=False"] * 2  # the handler's write was rolled back
    assert "left an atomic block open; it was rolled back and its connection closed" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_connection_a_handler_closed_under_django_is_replaced_and_logged_as_closed_not_as_a_transaction(caplog):
    reports = in_a_new_thread("TEST_EXECUTE_CLOSES_ITS_RAW_CONNECTION", "TEST_EXECUTE_TRANSACTION_STATUS")

    assert [r.outcome for r in reports] == [Outcome.SUCCEEDED] * 2
    assert reports[1].result == "IDLE table=False"
    assert "left its database connection closed or broken; it was replaced" in caplog.text
    assert "transaction open" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_what_a_handler_set_in_its_session_is_reset_before_the_threads_next_job() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout'), current_setting('search_path')")
        timeout, path = cursor.fetchone()
        cursor.execute("DROP ROLE IF EXISTS test_execute_nobody; CREATE ROLE test_execute_nobody NOLOGIN")
        cursor.execute("GRANT test_execute_nobody TO current_user")
    try:
        reports = in_a_new_thread("TEST_EXECUTE_SPOILS_ITS_SESSION", "TEST_EXECUTE_SESSION_STATE")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP ROLE test_execute_nobody")

    assert [r.outcome for r in reports] == [Outcome.SUCCEEDED] * 2, reports[0].error
    assert reports[1].result == {
        "timeout": timeout,
        "path": path,
        "zone": "UTC",
        "advisory": 0,
        "listening": 0,
        "prepared": 0,
        "own_role": True,
        "no_temp": True,
    }


@pytest.mark.django_db(transaction=True)
def test_a_session_whose_time_zone_cannot_be_set_again_after_its_reset_is_closed() -> None:
    # Seen under load: the statement timeout a handler set (1 ms) fired at the very end of the
    # DISCARD ALL that reset it, and the pending cancel hit Django's SET TIME ZONE right after,
    # a psycopg error (Django's init_connection_state uses the raw connection), not Django's.
    closed: list[bool] = []

    def steps() -> None:
        connection.ensure_connection()

        def canceled() -> None:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

        connection.init_connection_state = canceled  # this thread's connection only
        execute._reset_sessions()
        closed.append(connection.connection is None)

    in_a_thread(steps)
    assert closed == [True]  # the thread's next job opens a fresh session, in Django's time zone


@pytest.mark.django_db(transaction=True)
def test_opened_a_connection_is_per_thread_and_set_by_the_first_connection() -> None:
    seen: list[bool] = []

    def steps() -> None:
        seen.append(db_threads.opened_a_connection())
        connection.ensure_connection()
        seen.append(db_threads.opened_a_connection())

    in_a_thread(steps)
    assert seen == [False, True]


@pytest.mark.django_db(transaction=True)
def test_a_run_returns_its_report_even_when_checking_its_connections_fails(monkeypatch, caplog) -> None:
    def broken() -> None:
        raise RuntimeError("close failed")

    monkeypatch.setattr(execute, "close_old_connections", broken)

    reports = in_a_new_thread("TEST_EXECUTE_QUERIES")

    assert [(r.outcome, r.result) for r in reports] == [(Outcome.SUCCEEDED, 1)]
    assert "closing its thread's database connection failed" in caplog.text


def in_a_thread(steps: Callable[[], None]) -> None:
    """Call ``steps`` in a new thread (as a pool slot runs jobs), close that thread's connection after, wait for it."""

    def slot() -> None:
        try:
            steps()
        finally:
            connection.close()

    thread = threading.Thread(target=slot)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()


def in_a_new_thread(*job_types: str) -> list[Report]:
    """Run one job of each type, in turn, in one new thread, as a pool slot does; return their reports."""
    _RESULTS["ok"] = "done"
    reports: list[Report] = []
    in_a_thread(
        lambda: reports.extend(
            run_handler(claimed_job(job_type, payload={"key": "ok"}), threading.Event(), pool_slot=True)
            for job_type in job_types
        )
    )
    return reports


@pytest.mark.django_db(transaction=True)
def test_a_thread_that_never_opened_a_connection_skips_the_connection_check(monkeypatch) -> None:
    checks: list[str] = []
    real = execute.close_old_connections

    def counted() -> None:
        checks.append(threading.current_thread().name)
        real()

    monkeypatch.setattr(execute, "close_old_connections", counted)

    reports = in_a_new_thread("TEST_EXECUTE_RETURNS", "TEST_EXECUTE_RETURNS")
    assert [r.outcome for r in reports] == [Outcome.SUCCEEDED] * 2
    assert checks == []

    # Once a handler of that thread has opened one, every later run checks it, as Django does per request.
    reports = in_a_new_thread("TEST_EXECUTE_RETURNS", "TEST_EXECUTE_QUERIES", "TEST_EXECUTE_RETURNS")
    assert [r.outcome for r in reports] == [Outcome.SUCCEEDED] * 3
    assert len(checks) == 2


@pytest.mark.django_db(transaction=True)
def test_a_connection_a_handler_left_past_its_max_age_is_closed_after_its_run() -> None:
    states: list[bool] = []

    def steps() -> None:
        report = run_handler(claimed_job("TEST_EXECUTE_QUERIES"), threading.Event())
        states.append(report.outcome == Outcome.SUCCEEDED)
        states.append(connection.connection is None)  # closed by the check after the run

    in_a_thread(steps)
    assert states == [True, True]


def test_the_forked_child_of_a_handler_that_returns_ends_there_and_never_runs_the_workers_code() -> None:
    read, write = os.pipe()
    report = run_handler(claimed_job("TEST_EXECUTE_FORKS"), threading.Event())
    if _FORKED[-1] == 0:  # the child would be here if run_handler let it go on
        os.write(write, b"escaped")
        os._exit(3)
    os.close(write)
    _, status = os.waitpid(_FORKED[-1], 0)

    assert os.read(read, 100) == b""
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (report.outcome, report.result) == (Outcome.SUCCEEDED, "returned")


@pytest.mark.django_db(transaction=True)
def test_a_connection_whose_backend_the_handler_ended_is_replaced_for_the_threads_next_job(caplog) -> None:
    reports = in_a_new_thread("TEST_EXECUTE_ENDS_ITS_BACKEND", "TEST_EXECUTE_SESSION_STATE")

    assert [r.outcome for r in reports] == [Outcome.SUCCEEDED] * 2, reports[1].error
    assert "closing its thread's database connection failed" not in caplog.text


# -- a handler that cancels its own job ------------------------------------------------------------


@handler("TEST_EXECUTE_CANCELS_ITSELF", max_retries=3)
def _cancels_itself(payload: Any, ctx: JobContext) -> None:
    raise JobCancelled(*payload["reason"])  # the public name, as a handler imports it


@pytest.mark.django_db(transaction=True)  # run_handler closes a connection left out of autocommit
@pytest.mark.parametrize(
    ("reason", "error"),
    [
        (["the customer closed the account"], "cancelled by the handler: the customer closed the account"),
        ([], "cancelled by the handler"),
    ],
    ids=["with a reason", "without one"],
)
def test_a_handler_that_raises_job_cancelled_ends_its_job_cancelled_with_its_reason_never_retried(reason, error):
    job = enqueue("TEST_EXECUTE_CANCELS_ITSELF", {"reason": reason})
    (claimed,) = leasing.claim_jobs(worker_id="test-execute", limit=1, queues=None)

    report = run_handler(claimed, threading.Event())
    assert (report.outcome, report.error) == (Outcome.CANCELLED, error)
    assert leasing.record_outcomes([report]) == {job.id}

    job.refresh_from_db()
    assert (job.status, job.last_error, job.finished_at is not None) == (JobStatus.CANCELLED, error, True)
    assert attempts(job) == [(1, AttemptStatus.CANCELLED)]
    assert events(job)[-1] == EventType.JOB_CANCELLED


def test_job_cancelled_raised_after_a_cancel_request_still_reads_as_that_request() -> None:
    flag = threading.Event()
    flag.set()  # the owner's cancel reached the worker; ctx.check_cancelled raised

    report = run_handler(claimed_job("TEST_EXECUTE_CANCELS_ITSELF", payload={"reason": []}), flag)

    assert (report.outcome, report.error) == (Outcome.CANCELLED, "cancelled")


# -- huge errors and tracebacks are cut where they are made ------------------------------------------


def _raise_huge(size: int) -> None:
    raise ValueError("x" * size)


@handler("TEST_EXECUTE_HUGE_ERROR")
def _huge_error(payload: Any, ctx: JobContext) -> None:
    _raise_huge(payload["size"])


def _ping(depth: int) -> None:
    # Two functions in turn: Python folds a run of identical frames into one line.
    if depth:
        _pong(depth - 1)
    raise ValueError("at the bottom")


def _pong(depth: int) -> None:
    _ping(depth)


@handler("TEST_EXECUTE_DEEP_TRACEBACK")
def _deep_traceback(payload: Any, ctx: JobContext) -> None:
    _ping(payload["depth"])


def test_a_huge_error_is_cut_in_the_slot_that_ran_it_and_its_traceback_keeps_the_frames() -> None:
    # 10 MB here, 100 MB in the wild: the report a slot thread queues (and a pool child sends) held
    # it whole, in the error and again in the traceback's last line, until the outcome writer cut it.
    report = run_handler(claimed_job("TEST_EXECUTE_HUGE_ERROR", payload={"size": 10 * 1024 * 1024}), threading.Event())

    assert report.outcome == Outcome.RETRYABLE
    assert len(report.error) == leasing.MAX_ERROR_CHARS
    assert report.error == ("ValueError: " + "x" * leasing.MAX_ERROR_CHARS)[: leasing.MAX_ERROR_CHARS]
    assert len(report.traceback) < leasing.MAX_TRACEBACK_CHARS
    assert "_huge_error" in report.traceback and "_raise_huge" in report.traceback  # the message line alone is cut
    assert len(encode_report(report)) < leasing.MAX_ERROR_CHARS + leasing.MAX_TRACEBACK_CHARS + 1000  # bytes


def test_a_long_traceback_keeps_its_last_characters_where_the_error_was_raised() -> None:
    report = run_handler(claimed_job("TEST_EXECUTE_DEEP_TRACEBACK", payload={"depth": 300}), threading.Event())

    assert len(report.traceback) == leasing.MAX_TRACEBACK_CHARS
    assert report.traceback.endswith("ValueError: at the bottom\n")
    assert report.error == "ValueError: at the bottom"


# -- a handler chooses when it is retried (RetryAfter) ------------------------------------------------

_ASKED: dict[str, Any] = {}
BACKOFF_INSTEAD = "retried after the job type's backoff instead"


class _UnreadableDelay(RetryAfter):
    """A RetryAfter whose delay attribute raises ``SystemExit`` when it is read."""

    @property
    def delay_seconds(self) -> float:
        raise SystemExit("no delay")

    @delay_seconds.setter
    def delay_seconds(self, value: object) -> None:
        pass


class _FloatWhoseFloatRaises(float):
    def __float__(self) -> float:
        raise SystemExit("__float__")


@handler("TEST_EXECUTE_RETRY_AFTER")
def _retry_after(payload: Any, ctx: JobContext) -> None:
    asked = _ASKED[payload["key"]]
    if isinstance(asked, BaseException):
        raise asked
    raise RetryAfter(asked, payload.get("message", ""))


def retrying_after(asked: Any, message: str = "") -> Report:
    key = str(len(_ASKED))
    _ASKED[key] = asked
    return run_handler(
        claimed_job("TEST_EXECUTE_RETRY_AFTER", payload={"key": key, "message": message}), threading.Event()
    )


def test_retry_after_ends_the_run_retryable_with_the_delay_the_handler_asked_for() -> None:
    report = retrying_after(2, "rate limited")

    assert (report.outcome, report.retry_after) == (Outcome.RETRYABLE, 2.0)
    assert report.error == "RetryAfter: rate limited (retried in 2 s, as the handler asked)"
    assert report.traceback.endswith("RetryAfter: rate limited\n")
    assert retrying_after(0.5).error == "RetryAfter: retried in 0.5 s, as the handler asked"  # "Type: ..." as ever


def test_any_other_error_leaves_the_delay_to_the_job_types_backoff() -> None:
    report = run_handler(claimed_job("TEST_EXECUTE_UNPRINTABLE"), threading.Event())

    assert (report.outcome, report.retry_after) == (Outcome.RETRYABLE, None)


@pytest.mark.parametrize(
    ("asked", "seconds", "why"),
    [
        (-30, 0.0, "it asked for a negative delay"),
        pytest.param(
            10**5000, float(MAX_BACKOFF_SECONDS), f"it asked for more than {MAX_BACKOFF_SECONDS} s", id="10**5000"
        ),
    ],
)
def test_a_finite_delay_out_of_range_is_clamped_and_the_error_says_so(asked: Any, seconds: float, why: str) -> None:
    report = retrying_after(asked, "busy")

    assert (report.outcome, report.retry_after) == (Outcome.RETRYABLE, seconds)
    assert report.error == f"RetryAfter: busy (retried in {seconds:.10g} s: {why})"


@pytest.mark.parametrize(
    ("asked", "error"),
    [
        ("5", "RetryAfter: busy (its delay is of type str, not a number of seconds: "),
        (math.nan, "RetryAfter: busy (its delay is NaN: "),
        (math.inf, "RetryAfter: busy (its delay is infinite: "),
        (_UnreadableDelay(1, "busy"), "_UnreadableDelay: busy (its delay could not be read (SystemExit): "),
    ],
)
def test_a_delay_that_is_not_a_finite_number_falls_back_to_the_backoff_and_the_error_says_why(
    asked: Any, error: str
) -> None:
    report = retrying_after(asked, "busy")

    assert (report.outcome, report.retry_after) == (Outcome.RETRYABLE, None)
    assert report.error == f"{error}{BACKOFF_INSTEAD})"


def test_a_float_subclass_is_read_as_the_value_it_holds_without_running_its_methods() -> None:
    report = retrying_after(_FloatWhoseFloatRaises(3.5), "busy")

    assert (report.outcome, report.retry_after, type(report.retry_after)) == (Outcome.RETRYABLE, 3.5, float)


def test_a_huge_message_is_cut_so_that_what_became_of_the_delay_is_kept() -> None:
    report = retrying_after(2, "x" * 100_000)

    assert len(report.error) == leasing.MAX_ERROR_CHARS
    assert report.error.startswith("RetryAfter: xxx")
    assert report.error.endswith("x (retried in 2 s, as the handler asked)")
