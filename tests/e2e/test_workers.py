"""End-to-end tests of ``manage.py run_workers`` and ``run_scheduler`` as real OS processes.

The processes and the polling come from ``tests/support/processes.py`` (the ``procs`` fixture,
``wait_until``): short leases, heartbeats and polls; waits on database state, never fixed sleeps.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from core.process_sessions import signal_session
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.job_actions import job_cancel
from scheduler.maintenance.promoter import DuePromoter
from scheduler.models import Attempt, Job, OutboxEvent, Queue, WorkerNode
from scheduler.states import AttemptStatus, EventType, JobStatus, Priority
from tests.support.jobs import attempts, events, status
from tests.support.processes import (
    ROOT,
    WAIT,
    Processes,
    dump_stacks,
    gone,
    live_workers,
    pool_children,
    process_group,
    status_is,
    wait_until,
    worker_of,
    worker_pid,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_backoff")]


# -- racing, crashing ------------------------------------------------------------------------


def test_ten_workers_racing_run_each_job_exactly_once(procs: Processes) -> None:
    workers = [procs.worker(concurrency=2, ready=False) for _ in range(10)]
    procs.wait_ready(*workers)

    job = enqueue("DEMO_TASK", {"result": "once"})
    wait_until(status_is(job, JobStatus.SUCCESS), what="the one job succeeded")

    assert attempts(job) == [(1, AttemptStatus.SUCCEEDED)]
    assert events(job).count(EventType.JOB_STARTED) == 1
    assert Job.objects.get(id=job.id).stored_result.result == {"echo": "once", "attempt": 1}

    ids = enqueue_many([{"type": "DEMO_TASK", "payload": {"result": i}} for i in range(200)])
    wait_until(
        lambda: Job.objects.filter(id__in=ids, status=JobStatus.SUCCESS).count() == 200, what="200 jobs succeeded"
    )
    assert Attempt.objects.filter(job_id__in=ids).count() == 200
    assert set(Attempt.objects.filter(job_id__in=ids).values_list("attempt_number", flat=True)) == {1}
    assert OutboxEvent.objects.filter(job_id__in=ids, event_type=EventType.JOB_STARTED).count() == 200
    assert all(w.popen.poll() is None for w in workers)


def test_a_job_of_a_killed_worker_is_rescued_and_completes_on_another(procs: Processes) -> None:
    first = procs.worker()
    first_id = worker_of(first)
    # Longer than the 3 s lease: the second run survives only because its worker heartbeats.
    job = enqueue("DEMO_TASK", {"sleep_seconds": 4, "result": "survived"}, max_retries=2)
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")

    signal_session(first.pid, signal.SIGKILL)  # supervisor and worker process at once, as when a host dies
    assert first.wait() == -signal.SIGKILL
    second = procs.worker()
    scheduler = procs.scheduler()  # rescues once the lease expires, then promotes after the backoff

    wait_until(status_is(job, JobStatus.SUCCESS), what="the rescued job succeeded")

    rows = list(Attempt.objects.filter(job_id=job.id).values_list("attempt_number", "status", "worker"))
    assert rows == [(1, AttemptStatus.LOST, first_id), (2, AttemptStatus.SUCCEEDED, worker_of(second))]
    assert Job.objects.get(id=job.id).stored_result.result == {"echo": "survived", "attempt": 2}
    assert events(job).count(EventType.JOB_LEASE_EXPIRED) == 1

    scheduler.send(signal.SIGTERM)
    assert scheduler.wait() == 0


def test_the_processes_of_a_killed_supervisor_hand_back_and_exit(procs: Processes) -> None:
    worker = procs.worker(concurrency=1, pool="processes", grace=0.5)
    process = worker_pid(worker)
    (child,) = pool_children(process)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 60}, max_retries=1)
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")

    worker.send(signal.SIGKILL)  # the supervisor only, not the processes it started

    assert worker.wait() == -signal.SIGKILL
    # Its worker process sees the supervisor's pipe close, drains (0.5 s grace), hands the job
    # back and exits; its pool child goes with it rather than run the handler on, beside the
    # attempt that comes next.
    wait_until(lambda: gone(process), what=f"orphaned worker process {process} exited")
    wait_until(lambda: gone(child), what=f"orphaned pool child {child} exited")
    assert status(job) == JobStatus.RETRYING
    assert attempts(job) == [(1, AttemptStatus.LOST)]
    assert Job.objects.get(id=job.id).last_error == "worker shut down"


# -- timeouts --------------------------------------------------------------------------------


def test_thread_pool_times_out_at_once_and_discards_the_late_result(procs: Processes) -> None:
    worker = procs.worker(concurrency=1)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 60}, timeout_seconds=1, max_retries=1)

    wait_until(status_is(job, JobStatus.RETRYING), what="the job timed out")

    assert attempts(job) == [(1, AttemptStatus.TIMED_OUT)]
    assert Job.objects.get(id=job.id).last_error == "timed out after 1 s"
    # The handler then stops (it sees its cancel flag) and frees the only slot; its own late
    # report is dropped, so the attempt stays TIMED_OUT and the job is not cancelled.
    after = enqueue("DEMO_TASK", {"result": "next"})
    wait_until(status_is(after, JobStatus.SUCCESS), what="the next job ran in the freed slot")
    assert attempts(job) == [(1, AttemptStatus.TIMED_OUT)]
    assert status(job) == JobStatus.RETRYING
    assert Job.objects.get(id=job.id).stored_result is None
    assert "overran its 1 s timeout" in worker.output()


def test_process_pool_kills_a_timed_out_child(procs: Processes) -> None:
    worker = procs.worker(concurrency=1, pool="processes")
    process = worker_pid(worker)
    (child,) = pool_children(process)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 60}, timeout_seconds=1, max_retries=1)

    wait_until(status_is(job, JobStatus.RETRYING), what="the job timed out")

    assert attempts(job) == [(1, AttemptStatus.TIMED_OUT)]
    wait_until(lambda: gone(child), what=f"child {child} was killed")
    # A fresh child takes the slot: the next job does not wait for the 60 s sleep.
    after = enqueue("DEMO_TASK", {"result": "next"})
    wait_until(status_is(after, JobStatus.SUCCESS), what="the next job ran on a new child")
    assert child not in pool_children(process)


# -- cancellation ----------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_cancelling_a_running_job_stops_it(procs: Processes, pool: str) -> None:
    worker = procs.worker(concurrency=1, pool=pool)
    children = pool_children(worker_pid(worker))
    job = enqueue("DEMO_TASK", {"sleep_seconds": 60}, max_retries=3)
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")

    assert job_cancel(job_id=job.id).status == JobStatus.RUNNING

    wait_until(status_is(job, JobStatus.CANCELLED), what="the job was cancelled")
    assert attempts(job) == [(1, AttemptStatus.CANCELLED)]
    assert events(job)[-1] == EventType.JOB_CANCELLED
    assert Job.objects.get(id=job.id).finished_at is not None
    if pool == "processes":
        (child,) = children
        wait_until(lambda: gone(child), what=f"child {child} was killed")
    after = enqueue("DEMO_TASK", {"result": "next"})
    wait_until(status_is(after, JobStatus.SUCCESS), what="the slot was freed")


# -- graceful shutdown -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "pool,signum",
    [("threads", signal.SIGTERM), ("processes", signal.SIGTERM), ("processes", signal.SIGHUP)],
    ids=["threads", "processes", "processes-sighup"],
)
def test_sigterm_lets_a_running_job_finish_and_takes_no_more(procs: Processes, pool: str, signum: int) -> None:
    # SIGHUP (the terminal that started it hung up) is a stop like SIGTERM: it ended every process
    # at once, leaving the job RUNNING until its lease expired and spending an attempt.
    worker = procs.worker(concurrency=1, pool=pool, grace=20)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 1.5, "result": "finished"})
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")
    waiting = enqueue("DEMO_TASK", {})  # the only slot is busy

    # To every process, as systemd (KillMode=control-group) does: worker processes and pool
    # children get it too and must leave the drain to the supervisor.
    signal_session(worker.pid, signum)

    assert worker.wait() == 0
    assert status(job) == JobStatus.SUCCESS
    assert attempts(job) == [(1, AttemptStatus.SUCCEEDED)]
    assert (status(waiting), attempts(waiting)) == (JobStatus.QUEUED, [])
    node = WorkerNode.objects.get(supervisor_pid=worker.pid)
    assert node.stopped_at is not None
    assert node.jobs_done == 1  # the console's "jobs done": the one outcome it recorded


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_stop_signal_to_the_supervisor_alone_drains_every_worker_process_and_pool_child(
    procs: Processes, signum: int
) -> None:
    # Each worker process and pool child leads a process group of its own (a handler signalling its
    # group reaches its own process only), so a terminal's Ctrl-C reaches the supervisor alone: it
    # stops the others over their pipes.
    worker = procs.worker(concurrency=1, pool="processes", processes=2, grace=20)
    processes = list(live_workers([worker.pid]).values_list("pid", flat=True))
    children = {child for process in processes for child in pool_children(process)}
    assert len(children) == 2
    assert process_group(worker.pid) == worker.pid
    assert all(process_group(pid) == pid for pid in [*processes, *children])
    jobs = [enqueue("DEMO_TASK", {"sleep_seconds": 1.5, "result": n}) for n in range(2)]
    wait_until(lambda: all(status(j) == JobStatus.RUNNING for j in jobs), what="both jobs started")

    worker.send(signum)

    assert worker.wait() == 0
    assert [(status(j), attempts(j)) for j in jobs] == [(JobStatus.SUCCESS, [(1, AttemptStatus.SUCCEEDED)])] * 2
    wait_until(lambda: all(gone(pid) for pid in [*processes, *children]), timeout=5, what="every process exited")


def test_sigusr1_to_the_process_group_dumps_every_stack_and_stops_nothing(procs: Processes) -> None:
    worker = procs.worker(concurrency=1, pool="processes")
    job = enqueue("DEMO_TASK", {"sleep_seconds": 1.5, "result": "finished"})
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")
    process = worker_pid(worker)
    children = pool_children(process)

    # What an operator (or this suite's teardown) sends to each process of a run_workers that looks wedged.
    assert dump_stacks(worker.pid) == sorted([worker.pid, process, *children])

    wait_until(status_is(job, JobStatus.SUCCESS), what="the job ran on")
    log = worker.output()
    # faulthandler's lines: '  File "<path>", line <n> in <function>'
    assert 'workers/supervisor.py", line' in log  # the supervisor's threads
    assert 'workers/runner.py", line' in log and " in _claim_loop" in log  # the worker process's
    assert " in _child_main" in log  # the pool child's, running the handler
    assert worker.popen.poll() is None
    assert (worker_pid(worker), pool_children(process)) == (process, children)
    assert "died unexpectedly" not in log  # multiprocessing's resource tracker was spared


def test_sigterm_hands_back_a_job_longer_than_the_grace_period(procs: Processes) -> None:
    worker = procs.worker(concurrency=1, grace=0.5)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 2, "result": "later"}, max_retries=1)
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")

    worker.send(signal.SIGTERM)

    assert worker.wait() == 0
    handed = Job.objects.get(id=job.id)
    assert handed.status == JobStatus.RETRYING
    assert handed.attempts_left == 2  # a hand-back does not spend the budget
    assert attempts(job) == [(1, AttemptStatus.LOST)]
    retried = OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").last()
    assert (retried.event_type, retried.payload["reason"]) == (EventType.JOB_RETRIED, "handed_back")

    procs.worker(concurrency=1)
    wait_until(status_is(job, JobStatus.SUCCESS), each=DuePromoter().run_once, what="the handed-back job ran again")
    assert attempts(job) == [(1, AttemptStatus.LOST), (2, AttemptStatus.SUCCEEDED)]
    assert Job.objects.get(id=job.id).stored_result.result == {"echo": "later", "attempt": 2}


def test_a_second_sigterm_hands_back_at_once(procs: Processes) -> None:
    worker = procs.worker(concurrency=1, grace=60)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 60}, max_retries=1)
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")

    worker.send(signal.SIGTERM)
    wait_until(lambda: "SIGTERM received" in worker.output(), what="the first SIGTERM was handled")
    worker.send(signal.SIGTERM)

    assert worker.wait() == 0  # within WAIT, far inside the 60 s grace period
    handed = Job.objects.get(id=job.id)
    assert (handed.status, handed.attempts_left) == (JobStatus.RETRYING, 2)
    assert attempts(job) == [(1, AttemptStatus.LOST)]


# Holds the lock that stop() needs (an Event's, as Event.wait/clear do between two bytecodes of
# every run loop) while a SIGTERM arrives, twice; prints which stop() calls were made.
SIGNAL_PROBE = """
import logging, os, signal, threading
from core.stop_signals import install_stop_handlers

logging.basicConfig(level=logging.INFO, format="%(message)s")

stopped = threading.Event()
calls = []

def stop(*, force=False):
    calls.append(force)
    stopped.set()

install_stop_handlers(stop, name="probe")
for _ in range(2):
    with stopped._cond:
        os.kill(os.getpid(), signal.{signal})
        for _ in range(10000):
            pass
    stopped.wait(10)
    stopped.clear()
print("calls", calls, flush=True)
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])  # SIGHUP: the terminal that started it closed
def test_stop_signals_never_deadlock_the_main_thread(signame: str) -> None:
    probe = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_PROBE.replace("{signal}", signame)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = probe.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        probe.kill()  # deadlocked: SIGTERM would only be caught and deadlock again
        output, _ = probe.communicate()
        raise AssertionError(f"stop() ran inside the signal handler and deadlocked:\n{output}") from None
    assert probe.returncode == 0, output
    assert "calls [False, True]" in output  # the first stops gently, the second forces
    assert f"probe: {signame} received, shutting down gracefully" in output


# -- priorities and permanent errors ---------------------------------------------------------


def test_priorities_are_honoured_when_slots_are_scarce(procs: Processes) -> None:
    procs.worker(concurrency=1)
    blocker = enqueue("DEMO_TASK", {"sleep_seconds": 1})
    wait_until(status_is(blocker, JobStatus.RUNNING), what="the blocker started")

    # Enqueued lowest first, in one statement: arrival order is the reverse of priority order.
    ids = enqueue_many(
        [{"type": "DEMO_TASK", "priority": p} for p in ["LOW"] * 3 + ["MEDIUM"] * 3 + ["HIGH"] * 3],
    )
    wait_until(lambda: Job.objects.filter(id__in=ids, status=JobStatus.SUCCESS).count() == 9, what="all nine succeeded")

    ran = list(Attempt.objects.filter(job_id__in=ids).order_by("started_at").values_list("started_at", "job__priority"))
    assert [Priority(p).name for _, p in ran] == ["HIGH"] * 3 + ["MEDIUM"] * 3 + ["LOW"] * 3
    assert len({started for started, _ in ran}) == 9  # one claim per freed slot, never a batch beyond it


def test_a_permanent_error_ends_failed_without_retry(procs: Processes) -> None:
    procs.worker(concurrency=2)
    bad = enqueue("REPORT", {"since": "not-a-date"}, max_retries=3)
    good = enqueue("REPORT", {"since": "2020-01-01"})

    wait_until(status_is(bad, JobStatus.FAILED), what="the bad report failed")
    wait_until(status_is(good, JobStatus.SUCCESS), what="the good report succeeded")

    failed = Job.objects.get(id=bad.id)
    assert "since must be an ISO date" in failed.last_error
    assert attempts(bad) == [(1, AttemptStatus.FAILED)]
    assert "PermanentError" in Attempt.objects.get(job_id=bad.id).traceback
    assert events(bad)[-1] == EventType.JOB_FAILED
    assert Job.objects.get(id=good.id).stored_result.result["total"] == 2


def test_retries_then_dead_letters_woken_only_by_notify(procs: Processes) -> None:
    # Polling every 30 s: within WAIT only a NOTIFY (on enqueue, on promotion) wakes the worker.
    procs.worker(concurrency=2, extra=["--poll-seconds=30"])
    flaky = enqueue("DEMO_TASK", {"fail_times": 1, "result": "second time"}, max_retries=2)
    hopeless = enqueue("FAILING", {}, max_retries=2)

    promote = DuePromoter().run_once
    wait_until(status_is(flaky, JobStatus.SUCCESS), each=promote, what="the flaky job succeeded on a retry")
    wait_until(status_is(hopeless, JobStatus.DEAD), each=promote, what="the failing job was dead-lettered")

    assert attempts(flaky) == [(1, AttemptStatus.FAILED), (2, AttemptStatus.SUCCEEDED)]
    assert Job.objects.get(id=flaky.id).stored_result.result == {"echo": "second time", "attempt": 2}
    assert attempts(hopeless) == [(n, AttemptStatus.FAILED) for n in (1, 2, 3)]
    assert events(hopeless)[-1] == EventType.JOB_DEAD


def test_queues_nothing_uses_are_named_in_one_warning_at_start_and_the_workers_still_run(procs: Processes) -> None:
    enqueue("DEMO_TASK", {}, queue="reports")  # a queue a job uses
    proc = procs.worker(extra=["--queues=default,reports,reprots,emials"], ready=False)
    job = enqueue("DEMO_TASK", {}, queue="default")

    wait_until(status_is(job, JobStatus.SUCCESS), what="a job ran on a worker started with typos in --queues")
    warnings = wait_until(
        lambda: [line for line in proc.output().splitlines() if "WARNING" in line and "--queues" in line],
        what="the warning about the unused queues",
    )
    assert len(warnings) == 1, warnings
    assert "'reprots', 'emials'" in warnings[0]
    assert "'default'" not in warnings[0] and "'reports'" not in warnings[0]


def test_a_paused_queue_is_not_leased_from_until_resumed(procs: Processes) -> None:
    Queue.objects.update_or_create(name="held", defaults={"paused": True})
    procs.worker(concurrency=2)
    held = enqueue("DEMO_TASK", {}, queue="held")
    marker = enqueue("DEMO_TASK", {}, queue="default")  # due after ``held``: claimed no earlier

    wait_until(status_is(marker, JobStatus.SUCCESS), what="the job on the live queue ran")
    assert (status(held), attempts(held)) == (JobStatus.QUEUED, [])

    Queue.objects.filter(name="held").update(paused=False)
    wait_until(status_is(held, JobStatus.SUCCESS), what="the resumed queue's job ran")
