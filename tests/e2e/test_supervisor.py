"""The ``run_workers`` supervisor against hostile handlers, as real OS processes.

The handlers come from the test-only app ``tests.support.hostile``, plugged into the worker processes
with ``STINT_EXTRA_APPS`` the way a user plugs in their own app; importing its ``jobs`` module
here registers the same types in this process, so that ``enqueue`` accepts them.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time

import pytest
from django.db import connection

import tests.support.hostile.jobs  # noqa: F401 - registers the HOSTILE_* job types in this process too
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.maintenance.promoter import DuePromoter
from scheduler.maintenance.rescuer import UNRUN_ERROR
from scheduler.models import Attempt, Job, WorkerNode
from scheduler.states import AttemptStatus, EventType, JobStatus
from tests.support.hostile.jobs import CRASH_TABLE
from tests.support.jobs import attempts, events, status
from tests.support.metrics import scrape, scrape_text, value
from tests.support.net import free_port
from tests.support.processes import (
    READY_WAIT,
    Processes,
    gone,
    live_workers,
    pool_children,
    process_group,
    status_is,
    wait_until,
    worker_of,
    worker_pid,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

POISON_WAIT = 90.0  # seconds for a poison job to use up its budget: four process deaths, two cores shared
TERMINAL = (JobStatus.SUCCESS, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED)


@pytest.fixture
def hostile(procs: Processes) -> Processes:
    """``procs`` whose worker processes also load the ``tests.support.hostile`` handlers."""
    procs.env["STINT_EXTRA_APPS"] = "tests.support.hostile"
    return procs


def promote() -> None:
    DuePromoter().run_once()


def terminal(ids: list) -> bool:
    return not Job.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists()


# -- a handler cannot take its slot ----------------------------------------------------------


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_system_exit_and_keyboard_interrupt_are_outcomes_and_the_slot_keeps_serving(
    hostile: Processes, pool: str
) -> None:
    worker = hostile.worker(concurrency=1, pool=pool)
    process, node = worker_pid(worker), worker_of(worker)
    children = pool_children(process)

    exits = enqueue("HOSTILE_SYS_EXIT", max_retries=1)
    wait_until(status_is(exits, JobStatus.DEAD), each=promote, what="the sys.exit() job was dead-lettered")
    interrupts = enqueue("HOSTILE_KEYBOARD_INTERRUPT", max_retries=1)
    wait_until(status_is(interrupts, JobStatus.DEAD), each=promote, what="the KeyboardInterrupt job was dead-lettered")
    after = enqueue("DEMO_TASK", {"result": "still serving"})
    wait_until(status_is(after, JobStatus.SUCCESS), what="the next job ran in the same one slot")

    for job, error in ((exits, "SystemExit: 3"), (interrupts, "KeyboardInterrupt")):
        rows = list(Attempt.objects.filter(job_id=job.id).values_list("status", "error", "worker"))
        assert rows == [(AttemptStatus.FAILED, error, node)] * 2
        assert error.split(":")[0] in Attempt.objects.filter(job_id=job.id).first().traceback
    assert Attempt.objects.get(job_id=after.id).worker == node
    # Neither the worker process nor its pool child was replaced: the exceptions never left the handler.
    assert worker_pid(worker) == process
    assert pool_children(process) == children
    assert WorkerNode.objects.filter(supervisor_pid=worker.pid).count() == 1


def test_a_thread_worker_whose_every_slot_is_held_by_a_hung_handler_is_replaced(hostile: Processes) -> None:
    # A thread cannot be killed: each handler hung past its timeout keeps its thread's slot
    # (DESIGN.md). Once every slot was held so, the worker process claimed nothing, for ever.
    worker = hostile.worker(concurrency=2)
    process, node = worker_pid(worker), worker_of(worker)
    hung = [enqueue("HOSTILE_HANG", timeout_seconds=1, max_retries=1) for _ in range(2)]

    wait_until(lambda: gone(process), what=f"the wedged worker process {process} exited")
    after = enqueue("DEMO_TASK", {"result": "served"})
    wait_until(status_is(after, JobStatus.SUCCESS), what="a new worker process ran the next job")

    assert Attempt.objects.get(job_id=after.id).worker != node
    for job in hung:  # timed out once each, and left for their retry (no promoter runs here)
        assert status(job) == JobStatus.RETRYING
        assert list(Attempt.objects.filter(job_id=job.id).values_list("status", "error")) == [
            (AttemptStatus.TIMED_OUT, "timed out after 1 s")
        ]
    assert WorkerNode.objects.get(id=node).stopped_at is not None
    assert "every one of its 2 slots is held by a handler past its timeout" in worker.output()


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_thread_or_exit_hook_a_handler_leaves_behind_never_holds_up_a_graceful_stop(
    hostile: Processes, pool: str
) -> None:
    # The interpreter's exit joins every non-daemon thread and runs every atexit hook: a worker
    # process (or pool child) that had "stopped" stayed alive until its supervisor killed it, its
    # grace period and STOP_MARGIN_SECONDS later, and logged it as a process that had to be killed.
    worker = hostile.worker(concurrency=1, pool=pool)
    job = enqueue("HOSTILE_LINGER")
    wait_until(status_is(job, JobStatus.SUCCESS), what="the job left its thread and hook behind")

    worker.send(signal.SIGTERM)

    assert worker.wait() == 0
    log = worker.output()
    assert "did not stop in time" not in log
    assert "did not exit when asked" not in log  # a pool child
    assert "was killed" not in log


def test_a_handler_that_closes_its_processs_stdout_and_stderr_takes_nothing_else_down(hostile: Processes) -> None:
    # The log handler then failed on the closed stream, and logging's error report, written to the
    # closed sys.stderr too, raised out of the worker's next log call: the worker process died
    # (exit code 1) and the jobs beside it lost an attempt.
    worker = hostile.worker(concurrency=2)
    process = worker_pid(worker)
    closer = enqueue("HOSTILE_CLOSE_STDIO")
    wait_until(status_is(closer, JobStatus.SUCCESS), what="the job closed its process's streams")

    after = [enqueue("DEMO_TASK", {"result": n}) for n in range(3)]
    wait_until(lambda: terminal([j.id for j in after]), each=promote, what="the next jobs finished")

    assert [(status(j), attempts(j)) for j in after] == [(JobStatus.SUCCESS, [(1, AttemptStatus.SUCCEEDED)])] * 3
    assert worker_pid(worker) == process


def test_a_worker_process_stopped_for_a_whole_lease_is_killed_and_replaced_and_its_job_isolated(
    hostile: Processes,
) -> None:
    worker = hostile.worker(concurrency=2)
    process = worker_pid(worker)
    stopper = enqueue("HOSTILE_SIGSTOP", max_retries=1)
    wait_until(status_is(stopper, JobStatus.RUNNING), what="the job started")

    wait_until(lambda: gone(process), what=f"the stopped worker process {process} was killed")
    wait_until(status_is(stopper, JobStatus.SUCCESS), each=promote, what="the job ran again, in isolation")

    error = "worker process stopped (SIGSTOP) for a whole lease; killed by its supervisor"
    assert list(Attempt.objects.filter(job_id=stopper.id).values_list("status", "error")) == [
        (AttemptStatus.LOST, error),
        (AttemptStatus.SUCCEEDED, ""),
    ]

    def replaced() -> bool:
        live = WorkerNode.objects.filter(supervisor_pid=worker.pid, isolation=False, stopped_at__isnull=True)
        pids = set(live.values_list("pid", flat=True))
        return bool(pids) and process not in pids

    wait_until(replaced, what="a new process took the slot")
    after = enqueue("DEMO_TASK", {"result": "served"})
    wait_until(status_is(after, JobStatus.SUCCESS), what="the new process runs jobs")
    assert "has been stopped (SIGSTOP)" in worker.output()


def test_a_child_result_is_read_as_json_so_one_built_to_run_code_when_unpickled_runs_nothing(
    hostile: Processes,
) -> None:
    worker = hostile.worker(concurrency=1, pool="processes")
    process, node = worker_pid(worker), worker_of(worker)

    job = enqueue("HOSTILE_PICKLE_RESULT", max_retries=1)
    wait_until(status_is(job, JobStatus.SUCCESS), each=promote, what="the job succeeded")

    assert Job.objects.get(id=job.id).stored_result.result == "hello"
    assert attempts(job) == [(1, AttemptStatus.SUCCEEDED)]
    assert worker_pid(worker) == process  # unpickled in the worker, it would have ended it with exit code 7
    assert WorkerNode.objects.filter(supervisor_pid=worker.pid).values_list("id", flat=True).get() == node


def test_a_pool_child_that_forges_reports_for_other_jobs_is_killed_and_no_forged_outcome_is_recorded(
    hostile: Processes,
) -> None:
    worker = hostile.worker(concurrency=1, pool="processes")
    process = worker_pid(worker)
    forger = enqueue("HOSTILE_FORGED_REPORTS", {"then_sleep": 1}, max_retries=1)
    innocent = enqueue("DEMO_TASK", {"result": "mine"})

    wait_until(lambda: terminal([forger.id, innocent.id]), each=promote, what="both jobs finished")

    done = Job.objects.get(id=innocent.id)
    assert (done.status, done.stored_result.result["echo"]) == (JobStatus.SUCCESS, "mine")
    assert not Job.objects.filter(result__forged=True).exists()
    assert not Attempt.objects.filter(job_id=innocent.id).exclude(status=AttemptStatus.SUCCEEDED).exists()
    assert worker_pid(worker) == process  # only the pool child was killed
    assert "sent a report for a job it is not running; killing it" in worker.output()


# -- a handler that kills its process ----------------------------------------------------------


def crash_times(job: Job) -> dict[int, dt.datetime]:
    """Attempt number -> when (database clock) HOSTILE_CRASH killed its process in that attempt."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT attempt, at FROM {CRASH_TABLE} WHERE job_id = %s", [job.id])  # noqa: S608
        return dict(cursor.fetchall())


@pytest.mark.parametrize(
    ("how", "death"), [("exit", "exit code 1"), ("exit0", "exit code 0"), ("segv", "signal 11: SIGSEGV")]
)
def test_a_poison_job_is_dead_lettered_and_the_jobs_that_shared_its_process_succeed(
    hostile: Processes, how: str, death: str
) -> None:
    port = free_port()
    worker = hostile.worker(concurrency=4, extra=[f"--metrics-port={port}"])
    first_pid, first_node = worker_pid(worker), worker_of(worker)
    # One transaction: the worker claims all four at once. The poison job waits for the other
    # three to be RUNNING, then kills the process they share. Default budgets (max_retries 3).
    *neighbours, poison_id = enqueue_many(
        [
            *({"type": "DEMO_TASK", "payload": {"sleep_seconds": 1.5, "result": n}} for n in range(3)),
            {"type": "HOSTILE_CRASH", "payload": {"how": how, "neighbours": 3}},
        ]
    )
    poison = Job.objects.get(id=poison_id)

    wait_until(
        lambda: status(poison) == JobStatus.DEAD and terminal(neighbours),
        each=promote,
        timeout=POISON_WAIT,
        what="the poison job dead and its neighbours finished",
    )

    lost = f"worker process died ({death}) while running this job"
    poison_attempts = list(Attempt.objects.filter(job_id=poison.id).values_list("status", "error", "worker"))
    assert [(s, e) for s, e, _ in poison_attempts] == [(AttemptStatus.LOST, lost)] * 4  # 1 + max_retries
    isolation_nodes = set(
        WorkerNode.objects.filter(supervisor_pid=worker.pid, isolation=True).values_list("id", flat=True)
    )
    assert poison_attempts[0][2] == first_node
    assert {w for _, _, w in poison_attempts[1:]} <= isolation_nodes  # each run alone, in isolation
    dead = Job.objects.get(id=poison.id)
    assert (dead.last_error, dead.isolated) == (lost, True)  # recovered, it would run in isolation again
    assert events(poison)[-1] == EventType.JOB_DEAD

    for job_id in neighbours:
        job = Job.objects.get(id=job_id)
        rows = list(Attempt.objects.filter(job_id=job_id).values_list("status", "error", "worker"))
        assert job.status == JobStatus.SUCCESS
        assert [(s, e) for s, e, _ in rows] == [(AttemptStatus.LOST, lost), (AttemptStatus.SUCCEEDED, "")]
        assert rows[1][2] in isolation_nodes
        assert job.isolated is False  # it ran without killing its process: it may share one again
        assert Job.objects.get(id=job_id).stored_result.result["attempt"] == 2

    # Rescue followed the first crash at once (the supervisor, not a lease expiry 3 s later).
    first_loss = Attempt.objects.get(job_id=poison.id, attempt_number=1).finished_at
    assert dt.timedelta(0) <= first_loss - crash_times(poison)[1] < dt.timedelta(seconds=2)
    # The supervisor replaced the dead worker process and is still running.
    assert worker.popen.poll() is None
    assert gone(first_pid)
    assert WorkerNode.objects.get(id=first_node).stopped_at is not None
    wait_until(lambda: live_workers([worker.pid]).exclude(pid=first_pid).exists(), what="a replacement registered")
    assert f"worker process {first_pid} ({first_node}) died ({death})" in worker.output()
    # The supervisor serves its processes' metrics and its own, summed, each family once.
    help_lines = [line for line in scrape_text(port).splitlines() if line.startswith("# HELP ")]
    assert len(help_lines) == len(set(help_lines))
    samples = scrape(port)
    assert value(samples, "worker_processes_died_total") == 1
    assert value(samples, "leases_rescued_total") == 4  # the four jobs of the dead process, at once
    assert value(samples, "jobs_dead_total", type="HOSTILE_CRASH", queue="default") == 1
    assert value(samples, "jobs_completed_total", type="DEMO_TASK", queue="default") == 3


def test_the_jobs_a_dead_process_had_claimed_ahead_go_back_unrun_with_no_attempt_spent(hostile: Processes) -> None:
    worker = hostile.worker(concurrency=2)
    first_node = worker_of(worker)
    # Short runs first: with a backlog and short recent runs the process claims jobs ahead of its
    # free slots (runner.CLAIM_AHEAD_MAX_RUN). Then the poison job waits until three others are
    # RUNNING: the LOW job its second slot runs (1 s) and the LOW jobs claimed ahead behind it,
    # which no slot has begun when it kills the process.
    ids = enqueue_many(
        [
            *({"type": "DEMO_TASK", "priority": "HIGH"} for _ in range(10)),
            {"type": "HOSTILE_CRASH", "payload": {"how": "exit", "neighbours": 3}, "max_retries": 1},
            *({"type": "DEMO_TASK", "priority": "LOW", "payload": {"sleep_seconds": 1.0}} for _ in range(4)),
        ]
    )
    poison, behind = ids[10], ids[11:]

    wait_until(lambda: terminal(ids), each=promote, timeout=POISON_WAIT, what="every job finished")

    assert status(Job.objects.get(id=poison)) == JobStatus.DEAD
    first_attempts = {a.job_id: a for a in Attempt.objects.filter(job_id__in=behind, attempt_number=1)}
    handed = [j for j in behind if first_attempts[j].error == UNRUN_ERROR]
    assert handed, {j: first_attempts[j].error for j in behind}  # at least one waited unbegun at the crash
    for job_id in handed:
        job = Job.objects.get(id=job_id)
        rows = list(Attempt.objects.filter(job_id=job_id).values_list("status", "error", "worker"))
        assert [(s, e) for s, e, _ in rows] == [(AttemptStatus.LOST, UNRUN_ERROR), (AttemptStatus.SUCCEEDED, "")]
        assert rows[0][2] == first_node  # claimed by the process that died
        assert (job.status, job.isolated) == (JobStatus.SUCCESS, False)  # never sent to the isolation slot
        assert job.attempts_left == job.max_retries  # only its successful run counted
    assert all(status(Job.objects.get(id=j)) == JobStatus.SUCCESS for j in behind)


def test_a_worker_process_that_keeps_dying_at_start_up_is_restarted_with_backoff(procs: Processes) -> None:
    # A database that does not exist: every worker process dies registering itself.
    procs.env["DATABASE_URL"] = procs.env["DATABASE_URL"].rsplit("/", 1)[0] + "/stint_no_such_database"
    worker = procs.worker(concurrency=1, ready=False)

    wait_until(lambda: "(2 in a row); starting another in 2 s" in worker.output(), what="the second restart")

    assert "(1 in a row); starting another in 1 s" in worker.output()
    assert worker.popen.poll() is None  # the supervisor itself stays up
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_sigterm_to_its_group_while_its_worker_processes_start_up_is_a_clean_stop(procs: Processes) -> None:
    # honcho stops a process by signalling its group: a make run stopped a second after start (its web
    # port taken) reached worker processes that had not yet left the supervisor's group, and the
    # supervisor logged "worker process ... died (signal 15: SIGTERM)" at ERROR for each.
    worker = procs.worker(processes=2, ready=False)

    def starting() -> bool:  # a worker process still in the supervisor's group: not yet set up
        if worker.popen.poll() is not None:
            raise AssertionError(f"run_workers exited with {worker.popen.returncode}:\n{worker.output()}")
        return any(process_group(child) == worker.pid for child in pool_children(worker.pid))

    deadline = time.monotonic() + READY_WAIT
    while not starting():  # no sleep: the window lasts a few hundred milliseconds
        assert time.monotonic() < deadline, "no worker process was seen starting up"
    os.killpg(worker.pid, signal.SIGTERM)

    assert worker.wait() == 0
    assert "ERROR" not in worker.output() and "died" not in worker.output()


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_handler_that_spoils_its_threads_connection_costs_the_next_job_on_that_thread_nothing(
    hostile: Processes, pool: str
) -> None:
    # One slot: each next job gets the spoiled connection. "atomic" (a block entered, never left)
    # failed every later job of its slot with "the connection is closed".
    worker = hostile.worker(concurrency=1, pool=pool)
    process = worker_pid(worker)
    hows = ["close", "raw_close", "no_autocommit", "no_autocommit_idle", "statement_timeout", "atomic"]

    for how in hows:
        spoiler = enqueue("HOSTILE_BREAK_CONNECTION", {"how": how})
        after = enqueue("REPORT", {})  # queries through the same thread's connection
        wait_until(lambda: terminal([spoiler.id, after.id]), what=f"the job after {how!r} finished")  # noqa: B023

        for job in (spoiler, after):
            assert attempts(job) == [(1, AttemptStatus.SUCCEEDED)], how
    assert worker_pid(worker) == process
    log = worker.output()
    assert "left its database connection closed or broken; it was replaced" in log  # raw_close
    assert "(UNKNOWN)" not in log  # a closed connection is not called an open transaction
    assert "left an atomic block open; it was rolled back and its connection closed" in log


# -- a handler that signals its process group or forks ------------------------------------------


def pid_of(worker_id: str) -> int:
    return WorkerNode.objects.values_list("pid", flat=True).get(id=worker_id)


@pytest.mark.parametrize(
    ("pool", "how", "signame"),
    [("threads", "killpg", "SIGKILL"), ("processes", "killpg", "SIGKILL"), ("threads", "kill0", "SIGTERM")],
)
def test_a_handler_that_signals_its_process_group_reaches_only_its_own_process(
    hostile: Processes, pool: str, how: str, signame: str
) -> None:
    # Every process of run_workers was in the supervisor's process group: a handler's SIGKILL to it
    # ended the supervisor and every worker process (all their jobs lost an attempt, run_workers
    # was gone), and its SIGTERM stopped run_workers as a process manager's would.
    worker = hostile.worker(concurrency=1, pool=pool, processes=2)
    before = set(live_workers([worker.pid]).values_list("pid", flat=True))

    job = enqueue("HOSTILE_SIGNAL_GROUP", {"how": how, "signal": signame}, max_retries=1)

    def promote_while_running() -> None:
        assert worker.popen.poll() is None, f"run_workers exited ({worker.popen.returncode})"
        promote()

    wait_until(lambda: terminal([job.id]), each=promote_while_running, timeout=POISON_WAIT, what="the job finished")

    assert worker.popen.poll() is None
    rows = list(Attempt.objects.filter(job_id=job.id).values_list("status", "error", "worker"))
    ran_in = pid_of(rows[0][2])
    if signame == "SIGTERM":  # worker processes ignore it; it reached no other process
        assert [(s, e) for s, e, _ in rows] == [(AttemptStatus.SUCCEEDED, "")]
        assert set(live_workers([worker.pid]).values_list("pid", flat=True)) == before
        assert "shutting down gracefully" not in worker.output()
        return
    lost = "worker process died (signal 9: SIGKILL) while running this job"
    assert [(s, e) for s, e, _ in rows] == [(AttemptStatus.LOST, lost), (AttemptStatus.SUCCEEDED, "")]
    assert Job.objects.get(id=job.id).stored_result.result == "ran"
    if pool == "processes":  # its pool child alone died: both worker processes run on
        assert set(live_workers([worker.pid]).values_list("pid", flat=True)) == before
    else:  # its worker process alone died, reaped as a crash; the other one runs on
        assert gone(ran_in)
        (other,) = before - {ran_in}
        assert not gone(other)
        assert live_workers([worker.pid]).filter(pid=other).exists()
        assert f"worker process {ran_in} ({rows[0][2]}) died (signal 9: SIGKILL)" in worker.output()


def test_what_a_crashed_handler_forked_dies_with_its_process(hostile: Processes, tmp_path) -> None:
    # The fork slept on (60 s here) after its worker process, then its pool child, had died and the
    # job had been retried: in production it would do its side effects beside the retry.
    worker = hostile.worker(concurrency=1)
    pid_file = tmp_path / "fork"
    job = enqueue("HOSTILE_FORK_AND_EXIT", {"sleep": 60, "pid_file": str(pid_file)}, max_retries=1)

    wait_until(status_is(job, JobStatus.DEAD), each=promote, timeout=POISON_WAIT, what="the job was dead-lettered")

    # Attempt 1 forked in the thread worker process (killed with it by the supervisor), attempt 2
    # in a pool child of the isolation process (killed with it by its pool).
    forks = [int(pid_file.with_name(f"fork.{attempt}").read_text()) for attempt in (1, 2)]
    for fork in forks:
        wait_until(lambda: gone(fork), timeout=5, what=f"the fork {fork} was killed")  # noqa: B023
    assert worker.popen.poll() is None
    log = worker.output()
    assert "left processes in its process group (forked by its handlers); killed them" in log
    assert "left processes in its process group; killed them" in log  # the pool child's


# -- outcomes PostgreSQL refuses ---------------------------------------------------------------


def test_outcomes_postgresql_refuses_never_block_the_others(hostile: Processes) -> None:
    hostile.worker(concurrency=4)
    ids = enqueue_many(
        [
            {"type": "HOSTILE_NUL_ERROR", "max_retries": 1},
            {"type": "HOSTILE_NUL_RESULT"},
            *({"type": "DEMO_TASK", "payload": {"result": n}} for n in range(6)),
        ]
    )

    wait_until(lambda: terminal(ids), each=promote, what="every job finished")

    nul_error, nul_result, *ordinary = (Job.objects.get(id=i) for i in ids)
    assert all(job.status == JobStatus.SUCCESS for job in ordinary)
    assert nul_error.status == JobStatus.DEAD
    assert nul_error.last_error == "ValueError: badbyte ? here"
    failed = Attempt.objects.filter(job_id=nul_error.id)
    assert [a.error for a in failed] == ["ValueError: badbyte ? here"] * 2
    assert all("\x00" not in a.traceback and "ValueError" in a.traceback for a in failed)
    assert nul_result.status == JobStatus.FAILED
    assert nul_result.last_error == "result holds U+0000, which PostgreSQL cannot store"  # found before the write
    assert attempts(nul_result) == [(1, AttemptStatus.FAILED)]
    assert Job.objects.get(id=nul_result.id).stored_result.result is None


# -- a handler that holds its process's GIL ------------------------------------------------------


def test_a_handler_holding_the_gil_past_the_lease_costs_its_neighbours_no_attempt(hostile: Processes) -> None:
    # No other thread of the process runs while a C call holds the GIL: not the heartbeat. The
    # leases of all its jobs expired under them, the lease rescuer took them (LOST), and the
    # neighbours ran again while their first attempts were still to go on.
    worker = hostile.worker(concurrency=3)
    process = worker_pid(worker)
    hostile.scheduler()  # its lease rescuer would take any lease that expires
    ids = enqueue_many(
        [
            {"type": "HOSTILE_HOLD_GIL", "payload": {"seconds": 8}},  # the lease is 3 s (FAST)
            *({"type": "DEMO_TASK", "payload": {"sleep_seconds": 1, "result": n}} for n in range(2)),
        ]
    )

    wait_until(lambda: terminal(ids), timeout=40, what="every job finished")

    for job_id in ids:
        assert attempts(Job.objects.get(id=job_id)) == [(1, AttemptStatus.SUCCEEDED)]
    assert worker_pid(worker) == process
    assert "(a handler holds its GIL); renewing its 3 leases" in worker.output()


def test_a_handler_holding_the_gil_past_its_timeout_has_its_process_killed_and_its_job_isolated(
    hostile: Processes,
) -> None:
    worker = hostile.worker(concurrency=2)
    process = worker_pid(worker)
    holder, neighbour = enqueue_many(
        [
            {"type": "HOSTILE_HOLD_GIL", "payload": {"seconds": 3600}, "timeout_seconds": 1, "max_retries": 1},
            {"type": "DEMO_TASK", "payload": {"sleep_seconds": 1}},
        ]
    )

    wait_until(lambda: gone(process), what=f"the starved worker process {process} was killed")
    wait_until(lambda: terminal([holder, neighbour]), each=promote, timeout=60, what="both jobs finished")

    lost = "worker process held its GIL (no other thread ran) past a job's timeout; killed by its supervisor"
    rows = list(Attempt.objects.filter(job_id=holder).values_list("status", "error"))
    assert rows == [(AttemptStatus.LOST, lost), (AttemptStatus.SUCCEEDED, "")]
    # The neighbour's slot thread may not have begun it before the GIL was taken: then it went
    # back unrun (the waiting board), else it was rescued with the holder.
    first, *rest = Attempt.objects.filter(job_id=neighbour).values_list("status", "error")
    assert first in {(AttemptStatus.LOST, lost), (AttemptStatus.LOST, UNRUN_ERROR)}
    assert rest == [(AttemptStatus.SUCCEEDED, "")]
    assert "past a job's timeout; killing it" in worker.output()
