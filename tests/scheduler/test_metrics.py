"""Metrics: a real worker and scheduler process scraped over HTTP, the scrape-time collector, jobs_created_total.

The process tests start ``manage.py run_workers``/``run_scheduler`` with ``--metrics-port`` on
the test database and read ``/metrics`` with prometheus_client's own parser. Each process is
fresh, so its counters start at zero and must end at exactly what the run did.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest

from core.pg_connect import pg_connect
from scheduler import metrics
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.job_actions import job_cancel
from scheduler.maintenance.promoter import DuePromoter
from scheduler.metrics import ClusterStateCollector, register_cluster_state
from scheduler.models import Job, OutboxBatch, OutboxEvent, WorkerNode
from scheduler.states import JobStatus
from tests.support.factories import JobFactory
from tests.support.metrics import ISSUE_METRICS, Samples, scrape, value
from tests.support.net import free_port
from tests.support.processes import Processes, status_is, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("fast_backoff")


# -- observe_many ------------------------------------------------------------------------------


def _histogram_text(fill) -> list[str]:
    """The exposition of a fresh histogram that ``fill(child)`` observed into, its creation time left out."""
    registry = CollectorRegistry()
    histogram = Histogram("run_seconds", "Run time.", ["queue"], buckets=metrics.LATENCY_BUCKETS, registry=registry)
    fill(histogram.labels("default"))
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_observe_many_exposes_what_one_observe_per_value_does():
    # Bucket bounds themselves (a value counts in the bucket whose bound equals it), values between
    # them, zero, a negative, one past the last finite bound, NaN (counted in no bucket).
    values = [0.0, 0.001, 0.0011, 0.0025, 0.003, 0.5, 0.5, 1, 2.4, 600, 601.5, -0.2, float("nan"), 0.01]

    def one_by_one(child):
        for amount in values:
            child.observe(amount)

    by_batch = _histogram_text(lambda child: metrics.observe_many(child, values))
    assert by_batch == _histogram_text(one_by_one)


def test_observe_many_of_nothing_writes_nothing():
    assert _histogram_text(lambda child: metrics.observe_many(child, [])) == _histogram_text(lambda child: None)


# -- the registry ------------------------------------------------------------------------------


def test_every_metric_of_the_issue_is_declared_in_the_one_registry() -> None:
    registry = CollectorRegistry()
    register_cluster_state(registry)
    declared = {family.name for family in REGISTRY.collect()} | {f.name for f in registry.collect()}

    for name in ISSUE_METRICS:
        family = name.removesuffix("_total")  # prometheus_client names a counter family without it
        assert family in declared, name


def test_every_stint_metric_is_served_by_a_process_and_each_process_serves_only_its_own() -> None:
    from prometheus_client.metrics import MetricWrapperBase

    from scheduler import metrics

    declared = {m._name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    assert declared <= metrics.STINT_FAMILIES  # none is left out of SERVED_BY (it would be served nowhere)
    registry = CollectorRegistry()
    register_cluster_state(registry)
    everything = {f.name for f in REGISTRY.collect()} | {f.name for f in registry.collect()}
    for role in ("web", "scheduler", "workers", "audit"):
        source = CollectorRegistry(auto_describe=False)
        source.register(metrics.SummedCollector([REGISTRY, registry]))
        served = {f.name for f in metrics.served_registry(role, source).collect()}
        assert served & metrics.STINT_FAMILIES == metrics.served_families(role), role
        assert everything - metrics.STINT_FAMILIES <= served  # python_*, process_*, django_*: untouched
    assert "worker_slots_busy" not in metrics.served_families("web")
    assert "scheduler_is_leader" not in metrics.served_families("workers")
    assert "jobs_queue_depth" in metrics.served_families("scheduler")


def _listed(text: str) -> set[str]:
    """Metric names in backticks in ``text``, ``a_x/y/z_total`` spelled out; each also without ``_total``.

    prometheus_client names a counter's family without its ``_total``, a gauge's as it is.
    """
    names = set()
    for token in re.findall(r"`([a-z_]+(?:/[a-z_]+)*)`", text):
        first, *rest = token.split("/")
        suffix = "_total" if rest and rest[-1].endswith("_total") else ""
        prefix = first[: first.index("_") + 1] if rest else ""
        for name in [first + (suffix if rest else ""), *(prefix + part.removesuffix(suffix) + suffix for part in rest)]:
            names |= {name, name.removesuffix("_total")}
    return names


PROCESS_COMMANDS = {
    "scheduler": "`run_scheduler",
    "workers": "`run_workers",
    "audit": "`run_audit_consumer",
    "web": "web",
}


def _process_rows(path: Path) -> dict[str, set[str]]:
    """{role: families listed} from the rows of ``path``'s table of what each process serves."""
    rows: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for role, command in PROCESS_COMMANDS.items():
            if len(cells) > 1 and cells[0].startswith(command):
                rows[role] = _listed(cells[-1])
    return rows


@pytest.mark.parametrize("doc", ["README.md", "docs/observability.md"])
def test_the_docs_list_every_family_each_process_serves(doc: str) -> None:
    # README's table of what each process serves lacked the scheduler's jobs_queued_oldest_age_seconds.
    rows = _process_rows(ROOT / doc)

    assert set(rows) == {"web", "scheduler", "workers", "audit"}
    for role, listed in rows.items():
        assert metrics.served_families(role) - listed == set(), role


def test_the_metric_reference_has_a_row_for_every_family() -> None:
    table = [line for line in (ROOT / "docs/observability.md").read_text().splitlines() if line.startswith("| `")]
    rows = set().union(*(_listed(line.split("|")[1]) for line in table))

    assert metrics.STINT_FAMILIES - rows == set()


def test_registering_the_cluster_collector_twice_registers_it_once() -> None:
    registry = CollectorRegistry()

    first = register_cluster_state(registry)
    second = register_cluster_state(registry)

    assert first is second
    assert [f.name for f in registry.collect() if f.name == "outbox_backlog"] == ["outbox_backlog"]


def test_a_new_registry_at_a_collected_ones_address_gets_its_own_collector() -> None:
    # CPython reuses a freed object's address: a registry keyed by id() was told it had a
    # collector when only its garbage-collected predecessor at that address had one (a CI flake).
    for _ in range(20):
        gone = CollectorRegistry()
        register_cluster_state(gone)
        del gone
        registry = CollectorRegistry()  # usually at the address just freed
        register_cluster_state(registry)
        assert [f.name for f in registry.collect() if f.name == "outbox_backlog"] == ["outbox_backlog"]
        del registry


def test_a_supervisor_sums_its_own_counts_with_its_processes_into_one_family_each() -> None:
    processes, supervisor = CollectorRegistry(), CollectorRegistry()
    # Stand-ins for a worker process's counters and the supervisor's own, of the same names.
    in_process = Counter("demo_failed_total", "Failed.", ["type"], registry=processes)
    in_supervisor = Counter("demo_failed_total", "Failed.", ["type"], registry=supervisor)
    in_process.labels("A").inc(2)
    in_process.labels("B").inc(1)
    in_supervisor.labels("A").inc(3)
    summed = CollectorRegistry()
    summed.register(metrics.SummedCollector([processes, supervisor]))

    text = generate_latest(summed).decode()

    assert text.count("# HELP demo_failed_total") == 1
    assert "_created" not in text
    assert summed.get_sample_value("demo_failed_total", {"type": "A"}) == 5
    assert summed.get_sample_value("demo_failed_total", {"type": "B"}) == 1


# -- jobs_created_total ------------------------------------------------------------------------


def created(type_: str, queue: str, priority: str) -> float:
    return REGISTRY.get_sample_value("jobs_created_total", {"type": type_, "queue": queue, "priority": priority}) or 0.0


@pytest.mark.django_db
def test_jobs_created_total_counts_committed_jobs_by_type_queue_and_priority(
    django_capture_on_commit_callbacks,
) -> None:
    before = (
        created("DEMO_TASK", "mq1", "HIGH"),
        created("FAILING", "mq1", "MEDIUM"),
        created("DEMO_TASK", "mq2", "LOW"),
    )

    with django_capture_on_commit_callbacks(execute=True):
        enqueue_many([{"type": "DEMO_TASK", "queue": "mq1", "priority": "HIGH"}] * 3)
        enqueue("FAILING", queue="mq1")
        enqueue("DEMO_TASK", queue="mq2", priority="LOW", scheduled_at=timezone.now() + dt.timedelta(hours=1))

    after = (
        created("DEMO_TASK", "mq1", "HIGH"),
        created("FAILING", "mq1", "MEDIUM"),
        created("DEMO_TASK", "mq2", "LOW"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 1, 1]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_counts_nothing() -> None:
    before = created("DEMO_TASK", "mq-rollback", "MEDIUM")

    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("DEMO_TASK", queue="mq-rollback")
        raise RuntimeError("roll back")
    enqueue("DEMO_TASK", queue="mq-rollback")

    assert created("DEMO_TASK", "mq-rollback", "MEDIUM") - before == 1


# -- the scrape-time collector -----------------------------------------------------------------


def collected(collector: ClusterStateCollector) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value for f in collector.collect() for s in f.samples}


@pytest.mark.django_db
def test_cluster_state_collector_counts_depth_workers_and_outbox_backlog() -> None:
    enqueue_many([{"type": "DEMO_TASK", "queue": "depth"}] * 3)  # QUEUED, 2 outbox events each
    JobFactory.create_batch(2, scheduled=True, queue="depth", owner=None)
    JobFactory(running=True, queue="depth", owner=None)
    JobFactory(status=JobStatus.RETRYING, queue="depth", owner=None)
    JobFactory(succeeded=True, queue="depth", owner=None)  # terminal: not counted
    JobFactory(dead=True, queue="other", owner=None)  # waits for a person: not counted
    enqueue("DEMO_TASK", queue="idle")
    job_cancel(job_id=enqueue("DEMO_TASK", queue="idle").id)
    OutboxBatch.objects.filter(id=OutboxBatch.objects.order_by("id").values("id")[:1]).update(published_at=Now())
    unpublished = OutboxEvent.objects.filter(published_at__isnull=True).count()  # events, not rows
    assert unpublished == 5 > OutboxBatch.objects.filter(published_at__isnull=True).count() == 3
    now = timezone.now()
    node = {
        "hostname": "h",
        "queues": [],
        "concurrency": 1,
        "pool": "threads",
        "started_at": now - dt.timedelta(hours=1),
    }
    WorkerNode.objects.create(id="alive", pid=1, last_heartbeat_at=now, **node)
    WorkerNode.objects.create(id="stopped", pid=2, last_heartbeat_at=now, stopped_at=now, **node)
    WorkerNode.objects.create(id="silent", pid=3, last_heartbeat_at=now - dt.timedelta(minutes=5), **node)
    WorkerNode.objects.create(
        id="reaped",
        pid=4,
        last_heartbeat_at=now - dt.timedelta(minutes=4),  # reaped after 2 min of silence (> WORKER_DEAD_AFTER_SECONDS)
        stopped_at=now - dt.timedelta(minutes=2),
        **node,
    )
    WorkerNode.objects.create(
        id="reaped-long-ago",
        pid=5,
        last_heartbeat_at=now - dt.timedelta(hours=1),
        stopped_at=now - dt.timedelta(minutes=50),
        **node,
    )

    samples = collected(ClusterStateCollector(close_connection=False))

    depth = {
        (dict(labels)["queue"], dict(labels)["status"]): v
        for (name, labels), v in samples.items()
        if name == "jobs_queue_depth"
    }
    assert depth == {
        ("depth", "QUEUED"): 3,
        ("depth", "SCHEDULED"): 2,
        ("depth", "RUNNING"): 1,
        ("depth", "RETRYING"): 1,
        ("idle", "QUEUED"): 1,
        ("idle", "SCHEDULED"): 0,
        ("idle", "RUNNING"): 0,
        ("idle", "RETRYING"): 0,
        # "other" has no row in stint_queue (a factory row) and no waiting job: not reported.
    }
    assert value(samples, "workers_active") == 1
    assert value(samples, "workers_heartbeat_overdue") == 2  # "silent" and "reaped"
    assert value(samples, "outbox_backlog") == unpublished > 0


@pytest.mark.django_db(transaction=True)
def test_cluster_state_collector_skips_its_samples_when_the_database_fails(monkeypatch) -> None:
    enqueue("DEMO_TASK", queue="locked")
    monkeypatch.setattr(metrics, "STATEMENT_TIMEOUT_MS", 200)
    # A real lock held by another session: the collector's query hits its statement timeout.
    with pg_connect(autocommit=False) as locker:
        locker.execute("LOCK TABLE stint_outbox IN ACCESS EXCLUSIVE MODE")
        families = list(ClusterStateCollector().collect())
        locker.rollback()

    assert {f.name for f in families} == {
        "jobs_queue_depth",
        "workers_active",
        "workers_heartbeat_overdue",
        "outbox_backlog",
    }
    assert all(not f.samples for f in families)
    # The next scrape, with the lock gone, reports again.
    assert value(collected(ClusterStateCollector()), "jobs_queue_depth", queue="locked", status="QUEUED") == 1


# -- real processes ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_worker_run_moves_each_counter_and_histogram_by_the_expected_amount(procs: Processes) -> None:
    port = free_port()
    procs.worker(concurrency=2, extra=[f"--metrics-port={port}"])
    assert value(scrape(port), "jobs_completed_total", type="DEMO_TASK", queue="metrics") is None
    created_before = {
        key: created(*key)
        for key in [
            ("DEMO_TASK", "metrics", "HIGH"),
            ("FAILING", "metrics", "MEDIUM"),
            ("DEMO_TASK", "metrics", "MEDIUM"),
        ]
    }

    # 3 successes.
    ids = enqueue_many(
        [{"type": "DEMO_TASK", "queue": "metrics", "priority": "HIGH", "payload": {"result": i}} for i in range(3)]
    )
    wait_until(lambda: Job.objects.filter(id__in=ids, status=JobStatus.SUCCESS).count() == 3, what="3 jobs succeeded")
    # 2 failed attempts: retried once, then dead-lettered.
    failing = enqueue("FAILING", queue="metrics", max_retries=1)
    wait_until(status_is(failing, JobStatus.DEAD), what="FAILING dead", each=DuePromoter().run_once)
    # 1 timed-out attempt (retried), then cancelled while it waits for its retry.
    slow = enqueue("DEMO_TASK", {"sleep_seconds": 60}, queue="metrics", timeout_seconds=1, max_retries=1)
    wait_until(status_is(slow, JobStatus.RETRYING), what="the slow job timed out")
    job_cancel(job_id=slow.id)
    # 1 cancelled while running.
    running = enqueue("DEMO_TASK", {"sleep_seconds": 60}, queue="metrics")
    wait_until(status_is(running, JobStatus.RUNNING), what="the long job started")
    job_cancel(job_id=running.id)
    wait_until(status_is(running, JobStatus.CANCELLED), what="the long job stopped")

    def idle() -> Samples | None:
        samples = scrape(port)
        return samples if value(samples, "worker_slots_busy") == 0 else None

    s = wait_until(idle, what="the heartbeat reports every slot idle")
    demo, fail = {"type": "DEMO_TASK", "queue": "metrics"}, {"type": "FAILING", "queue": "metrics"}
    assert value(s, "jobs_completed_total", **demo) == 3
    assert value(s, "jobs_completed_total", **fail) is None
    assert value(s, "jobs_failed_total", **fail) == 2
    assert value(s, "jobs_failed_total", **demo) == 1  # the timeout
    assert value(s, "jobs_retried_total", **fail) == 1
    assert value(s, "jobs_retried_total", **demo) == 1
    assert value(s, "jobs_dead_total", **fail) == 1
    assert value(s, "jobs_dead_total", **demo) is None
    assert value(s, "jobs_timed_out_total", **demo) == 1
    assert value(s, "jobs_cancelled_total", **demo) == 1  # the one cancelled while running
    # One observation per handler that returned in time: 3 successes + the cancelled one; the
    # timed-out attempt is finalized at its deadline, not when its handler returns.
    assert value(s, "jobs_execution_duration_seconds_count", **demo) == 4
    assert value(s, "jobs_execution_duration_seconds_bucket", **demo, le="+Inf") == 4
    assert value(s, "jobs_execution_duration_seconds_count", **fail) == 2
    assert value(s, "jobs_execution_duration_seconds_sum", **demo) > 0
    # One lag observation per claim: 3 HIGH; MEDIUM: FAILING twice, the slow and the long job.
    assert value(s, "jobs_schedule_lag_seconds_count", queue="metrics", priority="HIGH") == 3
    assert value(s, "jobs_schedule_lag_seconds_count", queue="metrics", priority="MEDIUM") == 4
    assert value(s, "jobs_schedule_lag_seconds_bucket", queue="metrics", priority="MEDIUM", le="+Inf") == 4
    assert value(s, "worker_slots_total") == 2
    assert value(s, "worker_slots_busy") == 0
    # Jobs are created by the process that enqueues: this one.
    assert {key: created(*key) - before for key, before in created_before.items()} == {
        ("DEMO_TASK", "metrics", "HIGH"): 3,
        ("FAILING", "metrics", "MEDIUM"): 1,
        ("DEMO_TASK", "metrics", "MEDIUM"): 2,
    }
    # A worker does not report cluster-wide gauges: the schedulers do.
    assert value(s, "outbox_backlog") is None


@pytest.mark.slow
def test_a_real_scheduler_serves_cluster_gauges_and_leadership(procs: Processes) -> None:
    later = timezone.now() + dt.timedelta(days=1)
    enqueue_many([{"type": "DEMO_TASK", "queue": "sched", "scheduled_at": later}] * 2)
    node = {"hostname": "h", "queues": [], "concurrency": 1, "pool": "threads", "started_at": timezone.now()}
    WorkerNode.objects.create(id="alive", pid=1, last_heartbeat_at=timezone.now(), **node)
    port = free_port()
    procs.env.update(
        # Kafka unreachable: the relay publishes nothing, so the backlog holds still.
        KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9",
        KAFKA_TOPIC="stint-test-metrics",
        STINT_HEARTBEAT_SECONDS="10",
    )
    procs.start("scheduler", ["run_scheduler", "--tick-seconds=0.1", f"--metrics-port={port}"])

    def keep_alive() -> None:
        WorkerNode.objects.filter(id="alive").update(last_heartbeat_at=Now())

    def leading() -> Samples | None:
        try:
            samples = scrape(port)
        except OSError:
            return None  # not listening yet
        return samples if value(samples, "scheduler_is_leader") == 1 else None

    s = wait_until(leading, what="the scheduler leads and serves metrics", each=keep_alive)

    assert value(s, "jobs_queue_depth", queue="sched", status="SCHEDULED") == 2
    assert value(s, "jobs_queue_depth", queue="sched", status="QUEUED") == 0
    assert value(s, "workers_active") == 1
    assert value(s, "workers_heartbeat_overdue") == 0
    assert value(s, "outbox_backlog") == OutboxEvent.objects.filter(published_at__isnull=True).count() == 4
    assert value(s, "leases_rescued_total") == 0


def test_a_taken_metrics_port_ends_the_command_with_a_clear_error_not_a_traceback() -> None:
    # A second stack on the same host used to die with a raw "Address already in use" traceback.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "manage.py", "run_scheduler", f"--metrics-port={port}"],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "LOG_LEVEL": "WARNING"},
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert done.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
