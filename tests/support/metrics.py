"""Reading a real process's ``/metrics`` the way Prometheus does (prometheus_client's own parser)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# The metric families the issue asked for, each served by one Stint process (tests/scheduler/test_metrics.py).
ISSUE_METRICS = (
    "jobs_created_total",
    "jobs_completed_total",
    "jobs_failed_total",
    "jobs_retried_total",
    "jobs_dead_total",
    "jobs_cancelled_total",
    "jobs_execution_duration_seconds",
    "jobs_schedule_lag_seconds",
    "workers_active",
    "worker_slots_busy",
    "jobs_queue_depth",
    "leases_rescued_total",
    "cron_fires_total",
    "scheduler_is_leader",
    "outbox_backlog",
    "outbox_publish_lag_seconds",
    "audit_events_stored_total",
    "rate_limit_rejections_total",
    "rate_limit_backend_errors_total",
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_text(port: int) -> str:
    """GET http://127.0.0.1:port/metrics and return the exposition text; URLError when nothing answers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310 - loopback
        return response.read().decode()


def scrape(port: int) -> Samples:
    """GET http://127.0.0.1:port/metrics and return {(sample name, frozenset of labels): value}."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(scrape_text(port))
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of one sample, or None when the process does not export it."""
    return samples.get((name, frozenset(labels.items())))
