"""Numbers for the operator dashboard on the admin index, and the geometry of its inline SVG chart.

Everything is read in a handful of aggregate queries and measured against the database clock
(DESIGN.md: never a process's clock). ``dashboard_data()`` is called by the admin index
template tag (``scheduler.templatetags.stint_ui``); nothing here writes. The event trail's card
comes from the audit app (``audit.templatetags.audit_ui``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, F, Func, Max, Min, Q, Sum, Value
from django.db.models.functions import Left, TruncMinute

from core.db_clock import age_seconds, db_now
from scheduler.action_log import actions_recent
from scheduler.job_search import error_term
from scheduler.leadership import DEFAULT_ROLE
from scheduler.models import Attempt, Job, JobAttempt, LeaderFence, OutboxBatch, Queue, WorkerNode
from scheduler.selectors import worker_alive_q
from scheduler.states import AttemptStatus, JobStatus

WINDOW_MINUTES = 60  # the chart covers the last hour, one bar per minute
CHART_WIDTH = 720  # SVG user units
CHART_HEIGHT = 160  # SVG user units
CHART_TOP = 12  # room above the tallest bar for its axis label
CHART_BOTTOM = 20  # room below the bars for the time axis
DEAD_SHOWN = 5  # dead jobs listed by name
ERROR_GROUPS_SHOWN = 5  # groups of the last hour's failed attempts listed (by type and error class)
ERROR_CLASS_CHARS = 80  # characters of an error kept as its class (the text before its first colon)
FAILED_ATTEMPTS = (AttemptStatus.FAILED, AttemptStatus.TIMED_OUT, AttemptStatus.LOST)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One minute of the chart: successes stacked under failures (SVG coordinates)."""

    minute: dt.datetime
    succeeded: int
    failed: int
    x: float
    width: float
    ok_y: float
    ok_height: float
    fail_y: float
    fail_height: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    """The throughput chart: bars, the value of the top gridline, and the axis geometry."""

    width: int
    height: int
    baseline: float
    top: float
    y_max: int
    bars: list[Bar]
    succeeded: int
    failed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Leader:
    """The cron leader: the newest term the database accepted (who, since when, its fencing token).

    ``since`` is when that term began (the fence row is written once per term, so its age is
    how long this scheduler has led, not how stale anything is). ``lock`` says what holds the
    leadership right now, from the health probes: "redis" (the Redis lock holds this holder and
    token), "postgres" (the advisory-lock fallback is held) or None (nobody holds it now: no
    scheduler leads, or the probes do not know yet).
    """

    holder: str
    token: int
    since: dt.datetime
    term_seconds: float
    lock: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorGroup:
    """Failed, timed-out or lost attempts of the last hour sharing a job type and error class.

    ``error_class`` is the error's text before its first colon (``RetryableError`` of
    ``RetryableError: FAILING always fails``), cut to ``ERROR_CLASS_CHARS``; ``sample`` is one
    whole error of the group; ``search`` is the job list's search for it (``error:<class>``),
    or "" when the class holds a double quote the search syntax cannot quote.
    """

    job_type: str
    error_class: str
    count: int
    sample: str
    search: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Dashboard:
    """What the admin index shows."""

    now: dt.datetime
    by_status: list[tuple[str, int]]
    total_jobs: int
    chart: Chart
    oldest_queued_age_seconds: float | None
    oldest_queued_id: object | None
    dead_count: int
    dead_recent: list[Job]
    workers_alive: int
    workers_gone: int
    slots_busy: int
    slots_total: int
    leader: Leader | None
    outbox_backlog: int
    outbox_oldest_age_seconds: float | None
    paused_queues: list[str] = field(default_factory=list)
    error_groups: list[ErrorGroup] = field(default_factory=list)
    operator_actions: list[Any] = field(default_factory=list)  # LogEntry rows, newest first


def chart_build(*, now: dt.datetime, counts: dict[dt.datetime, tuple[int, int]]) -> Chart:
    """Lay out one bar per minute of the hour before ``now`` from ``counts`` {minute: (succeeded, failed)}.

    Pure: bar heights are scaled to the busiest minute (at least 1 so an idle hour draws flat).
    """
    end = now.replace(second=0, microsecond=0)
    minutes = [end - dt.timedelta(minutes=WINDOW_MINUTES - 1 - i) for i in range(WINDOW_MINUTES)]
    y_max = max([ok + bad for ok, bad in counts.values()] + [1])
    baseline = CHART_HEIGHT - CHART_BOTTOM
    usable = baseline - CHART_TOP
    slot = CHART_WIDTH / WINDOW_MINUTES
    bars = []
    for i, minute in enumerate(minutes):
        ok, bad = counts.get(minute, (0, 0))
        ok_h = usable * ok / y_max
        bad_h = usable * bad / y_max
        bars.append(
            Bar(
                minute=minute,
                succeeded=ok,
                failed=bad,
                x=round(i * slot + 1, 2),
                width=round(slot - 2, 2),
                ok_y=round(baseline - ok_h, 2),
                ok_height=round(ok_h, 2),
                fail_y=round(baseline - ok_h - bad_h, 2),
                fail_height=round(bad_h, 2),
            )
        )
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        baseline=baseline,
        top=CHART_TOP,
        y_max=y_max,
        bars=bars,
        succeeded=sum(b.succeeded for b in bars),
        failed=sum(b.failed for b in bars),
    )


def _throughput(now: dt.datetime) -> dict[dt.datetime, tuple[int, int]]:
    since = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=WINDOW_MINUTES - 1)
    rows = (
        Attempt.objects.filter(finished_at__gte=since, finished_at__lte=now)
        .annotate(minute=TruncMinute("finished_at", tzinfo=dt.UTC))
        .values("minute")
        .annotate(
            ok=Count("id", filter=Q(status=AttemptStatus.SUCCEEDED)),
            bad=Count("id", filter=Q(status__in=FAILED_ATTEMPTS)),
        )
        .order_by()
    )
    return {row["minute"]: (row["ok"], row["bad"]) for row in rows}


def error_groups(*, now: dt.datetime, limit: int = ERROR_GROUPS_SHOWN) -> list[ErrorGroup]:
    """Group the attempts that failed in the hour before ``now`` by job type and error class, most first.

    ``now``: the database's time (``db_now``). Returns at most ``limit`` groups. Reads
    ``stint_job_attempt`` (only attempts that did not succeed are rows there) joined to their jobs.
    "What failed in the last hour and why", as Sidekiq's Dead tab and Sentry group it.
    """
    error_class = Left(Func(F("error"), Value(":"), Value(1), function="split_part"), ERROR_CLASS_CHARS)
    rows = (
        JobAttempt.objects.filter(
            finished_at__gt=now - dt.timedelta(minutes=WINDOW_MINUTES),
            finished_at__lte=now,
            status__in=FAILED_ATTEMPTS,
        )
        .annotate(error_class=error_class)
        .values("job__type", "error_class")
        .annotate(n=Count("id"), sample=Max("error"))
        .order_by("-n", "job__type", "error_class")[:limit]
    )
    groups = []
    for row in rows:
        cls = row["error_class"].strip()
        groups.append(
            ErrorGroup(
                job_type=row["job__type"],
                error_class=cls or "(no error text)",
                count=row["n"],
                sample=row["sample"],
                search=error_term(cls),
            )
        )
    return groups


def _leader_lock(fence: LeaderFence) -> str | None:
    """What holds this fence's term now ("redis", "postgres" or None), from the web's health probes."""
    from scheduler.health import health_report, monitor

    try:
        leader = health_report(monitor.readings())["cron_leader"]
    except Exception:  # the console must render whatever the probes do
        return None
    if leader is None or leader.get("token") != fence.token:
        return None
    return leader.get("lock")


def dashboard_data() -> Dashboard:
    """Collect the dashboard's numbers: jobs by status, the last hour's throughput, and system health."""
    now = db_now()
    by_status_map = dict(Job.objects.values_list("status").annotate(n=Count("id")).order_by())
    by_status = [(status, by_status_map.get(status, 0)) for status in JobStatus.values]
    oldest = (
        Job.objects.filter(status=JobStatus.QUEUED)
        .order_by("scheduled_at", "created_at")
        .values_list("id", "scheduled_at")
        .first()
    )
    alive = worker_alive_q(now=now)
    workers = WorkerNode.objects.aggregate(
        alive=Count("id", filter=alive),
        gone=Count("id", filter=~alive),
        busy=Sum("busy_slots", filter=alive),
        total=Sum("concurrency", filter=alive),
    )
    fence = LeaderFence.objects.filter(role=DEFAULT_ROLE).first()
    # Events, not rows (a row holds the events of one statement): the sum walks outbox_unpublished.
    outbox = OutboxBatch.objects.filter(published_at__isnull=True).aggregate(
        n=Sum("event_count"), oldest=Min("occurred_at")
    )
    return Dashboard(
        now=now,
        by_status=by_status,
        total_jobs=sum(by_status_map.values()),
        chart=chart_build(now=now, counts=_throughput(now)),
        oldest_queued_age_seconds=age_seconds(now, oldest[1]) if oldest else None,
        oldest_queued_id=oldest[0] if oldest else None,
        dead_count=by_status_map.get(JobStatus.DEAD, 0),
        dead_recent=list(
            Job.objects.filter(status=JobStatus.DEAD).defer("payload").order_by("-finished_at", "-id")[:DEAD_SHOWN]
        ),
        workers_alive=workers["alive"] or 0,
        workers_gone=workers["gone"] or 0,
        slots_busy=workers["busy"] or 0,
        slots_total=workers["total"] or 0,
        leader=(
            Leader(
                holder=fence.holder,
                token=fence.token,
                since=fence.updated_at,
                term_seconds=age_seconds(now, fence.updated_at) or 0.0,
                lock=_leader_lock(fence),
            )
            if fence is not None
            else None
        ),
        outbox_backlog=outbox["n"] or 0,
        outbox_oldest_age_seconds=age_seconds(now, outbox["oldest"]),
        paused_queues=list(Queue.objects.filter(paused=True).order_by("name").values_list("name", flat=True)),
        error_groups=error_groups(now=now),
        operator_actions=actions_recent(),
    )
