"""No starvation: the reprioritizer raises long-waiting jobs' priority; the oldest waiting job per priority.

``Reprioritizer.run_once`` (a ``run_scheduler`` service, Oban Pro's Reprioritizer): a job
QUEUED for longer than ``SCHEDULER["AGING_SECONDS"]`` (and not raised within that time) gets
``AGING_STEP`` more priority (default 50: one named level, LOW -> MEDIUM -> HIGH), up to
``AGING_MAX_PRIORITY`` (default 50, HIGH). Off by default (``AGING_SECONDS`` 0). The raise is
a plain write of ``priority`` (not a status change), visible on the job; ``updated_at`` marks
it, so the next raise comes one more age later. Settings outside the priority column's range
(``PRIORITY_MIN``..``PRIORITY_MAX``, the ``job_priority_range`` constraint) are refused at
start-up (``config.settings``); a run given one anyway (an override) clamps the cap to that range
and the step to 1..its span, so no job can break the constraint and stop aging for every job.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db import connection

from scheduler.states import PRIORITY_MAX, PRIORITY_MIN, priority_label

logger = logging.getLogger(__name__)

BATCH = 1000  # jobs raised per run at most
INTERVAL_SECONDS = 5.0  # seconds between runs


def _setting(name: str, default: int) -> int:
    from django.conf import settings

    return int(settings.SCHEDULER.get(name, default))


class Reprioritizer:
    """Raise the priority of long-waiting QUEUED jobs (see the module); ``run_once(now) -> rows changed``."""

    name = "reprioritizer"
    interval_seconds = INTERVAL_SECONDS
    leader_only = False

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Raise up to ``BATCH`` jobs; return how many. ``now`` (aware) defaults to the database clock.

        A raise never passes ``AGING_MAX_PRIORITY`` nor the column's range; raises only database errors.
        """
        age = _setting("AGING_SECONDS", 0)
        if age <= 0:
            return 0
        # Clamped: one job raised past the column's range would fail the statement, so every run.
        step = min(max(_setting("AGING_STEP", 50), 1), PRIORITY_MAX - PRIORITY_MIN)
        cap = min(max(_setting("AGING_MAX_PRIORITY", 50), PRIORITY_MIN), PRIORITY_MAX)
        with connection.cursor() as cursor:
            # SKIP LOCKED: a job a worker is claiming right now is left alone (it is about to run anyway).
            cursor.execute(
                """
                WITH aged AS (
                    SELECT id FROM stint_job
                    WHERE status = 'QUEUED' AND priority < %(cap)s
                      AND scheduled_at <= coalesce(%(now)s, now()) - make_interval(secs => %(age)s)
                      AND updated_at <= coalesce(%(now)s, now()) - make_interval(secs => %(age)s)
                    ORDER BY scheduled_at
                    LIMIT %(batch)s
                    FOR UPDATE SKIP LOCKED
                )
                UPDATE stint_job j
                SET priority = LEAST(j.priority + %(step)s, %(cap)s), updated_at = coalesce(%(now)s, now())
                FROM aged WHERE j.id = aged.id AND j.status = 'QUEUED'
                """,
                {"cap": cap, "now": now, "age": float(age), "batch": BATCH, "step": step},
            )
            raised = cursor.rowcount
        if raised:
            logger.info("reprioritizer: raised the priority of %d jobs waiting over %d s", raised, age)
        return raised


def oldest_waiting() -> list[tuple[str, float]]:
    """Return (priority label, seconds waited) of the oldest QUEUED job of each priority present, highest first.

    Waited = database ``now()`` minus ``scheduled_at`` (when it became due). Two probes of the
    ``job_claim_scan_desc`` index (its unheld and held parts) per priority value (-100..100),
    whatever the backlog.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT p.priority, extract(epoch FROM now() - min(o.scheduled_at))::float8
            FROM generate_series(100, -100, -1) AS p(priority)
            CROSS JOIN (VALUES (false), (true)) AS h(held)
            CROSS JOIN LATERAL (
                SELECT scheduled_at FROM stint_job
                WHERE status = 'QUEUED' AND flow_held = h.held AND priority = p.priority
                ORDER BY priority DESC, scheduled_at LIMIT 1
            ) o
            GROUP BY p.priority
            ORDER BY p.priority DESC
            """
        )
        return [(priority_label(p), max(0.0, age)) for p, age in cursor.fetchall()]


class OldestWaitingCollector:
    """Prometheus collector: ``jobs_queued_oldest_age_seconds{priority}`` read from PostgreSQL at each scrape.

    Served by ``run_scheduler`` beside the other cluster-state gauges. A database error is logged
    and the family goes out without samples (stale, not a false zero). The scrape runs on the
    exporter's own thread, so its connection is closed afterwards unless ``close_connection``
    is False (tests inside a transaction).
    """

    def __init__(self, *, close_connection: bool = True) -> None:
        self.close_connection = close_connection

    def describe(self):  # noqa: ANN201 - prometheus_client's collector protocol
        """Yield the family without samples (registering never queries the database)."""
        yield self._family()

    def collect(self):  # noqa: ANN201
        """Query the oldest QUEUED job of each priority and yield the family."""
        family = self._family()
        try:
            for label, age in oldest_waiting():
                family.add_metric([label], age)
        except Exception:  # the database may be down: report nothing rather than fail the scrape
            logger.warning("oldest-waiting metric: database query failed; samples skipped", exc_info=True)
        finally:
            if self.close_connection:
                connection.close()
        yield family

    @staticmethod
    def _family():  # noqa: ANN205
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily(
            "jobs_queued_oldest_age_seconds",
            "Seconds the oldest QUEUED job of each priority has waited since due (read at scrape time).",
            labels=["priority"],
        )
