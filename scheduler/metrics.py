"""The one registry of Stint's Prometheus metrics (prometheus-client); every process imports from here.

Labels are low-cardinality only (type, queue, priority, scope, status): never a job id or owner.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
workers_active = Gauge("workers_active", "Worker processes heartbeating (read at scrape time).")
worker_slots_busy = Gauge("worker_slots_busy", "Pool slots running a handler in this worker process.")
worker_slots_total = Gauge("worker_slots_total", "Pool slots of this worker process.")
worker_stuck_threads = Gauge("worker_stuck_threads", "Threads still running a handler past its timeout.")
jobs_queue_depth = Gauge("jobs_queue_depth", "Jobs by queue and status (read at scrape time).", ["queue", "status"])
leases_rescued_total = Counter("leases_rescued_total", "RUNNING jobs rescued after their lease expired.")
cron_fires_total = Counter("cron_fires_total", "Jobs materialized from schedules.")
scheduler_is_leader = Gauge("scheduler_is_leader", "1 while this scheduler process holds cron leadership.")
outbox_backlog = Gauge("outbox_backlog", "Unpublished outbox events (read at scrape time).")
outbox_publish_lag_seconds = Histogram(
    "outbox_publish_lag_seconds", "Event commit to Kafka delivery, in seconds.", buckets=LATENCY_BUCKETS
)
audit_events_stored_total = Counter("audit_events_stored_total", "Audit events stored (duplicates excluded).")
rate_limit_rejections_total = Counter("rate_limit_rejections_total", "Requests rejected with 429.", ["scope"])
rate_limit_backend_errors_total = Counter(
    "rate_limit_backend_errors_total", "Rate-limit checks that failed open because Redis was unreachable."
)
