"""End-to-end tests of ``manage.py run_workers`` and ``run_scheduler`` as real OS processes.

The processes connect to the test database (``DATABASE_URL`` built from the test connection) and
run with short leases, heartbeats and polls. Tests wait on database state with a bounded poll
(``wait_until``), never on fixed sleeps. Every process is stopped in teardown (SIGKILL to its
process group if SIGTERM is not enough) and its log is printed there, which pytest shows only
when the test failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from scheduler import selectors
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.job_actions import job_cancel
from scheduler.maintenance.promoter import DuePromoter
from scheduler.models import Job, JobAttempt, JobResult, OutboxEvent, Queue, WorkerNode
from scheduler.states import AttemptStatus, EventType, JobStatus, Priority
from tests.subprocess_env import database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
WAIT = 20.0  # seconds any one awaited condition may take
READY_WAIT = 60.0  # seconds for processes to start: ten at once on two busy cores is slow
STOP_WAIT = 10.0  # seconds a process may take to exit after SIGTERM in teardown
LOG_TAIL = 6000  # characters of each process log shown on failure
FAST = {
    "STINT_LEASE_SECONDS": "3",
    "STINT_HEARTBEAT_SECONDS": "0.5",
    "STINT_POLL_SECONDS": "0.2",
    "STINT_BACKOFF_BASE_SECONDS": "0.1",
    "STINT_BACKOFF_MAX_SECONDS": "0.2",
    "STINT_WORKER_DEAD_AFTER_SECONDS": "30",
    "KAFKA_TOPIC": "stint-test-workers",  # run_scheduler's outbox relay never feeds the real topic
    "LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}

T = TypeVar("T")


@dataclass(eq=False)
class Proc:
    """A started ``manage.py`` command; its stdout and stderr go to ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    processes: int = 0  # run_workers: its worker processes

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def send(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = WAIT) -> int:
        return self.popen.wait(timeout=timeout)


class Processes:
    """Starts worker and scheduler commands for one test and stops them all afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.env = {**os.environ, **FAST, "DATABASE_URL": database_url()}
        self.started: list[Proc] = []

    def start(self, name: str, command: list[str]) -> Proc:
        log = self.tmp_path / f"{len(self.started):02d}-{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "manage.py", *command],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: teardown can reap pool children too
            )
        proc = Proc(name=name, popen=popen, log=log)
        self.started.append(proc)
        return proc

    def worker(
        self,
        *,
        concurrency: int = 1,
        pool: str = "threads",
        grace: float = 2.0,
        ready: bool = True,
        processes: int = 1,
        extra: Sequence[str] = (),
    ) -> Proc:
        """Start ``run_workers``; with ``ready``, wait until its worker processes have registered."""
        proc = self.start(
            f"worker-{pool}",
            [
                "run_workers",
                f"--processes={processes}",
                f"--concurrency={concurrency}",
                f"--pool={pool}",
                f"--grace-seconds={grace}",
                *extra,
            ],
        )
        proc.processes = processes
        if ready:
            self.wait_ready(proc)
        return proc

    def scheduler(self) -> Proc:
        """Start ``run_scheduler`` with a short tick."""
        return self.start("scheduler", ["run_scheduler", "--tick-seconds=0.1"])

    def wait_ready(self, *procs: Proc) -> None:
        """Wait until the worker processes of each ``run_workers`` in ``procs`` have registered."""
        pids = [p.pid for p in procs]
        expected = sum(p.processes for p in procs)

        def registered() -> bool:
            for proc in procs:
                if proc.popen.poll() is not None:
                    raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.output()}")
            return live_workers(pids).count() == expected

        wait_until(registered, what=f"{expected} worker processes registered", timeout=READY_WAIT)

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.popen.poll() is None:
                proc.send(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        for proc in self.started:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group of a process we started: leftovers only
            except (ProcessLookupError, PermissionError):
                pass
            proc.popen.wait(timeout=STOP_WAIT)

    def report(self) -> str:
        parts = []
        for proc in self.started:
            text = proc.output()
            parts.append(f"----- {proc.name} pid {proc.pid} exit {proc.popen.returncode} -----\n{text[-LOG_TAIL:]}")
        return "\n".join(parts)


@pytest.fixture
def procs(transactional_db: None, tmp_path: Path) -> Iterator[Processes]:
    """Start commands with ``procs.worker()``/``procs.scheduler()``; all are stopped before the DB is flushed."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.stop_all()
        sys.stderr.write(processes.report() + "\n")


@pytest.fixture(autouse=True)
def _fast_backoff(settings) -> None:
    """In-test maintenance (the promoter) uses the same short backoff as the processes."""
    settings.SCHEDULER = {**settings.SCHEDULER, "BACKOFF_BASE_SECONDS": 0.1, "BACKOFF_MAX_SECONDS": 0.2}


def wait_until(
    predicate: Callable[[], T],
    *,
    what: str,
    timeout: float = WAIT,
    each: Callable[[], Any] | None = None,
) -> T:
    """Poll ``predicate`` (after calling ``each``, if given) until it is truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if each is not None:
            each()
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            jobs = list(Job.objects.values_list("type", "status", "attempts", "last_error"))
            raise AssertionError(f"not within {timeout} s: {what}; jobs (type, status, attempts, error): {jobs}")
        time.sleep(0.05)


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(id=job.id)


def status_is(job: Job, expected: JobStatus) -> Callable[[], bool]:
    return lambda: status(job) == expected


def attempts(job: Job) -> list[tuple[int, str]]:
    """The job's attempts as the API lists them: the finished rows, then a RUNNING job's current one."""
    rows = list(JobAttempt.objects.filter(job_id=job.id).values_list("attempt_number", "status"))
    running = selectors.job_running_attempt(job_id=job.id)
    return rows + ([(running.attempt_number, running.status)] if running else [])


def events(job: Job) -> list[str]:
    return list(OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").values_list("event_type", flat=True))


def live_workers(supervisor_pids: Sequence[int]) -> Any:
    """The registered, running (non-isolation) worker processes of these ``run_workers`` supervisors."""
    return WorkerNode.objects.filter(supervisor_pid__in=supervisor_pids, isolation=False, stopped_at__isnull=True)


def worker_of(proc: Proc) -> str:
    """The worker id of the one running worker process of ``run_workers`` ``proc``."""
    return live_workers([proc.pid]).values_list("id", flat=True).get()


def worker_pid(proc: Proc) -> int:
    """The pid of the one running worker process of ``run_workers`` ``proc``."""
    return live_workers([proc.pid]).values_list("pid", flat=True).get()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid`` from /proc, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def pool_children(pid: int) -> set[int]:
    """Pids of the live multiprocessing pool children of process ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[1] != pid or stat[0] in {"Z", "X"}:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts as exited)."""
    stat = _stat(pid)
    return stat is None or stat[0] in {"Z", "X"}


# -- racing, crashing ------------------------------------------------------------------------


def test_ten_workers_racing_run_each_job_exactly_once(procs: Processes) -> None:
    workers = [procs.worker(concurrency=2, ready=False) for _ in range(10)]
    procs.wait_ready(*workers)

    job = enqueue("DEMO_TASK", {"result": "once"})
    wait_until(status_is(job, JobStatus.SUCCESS), what="the one job succeeded")

    assert attempts(job) == [(1, AttemptStatus.SUCCEEDED)]
    assert events(job).count(EventType.JOB_STARTED) == 1
    assert JobResult.objects.get(job_id=job.id).result == {"echo": "once", "attempt": 1}

    ids = enqueue_many([{"type": "DEMO_TASK", "payload": {"result": i}} for i in range(200)])
    wait_until(
        lambda: Job.objects.filter(id__in=ids, status=JobStatus.SUCCESS).count() == 200, what="200 jobs succeeded"
    )
    assert JobAttempt.objects.filter(job_id__in=ids).count() == 200
    assert set(JobAttempt.objects.filter(job_id__in=ids).values_list("attempt_number", flat=True)) == {1}
    assert OutboxEvent.objects.filter(job_id__in=ids, event_type=EventType.JOB_STARTED).count() == 200
    assert all(w.popen.poll() is None for w in workers)


def test_a_job_of_a_killed_worker_is_rescued_and_completes_on_another(procs: Processes) -> None:
    first = procs.worker()
    first_id = worker_of(first)
    # Longer than the 3 s lease: the second run survives only because its worker heartbeats.
    job = enqueue("DEMO_TASK", {"sleep_seconds": 4, "result": "survived"}, max_retries=2)
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")

    os.killpg(first.pid, signal.SIGKILL)  # supervisor and worker process at once, as when a host dies
    assert first.wait() == -signal.SIGKILL
    second = procs.worker()
    scheduler = procs.scheduler()  # rescues once the lease expires, then promotes after the backoff

    wait_until(status_is(job, JobStatus.SUCCESS), what="the rescued job succeeded")

    rows = list(JobAttempt.objects.filter(job_id=job.id).values_list("attempt_number", "status", "worker"))
    assert rows == [(1, AttemptStatus.LOST, first_id), (2, AttemptStatus.SUCCEEDED, worker_of(second))]
    assert JobResult.objects.get(job_id=job.id).result == {"echo": "survived", "attempt": 2}
    assert events(job).count(EventType.JOB_LEASE_EXPIRED) == 1

    scheduler.send(signal.SIGTERM)
    assert scheduler.wait() == 0


def test_the_processes_of_a_killed_supervisor_hand_back_and_exit(procs: Processes) -> None:
    worker = procs.worker(concurrency=1, pool="processes", grace=0.5)
    process = worker_pid(worker)
    (child,) = pool_children(process)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 60}, max_retries=1)
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")

    worker.send(signal.SIGKILL)  # the supervisor only, not its process group

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
    assert not JobResult.objects.filter(job_id=job.id).exists()
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


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_sigterm_lets_a_running_job_finish_and_takes_no_more(procs: Processes, pool: str) -> None:
    worker = procs.worker(concurrency=1, pool=pool, grace=20)
    job = enqueue("DEMO_TASK", {"sleep_seconds": 1.5, "result": "finished"})
    wait_until(status_is(job, JobStatus.RUNNING), what="the job started")
    waiting = enqueue("DEMO_TASK", {})  # the only slot is busy

    # To the whole process group, as honcho and systemd (KillMode=control-group) do: worker
    # processes and pool children get it too and must leave the drain to the supervisor.
    os.killpg(worker.pid, signal.SIGTERM)

    assert worker.wait() == 0
    assert status(job) == JobStatus.SUCCESS
    assert attempts(job) == [(1, AttemptStatus.SUCCEEDED)]
    assert (status(waiting), attempts(waiting)) == (JobStatus.QUEUED, [])
    node = WorkerNode.objects.get(supervisor_pid=worker.pid)
    assert node.stopped_at is not None
    assert node.jobs_done == 1  # the console's "jobs done": the one outcome it recorded


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
    assert JobResult.objects.get(job_id=job.id).result == {"echo": "later", "attempt": 2}


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
import os, signal, threading
from core.stop_signals import install_stop_handlers

stopped = threading.Event()
calls = []

def stop(*, force=False):
    calls.append(force)
    stopped.set()

install_stop_handlers(stop, name="probe")
for _ in range(2):
    with stopped._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10000):
            pass
    stopped.wait(10)
    stopped.clear()
print("calls", calls, flush=True)
"""


def test_stop_signals_never_deadlock_the_main_thread() -> None:
    probe = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_PROBE], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = probe.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        probe.kill()  # deadlocked: SIGTERM would only be caught and deadlock again
        output, _ = probe.communicate()
        raise AssertionError(f"stop() ran inside the signal handler and deadlocked:\n{output}") from None
    assert probe.returncode == 0, output
    assert "calls [False, True]" in output


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

    ran = list(
        JobAttempt.objects.filter(job_id__in=ids).order_by("started_at").values_list("started_at", "job__priority")
    )
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
    assert "PermanentError" in JobAttempt.objects.get(job_id=bad.id).traceback
    assert events(bad)[-1] == EventType.JOB_FAILED
    assert JobResult.objects.get(job_id=good.id).result["total"] == 2


def test_retries_then_dead_letters_woken_only_by_notify(procs: Processes) -> None:
    # Polling every 30 s: within WAIT only a NOTIFY (on enqueue, on promotion) wakes the worker.
    procs.worker(concurrency=2, extra=["--poll-seconds=30"])
    flaky = enqueue("DEMO_TASK", {"fail_times": 1, "result": "second time"}, max_retries=2)
    hopeless = enqueue("FAILING", {}, max_retries=2)

    promote = DuePromoter().run_once
    wait_until(status_is(flaky, JobStatus.SUCCESS), each=promote, what="the flaky job succeeded on a retry")
    wait_until(status_is(hopeless, JobStatus.DEAD), each=promote, what="the failing job was dead-lettered")

    assert attempts(flaky) == [(1, AttemptStatus.FAILED), (2, AttemptStatus.SUCCEEDED)]
    assert JobResult.objects.get(job_id=flaky.id).result == {"echo": "second time", "attempt": 2}
    assert attempts(hopeless) == [(n, AttemptStatus.FAILED) for n in (1, 2, 3)]
    assert events(hopeless)[-1] == EventType.JOB_DEAD


def test_a_paused_queue_is_not_leased_from_until_resumed(procs: Processes) -> None:
    Queue.objects.update_or_create(name="held", defaults={"paused": True})
    procs.worker(concurrency=2)
    held = enqueue("DEMO_TASK", {}, queue="held")
    marker = enqueue("DEMO_TASK", {}, queue="default")  # due after ``held``: claimed no earlier

    wait_until(status_is(marker, JobStatus.SUCCESS), what="the job on the live queue ran")
    assert (status(held), attempts(held)) == (JobStatus.QUEUED, [])

    Queue.objects.filter(name="held").update(paused=False)
    wait_until(status_is(held, JobStatus.SUCCESS), what="the resumed queue's job ran")
