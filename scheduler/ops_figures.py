"""Per-queue and per-worker figures for the operator console, read from PostgreSQL (no Prometheus needed).

Per queue: depth by status, jobs completed and failed in the last minute and the last hour,
p50/p95 run time and pickup lag; per worker process: busy slots, jobs done, last heartbeat; and
per minute over the last hour (all queues, or one): completed, failed and pickup lag, for the
charts. Everything is measured against the database clock (DESIGN.md).

What each figure counts (the console says so too):
- depth: jobs SCHEDULED, QUEUED, RUNNING or RETRYING now;
- completed: jobs that ended SUCCESS in the window; failed: jobs that ended FAILED or DEAD in it
  (an attempt that failed and was retried is not a failed job: its job is RETRYING, in depth);
- run time: ``finished_at - started_at`` of those jobs (their last attempt); pickup lag:
  ``started_at - scheduled_at``, how long the last attempt waited after it was due.

Cost at a million jobs: three statements, none reading the finished bulk of the table outside
the window. Depth walks the partial indexes of non-terminal jobs (as the cluster gauges do);
the window reads only the jobs finished in the last hour, through ``job_finished_scan`` (status,
finished_at); workers are a few rows. Each statement runs under ``STATEMENT_TIMEOUT_MS``.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from scheduler.metrics import QUEUE_DEPTH_STATUSES
from scheduler.selectors import worker_alive_sql, worker_dead_after_seconds

WINDOW_MINUTES = 60  # the hour the figures and charts cover
RECENT_WORKERS_SECONDS = 3600  # a worker is listed while its last heartbeat is this recent (stopped or not)
STATEMENT_TIMEOUT_MS = 3000  # a refresh never waits longer than this on the database
FINISHED_OK = "SUCCESS"
FINISHED_FAILED = ("FAILED", "DEAD")

_DEPTH_SQL = """
    SELECT queue, status, count(*) FROM stint_job WHERE status = 'QUEUED' GROUP BY queue, status
    UNION ALL
    SELECT queue, status, count(*) FROM stint_job WHERE status IN ('SCHEDULED', 'RETRYING') GROUP BY queue, status
    UNION ALL
    SELECT queue, status, count(*) FROM stint_job WHERE status = 'RUNNING' GROUP BY queue, status
"""

# One pass over the jobs finished in the window; GROUPING SETS give the per-queue rows and the
# per-minute rows from the same rows. The chart's columns count only the charted queue (or all).
_WINDOW_SQL = """
    WITH w AS (
        SELECT queue, status, finished_at,
               -- NULL (no start recorded) stays NULL: greatest() would turn it into 0
               CASE WHEN started_at IS NOT NULL THEN greatest(0, extract(epoch FROM finished_at - started_at)) END
                   AS run_s,
               CASE WHEN started_at IS NOT NULL THEN greatest(0, extract(epoch FROM started_at - scheduled_at)) END
                   AS lag_s,
               %(chart_queue)s::text IS NULL OR queue = %(chart_queue)s::text AS charted
        FROM stint_job
        WHERE status IN ('SUCCESS', 'FAILED', 'DEAD') AND finished_at > %(since)s AND finished_at <= %(now)s
    )
    SELECT grouping(queue) = 0 AS per_queue, queue, date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE status = 'SUCCESS'),
           count(*) FILTER (WHERE status <> 'SUCCESS'),
           count(*) FILTER (WHERE status = 'SUCCESS' AND finished_at > %(minute_ago)s),
           count(*) FILTER (WHERE status <> 'SUCCESS' AND finished_at > %(minute_ago)s),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY run_s),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY run_s),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY lag_s),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY lag_s),
           count(*) FILTER (WHERE charted AND status = 'SUCCESS'),
           count(*) FILTER (WHERE charted AND status <> 'SUCCESS'),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY lag_s) FILTER (WHERE charted),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY lag_s) FILTER (WHERE charted)
    FROM w
    GROUP BY GROUPING SETS ((queue), (date_trunc('minute', finished_at)))
"""

_WORKERS_SQL = """
    SELECT id, hostname, pid, supervisor_pid, pool, isolation, queues, concurrency, busy_slots, jobs_done,
           started_at, last_heartbeat_at, stopped_at,
           {alive} AS alive
    FROM stint_worker_node
    WHERE last_heartbeat_at >= %(now)s - make_interval(secs => %(recent)s)
    ORDER BY alive DESC, hostname, supervisor_pid NULLS LAST, id
    LIMIT 500
""".replace("{alive}", worker_alive_sql(now="%(now)s"))


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFigures:
    """One queue's figures. Times in seconds; None where no job finished in the hour."""

    name: str
    paused: bool
    depth: dict[str, int]
    completed_last_minute: int = 0
    completed_last_hour: int = 0
    failed_last_minute: int = 0
    failed_last_hour: int = 0
    run_p50_seconds: float | None = None
    run_p95_seconds: float | None = None
    lag_p50_seconds: float | None = None
    lag_p95_seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFigures:
    """One worker process: its slots, the jobs it finished, its last heartbeat (age in seconds)."""

    id: str
    hostname: str
    pid: int
    supervisor_pid: int | None
    pool: str
    isolation: bool
    queues: list[str]
    slots_busy: int
    slots_total: int
    jobs_done: int
    started_at: dt.datetime
    last_heartbeat_at: dt.datetime
    last_heartbeat_age_seconds: float
    alive: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Minute:
    """One minute of the last hour: jobs completed and failed, pickup lag p50/p95 (None: nothing finished)."""

    minute: dt.datetime
    completed: int
    failed: int
    lag_p50_seconds: float | None
    lag_p95_seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpsFigures:
    """Everything the console's queues page shows, as of ``now`` (database clock)."""

    now: dt.datetime
    queues: list[QueueFigures]
    workers: list[WorkerFigures]
    minutes: list[Minute]
    chart_queue: str | None = None
    statuses: tuple[str, ...] = field(default=QUEUE_DEPTH_STATUSES)

    def as_json(self) -> dict[str, Any]:
        """The figures as JSON-ready data (ISO 8601 times, seconds as floats)."""

        def value(v: Any) -> Any:
            if isinstance(v, dt.datetime):
                return v.isoformat()
            if isinstance(v, list):
                return [value(x) for x in v]
            if hasattr(v, "__dataclass_fields__"):
                return {k: value(getattr(v, k)) for k in v.__dataclass_fields__}
            return v

        return {
            "now": self.now.isoformat(),
            "chart_queue": self.chart_queue,
            "queues": value(self.queues),
            "workers": value(self.workers),
            "minutes": value(self.minutes),
        }


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def ops_figures(*, queue: str | None = None) -> OpsFigures:
    """Read the figures of every queue and worker; the per-minute series covers ``queue`` (None: all).

    Three statements in one read-only transaction under ``STATEMENT_TIMEOUT_MS``; raises the
    database's error (e.g. ``QueryCanceled``) if one fails. ``queue`` is any string (an unknown
    queue charts an empty hour).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('statement_timeout', %s, true), clock_timestamp()", [str(STATEMENT_TIMEOUT_MS)]
        )
        now = cursor.fetchone()[1]
        cursor.execute("SELECT name, paused FROM stint_queue ORDER BY name")
        known = dict(cursor.fetchall())
        cursor.execute(_DEPTH_SQL)
        depth: dict[str, dict[str, int]] = {}
        for name, status, n in cursor.fetchall():
            depth.setdefault(name, {})[status] = int(n)
        since = now - dt.timedelta(minutes=WINDOW_MINUTES)
        cursor.execute(
            _WINDOW_SQL,
            {"since": since, "now": now, "minute_ago": now - dt.timedelta(minutes=1), "chart_queue": queue},
        )
        per_queue: dict[str, tuple[Any, ...]] = {}
        per_minute: dict[dt.datetime, tuple[Any, ...]] = {}
        for row in cursor.fetchall():
            if row[0]:
                per_queue[row[1]] = row[3:11]
            else:
                per_minute[row[2]] = row[11:]
        cursor.execute(
            _WORKERS_SQL,
            {"now": now, "dead_after": worker_dead_after_seconds(), "recent": RECENT_WORKERS_SECONDS},
        )
        workers = [_worker(row, now) for row in cursor.fetchall()]
    names = sorted(set(known) | set(depth) | set(per_queue))
    queues = [_queue(name, known.get(name, False), depth.get(name, {}), per_queue.get(name)) for name in names]
    return OpsFigures(now=now, queues=queues, workers=workers, minutes=_minutes(now, per_minute), chart_queue=queue)


def _queue(name: str, paused: bool, depth: dict[str, int], window: tuple[Any, ...] | None) -> QueueFigures:
    full = {status: depth.get(status, 0) for status in QUEUE_DEPTH_STATUSES}
    if window is None:
        return QueueFigures(name=name, paused=paused, depth=full)
    ok_hour, bad_hour, ok_minute, bad_minute, run50, run95, lag50, lag95 = window
    return QueueFigures(
        name=name,
        paused=paused,
        depth=full,
        completed_last_minute=int(ok_minute),
        completed_last_hour=int(ok_hour),
        failed_last_minute=int(bad_minute),
        failed_last_hour=int(bad_hour),
        run_p50_seconds=_seconds(run50),
        run_p95_seconds=_seconds(run95),
        lag_p50_seconds=_seconds(lag50),
        lag_p95_seconds=_seconds(lag95),
    )


def _worker(row: tuple[Any, ...], now: dt.datetime) -> WorkerFigures:
    (wid, host, pid, sup, pool, iso, queues, conc, busy, done, started, beat, _stopped, alive) = row
    return WorkerFigures(
        id=wid,
        hostname=host,
        pid=pid,
        supervisor_pid=sup,
        pool=pool,
        isolation=bool(iso),
        queues=_json_list(queues),
        slots_busy=int(busy),
        slots_total=int(conc),
        jobs_done=int(done),
        started_at=started,
        last_heartbeat_at=beat,
        last_heartbeat_age_seconds=round(max(0.0, (now - beat).total_seconds()), 1),
        alive=bool(alive),
    )


def _json_list(value: Any) -> list[str]:
    """A jsonb list from a raw cursor (Django's psycopg setup returns jsonb as text there)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _minutes(now: dt.datetime, rows: dict[dt.datetime, tuple[Any, ...]]) -> list[Minute]:
    end = now.replace(second=0, microsecond=0)
    out = []
    for i in range(WINDOW_MINUTES):
        minute = end - dt.timedelta(minutes=WINDOW_MINUTES - 1 - i)
        row = rows.get(minute)
        if row is None:
            out.append(Minute(minute=minute, completed=0, failed=0, lag_p50_seconds=None, lag_p95_seconds=None))
            continue
        completed, failed, lag50, lag95 = row
        out.append(
            Minute(
                minute=minute,
                completed=int(completed),
                failed=int(failed),
                lag_p50_seconds=_seconds(lag50),
                lag_p95_seconds=_seconds(lag95),
            )
        )
    return out


# -- the lag chart (pure geometry for the inline SVG) -----------------------------------------

LAG_CHART_WIDTH = 720  # SVG user units
LAG_CHART_HEIGHT = 160
LAG_CHART_TOP = 12
LAG_CHART_BOTTOM = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class LagChart:
    """Pickup lag per minute as two polylines (p50, p95) scaled to the largest p95 of the hour."""

    width: int
    height: int
    top: float
    baseline: float
    y_max_seconds: float
    p50_points: str  # SVG "x,y x,y ..." (minutes without finished jobs are left out)
    p95_points: str
    p95_max_seconds: float | None


def lag_chart_build(minutes: list[Minute]) -> LagChart:
    """Lay out ``minutes`` (oldest first, one per minute) as polylines; an idle hour draws nothing."""
    baseline = LAG_CHART_HEIGHT - LAG_CHART_BOTTOM
    usable = baseline - LAG_CHART_TOP
    highs = [m.lag_p95_seconds for m in minutes if m.lag_p95_seconds is not None]
    y_max = max(highs) if highs and max(highs) > 0 else 1.0
    slot = LAG_CHART_WIDTH / max(1, len(minutes))

    def points(attr: str) -> str:
        out = []
        for i, m in enumerate(minutes):
            value = getattr(m, attr)
            if value is None:
                continue
            x = round(i * slot + slot / 2, 2)
            y = round(baseline - usable * min(value, y_max) / y_max, 2)
            out.append(f"{x},{y}")
        return " ".join(out)

    return LagChart(
        width=LAG_CHART_WIDTH,
        height=LAG_CHART_HEIGHT,
        top=LAG_CHART_TOP,
        baseline=baseline,
        y_max_seconds=round(y_max, 3),
        p50_points=points("lag_p50_seconds"),
        p95_points=points("lag_p95_seconds"),
        p95_max_seconds=round(max(highs), 3) if highs else None,
    )
