"""The one registry of Stint's Prometheus metrics (prometheus-client); every process imports from here.

Every metric is declared here but core's own (``core.metrics``: the rate limit), which core
declares so as to import nothing of the apps; ``SERVED_BY`` lists those too.

Labels are low-cardinality only (type, queue, priority, scope, status): never a job id or owner.

Who exports what (docs/observability.md has the full list):

- Counters and histograms live in the process that does the work: ``run_workers`` (job
  outcomes, durations, lag, slots), ``run_scheduler`` (rescues, cron fires, leadership, outbox
  lag, repaired audit events), ``run_audit_consumer`` (stored, quarantined and skipped audit
  events), the web process (rate limits, HTTP via
  django-prometheus) and every process that enqueues (``jobs_created_total``). Sum them across
  instances in PromQL.
- Each process serves only the families it measures (``SERVED_BY``, ``ServedCollector``): the
  web's ``/metrics`` has no worker or scheduler gauge stuck at 0.
- ``jobs_queue_depth``, ``workers_active``, ``workers_heartbeat_overdue`` and ``outbox_backlog``
  describe the whole cluster and are read from PostgreSQL at scrape time by
  ``ClusterStateCollector``, registered only in the scheduler processes (``serve(...,
  cluster_state=True)``). Every scheduler reports the same numbers: aggregate them with
  ``max``, never ``sum``.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from django.db import transaction
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core.metrics import rate_limit_backend_errors_total, rate_limit_rejections_total
from scheduler.states import priority_label

logger = logging.getLogger(__name__)

# Latency buckets in seconds, from 1 ms to 10 min.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

jobs_created_total = Counter("jobs_created_total", "Jobs created.", ["type", "queue", "priority"])
jobs_completed_total = Counter("jobs_completed_total", "Jobs that ended SUCCESS.", ["type", "queue"])
jobs_failed_total = Counter("jobs_failed_total", "Attempts that failed (any error or timeout).", ["type", "queue"])
jobs_retried_total = Counter("jobs_retried_total", "Jobs moved to RETRYING.", ["type", "queue"])
jobs_dead_total = Counter("jobs_dead_total", "Jobs dead-lettered (DEAD).", ["type", "queue"])
jobs_cancelled_total = Counter("jobs_cancelled_total", "Jobs cancelled.", ["type", "queue"])
jobs_timed_out_total = Counter("jobs_timed_out_total", "Attempts that overran their timeout.", ["type", "queue"])
jobs_execution_duration_seconds = Histogram(
    "jobs_execution_duration_seconds", "Handler run time in seconds.", ["type", "queue"], buckets=LATENCY_BUCKETS
)
jobs_schedule_lag_seconds = Histogram(
    "jobs_schedule_lag_seconds",
    "Start time minus due time (scheduled_at), in seconds.",
    ["queue", "priority"],
    buckets=LATENCY_BUCKETS,
)
# A claim statement takes well under a millisecond on a healthy table; its buckets start there.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
worker_claims_skipped_total = Counter(
    "worker_claims_skipped_total",
    "Claims a worker process did not make because a sibling process's claim had served the NOTIFY that woke it.",
)
worker_claim_duration_seconds = Histogram(
    "worker_claim_duration_seconds",
    "Wall time of one claim of a worker process, empty ones included (round trip and commit), in seconds.",
    buckets=CLAIM_BUCKETS,
)
# Summed over the live worker processes of a ``run_workers`` supervisor (prometheus-client's
# multiprocess mode); a plain gauge of its process elsewhere.
worker_slots_busy = Gauge(
    "worker_slots_busy", "Pool slots running a handler in the worker processes.", multiprocess_mode="livesum"
)
worker_slots_total = Gauge("worker_slots_total", "Pool slots of the worker processes.", multiprocess_mode="livesum")
worker_stuck_threads = Gauge(
    "worker_stuck_threads", "Threads still running a handler past its timeout.", multiprocess_mode="livesum"
)
worker_claimed_ahead_handed_back_total = Counter(
    "worker_claimed_ahead_handed_back_total",
    "Jobs claimed ahead of a free thread slot that waited past CLAIM_AHEAD_MAX_WAIT and were handed back unrun.",
)
worker_threads_lost_total = Counter(
    "worker_threads_lost_total", "Pool threads that died (and were replaced) although handlers cannot kill them."
)
worker_processes_died_total = Counter(
    "worker_processes_died_total", "Worker processes of a run_workers supervisor that died (and were replaced)."
)
worker_outcomes_unrecorded_total = Counter(
    "worker_outcomes_unrecorded_total",
    "Job outcomes the database refused even on their own and as FAILED (left to the lease rescuer).",
)
leases_rescued_total = Counter("leases_rescued_total", "RUNNING jobs rescued after their lease expired.")
cron_fires_total = Counter("cron_fires_total", "Jobs materialized from schedules.")
scheduler_is_leader = Gauge(
    "scheduler_is_leader", "1 while this scheduler process holds cron leadership.", multiprocess_mode="livemax"
)
outbox_publish_lag_seconds = Histogram(
    "outbox_publish_lag_seconds", "Event commit to Kafka delivery, in seconds.", buckets=LATENCY_BUCKETS
)
outbox_topic_missing = Gauge(
    "outbox_topic_missing",
    "1 while the outbox relay finds its Kafka topic missing (it never creates it: provision it).",
    multiprocess_mode="livemax",
)
claim_index_pages_read = Gauge(
    "claim_index_pages_read",
    "Pages a claim reads before its first QUEUED job, as of the last probe (scheduler.maintenance.claim_index).",
    multiprocess_mode="livemax",
)
claim_index_vacuums_total = Counter(
    "claim_index_vacuums_total", "VACUUMs of stint_job the claim index upkeep ran (claims read too many dead entries)."
)
jobs_pruned_total = Counter(
    "jobs_pruned_total", "Finished jobs deleted by the retention pruner (with their attempts and events).", ["status"]
)
audit_events_stored_total = Counter("audit_events_stored_total", "Audit events stored (duplicates excluded).")
audit_messages_quarantined_total = Counter(
    "audit_messages_quarantined_total",
    "Lifecycle messages the audit consumer set aside in its quarantine (reason MALFORMED or REFUSED).",
    ["reason"],
)
audit_topic_missing = Gauge(
    "audit_topic_missing",
    "1 while the audit consumer finds its Kafka topic missing (it never creates it: provision it).",
    multiprocess_mode="livemax",
)
audit_consumer_rejoins_total = Counter(
    "audit_consumer_rejoins_total",
    "Kafka clients the audit consumer replaced: it held no partition while its topic had events nobody committed.",
)
audit_offset_gaps_total = Counter(
    "audit_offset_gaps_total", "Offsets of the lifecycle topic the audit consumer skipped without receiving them."
)
audit_events_repaired_total = Counter(
    "audit_events_repaired_total", "Published outbox events without an audit row, re-published by the reconciler."
)

# -- which process serves which family --------------------------------------------------------

# The cluster-wide gauges ``ClusterStateCollector`` reads from PostgreSQL at scrape time.
CLUSTER_FAMILIES = frozenset(
    {
        "jobs_queue_depth",
        "workers_active",
        "workers_heartbeat_overdue",
        "outbox_backlog",
        "jobs_queued_oldest_age_seconds",  # scheduler.flow.aging.OldestWaitingCollector
    }
)
_JOB_OUTCOMES = (jobs_failed_total, jobs_retried_total, jobs_dead_total, jobs_cancelled_total)
# Every metric object of this module is declared in exactly one process's set below, or in
# several when several processes really count it (jobs_created_total: whoever enqueues).
SERVED_BY: dict[str, tuple[Any, ...]] = {
    "web": (jobs_created_total, rate_limit_rejections_total, rate_limit_backend_errors_total),
    "scheduler": (
        jobs_created_total,  # cron fires
        leases_rescued_total,
        *_JOB_OUTCOMES,  # of rescued leases
        cron_fires_total,
        scheduler_is_leader,
        outbox_publish_lag_seconds,
        outbox_topic_missing,
        jobs_pruned_total,
        audit_events_repaired_total,
        claim_index_pages_read,
        claim_index_vacuums_total,
    ),
    "workers": (
        jobs_created_total,  # handlers that enqueue jobs
        jobs_completed_total,
        *_JOB_OUTCOMES,
        jobs_timed_out_total,
        jobs_execution_duration_seconds,
        jobs_schedule_lag_seconds,
        worker_claim_duration_seconds,
        worker_claims_skipped_total,
        worker_slots_busy,
        worker_slots_total,
        worker_stuck_threads,
        worker_claimed_ahead_handed_back_total,
        worker_threads_lost_total,
        worker_processes_died_total,
        worker_outcomes_unrecorded_total,
        leases_rescued_total,  # the supervisor's rescue of a dead process's jobs
    ),
    "audit": (
        audit_events_stored_total,
        audit_messages_quarantined_total,
        audit_offset_gaps_total,
        audit_topic_missing,
        audit_consumer_rejoins_total,
    ),
}


def _family(metric: Any) -> str:
    # prometheus_client's family name: a counter's without its "_total".
    return metric._name


STINT_FAMILIES = frozenset(_family(m) for metrics in SERVED_BY.values() for m in metrics) | CLUSTER_FAMILIES


def served_families(role: str) -> frozenset[str]:
    """Return the family names of Stint's metrics that process ``role`` serves (web, scheduler, workers, audit).

    The scheduler also serves ``CLUSTER_FAMILIES``. Raises KeyError for an unknown role.
    """
    own = frozenset(_family(m) for m in SERVED_BY[role])
    return own | CLUSTER_FAMILIES if role == "scheduler" else own


class ServedCollector(Collector):
    """The families of ``source`` that process ``role`` really measures: Stint's others are left out.

    Every Stint metric is declared in this module and so registered in every process, where
    prometheus-client exports an untouched unlabelled one as 0: the web's ``/metrics`` said
    ``worker_slots_busy 0`` and ``scheduler_is_leader 0`` although no worker or scheduler runs
    there. Families that are not Stint's (django-prometheus's, ``process_*``, ``python_*``)
    pass through unchanged.
    """

    def __init__(self, source: Collector | CollectorRegistry, *, role: str) -> None:
        self.source = source
        self.dropped = STINT_FAMILIES - served_families(role)

    def collect(self) -> Iterator[Metric]:
        """Yield ``source``'s families except the Stint ones this role does not serve."""
        for family in self.source.collect():
            if family.name not in self.dropped:
                yield family


def served_registry(role: str, source: Collector | CollectorRegistry = REGISTRY) -> CollectorRegistry:
    """Return a registry exposing ``source`` as ``ServedCollector(role)`` does (for an exporter or a view)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServedCollector(source, role=role))
    return registry


# -- jobs created ---------------------------------------------------------------------------


class _NewJob(Protocol):
    id: Any
    type: str
    queue: str
    priority: int


_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """Return ``metric.labels(*labels)``, looked up once per process and label set, then reused.

    The job path counts and observes per job: prometheus-client's ``labels()`` validates, locks
    and looks up on every call, a dict lookup here does not. Label sets are low-cardinality
    (type, queue, priority), so the cache stays small.
    """
    key = (metric, labels)
    bound = _children.get(key)
    if bound is None:
        bound = _children[key] = metric.labels(*labels)
    return bound


def observe_many(histogram: Any, amounts: Sequence[float]) -> None:
    """Record every value of ``amounts`` (seconds, say) in ``histogram`` (a labelled child), as ``observe`` would.

    The job path observes per job, and in the workers' multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``)
    each ``observe`` takes a lock and writes two values to a memory-mapped file (about 9 us, measured:
    a fifth of a no-op job's worker CPU for two observations). This writes the sum once and each
    bucket touched once, with the counts prometheus-client's ``Histogram.observe`` (0.26) would
    have added one by one: a value counts in the first bucket whose upper bound is >= it.
    A histogram without those internals (another client version) gets one ``observe`` per value.
    """
    if not amounts:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for amount in amounts:
            histogram.observe(amount)
        return
    histogram._raise_if_not_observable()  # a metric with labels but none given, as observe raises
    # NaN is below no bound (observe counts it in no bucket) but is added to the sum.
    counts = collections.Counter(bisect.bisect_left(bounds, amount) for amount in amounts if amount == amount)
    total.inc(sum(amounts))
    for index, n in counts.items():
        if index < len(buckets):
            buckets[index].inc(n)


def jobs_created_on_commit(jobs: Sequence[_NewJob], created_ids: Iterable[Any]) -> None:
    """Count ``created_ids`` (a subset of ``jobs``) in ``jobs_created_total`` once the transaction commits.

    Labels: type, queue and priority label (HIGH/MEDIUM/LOW, or the integer for a priority between
    the named points: at most 201 values). A rolled-back insert counts
    nothing; outside a transaction the count is immediate (Django's ``on_commit``).
    """
    if len(jobs) == 1:  # one enqueue: no grouping
        if next(iter(created_ids), None) is not None:
            job = jobs[0]
            transaction.on_commit(child(jobs_created_total, job.type, job.queue, priority_label(job.priority)).inc)
        return
    by_id = {job.id: job for job in jobs}
    counts = collections.Counter(
        (by_id[i].type, by_id[i].queue, priority_label(by_id[i].priority)) for i in created_ids if i in by_id
    )
    if not counts:
        return

    def count() -> None:
        for labels, n in counts.items():
            child(jobs_created_total, *labels).inc(n)

    transaction.on_commit(count)


# -- cluster state, read at scrape time -------------------------------------------------------

# Statuses a job waits or runs in; CREATED never outlives its transaction, the rest are final
# or wait for a person (FAILED, DEAD).
QUEUE_DEPTH_STATUSES = ("SCHEDULED", "QUEUED", "RUNNING", "RETRYING")
OVERDUE_REMEMBERED_SECONDS = 600  # a worker reaped as silent stays counted as overdue this long
STATEMENT_TIMEOUT_MS = 2000  # a scrape never waits longer than this on the database

# One round trip. Each arm of the depth count repeats the predicate of one partial index
# (job_claim_scan, job_due_scan, job_lease_scan), so terminal rows, the bulk of the table, are
# never read; the unpublished-outbox count walks the outbox_unpublished partial index.
_CLUSTER_STATE_SQL = """
    SELECT 'depth', queue, status, count(*) FROM stint_job WHERE status = 'QUEUED' GROUP BY queue, status
    UNION ALL
    SELECT 'depth', queue, status, count(*) FROM stint_job
        WHERE status IN ('SCHEDULED', 'RETRYING') GROUP BY queue, status
    UNION ALL
    SELECT 'depth', queue, status, count(*) FROM stint_job WHERE status = 'RUNNING' GROUP BY queue, status
    UNION ALL
    SELECT 'queue', name, NULL, 0 FROM stint_queue
    UNION ALL
    SELECT 'active', NULL, NULL, count(*) FROM stint_worker_node WHERE {alive}
    UNION ALL
    SELECT 'overdue', NULL, NULL, count(*) FROM stint_worker_node
        WHERE last_heartbeat_at < now() - make_interval(secs => %(dead_after)s)
          AND (stopped_at IS NULL
               OR (stopped_at > now() - make_interval(secs => %(remembered)s)
                   AND stopped_at - last_heartbeat_at > make_interval(secs => %(dead_after)s)))
    UNION ALL
    SELECT 'outbox', NULL, NULL, coalesce(sum(event_count), 0) FROM stint_outbox WHERE published_at IS NULL
"""


class ClusterStateCollector(Collector):
    """Report queue depth, live workers and the outbox backlog from PostgreSQL at each scrape.

    Families: ``jobs_queue_depth{queue,status}`` (every known queue gets a sample for each
    non-terminal status, zeros included), ``workers_active`` (alive by the one liveness rule,
    ``scheduler.selectors.WORKER_ALIVE_SQL``), ``workers_heartbeat_overdue`` (silent longer than
    ``WORKER_DEAD_AFTER_SECONDS`` and
    either not stopped or reaped as silent within ``OVERDUE_REMEMBERED_SECONDS``) and
    ``outbox_backlog`` (unpublished events). A database error is logged and the scrape carries
    these families without samples, so Prometheus sees them go stale instead of a false zero.

    The scrape runs on the exporter's own thread, so by default the Django connection it opened
    is closed afterwards (``close_connection``); tests inside a transaction pass False.
    """

    def __init__(self, *, close_connection: bool = True) -> None:
        self.close_connection = close_connection

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """Yield the families without samples, so registering never queries the database."""
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Query the database once and yield the four families."""
        depth, active, overdue, backlog = self._families()
        try:
            rows = self._query()
        except Exception:  # the DB may be down or slow: report nothing rather than fail the scrape
            logger.warning("cluster-state metrics: database query failed; samples skipped", exc_info=True)
            yield from (depth, active, overdue, backlog)
            return
        counts: dict[tuple[str, str], int] = {}
        queues: set[str] = set()
        for kind, queue, status, n in rows:
            if kind == "depth":
                counts[(queue, status)] = int(n)
                queues.add(queue)
            elif kind == "queue":
                queues.add(queue)
            elif kind == "active":
                active.add_metric([], int(n))
            elif kind == "overdue":
                overdue.add_metric([], int(n))
            elif kind == "outbox":
                backlog.add_metric([], int(n))
        for queue in sorted(queues):
            for status in QUEUE_DEPTH_STATUSES:
                depth.add_metric([queue, status], counts.get((queue, status), 0))
        yield from (depth, active, overdue, backlog)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "jobs_queue_depth",
                "Jobs by queue and non-terminal status (read at scrape time).",
                labels=["queue", "status"],
            ),
            GaugeMetricFamily("workers_active", "Worker processes heartbeating (read at scrape time)."),
            GaugeMetricFamily(
                "workers_heartbeat_overdue",
                "Worker processes that missed heartbeats: still registered but silent, or reaped as silent recently.",
            ),
            GaugeMetricFamily("outbox_backlog", "Unpublished outbox events (read at scrape time)."),
        )

    def _query(self) -> list[tuple[str, str | None, str | None, int]]:
        from django.db import connection, transaction

        from scheduler.selectors import worker_alive_sql, worker_dead_after_seconds

        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [str(STATEMENT_TIMEOUT_MS)])
                cursor.execute(
                    _CLUSTER_STATE_SQL.replace("{alive}", worker_alive_sql()),
                    {"dead_after": worker_dead_after_seconds(), "remembered": OVERDUE_REMEMBERED_SECONDS},
                )
                return cursor.fetchall()
        finally:
            if self.close_connection:
                connection.close()


# By registry object, held weakly: keyed by ``id()``, a registry created after another was
# garbage-collected could get its id and be told it already had a collector (it had none).
_registered: weakref.WeakKeyDictionary[CollectorRegistry, ClusterStateCollector] = weakref.WeakKeyDictionary()
_register_lock = threading.Lock()


def register_cluster_state(registry: CollectorRegistry = REGISTRY) -> ClusterStateCollector:
    """Register one ``ClusterStateCollector`` in ``registry`` (idempotent) and return it.

    The oldest-waiting gauge (``scheduler.flow.aging.OldestWaitingCollector``) comes with it.
    """
    with _register_lock:
        collector = _registered.get(registry)
        if collector is None:
            collector = ClusterStateCollector()
            registry.register(collector)
            from scheduler.flow.aging import OldestWaitingCollector  # flow control (issue 17)

            registry.register(OldestWaitingCollector())
            _registered[registry] = collector
        return collector


# What a ``run_workers`` supervisor counts itself (its rescues of a dead process's jobs), added
# to what its worker processes count.
SUPERVISOR_METRICS = (
    worker_processes_died_total,
    leases_rescued_total,
    jobs_failed_total,
    jobs_retried_total,
    jobs_dead_total,
    jobs_cancelled_total,
)


class SummedCollector(Collector):
    """The families of several collectors as one: samples with the same name and labels are added up.

    For a supervisor, which serves its worker processes' metrics (prometheus-client's
    ``MultiProcessCollector``) and its own counters of the same names: exposing both as they are
    would repeat a family, and Prometheus refuses a scrape that does. ``*_created`` samples (a
    process's start time, not a count) are left out.
    """

    def __init__(self, collectors: Sequence[Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        """Collect every collector and yield each family once, its samples summed."""
        families: dict[str, Metric] = {}
        sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for collector in self.collectors:
            for family in collector.collect():
                if family.name not in families:
                    families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                    sums[family.name] = {}
                total = sums[family.name]
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    total[key] = total.get(key, 0.0) + sample.value
        for name, family in families.items():
            for (sample_name, labels), amount in sums[name].items():
                family.add_sample(sample_name, dict(labels), amount)
            yield family


def serve(port: int, *, role: str, cluster_state: bool = False, multiprocess_dir: str | None = None) -> None:
    """Serve this process's metrics at ``http://METRICS_BIND_ADDRESS:port/metrics`` from a daemon thread.

    ``role`` (scheduler, workers, audit) picks the Stint families served (``served_families``):
    only those the process measures, never another process's left at 0.
    ``cluster_state`` also registers the scrape-time database gauges (scheduler processes
    only). ``multiprocess_dir`` (the ``run_workers`` supervisor) serves instead the metrics its
    worker processes write there (prometheus-client's multiprocess mode: counters and
    histograms summed over every process that ever ran, ``livesum`` gauges over the live ones),
    plus what the supervisor counted itself (``SUPERVISOR_METRICS``), summed with them.
    ``METRICS_BIND_ADDRESS`` is 127.0.0.1 by default, 0.0.0.0 in the containers where
    Prometheus scrapes over the compose network. Raises ``CommandError`` (the command exits 1
    with that one line, not a traceback) when the port cannot be bound, e.g. taken by another
    stack on the same host.
    """
    from django.conf import settings
    from django.core.management.base import CommandError

    if cluster_state:
        register_cluster_state()
    source: Collector | CollectorRegistry = REGISTRY
    if multiprocess_dir is not None:
        from prometheus_client import multiprocess

        workers = multiprocess.MultiProcessCollector(None, path=multiprocess_dir)
        source = SummedCollector([workers, *SUPERVISOR_METRICS])
    registry = served_registry(role, source)
    address = getattr(settings, "METRICS_BIND_ADDRESS", "127.0.0.1")
    try:
        start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise CommandError(
            f"cannot serve metrics on {address}:{port} ({exc.strerror or exc}): is another Stint running? "
            "Choose another --metrics-port, or 0 for none."
        ) from exc
    logger.info("metrics on http://%s:%d/metrics", address, port)
