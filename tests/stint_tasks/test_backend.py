"""The Stint backend for Django's Tasks framework, in process: enqueue, claim order, results, context, checks.

Attempts run through the worker's own code (``leasing.claim_jobs``, ``execute.run_handler``,
``leasing.record_outcomes``) against the real database; ``test_worker.py`` runs real processes.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import sys
import threading
import uuid
from collections.abc import Callable

import pytest
from django.core.checks import Error, Warning  # noqa: A004 - Django's names
from django.db import connection
from django.utils import timezone

from scheduler import leasing, lifecycle, schedules
from scheduler.enqueuing import enqueue
from scheduler.exceptions import UnknownJobType
from scheduler.jobspec import MAX_RETRIES_RANGE, TIMEOUT_RANGE
from scheduler.leasing import MAX_TRACEBACK_CHARS, Outcome, Report
from scheduler.lifecycle import Claimed, NewJob
from scheduler.models import CronSchedule, Job
from scheduler.registry import resolve
from scheduler.states import JobStatus, Priority
from scheduler.workers.execute import run_handler
from stint_tasks import registry
from stint_tasks.backend import StintBackend
from stint_tasks.compat import (
    TASKS_PACKAGE,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from stint_tasks.exceptions import TaskTimedOut
from stint_tasks.options import TaskSettings, task_option_errors, task_settings
from stint_tasks.periodic import task_schedule
from tests.stint_tasks import tasks as t

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

pytestmark = pytest.mark.django_db
WORKER = "test-worker"


@pytest.fixture(autouse=True)
def _keep_the_test_transaction(monkeypatch) -> None:
    """``run_handler`` recycles the thread's connection after each job; here that is the test's transaction."""
    monkeypatch.setattr("scheduler.workers.execute.close_old_connections", lambda: None)


def claim_all() -> list[Claimed]:
    return leasing.claim_jobs(worker_id=WORKER, limit=100, queues=None)


def run(job: Claimed, flag: threading.Event | None = None) -> Report:
    """One attempt as a worker runs it: the handler, then the fenced outcome write."""
    report = run_handler(job, flag or threading.Event())
    leasing.record_outcomes([report])
    return report


def run_next() -> Report:
    (job,) = claim_all()
    return run(job)


def run_next_seeing_finished() -> tuple[Report, list[tuple[str, str | None]]]:
    """``run_next()``, with the (status, last error's class path) of each ``task_finished`` it sent."""
    finished: list[tuple[str, str | None]] = []

    def on_finished(sender, task_result, **kwargs) -> None:
        errors = task_result.errors
        finished.append((task_result.status, errors[-1].exception_class_path if errors else None))

    task_finished.connect(on_finished)
    try:
        report = run_next()
    finally:
        task_finished.disconnect(on_finished)
    return report, finished


def make_due(result_id: str) -> None:
    """Move a RETRYING job's backoff to now (the promoter's job, without waiting)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE stint_job SET status = 'QUEUED' WHERE id = %s AND status = 'RETRYING'", [uuid.UUID(result_id)]
        )


def test_the_backend_says_what_it_supports() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, StintBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result) == (True, True, True)
    assert backend.supports_priority is True


def test_enqueue_writes_a_job_named_by_the_task_path_and_returns_its_ready_result() -> None:
    result = t.add.using(priority=37).enqueue(2, b=3)

    job = Job.objects.get(id=result.id)
    assert (job.type, job.name, job.status, job.queue, job.owner_id) == (
        "tests.stint_tasks.tasks.add",
        "add",
        JobStatus.QUEUED,
        "default",
        None,
    )
    assert (job.priority, job.payload, job.max_retries, job.timeout_seconds) == (
        37,
        {"args": [2], "kwargs": {"b": 3}},
        3,
        300,
    )
    assert (result.status, result.args, result.kwargs, result.attempts) == (TaskResultStatus.READY, [2], {"b": 3}, 0)
    assert result.enqueued_at == job.created_at
    assert t.add.get_result(result.id) == result


def test_arguments_follow_djangos_json_rules_and_a_refused_call_writes_nothing() -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        t.add.enqueue(dt.datetime.now(), 1)
    result = t.add.enqueue((1, 2), b"3")  # a tuple becomes a list, bytes a string (normalize_json)
    assert Job.objects.get().payload == {"args": [[1, 2], "3"], "kwargs": {}}
    assert result.args == [[1, 2], "3"]


def test_run_after_defers_the_job_and_reads_back_on_the_result() -> None:
    when = timezone.now() + dt.timedelta(hours=1)
    result = t.add.using(run_after=when).enqueue(1, 1)

    job = Job.objects.get(id=result.id)
    assert (job.status, job.scheduled_at) == (JobStatus.SCHEDULED, when)
    assert t.add.get_result(result.id).task.run_after == when
    assert claim_all() == []


def test_djangos_validation_still_applies() -> None:
    with pytest.raises(InvalidTask):
        t.add.using(priority=101)
    with pytest.raises(InvalidTask):
        t.add.using(queue_name="not-in-QUEUES")
    with pytest.raises(InvalidTask):
        t.add.using(run_after=dt.datetime(2030, 1, 1))  # naive


@pytest.mark.parametrize(("option", "value"), [("priority", 1.5), ("priority", True), ("priority", 50.0)])
def test_a_priority_a_job_cannot_take_is_an_invalid_task(option: str, value: object) -> None:
    # Django's own check is a range (-100 <= p <= 100): 1.5 and True pass it, and each enqueue() then
    # failed as an InvalidJob instead of the task at its definition.
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        t.add.using(**{option: value})
    assert Job.objects.count() == 0


@pytest.mark.parametrize("queue", ["has space", "", "q" * 101, "nul\x00", "caf\u00e9"])
def test_a_queue_name_a_job_cannot_take_is_an_invalid_task_even_with_no_queues_configured(settings, queue) -> None:
    # With QUEUES empty Django lets any queue name through (the check of QUEUES names nothing).
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": []}}
    assert t.add.using(queue_name="any.name:1-x").queue_name == "any.name:1-x"
    with pytest.raises(InvalidTask, match="is not a Stint queue name"):
        t.add.using(queue_name=queue)
    assert Job.objects.count() == 0


def _function(qualname: str, module: str = "tests.stint_tasks.tasks") -> Callable[[], None]:
    """A function whose import path is ``module.qualname`` (Django checks its name, not where it was made)."""

    def func() -> None:
        return None

    func.__module__, func.__qualname__ = module, qualname
    return func


def test_a_task_path_that_a_job_type_cannot_hold_is_an_invalid_task() -> None:
    limit = Job._meta.get_field("type").max_length  # the path becomes the job's type
    module = "tests.stint_tasks.tasks"
    longest = task(_function("f" * (limit - len(module) - 1)))
    assert len(longest.module_path) == limit
    assert Job.objects.get(id=longest.enqueue().id).type == longest.module_path

    refused = [
        (module, "g" * (limit - len(module)), f"is {limit + 1} characters.*at most {limit}"),
        (module, "has_nul\x00", "U\\+0000"),
        (module, "has_surrogate\ud800", "surrogate"),
        ("tests.stint_tasks.\udc00", "in_a_module_with_a_surrogate", "surrogate"),
    ]
    for module_name, qualname, message in refused:
        with pytest.raises(InvalidTask, match=message):  # at definition, as Django refuses any invalid task
            task(_function(qualname, module_name))
        assert registry.get_task(f"{module_name}.{qualname}") is None
    assert Job.objects.count() == 1


def test_higher_priority_is_claimed_first_across_tasks_and_rest_jobs() -> None:
    low = t.add.using(priority=-100).enqueue(0, 0)
    default = t.add.enqueue(0, 0)
    between = t.prioritised.enqueue()  # 37, from the decorator
    rest_high = enqueue("DEMO_TASK", priority="HIGH")  # 50
    top = t.add.using(priority=100).enqueue(0, 0)

    order = [str(leasing.claim_jobs(worker_id=WORKER, limit=1, queues=None)[0].id) for _ in range(5)]

    assert order == [top.id, str(rest_high.id), between.id, default.id, low.id]


def test_per_task_options_set_retries_timeout_and_backoff(settings) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "stint_tasks.backend.StintBackend",
            "QUEUES": ["default"],
            "OPTIONS": {
                "defaults": {"timeout_seconds": 60},
                "tasks": {
                    "tests.stint_tasks.tasks.fails": {"max_retries": 0, "timeout_seconds": 5},
                    "tests.stint_tasks.tasks.sleeps": {"backoff_base_seconds": 7, "backoff_max_seconds": 9},
                },
            },
        }
    }
    fails = Job.objects.get(id=t.fails.enqueue().id)
    other = Job.objects.get(id=t.add.enqueue(1, 2).id)
    assert (fails.max_retries, fails.timeout_seconds) == (0, 5)
    assert (other.max_retries, other.timeout_seconds) == (3, 60)
    assert leasing.retry_delay("tests.stint_tasks.tasks.sleeps", 1) == 7
    assert leasing.retry_delay("tests.stint_tasks.tasks.sleeps", 3) == 9

    report = run(next(j for j in claim_all() if j.id == fails.id))
    assert report.outcome == Outcome.RETRYABLE
    assert Job.objects.get(id=fails.id).status == JobStatus.DEAD  # no retry left: one attempt only


def test_a_successful_run_reads_back_as_djangos_result() -> None:
    result = t.add.enqueue(2, 3)
    run_next()

    done = t.add.get_result(result.id)
    assert (done.status, done.return_value, done.errors, done.worker_ids) == (
        TaskResultStatus.SUCCESSFUL,
        5,
        [],
        [WORKER],
    )
    assert done.is_finished and done.attempts == 1
    assert done.enqueued_at <= done.started_at == done.last_attempted_at <= done.finished_at
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


def test_each_failed_attempt_is_an_error_with_its_exception_class_and_traceback() -> None:
    result = t.fails.enqueue()
    run_next()
    assert t.fails.get_result(result.id).status == TaskResultStatus.READY  # waiting for its retry
    make_due(result.id)
    run_next()

    failed = t.fails.get_result(result.id)
    assert failed.status == TaskResultStatus.READY and failed.attempts == 2
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError"] * 2
    assert failed.errors[0].exception_class is ValueError
    assert failed.errors[0].traceback.endswith("ValueError: this task fails\n")  # as Django's backends store it
    assert 'tasks.py", line' in failed.errors[0].traceback
    with pytest.raises(ValueError, match="not finished"):
        _ = failed.return_value


def test_a_task_that_raises_retry_after_is_retried_after_the_delay_it_asked_for() -> None:
    result = t.retries_after.enqueue(45)

    report = run_next()

    job = Job.objects.get(id=result.id)
    assert (report.retry_after, job.status) == (45.0, JobStatus.RETRYING)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")  # one transaction: the instant the outcome was written
        assert job.scheduled_at == cursor.fetchone()[0] + dt.timedelta(seconds=45)
    waiting = t.retries_after.get_result(result.id)
    assert (waiting.status, waiting.attempts) == (TaskResultStatus.READY, 1)
    assert [e.exception_class_path for e in waiting.errors] == ["scheduler.exceptions.RetryAfter"]


def test_an_attempt_that_will_be_retried_logs_a_warning_and_the_last_failure_an_error(caplog) -> None:
    # Django's receiver of task_finished logs a FAILED result with logger.exception: every attempt
    # that Stint was about to retry was an ERROR with its traceback.
    result = t.fails.enqueue()
    with caplog.at_level(logging.INFO, logger=TASKS_PACKAGE):
        run_next()  # attempt 1 of 4: retried
        Job.objects.filter(id=result.id).update(max_retries=1)  # so attempt 2 is the last
        make_due(result.id)
        run_next()

    failed = [r for r in caplog.records if r.name == TASKS_PACKAGE and "state=FAILED" in r.getMessage()]
    assert [(r.levelname, r.exc_info is not None) for r in failed] == [("WARNING", True), ("ERROR", True)]
    assert failed[0].getMessage().endswith("(attempt 1 failed; it will be retried: 3 attempts left)")
    assert "retried" not in failed[1].getMessage()
    assert Job.objects.get(id=result.id).status == JobStatus.DEAD


def test_a_failure_that_is_never_retried_logs_an_error(caplog) -> None:
    not_json = t.not_json.enqueue()  # PermanentError: ends FAILED whatever attempts are left
    with caplog.at_level(logging.INFO, logger=TASKS_PACKAGE):
        run_next()

    failed = [r for r in caplog.records if r.name == TASKS_PACKAGE and "state=FAILED" in r.getMessage()]
    assert [r.levelname for r in failed] == ["ERROR"]
    assert Job.objects.get(id=not_json.id).status == JobStatus.FAILED


def test_a_dead_job_reads_failed_and_a_timed_out_attempt_names_its_class() -> None:
    result = t.sleeps.enqueue(0)
    (job,) = claim_all()
    leasing.record_outcomes([Report(job=job, outcome=Outcome.TIMED_OUT, error="timed out after 300 s")])
    Job.objects.filter(id=job.id).update(max_retries=0)  # the next failure dead-letters it
    make_due(result.id)
    leasing.record_outcomes([Report(job=claim_all()[0], outcome=Outcome.TIMED_OUT, error="timed out")])

    dead = t.sleeps.get_result(result.id)
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD
    assert dead.status == TaskResultStatus.FAILED and dead.finished_at is not None
    assert [e.exception_class for e in dead.errors] == [TaskTimedOut, TaskTimedOut]


def test_system_exit_non_json_returns_and_project_exceptions_fail_the_attempt_with_their_class() -> None:
    exits = t.exits.enqueue()
    not_json = t.not_json.enqueue()
    custom = t.raises_custom.enqueue()
    reports = {str(j.id): run(j) for j in claim_all()}

    assert reports[exits.id].outcome == reports[custom.id].outcome == Outcome.RETRYABLE  # the thread survives
    assert reports[not_json.id].outcome == Outcome.PERMANENT  # the task ran: a retry would run it again
    assert t.raises_custom.get_result(custom.id).errors[0].exception_class is t.CustomError
    assert t.exits.get_result(exits.id).errors[0].exception_class_path == "builtins.SystemExit"
    assert t.not_json.get_result(not_json.id).errors[0].exception_class_path == "builtins.TypeError"


@pytest.mark.parametrize(
    ("kind", "exception", "detail"),
    [
        ("set", "builtins.TypeError", "Unsupported type: <class 'set'>"),
        ("decimal", "builtins.TypeError", "Unsupported type: <class 'decimal.Decimal'>"),
        ("datetime", "builtins.TypeError", "Unsupported type: <class 'datetime.datetime'>"),
        ("object", "builtins.TypeError", "Unsupported type: <class 'object'>"),
        ("deep", "builtins.RecursionError", "nested too deeply"),
    ],
)
@pytest.mark.parametrize("returns", [t.returns_unstorable, t.async_returns_unstorable], ids=["sync", "async"])
def test_a_return_value_that_is_not_json_fails_the_job_after_one_attempt(returns, kind, exception, detail) -> None:
    result = returns.enqueue(kind)  # Stint's default budget: 3 retries
    report, finished = run_next_seeing_finished()

    # The task ran (its side effects happened): a retry would run it again, for the same value.
    assert report.outcome == Outcome.PERMANENT
    assert f"{exception}: the task's return value is not JSON" in report.error and detail in report.error
    assert claim_all() == []
    job = Job.objects.get(id=result.id)
    assert (job.status, job.attempts) == (JobStatus.FAILED, 1)
    failed = returns.get_result(result.id)
    assert (failed.status, failed.attempts) == (TaskResultStatus.FAILED, 1)
    assert [e.exception_class_path for e in failed.errors] == [exception]  # as Django's own backends name it
    assert detail in failed.errors[0].traceback
    assert finished == [(TaskResultStatus.FAILED, exception)]


@pytest.mark.parametrize(
    ("kind", "detail"),
    [
        ("nan", "result is not JSON: Out of range float values are not JSON compliant"),
        ("nul", "result holds U+0000, which PostgreSQL cannot store"),
        ("surrogate", "result holds a lone UTF-16 surrogate, which PostgreSQL cannot store"),
        ("big", "result is 1,048,578 bytes of JSON, over the 1,048,576 a job keeps"),
    ],
)
def test_a_return_value_normalize_json_passes_but_a_job_cannot_keep_is_signalled_failed(kind, detail) -> None:
    # Django's normalize_json passes NaN, U+0000, lone surrogates and any size: task_finished said
    # SUCCESSFUL for a value the worker then refused, so the job ended FAILED behind the signal's back.
    result = t.returns_refused.enqueue(kind)
    report, finished = run_next_seeing_finished()

    assert report.outcome == Outcome.PERMANENT
    # Python 3.12's json adds the value (": nan") to its message: the start is what is checked.
    assert report.error.startswith(
        f"TaskResultNotJSON: builtins.ValueError: the task's return value cannot be stored: {detail}"
    )
    assert finished == [(TaskResultStatus.FAILED, "builtins.ValueError")]
    failed = t.returns_refused.get_result(result.id)
    assert (failed.status, failed.attempts) == (TaskResultStatus.FAILED, 1)
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError"]


def test_the_context_carries_stints_attempt_number() -> None:
    result = t.attempt_of.enqueue(fail_until=1)
    first = run_next()
    assert first.outcome == Outcome.RETRYABLE and "attempt 1" in first.error
    make_due(result.id)
    second = run_next()

    assert second.result == {"attempt": 2, "id": result.id, "workers": 2}
    assert t.attempt_of.get_result(result.id).errors[0].exception_class_path == "builtins.KeyError"


def test_an_async_task_runs_on_an_event_loop_and_stops_when_cancelled() -> None:
    t.async_add.enqueue(20, 22)
    assert run_next().result == 42

    t.async_sleep.enqueue(60)
    (job,) = claim_all()
    flag = threading.Event()
    threading.Timer(0.2, flag.set).start()  # what the worker does on cancel or timeout
    assert run(job, flag).outcome == Outcome.CANCELLED


def test_get_result_refuses_unknown_ids_and_jobs_that_are_not_tasks() -> None:
    backend = task_backends["default"]
    native = enqueue("DEMO_TASK")
    for bad in ["123", str(uuid.uuid4()), str(native.id)]:
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(bad)


def test_get_result_reads_a_task_job_whose_stored_documents_python_cannot_read() -> None:
    # Rows edited by hand (as tests/config/test_unreadable_json.py does): jsonb holds a number of
    # 5,000 digits and a run_after that is not ISO text; json.loads and fromisoformat raised out of
    # get_result, where every other reader shows core.stored_json.UnreadableJSON.
    big = """('{"n": ' || repeat('9', 5000) || '}')::jsonb"""
    unreadable_payload, odd_run_after, unreadable_result = (t.add.enqueue(1, 2) for _ in range(3))
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE stint_job SET payload = {big} WHERE id = %s", [unreadable_payload.id])  # noqa: S608
        cursor.execute(
            """UPDATE stint_job SET payload = '{"args": [1, 2], "kwargs": {}, "run_after": 5}' WHERE id = %s""",
            [odd_run_after.id],
        )
        cursor.execute(
            f"UPDATE stint_job SET status = 'SUCCESS', result = {big}, result_attempt = 1,"  # noqa: S608
            " result_status = 'SUCCEEDED', result_at = now() WHERE id = %s",
            [unreadable_result.id],
        )

    read = t.add.get_result(unreadable_payload.id)
    assert (read.status, read.args, read.kwargs) == (TaskResultStatus.READY, [], {})  # as a payload of no object
    odd = t.add.get_result(odd_run_after.id)
    assert (odd.task.run_after, odd.args) == (None, [1, 2])
    done = t.add.get_result(unreadable_result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert str(done.return_value) == "(cannot be read: it holds a number of more than 4300 digits)"


def test_enqueue_is_part_of_the_callers_transaction() -> None:
    from django.db import transaction

    class Rollback(Exception):  # noqa: N818
        pass

    with pytest.raises(Rollback), transaction.atomic():
        t.add.enqueue(1, 2)
        assert Job.objects.count() == 1
        raise Rollback
    assert Job.objects.count() == 0


# -- what a job type string can reach -----------------------------------------------------------


def test_the_rest_api_and_schedules_refuse_task_paths(user_api, user) -> None:
    for job_type in ["tests.stint_tasks.tasks.add", "os.system", "subprocess.check_output"]:
        response = user_api.post("/api/jobs", {"type": job_type, "payload": {"args": ["id"]}}, format="json")
        assert response.status_code == 400, response.content
        with pytest.raises(Exception, match="Unknown job type"):
            schedules.schedule_create(owner=user, name="x", interval_seconds=60, job={"type": job_type})
    assert Job.objects.count() == 0


def test_a_worker_resolves_only_registered_tasks_and_never_imports_a_stored_type() -> None:
    hostile = ["tests.stint_tasks.trap.boom", "subprocess.check_output", "os.system", "builtins.eval"]
    lifecycle.create_jobs(
        [
            NewJob(
                id=uuid.uuid4(),
                owner_id=None,
                name="",
                type=job_type,
                payload={"args": ["id"]},
                priority=0,
                queue="default",
                scheduled_at=None,
                max_retries=3,
                timeout_seconds=10,
            )
            for job_type in hostile
        ]
    )
    for job_type in hostile:
        with pytest.raises(UnknownJobType):
            resolve(job_type)

    reports = [run(job) for job in claim_all()]

    assert {r.outcome for r in reports} == {Outcome.PERMANENT}
    assert all("Unknown job type" in r.error for r in reports)
    assert "tests.stint_tasks.trap" not in sys.modules
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.FAILED}


# -- periodic tasks and checks ----------------------------------------------------------------


def test_a_schedule_can_fire_a_task_and_syncing_it_again_updates_it_in_place(user) -> None:
    schedule = task_schedule(t.add, owner=user, name="sums", cron="*/5 * * * *", timezone="Europe/London", args=[4, 5])
    again = task_schedule(t.add, owner=user, name="sums", interval_seconds=90, args=[6, 7], overlap_policy="skip")

    assert again.id == schedule.id and CronSchedule.objects.count() == 1
    assert (again.cron, again.interval_seconds, again.overlap_policy) == (None, 90, "skip")
    assert (again.job_type, again.job_payload) == ("tests.stint_tasks.tasks.add", {"args": [6, 7], "kwargs": {}})
    fired = schedules.schedule_trigger(schedule_id=schedule.id)
    run_next()
    assert t.add.get_result(str(fired.id)).return_value == 13


def test_the_system_check_reports_bad_queues_options_and_periodic_entries(settings) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "stint_tasks.backend.StintBackend",
            "QUEUES": ["default", "has space"],
            "OPTIONS": {
                "retries": 3,
                "defaults": {"max_retries": 11},
                "tasks": {"no.such.task": {}},
                "modules": ["no_such_package.tasks"],
                "periodic": {"p": {"task": "tests.stint_tasks.tasks.add", "cron": "not cron", "misfire_policy": "x"}},
            },
        }
    }
    messages = list(task_backends["default"].check())

    ids = sorted({m.id for m in messages if isinstance(m, Error)})
    assert ids == [f"stint_tasks.E00{i}" for i in range(1, 6)]
    text = "\n".join(m.msg for m in messages)
    for fragment in [
        "'has space'",
        "'retries'",
        "max_retries must be 0 to 10",
        "'no.such.task'",
        "no_such_package",
        "misfire_policy",
    ]:
        assert fragment in text
    warnings = [m for m in messages if isinstance(m, Warning)]
    assert warnings and all(m.id == "stint_tasks.W001" for m in warnings)  # this module is not discovered


@pytest.mark.parametrize("value", [-1, math.inf, 1e15, 604_801], ids=repr)
def test_a_task_backoff_the_database_cannot_schedule_is_an_option_error(value) -> None:
    # "a number >= 0" let 1e15 through: its retries' due time was out of PostgreSQL's range, which
    # failed every rescue batch holding one of its jobs (see @handler's own check).
    for key in ("backoff_base_seconds", "backoff_max_seconds"):
        assert task_option_errors("OPTIONS['defaults']", {key: value}) == [
            f"OPTIONS['defaults']: {key} must be a number of seconds from 0 to 604800, not {value!r}."
        ]
    assert task_option_errors("OPTIONS['defaults']", {"backoff_base_seconds": 0, "backoff_max_seconds": 604_800}) == []


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_retries", -1),
        ("max_retries", 11),
        ("max_retries", True),
        ("timeout_seconds", 0),
        ("timeout_seconds", 3601),
    ],
    ids=repr,
)
def test_a_task_retry_or_timeout_out_of_the_job_range_is_a_system_check_error(settings, option, value) -> None:
    # The same values @handler refuses at declaration are stint_tasks.E002 here, for the backend's
    # defaults and for one task's entry alike; the bounds are the job spec's (a task may also opt
    # out of retries: max_retries 0).
    low, high = {"max_retries": (0, MAX_RETRIES_RANGE[1]), "timeout_seconds": TIMEOUT_RANGE}[option]
    settings.TASKS = {
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {"defaults": {option: value}, "tasks": {"tests.stint_tasks.tasks.add": {option: value}}},
        }
    }
    errors = [m for m in task_backends["default"].check() if isinstance(m, Error)]

    assert [m.id for m in errors] == ["stint_tasks.E002"] * 2
    assert [m.msg for m in errors] == [
        f"TASKS['default']: {where}: {option} must be {low} to {high}, not {value!r}."
        for where in ("OPTIONS['defaults']", "OPTIONS['tasks']['tests.stint_tasks.tasks.add']")
    ]
    assert task_settings(settings.TASKS["default"]["OPTIONS"], "tests.stint_tasks.tasks.add") == TaskSettings()


def test_the_check_reports_a_task_module_that_failed_to_import_for_a_task_path_too_long(settings, monkeypatch) -> None:
    module = "tests.stint_tasks.long_path_tasks"
    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"modules": [module]}}}
    monkeypatch.setattr(registry, "_DISCOVERED", set(registry._DISCOVERED))  # discover() adds to it
    registry.discover()  # what every process does at start-up: the failure is logged, and the process starts

    errors = [m for m in task_backends["default"].check() if isinstance(m, Error)]

    assert [m.id for m in errors] == ["stint_tasks.E004"]
    assert module in errors[0].msg and "is 102 characters" in errors[0].msg and "at most 100" in errors[0].msg
    assert not [path for path in registry.registered_paths() if path.startswith(module)]


def test_the_default_configuration_passes_the_check(settings) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "OPTIONS": {"modules": ["tests.stint_tasks.tasks"]}},
    }
    assert [m for m in task_backends["default"].check() if isinstance(m, Error)] == []
    assert Priority.MEDIUM == 0  # Django's default priority is Stint's MEDIUM


def test_the_worker_sends_djangos_started_and_finished_signals_and_a_raising_receiver_changes_nothing() -> None:
    seen: list[tuple[str, str, str, object]] = []

    def started(sender, task_result, **kwargs) -> None:
        seen.append(("started", task_result.id, task_result.status, task_result.task.module_path))

    def finished(sender, task_result, **kwargs) -> None:
        detail = task_result.return_value if task_result.status == TaskResultStatus.SUCCESSFUL else None
        if task_result.status == TaskResultStatus.FAILED:
            detail = task_result.errors[-1].exception_class_path
        seen.append(("finished", task_result.id, task_result.status, detail))

    def hostile(sender, task_result, **kwargs) -> None:
        raise RuntimeError("a receiver that raises")

    receivers = [(task_started, started), (task_finished, finished), (task_started, hostile), (task_finished, hostile)]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        ok = t.add.enqueue(2, 3)
        assert run_next().outcome == Outcome.SUCCEEDED
        failing = t.fails.enqueue()
        assert run_next().outcome == Outcome.RETRYABLE
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)

    assert seen == [
        ("started", ok.id, TaskResultStatus.RUNNING, t.add.module_path),
        ("finished", ok.id, TaskResultStatus.SUCCESSFUL, 5),
        ("started", failing.id, TaskResultStatus.RUNNING, t.fails.module_path),
        ("finished", failing.id, TaskResultStatus.FAILED, "builtins.ValueError"),
    ]


def test_a_task_exception_whose_text_or_traceback_cannot_be_read_is_still_the_attempts_error_and_signalled() -> None:
    # Building the FAILED result for task_finished read the exception's text and formatted its
    # traceback unguarded: what that raised (SystemExit, RuntimeError) replaced the task's own
    # exception as the attempt's error, and task_finished was never sent.
    signalled: list[str] = []

    def finished(sender, task_result, **kwargs) -> None:
        signalled.append(task_result.errors[-1].exception_class_path)

    exits = t.exits_unreadably.enqueue()
    unformattable = t.raises_unformattable.enqueue()
    task_finished.connect(finished)
    try:
        reports = {str(j.id): run(j) for j in claim_all()}
    finally:
        task_finished.disconnect(finished)

    exited = f"TaskExited: {t.UnreadableExit.__module__}.UnreadableExit: (its message could not be read: SystemExit)"
    assert (reports[exits.id].outcome, reports[exits.id].error) == (Outcome.RETRYABLE, exited)
    assert (reports[unformattable.id].outcome, reports[unformattable.id].error) == (
        Outcome.RETRYABLE,
        "UnformattableError: the message",
    )
    paths = [f"{t.UnreadableExit.__module__}.UnreadableExit", f"{t.UnformattableError.__module__}.UnformattableError"]
    assert sorted(signalled) == sorted(paths)
    assert t.exits_unreadably.get_result(exits.id).errors[0].exception_class is t.UnreadableExit


def test_the_failed_result_a_receiver_gets_and_its_log_line_hold_the_traceback_cut_as_the_attempt_stores_it(
    caplog,
) -> None:
    # A 20 MB message went whole into the TaskError handed to every task_finished receiver, and
    # into the traceback of Django's log line of the FAILED result, at every attempt.
    tracebacks: list[str] = []

    def finished(sender, task_result, **kwargs) -> None:
        tracebacks.append(task_result.errors[-1].traceback)

    huge = t.raises_huge.enqueue(20)
    task_finished.connect(finished)
    try:
        with caplog.at_level(logging.INFO, logger=TASKS_PACKAGE):
            report = run_next()
    finally:
        task_finished.disconnect(finished)

    assert len(caplog.text) < 2 * MAX_TRACEBACK_CHARS

    assert report.outcome == Outcome.RETRYABLE
    (signalled,) = tracebacks
    assert len(signalled) <= MAX_TRACEBACK_CHARS
    stored = t.raises_huge.get_result(huge.id).errors[0].traceback
    assert stored == report.traceback
    # Formatted while the exception was still on its way up: the same message line, fewer frames.
    assert signalled.splitlines()[-1] == stored.splitlines()[-1]
    assert stored.splitlines()[-1].startswith("ValueError: xxx") and stored.endswith(" characters cut]\n")


def test_a_module_name_with_a_trailing_newline_is_refused_in_the_options():
    # "$" matches before a final newline: "stint_tasks.tasks\n" passed the check, to fail at import.
    from stint_tasks.options import validate

    assert validate({"modules": ["tests.stint_tasks.tasks"]}) == []
    assert validate({"modules": ["tests.stint_tasks.tasks\n"]}) == [
        "OPTIONS['modules'] must be a list of dotted module names."
    ]
