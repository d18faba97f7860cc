"""Reads for the API, pages and console: jobs, attempts and results scoped to what the asking user may see.

Also the reads those views share beyond one job: the worker-liveness rule and the workers' and
queues' counts (console), and whether a queue or type name is in use (``flow_name_use``: the
warning on a pause or flow limit that matches nothing). Nothing here writes.

Visibility rule (DESIGN.md, REST API): a USER sees their own jobs, an ADMIN sees every job.
A job the actor may not see is reported as missing (``JobNotFound``, 404), never as forbidden,
so that ids of other users' jobs cannot be probed.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any, TypedDict

from django.contrib.auth import get_user_model
from django.contrib.postgres.expressions import ArraySubquery
from django.db import OperationalError, connection, transaction
from django.db.models import (
    BooleanField,
    Case,
    Count,
    DateTimeField,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce, JSONObject, Now
from psycopg import errors as psycopg_errors

from scheduler.conf import conf
from scheduler.exceptions import JobNotFound, NoResult
from scheduler.models import Attempt, Job, JobAttempt, JobResult, Queue, WorkerNode
from scheduler.states import AttemptStatus, JobStatus

logger = logging.getLogger(__name__)

# Stable order for paging: created_at ties (jobs inserted by one statement share now()) break on id.
NEWEST_FIRST = ("-created_at", "-id")


def job_visible_to(*, actor: Any) -> QuerySet[Job]:
    """Return the jobs ``actor`` (a User) may see: every job for an ADMIN, their own otherwise."""
    if getattr(actor, "is_admin", False):
        return Job.objects.all()
    return Job.objects.filter(owner_id=actor.pk)


# A handler's result has no size limit and lives in the job row: lists leave it in the database.
LIST_DEFERRED = ("result",)


def job_list_owned(*, owner: Any) -> QuerySet[Job]:
    """Return ``owner``'s jobs, newest first (also for an ADMIN: the admin list is ``job_list_all``).

    The handler's ``result`` is deferred (``LIST_DEFERRED``): a list never shows it.
    """
    return Job.objects.filter(owner_id=owner.pk).defer(*LIST_DEFERRED).order_by(*NEWEST_FIRST)


def job_list_all() -> QuerySet[Job]:
    """Return every owner's jobs, newest first (the ADMIN list), the ``result`` deferred as in ``job_list_owned``."""
    return Job.objects.defer(*LIST_DEFERRED).order_by(*NEWEST_FIRST)


def job_get(*, job_id: uuid.UUID, actor: Any) -> Job:
    """Return the job ``job_id`` if ``actor`` may see it; raise ``JobNotFound`` otherwise."""
    job = job_visible_to(actor=actor).filter(id=job_id).first()
    if job is None:
        raise JobNotFound()
    return job


class Cancellation(TypedDict):
    """What became of a cancellation requested of a job (``job_cancellation``)."""

    code: str  # "requested": RUNNING, its worker stops it; "finished_first": it ended before it stopped
    message: str


CANCEL_REQUESTED_MESSAGE = "Cancellation requested: the job stops when its handler next checks."


def job_cancellation(job: Job) -> Cancellation | None:
    """Say what became of the cancellation requested of ``job`` (a RUNNING one's ``cancel_requested``), if any.

    None when none was requested, or when the job ended CANCELLED (its status says it all).
    ``requested`` while it still runs. ``finished_first`` when its handler returned (SUCCESS) or
    raised a permanent error (FAILED) before it checked for the request: a thread handler that
    never looks at ``ctx.cancelled``. The flag is kept on such a job as the record that someone
    asked, and explained here rather than cleared by the outcome's statement, which stays one
    cheap write (as River keeps ``cancel_attempted_at`` on a job that completed anyway, and
    Celery's revoke leaves a finished task SUCCESS). Reads only the job's own fields.
    """
    if not job.cancel_requested or job.status == JobStatus.CANCELLED:
        return None
    if job.status == JobStatus.RUNNING:
        return {"code": "requested", "message": CANCEL_REQUESTED_MESSAGE}
    return {
        "code": "finished_first",
        "message": f"Cancellation was requested, but the job finished first ({job.status}): its handler ended"
        " before it checked for the request.",
    }


def job_attempt_list(*, job_id: uuid.UUID, actor: Any) -> QuerySet[Attempt]:
    """Return the attempts of a job ``actor`` may see, first attempt first; raise ``JobNotFound`` otherwise.

    The finished attempts only (``Attempt``: rows, and a successful one kept in the job row): a
    RUNNING job's current attempt has no record until its outcome (``job_running_attempt`` describes it).
    """
    if not job_visible_to(actor=actor).filter(id=job_id).exists():
        raise JobNotFound()
    return Attempt.objects.filter(job_id=job_id).order_by("attempt_number")


def job_running_attempt(*, job_id: uuid.UUID) -> Attempt | None:
    """Return the attempt a RUNNING job is making now, as an unsaved ``Attempt``, or None.

    Attempts are written once, at their outcome (``scheduler.lifecycle``'s verbs); until then the job row
    (``attempts``, ``lease_owner``, ``started_at``) describes the running one. No access check:
    callers check the job first (``job_attempt_list``).
    """
    row = (
        Job.objects.filter(id=job_id, status=JobStatus.RUNNING)
        .values_list("attempts", "lease_owner", "lease_token", "started_at")
        .first()
    )
    if row is None or not row[0] or JobAttempt.objects.filter(job_id=job_id, attempt_number=row[0]).exists():
        return None
    attempts, worker, token, started_at = row
    return Attempt(
        id=str(job_id),
        job_id=job_id,
        attempt_number=attempts,
        status=AttemptStatus.RUNNING,
        worker=worker or "",
        lease_token=token,
        started_at=started_at,
        error="",
        traceback="",
    )


def job_result_get(*, job_id: uuid.UUID, actor: Any) -> JobResult:
    """Return the result of a job ``actor`` may see (``JobResult``, read from the job row, one query).

    Raises ``JobNotFound`` when the job is missing or not visible, ``NoResult`` (404, code
    ``no_result``) while it has none.
    """
    row = (
        job_visible_to(actor=actor)
        .filter(id=job_id)
        .values_list("result_attempt", "result_status", "result", "result_at")
        .first()
    )
    if row is None:
        raise JobNotFound()
    if row[0] is None:
        raise NoResult()
    return JobResult(job_id=job_id, attempt=row[0], status=row[1], result=row[2], created_at=row[3])


# -- worker liveness ----------------------------------------------------------------------------
# One rule for the rescuer's reaper, the admin, the dashboard, the health check and the metrics: a
# worker process is alive while it is not stopped and heartbeated within WORKER_DEAD_AFTER_SECONDS
# (SCHEDULER setting, default 60 s), measured on the database clock.

# SQL over stint_worker_node's columns; ``{now}`` is an SQL timestamp (``now()`` or a parameter),
# and the query passes ``%(dead_after)s`` = ``worker_dead_after_seconds()``.
WORKER_ALIVE_SQL = "(stopped_at IS NULL AND last_heartbeat_at >= {now} - make_interval(secs => %(dead_after)s))"


def worker_dead_after_seconds() -> int:
    """Return the seconds without a heartbeat after which a worker process counts as gone."""
    return conf().worker_dead_after_seconds


def worker_alive_sql(*, now: str = "now()") -> str:
    """Return ``WORKER_ALIVE_SQL`` measured against ``now`` (an SQL expression); needs ``%(dead_after)s``."""
    return WORKER_ALIVE_SQL.format(now=now)


def worker_alive_q(*, now: dt.datetime | None = None) -> Q:
    """Return the ORM filter of alive ``WorkerNode`` rows, against ``now`` (aware) or the database's ``now()``."""
    dead_after = dt.timedelta(seconds=worker_dead_after_seconds())
    cutoff: Any = (
        now - dead_after
        if now is not None
        else ExpressionWrapper(Now() - Value(dead_after), output_field=DateTimeField())
    )
    return Q(stopped_at__isnull=True, last_heartbeat_at__gte=cutoff)


# -- the operator console's reads (scheduler.admin) ----------------------------------------------

# Distinct owners of jobs by a loose index scan of job_owner_recent: one probe per owner.
_OWNERS_WITH_JOBS = """
    WITH RECURSIVE owners(id, n) AS (
        (SELECT owner_id, 1 FROM stint_job WHERE owner_id IS NOT NULL ORDER BY owner_id LIMIT 1)
        UNION ALL
        SELECT (SELECT owner_id FROM stint_job WHERE owner_id > owners.id ORDER BY owner_id LIMIT 1), n + 1
        FROM owners WHERE owners.id IS NOT NULL AND n < %s
    )
    SELECT id FROM owners WHERE id IS NOT NULL
"""


def owners_with_jobs(*, limit: int) -> list[tuple[int, str]]:
    """Return up to ``limit`` owners that have jobs as (user id, username), by username.

    Walks the ``job_owner_recent`` index one probe per owner (a loose index scan), so the cost
    follows the number of owners, not of jobs (Django's ``DISTINCT owner_id`` reads every job).
    """
    with connection.cursor() as cursor:
        cursor.execute(_OWNERS_WITH_JOBS, [limit])
        ids = [row[0] for row in cursor.fetchall()]
    users = get_user_model().objects.filter(pk__in=ids).order_by("username").values_list("pk", "username")
    return list(users)


def jobs_count_by_status(jobs: QuerySet[Job]) -> dict[str, int]:
    """Return ``{status: count}`` over ``jobs`` (one grouped query)."""
    return dict(jobs.order_by().values_list("status").annotate(n=Count("id")))


def _count_of(jobs: QuerySet[Job], group: str) -> Any:
    counted = jobs.order_by().values(group).annotate(n=Count("id")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def workers_with_liveness(workers: QuerySet[WorkerNode]) -> QuerySet[WorkerNode]:
    """Annotate ``is_alive`` (``worker_alive_q``) and ``running`` (RUNNING jobs whose lease it holds)."""
    running = Job.objects.filter(status=JobStatus.RUNNING, lease_owner=OuterRef("id"))
    return workers.annotate(
        is_alive=Case(When(worker_alive_q(), then=Value(True)), default=Value(False), output_field=BooleanField()),
        running=_count_of(running, "lease_owner"),
    )


RUNNING_SHOWN = 3  # running jobs named in each row of the console's worker list; the rest are counted


class _EpochSeconds(Func):
    """``EXTRACT(EPOCH FROM <interval>)``: an interval's length in seconds."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)"
    output_field = FloatField()


class RunningJobBrief(TypedDict):
    """One running job as a worker's row names it: ``id`` (uuid text), ``type``, ``seconds`` it has run (or None)."""

    id: str
    type: str
    seconds: float | None


def workers_with_running_shown(workers: QuerySet[WorkerNode], *, limit: int = RUNNING_SHOWN) -> QuerySet[WorkerNode]:
    """Annotate ``running_shown``: up to ``limit`` RUNNING jobs whose lease each worker holds, oldest start first.

    Each is a ``RunningJobBrief``; ``seconds`` is ``now() - started_at`` by the database clock
    (which wrote ``started_at``), at the statement's start. The jobs come in the workers' own query
    (one array subquery per row, as ``running`` counts them): a page of workers costs no query per
    worker (Sidekiq's Busy page, Flower's workers).
    """
    running = (
        Job.objects.filter(status=JobStatus.RUNNING, lease_owner=OuterRef("id"))
        .order_by("started_at", "id")
        .values(brief=JSONObject(id="id", type="type", seconds=_EpochSeconds(Now() - F("started_at"))))[:limit]
    )
    return workers.annotate(running_shown=ArraySubquery(running))


def worker_running_jobs(*, worker_id: str, limit: int = 100) -> QuerySet[Job]:
    """Return up to ``limit`` RUNNING jobs whose lease worker ``worker_id`` holds, oldest start first."""
    return Job.objects.filter(status=JobStatus.RUNNING, lease_owner=worker_id).order_by("started_at")[:limit]


def queues_with_counts(queues: QuerySet[Queue]) -> QuerySet[Queue]:
    """Annotate each queue's ``queued_count`` (QUEUED jobs) and ``running_count`` (RUNNING jobs)."""

    def count(status: str) -> Any:
        return _count_of(Job.objects.filter(queue=OuterRef("name"), status=status), "queue")

    return queues.annotate(queued_count=count(JobStatus.QUEUED), running_count=count(JobStatus.RUNNING))


def queue_names() -> list[str]:
    """Return the name of every known queue (a ``stint_queue`` row), sorted."""
    return list(Queue.objects.order_by("name").values_list("name", flat=True))


# Which of the (scope, name) pairs something uses, in one statement: a queue by a schedule's job
# template, a live worker restricted to it (when %(workers)s), or a job of any status (the default
# queue, always in use, is never asked); a type by a schedule (handlers and tasks are known in
# memory). No index serves the job check: an index on stint_job.queue cost every row version of a
# job outside the default queue an entry (about 210 bytes of WAL a job, 15%) for an advisory
# warning; the scan stops at a name's first job and is bounded by IN_USE_CHECK_MS. The comment
# names the query in logs and the tests' captured queries.
FLOW_NAMES_IN_USE_SQL = f"""
    /* flow_names_in_use */
    SELECT n.scope, n.name FROM unnest(%(scopes)s::text[], %(names)s::text[]) AS n(scope, name)
    WHERE CASE WHEN n.scope = 'queue' THEN
            EXISTS (SELECT 1 FROM stint_schedule s WHERE s.job_queue = n.name)
            OR (%(workers)s AND EXISTS (SELECT 1 FROM stint_worker_node WHERE queues ? n.name AND {worker_alive_sql()}))
            OR EXISTS (SELECT 1 FROM stint_job j WHERE j.queue = n.name AND j.queue <> %(default)s)
          ELSE EXISTS (SELECT 1 FROM stint_schedule s WHERE s.job_type = n.name) END
"""  # noqa: S608 - constant SQL


def flow_names_params(names: list[tuple[str, str]], *, workers: bool = True) -> dict[str, Any]:
    """Return ``FLOW_NAMES_IN_USE_SQL``'s parameters for ``names``, a list of (scope, name) pairs.

    ``workers``: a live worker restricted to a queue counts as its use.
    """
    from scheduler.models import DEFAULT_QUEUE

    return {
        "scopes": [scope for scope, _ in names],
        "names": [name for _, name in names],
        "default": DEFAULT_QUEUE,
        "dead_after": worker_dead_after_seconds(),
        "workers": workers,
    }


def flow_names_in_use(*, names: Any, workers: bool = True) -> set[tuple[str, str]]:
    """Return the pairs of ``names`` (an iterable of (scope, name), scope "queue" or "type") that something uses.

    A flow limit or pause on a name nothing uses is kept (as Oban lets a queue be paused before its
    first job), and the API and console say so: a typo would otherwise never match, silently. Use is
    real use, never a ``stint_queue`` row (a pause makes one):

    - a queue: the default queue; a job of any status in it (a finished one in retention too); a
      schedule whose job template targets it; a live worker restricted to it (``worker_alive_q``:
      one serving every queue names none); a registered job type whose default queue it is
      (``registry.registered_queues``: Django's ``@task(queue_name=...)``);
    - a type: a ``@handler`` or Django task runs it (``registry.resolve``), or a schedule creates it.

    ``workers=False`` leaves live workers out of a queue's use (``queues.queues_unused``: the
    worker asking serves the names it asks about).

    Cost: at most one query, whatever the number of names (none when memory answers for all). The
    job check has no index (see ``FLOW_NAMES_IN_USE_SQL``): it reads jobs until a name's first one,
    so a name no job carries reads the whole job table, about 0.4 s a million jobs. The statement
    runs under a ``statement_timeout`` of ``IN_USE_CHECK_MS``; past it every name asked is
    answered as in use (no warning rather than a false one, and the caller is not held up). A name
    no queue or type could have (a NUL, a space: ``flow.limits.NAME``) is used by nothing and is
    not sent to the database, which refuses a NUL. Raises only database errors.
    """
    from scheduler.exceptions import UnknownJobType
    from scheduler.flow.limits import NAME
    from scheduler.models import DEFAULT_QUEUE
    from scheduler.registry import registered_queues, resolve

    used: set[tuple[str, str]] = set()
    ask: list[tuple[str, str]] = []
    task_queues: set[str] | None = None
    for scope, name in dict.fromkeys(names):
        if scope not in ("queue", "type") or not isinstance(name, str) or not NAME.match(name):
            continue
        if scope == "queue":
            if task_queues is None:
                task_queues = registered_queues()
            known = name == DEFAULT_QUEUE or name in task_queues
        else:
            try:
                resolve(name)
            except UnknownJobType:
                known = False
            else:
                known = True
        if known:
            used.add((scope, name))
        else:
            ask.append((scope, name))
    if ask:
        used.update(_names_in_use_bounded(ask, workers=workers))
    return used


IN_USE_CHECK_MS = 2000  # bound of flow_names_in_use's statement (a full scan of a few million jobs)


def _names_in_use_bounded(ask: list[tuple[str, str]], *, workers: bool = True) -> set[tuple[str, str]]:
    """Run ``FLOW_NAMES_IN_USE_SQL`` for ``ask`` under ``IN_USE_CHECK_MS``; all of ``ask`` when it runs out.

    In a savepoint, so a cancelled statement leaves the caller's transaction usable; the time bound
    is set transaction-locally (``set_config(..., true)``, as ``ops_figures`` does) and put back
    after, so it never outlives this statement in a caller's transaction.
    """
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)",
                [f"{IN_USE_CHECK_MS}ms"],
            )
            before = cursor.fetchone()[0]
            cursor.execute(FLOW_NAMES_IN_USE_SQL, flow_names_params(ask, workers=workers))
            found = {(scope, name) for scope, name in cursor.fetchall()}
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [before])
            return found
    except OperationalError as exc:
        if not isinstance(exc.__cause__, psycopg_errors.QueryCanceled | psycopg_errors.LockNotAvailable):
            raise
        logger.info(
            "flow_names_in_use: no answer within %d ms for %d names; taken as in use", IN_USE_CHECK_MS, len(ask)
        )
        return set(ask)


def flow_name_in_use(*, scope: str, name: str) -> bool:
    """True when something uses ``scope`` ("queue" or "type") ``name``: ``flow_names_in_use``'s rule, one name."""
    return (scope, name) in flow_names_in_use(names=[(scope, name)])


class FlowNameUse(TypedDict):
    """Whether a flow limit's or a pause's name matches anything: the API's ``in_use`` and ``warning`` fields."""

    in_use: bool
    warning: str | None


def flow_name_use(*, scope: str, name: str, resumed: bool = False, in_use: bool | None = None) -> FlowNameUse:
    """Return ``flow_name_in_use`` for ``scope`` ("queue"/"type") ``name`` and, when False, the warning to show.

    The API (limits, pause and resume) and the console (the queues' pause and resume actions, the
    Flow limits page) show the same words. ``resumed``: the name is a queue just resumed, where
    nothing is kept for its first jobs. ``in_use``: the answer already read for a page of names
    (``flow_names_in_use``), so no query is made here.
    """
    if in_use is None:
        in_use = flow_name_in_use(scope=scope, name=name)
    if in_use:
        warning = None
    elif scope == "queue" and resumed:
        warning = f"No job, schedule or worker uses the queue {name!r}: check the name. It is not paused."
    elif scope == "queue":
        warning = (
            f"No job, schedule or worker uses the queue {name!r} yet: check the name. The setting is kept "
            "and applies to the queue's first jobs."
        )
    else:
        warning = (
            f"No handler runs the job type {name!r} and no schedule creates it: check the name. The limit is "
            "kept and applies to jobs of that type if one is registered."
        )
    return {"in_use": in_use, "warning": warning}
