"""The one writer of job status: a named verb per transition, each one guarded statement with its events.

Every status change in Stint is a call to one of this module's verbs, and each verb owns what
its move writes: the job's columns (the result among them: ``Job.result*``), the attempt's
``JobAttempt`` row (written here and nowhere else; a successful attempt has none, the job row is
its record: ``models.Attempt``), and its events' payloads.

- New jobs: ``insert_jobs`` / ``create_jobs`` (CREATED -> QUEUED or SCHEDULED).
- The worker: ``claim`` (QUEUED -> RUNNING), then one of ``complete`` (SUCCESS), ``fail``
  (FAILED: a permanent error), ``retry_later`` (RETRYING after a backoff), ``dead_letter``
  (DEAD: no attempts left), ``cancel_running`` (CANCELLED: its stop was requested) and
  ``hand_back`` (RETRYING now: the worker shut down; the attempt costs nothing), fenced by the
  lease token.
- The scheduler: ``promote`` (SCHEDULED/RETRYING -> QUEUED when due) and ``rescue_leases``
  (RUNNING -> RETRYING, DEAD or CANCELLED for a worker that went silent or died).
- People: ``cancel`` (CREATED/SCHEDULED/QUEUED/RETRYING -> CANCELLED), ``request_cancel`` (a
  RUNNING job's ``cancel_requested``; its worker makes the move), ``retry_failed`` (FAILED ->
  RETRYING) and ``recover`` (DEAD -> QUEUED), the last two with a fresh attempt budget.

Which of retry, dead-letter or cancel follows a failed attempt is ``retry.after_failed_attempt``,
decided by the callers; the verbs only write. Each verb is one SQL statement per target status
(``_transition``): a conditional ``UPDATE ... WHERE status = ANY(expected)`` (fenced by
``lease_token`` where a worker holds the job) whose returned rows say which jobs moved, chained
by data-modifying CTEs to the ``INSERT`` of ONE ``OutboxBatch`` row holding an event per moved
job (and of attempt rows), with the job's ``event_sequence`` incremented in the same UPDATE so that per-job
sequences have no gaps. The caller supplies the transaction.
"""

from __future__ import annotations

import functools
import json
import operator
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from psycopg.types.json import Jsonb

from core.stored_json import unreadable_why
from scheduler import metrics, prepared, retry
from scheduler.exceptions import IllegalTransition
from scheduler.notify import CHANNEL, PAYLOAD_TOKEN_SQL
from scheduler.states import CANCELLABLE, TRANSITIONS, AttemptStatus, EventType, JobStatus

SCHEMA_VERSION = 1
# The order claims take QUEUED jobs in, the one the partial indexes job_claim_scan_desc (within
# each of its unheld and held parts) and job_isolated_claim_scan serve (``claim``; the claim index
# upkeep probes the same scan).
CLAIM_ORDER = "priority DESC, scheduled_at, created_at"
# HOT_PATH_RECORDS: ``Moved``, ``AttemptEnd`` and ``Claimed`` are made once or more per job and never
# changed after; they are not ``frozen`` because a frozen dataclass's __init__ costs about 4x a
# plain one's (3 us vs 0.7 us for Claimed's 14 fields). ``unsafe_hash`` keeps frozen's hashing.

# Columns a transition may assign besides status (never owner, id or payload).
ASSIGNABLE = frozenset(
    {
        "scheduled_at",
        "attempts",
        "attempts_base",
        "lease_owner",
        "lease_token",
        "lease_expires_at",
        "cancel_requested",
        "started_at",
        "finished_at",
        "last_error",
        "isolated",
        "result_at",
        "result_attempt",
        "result_status",
        "result",
    }
)


@dataclass(frozen=True, slots=True)
class _Sql:
    """Raw SQL for ``_transition`` to assign, e.g. ``_Sql("now()")``; ``v.<name>`` reads a per-row value."""

    text: str


# One packed event (the composite type ``stint_packed_event``, migration 0014): every statement
# that moves or creates jobs writes ONE ``stint_outbox`` row whose ``packed_events`` array holds one
# of these per event, in the order the relay produces them. The SQL function
# ``stint_outbox_entries`` renders each where it is read, as the fields of
# ``scheduler.models.EVENT_KEYS`` (its ``event_id`` derived from job id and sequence; its payload
# ``type``, ``queue``, the priority's label, then ``extra``'s pairs). Building that JSON here cost about 6 us an event,
# the packed value about 1.5. Filled with SQL expressions by ``str.format``; ``row`` is "" or an
# alias and a dot for the type, queue and priority columns.
PACKED_EVENT_SQL = (
    "ROW({event}, {job}, {owner}, {sequence}, {attempt}, {source}, {to}, {row}type, {row}queue, {row}priority,"
    " {extra})::stint_packed_event"
)

_NOW = _Sql("now()")
_NULL = _Sql("NULL")


@dataclass(slots=True, kw_only=True, unsafe_hash=True)  # not frozen: see HOT_PATH_RECORDS
class Moved:
    """A job that moved: its id, the status it left, and the event sequence written."""

    job_id: uuid.UUID
    from_status: str
    sequence: int
    attempts: int


def _expected_for(to: JobStatus, expected: JobStatus | Iterable[JobStatus] | None) -> list[str]:
    if expected is None:
        sources = [f for (f, t) in TRANSITIONS if t == to]
    elif isinstance(expected, str):
        sources = [JobStatus(expected)]
    else:
        sources = [JobStatus(s) for s in expected]
    for source in sources:
        if (source, to) not in TRANSITIONS:
            raise IllegalTransition(f"{source} -> {to} is not an allowed transition")
    return [str(s) for s in sources]


def _transition(
    *,
    job_ids: Sequence[uuid.UUID],
    to: JobStatus,
    expected: JobStatus | Iterable[JobStatus] | None = None,
    event: EventType | None = None,
    assign: Mapping[str, Any] | None = None,
    per_row: Mapping[str, tuple[str, Sequence[Any]]] | None = None,
    lease_tokens: Sequence[uuid.UUID] | None = None,
    event_payloads: Sequence[Mapping[str, Any]] | None = None,
    also: Sequence[str] = (),
) -> list[Moved]:
    """Move each job in ``job_ids`` whose status is in ``expected`` to ``to``; return the winners.

    - ``expected``: one status, several, or None for every source the table allows; a pair
      missing from ``TRANSITIONS`` raises ``IllegalTransition`` before touching the database.
    - ``assign``: column -> a Python value (same for every row) or ``_Sql`` expression; columns
      must be in ``ASSIGNABLE``.
    - ``per_row``: name -> (PostgreSQL type, values aligned with ``job_ids``), readable in
      ``assign`` as ``_Sql("v.<name>")``.
    - ``lease_tokens``: when given (aligned with ``job_ids``), a job moves only while it still
      holds that token (the fencing rule of DESIGN.md).
    - ``event_payloads``: per-row JSON merged into each event's payload.
    - ``also``: further data-modifying CTEs (``"name AS (INSERT ...)"``, constant SQL from our
      own code) written by the same statement; they read ``moved`` (the jobs that moved: ``id``,
      ``attempts``...) and ``v`` (the per-row inputs), so they touch exactly the winners.

    Returns ``Moved`` rows in no particular order; a job absent from them lost the race or was
    not in an expected state. Rows are locked in id order so concurrent batches cannot deadlock.
    Must run inside the caller's transaction (events and status commit together).
    """
    to = JobStatus(to)
    sources = _expected_for(to, expected)
    if not job_ids:
        return []
    if len(sources) == 1:
        event = event or TRANSITIONS[(JobStatus(sources[0]), to)]
    elif event is None:
        events = {TRANSITIONS[(JobStatus(s), to)] for s in sources}
        if len(events) != 1:
            raise ValueError(f"ambiguous event for {sources} -> {to}; pass event=")
        event = events.pop()
    n = len(job_ids)
    params: dict[str, Any] = {"expected": sources, "to": str(to), "event": str(event)}
    inputs: list[tuple[str, str, Sequence[Any]]] = [("id", "uuid", job_ids)]
    if lease_tokens is not None:
        if len(lease_tokens) != n:
            raise ValueError("lease_tokens must align with job_ids")
        inputs.append(("token", "uuid", lease_tokens))
    # An empty payload goes as SQL NULL (the events' function reads it as no pairs): a success
    # batch's events have none, and each {} cost a dict, its JSON and PostgreSQL's jsonb parse.
    payloads = [dict(p) or None for p in event_payloads] if event_payloads is not None else [None] * n
    if len(payloads) != n:
        raise ValueError("event_payloads must align with job_ids")
    inputs.append(("evp", "jsonb", payloads))
    for name, (pg_type, values) in (per_row or {}).items():
        if not name.isidentifier() or not pg_type.replace("[", "").replace("]", "").replace(" ", "").isalnum():
            raise ValueError(f"bad per-row input {name}::{pg_type}")
        if len(values) != n:
            raise ValueError(f"per_row[{name}] must align with job_ids")
        inputs.append((name, pg_type, values))
    params["rows"] = _rows_document(inputs)

    # A job leaves QUEUED, or enters it, unheld: only a limited claim phase marks a job held.
    sets = ["status = %(to)s", "updated_at = now()", "event_sequence = j.event_sequence + 1", "flow_held = false"]
    for i, (column, value) in enumerate((assign or {}).items()):
        if column not in ASSIGNABLE:
            raise ValueError(f"column {column!r} is not assignable by a transition")
        if isinstance(value, _Sql):
            sets.append(f"{column} = {value.text}")
        else:
            params[f"a{i}"] = value
            sets.append(f"{column} = %(a{i})s")
    fence = "AND j.lease_token = v.token" if lease_tokens is not None else ""
    sql = f"""
        WITH v AS (
            {_from_document((name, pg_type) for name, pg_type, _ in inputs)}
        ), locked AS (
            -- One primary-key lookup per input row, whatever the statistics say: a join would let
            -- the planner scan every RUNNING job when it believes there are none (OFFSET 0 keeps
            -- the subquery from being flattened into such a join). The FOR UPDATE below is applied
            -- inside that subquery, row by row as the input is read: the input is read in id
            -- order, so that the locks are taken in id order, not in the order of the caller's rows.
            SELECT j.id, j.status AS old_status
            FROM (SELECT * FROM v ORDER BY id) v,
                 LATERAL (SELECT s.id, s.status, s.lease_token FROM stint_job s WHERE s.id = v.id OFFSET 0) j
            WHERE j.status = ANY(%(expected)s::text[]) {fence}
            ORDER BY j.id
            FOR UPDATE OF j
        ), moved AS (
            UPDATE stint_job j SET {", ".join(sets)}
            FROM locked l, v
            WHERE j.id = l.id AND v.id = j.id
            RETURNING j.id, l.old_status, j.event_sequence, j.attempts, j.owner_id, j.type, j.queue,
                      j.priority, v.evp, j.started_at
        ), ev AS ({_outbox_row(source="old_status", to="%(to)s::text", extra="evp")}
        ){"".join(f", {cte}" for cte in also)}
        SELECT id, old_status, event_sequence, attempts FROM moved
    """  # noqa: S608 - identifiers are whitelisted above; values are bound parameters
    # Prepared (once per connection and statement text): with the rows in one jsonb document and
    # one primary-key lookup per row, the plan no longer depends on the batch size (it did with
    # unnest()ed arrays, whose generic plan made large batches twice as slow). Planning was about
    # 1 ms a statement: a one-job outcome took 2.5-2.6 ms unprepared, 1.4-1.5 ms prepared.
    rows = prepared.fetchall(sql, params)
    return [Moved(job_id=r[0], from_status=r[1], sequence=r[2], attempts=r[3]) for r in rows]


def _outbox_row(*, source: str, to: str, extra: str) -> str:
    """The INSERT of ONE outbox row holding a packed event (``%(event)s``) for each row of ``moved``.

    ``source``/``to``: SQL of the event's from/to status; ``extra``: SQL of a jsonb object (or
    NULL) whose pairs follow type, queue and priority in its payload. ``moved`` gives id, owner_id,
    event_sequence, attempts, type, queue and priority. Ordered by job id; no row when nothing
    moved. The claim and every transition write their events through it (new jobs write theirs
    in pairs: ``_insert_sql``).
    """
    event = PACKED_EVENT_SQL.format(
        event="%(event)s::text",
        job="id",
        owner="owner_id",
        sequence="event_sequence",
        attempt="attempts",
        source=source,
        to=to,
        row="",
        extra=extra,
    )
    return f"""
            INSERT INTO stint_outbox (schema_version, occurred_at, event_count, packed_events)
            SELECT {SCHEMA_VERSION}, now(), count(*), array_agg({event} ORDER BY id)
            FROM moved
            HAVING count(*) > 0"""  # noqa: S608 - constants only


def _rows_document(inputs: Sequence[tuple[str, str, Sequence[Any]]]) -> str:
    """The per-row inputs of a statement as one JSON object of columns, for ``_from_document``.

    ``inputs``: (name, PostgreSQL type, values aligned with the rows) -> ``{name: [one value per
    row]}``; raises ``ValueError`` when the columns differ in length. One text parameter, encoded
    by the C JSON encoder, instead of an array parameter per input that psycopg quotes element by
    element in Python (a fifth of a worker's CPU in a drain); by column rather than an object per
    row, which cost the encoder about 2.6 times as much (3.2 against 1.2 us a row of a success
    outcome). UUIDs travel as their 32 hex digits (``UUID.hex``, which PostgreSQL's uuid input
    reads, at 0.19 us against ``str``'s 0.49), datetimes as ISO 8601 (offset included), ``Jsonb``
    values as their object; a jsonb input's value is wrapped as ``{"v": value}`` so that a JSON
    ``null`` stays a jsonb null and only None is SQL NULL.
    """
    document: dict[str, list[Any]] = {}
    rows = None
    for name, pg_type, values in inputs:
        if pg_type == "uuid":
            # Anything but a UUID goes as its text, for PostgreSQL to accept or refuse.
            encoded: list[Any] = [v.hex if isinstance(v, uuid.UUID) else None if v is None else str(v) for v in values]
        elif pg_type == "timestamptz":
            encoded = [v.isoformat() if v is not None else None for v in values]
        elif pg_type == "jsonb":
            encoded = [None if v is None else {"v": v.obj if isinstance(v, Jsonb) else v} for v in values]
        else:
            encoded = list(values)
        if rows is None:
            rows = len(encoded)
        elif len(encoded) != rows:
            raise ValueError(f"input {name} has {len(encoded)} values for {rows} rows")
        document[name] = encoded
    return json.dumps(document)


def _from_document(columns: Iterable[tuple[str, str]]) -> str:
    """``SELECT ... FROM`` the ``%(rows)s`` document (``_rows_document``): one row per position.

    ``columns``: (name, PostgreSQL type) in the document. ``ROWS FROM`` walks the columns' arrays
    side by side, in order; each value is cast from its JSON text to its type, a jsonb one unwrapped
    from its ``{"v": ...}``.
    """
    columns = list(columns)
    arrays = ", ".join(
        f"jsonb_array_elements(d.doc -> '{name}')"
        if kind == "jsonb"
        else f"jsonb_array_elements_text(d.doc -> '{name}')"
        for name, kind in columns
    )
    selected = ", ".join(
        f"r.{name} -> 'v' AS {name}" if kind == "jsonb" else f"r.{name}::{kind} AS {name}" for name, kind in columns
    )
    names = ", ".join(name for name, _ in columns)
    return f"SELECT {selected} FROM (SELECT %(rows)s::jsonb AS doc) d, ROWS FROM ({arrays}) AS r({names})"  # noqa: S608 - constants only


def _transition_one(
    *,
    job_id: uuid.UUID,
    to: JobStatus,
    expected: JobStatus | Collection[JobStatus] | None = None,
    event: EventType | None = None,
    assign: Mapping[str, Any] | None = None,
    lease_token: uuid.UUID | None = None,
    event_payload: Mapping[str, Any] | None = None,
) -> Moved | None:
    """Move one job; return its ``Moved`` row, or None when it was not in an expected state."""
    moved = _transition(
        job_ids=[job_id],
        to=to,
        expected=expected,
        event=event,
        assign=assign,
        lease_tokens=[lease_token] if lease_token is not None else None,
        event_payloads=[event_payload] if event_payload is not None else None,
    )
    return moved[0] if moved else None


# -- the worker's verbs: the end of a leased attempt ----------------------------------------------


@dataclass(slots=True, kw_only=True, unsafe_hash=True)  # not frozen: see HOT_PATH_RECORDS
class AttemptEnd:
    """How one leased attempt ended: what its ``JobAttempt`` row, the job and the event record.

    - ``lease_token``: the lease the attempt held; the write happens only while the job still
      holds it (the fencing rule of DESIGN.md).
    - ``status``: the attempt row's status (SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, LOST).
    - ``worker``, ``started_at``: who ran it and since when: an aware datetime, the time its
      handler began when that was later than its claim (a job claimed ahead waits for a slot),
      written to the job row too; None: the job row's ``started_at`` (its claim) stands.
    - ``finished_at``: an aware datetime, or None for the database's now().
    - ``error`` (the job's ``last_error`` and the event's ``error``), ``traceback``: storable text.
    - ``isolated``: the job's ``isolated`` flag afterwards; None leaves it as it is.
    - ``reason``: the event payload's ``reason`` ("" for none), e.g. ``timed_out``.
    - ``result``: the handler's JSON result, stored by ``complete`` only.
    """

    job_id: uuid.UUID
    lease_token: uuid.UUID
    status: AttemptStatus
    worker: str = ""
    started_at: Any = None  # aware datetime or None
    finished_at: Any = None  # aware datetime or None
    error: str = ""
    traceback: str = ""
    isolated: bool | None = False
    reason: str = ""
    result: Any = None


def complete(ends: Sequence[AttemptEnd]) -> list[Moved]:
    """RUNNING -> SUCCESS: finish each job and store its result; JOB_COMPLETED.

    The successful attempt gets no ``JobAttempt`` row: the job row is its record (``Attempt``,
    the view ``stint_attempt``, shows it): ``result_attempt`` its number, ``started_at`` and
    ``finished_at`` its times, and ``lease_owner``/``lease_token``, which a SUCCESS job keeps, the
    worker and the lease it ran under (only ``lease_expires_at`` is cleared). Raises
    ``ValueError`` for an end whose status is not SUCCEEDED.
    """
    if any(e.status != AttemptStatus.SUCCEEDED for e in ends):
        raise ValueError("complete records SUCCEEDED attempts only")
    return _end_attempts(ends, to=JobStatus.SUCCESS, attempt_row=False)


def fail(ends: Sequence[AttemptEnd]) -> list[Moved]:
    """RUNNING -> FAILED (a permanent error: never retried on its own); attempt row and result; JOB_FAILED."""
    return _end_attempts(ends, to=JobStatus.FAILED)


def dead_letter(ends: Sequence[AttemptEnd]) -> list[Moved]:
    """RUNNING -> DEAD (the attempt failed and the budget is spent); attempt row and result; JOB_DEAD."""
    return _end_attempts(ends, to=JobStatus.DEAD)


def cancel_running(ends: Sequence[AttemptEnd]) -> list[Moved]:
    """RUNNING -> CANCELLED (the worker stopped the handler as asked); attempt row and result; JOB_CANCELLED."""
    return _end_attempts(ends, to=JobStatus.CANCELLED)


def retry_later(ends: Sequence[AttemptEnd], *, delays: Sequence[float]) -> list[Moved]:
    """RUNNING -> RETRYING, due ``delays`` seconds (aligned with ``ends``) from now; attempt row; JOB_RETRIED.

    The attempt counts against the budget; the event carries ``backoff_seconds`` and ``reason``.
    """
    return _end_attempts(
        ends,
        to=JobStatus.RETRYING,
        assign={"scheduled_at": _Sql("now() + make_interval(secs => v.delay)")},
        per_row={"delay": ("float8", list(delays))},
        backoffs=delays,
    )


def hand_back(ends: Sequence[AttemptEnd]) -> list[Moved]:
    """RUNNING -> RETRYING, due now, for runs a stopping worker gave up; attempt row (LOST); JOB_RETRIED.

    The attempt does not count against the budget (``attempts_base`` moves up with it). The job
    keeps its place in line: its ``scheduled_at`` (when it was due, which the claim orders by
    within a priority) stays, so once promoted it is claimed before the jobs queued after it, as
    Sidekiq's requeue of a stopping worker's jobs and Oban's rescue of orphaned ones leave it.
    """
    return _end_attempts(
        ends,
        to=JobStatus.RETRYING,
        event=EventType.JOB_RETRIED,
        assign={"scheduled_at": _Sql("least(j.scheduled_at, now())"), "attempts_base": _Sql("j.attempts_base + 1")},
        backoffs=[0.0] * len(ends),
    )


def rescue_leases(
    ends: Sequence[AttemptEnd], *, next_statuses: Sequence[JobStatus], delays: Sequence[float]
) -> list[Moved]:
    """Take RUNNING jobs from a worker that went silent or died; return the jobs that moved.

    ``next_statuses`` (aligned with ``ends``, decided by ``retry.after_failed_attempt``): RETRYING
    (event JOB_LEASE_EXPIRED, due ``delays`` seconds from now, ``backoff_seconds`` in the
    event), DEAD or CANCELLED (the job's ``last_error`` left as it was, no error in the event).
    The attempt row is written (an attempt already finished stays); no result is stored. Each
    move is fenced by the lease token the rescuer read, at most one statement per target status.
    """
    groups: dict[JobStatus, list[int]] = {}
    for i, status in enumerate(next_statuses):
        groups.setdefault(JobStatus(status), []).append(i)
    moved: list[Moved] = []
    for status, rows in groups.items():
        group = [ends[i] for i in rows]
        if status == JobStatus.RETRYING:
            group_delays = [delays[i] for i in rows]
            moved += _end_attempts(
                group,
                to=status,
                event=EventType.JOB_LEASE_EXPIRED,
                assign={"scheduled_at": _Sql("now() + make_interval(secs => v.delay)")},
                per_row={"delay": ("float8", group_delays)},
                backoffs=group_delays,
                results=False,
            )
        else:
            moved += _end_attempts(group, to=status, results=False, record_error=status != JobStatus.CANCELLED)
    return moved


# Written by an attempt-ending statement for the jobs that moved (``moved``), from the per-row
# inputs (``v``): the attempt's one row (``complete`` writes none: a successful attempt is kept in
# the job row, ``models.Attempt``). A plain INSERT (no ON CONFLICT, whose speculative insertion
# costs a HEAP_CONFIRM record per row): the row (job, n) is written once. Only this statement writes
# attempt rows; it writes (job, attempts) for a job it moves out of RUNNING, under the row lock and
# fenced by the lease token, so at most once per claim (a concurrent move waits for the row lock,
# then finds the job moved), and attempts only grows (the claim's +1). The RUNNING rows that
# releases before the attempt-at-outcome change wrote at claim were removed by migration 0012 for
# jobs still running them; those releases cannot claim since 0010 (their claim writes outbox
# columns 0010 dropped). The unique (job, attempt_number) index stays the guard: a second row is refused.
_ATTEMPT_ROW = """att AS (
    INSERT INTO stint_job_attempt (job_id, attempt_number, status, worker, lease_token, started_at,
                                   finished_at, error, traceback)
    SELECT m.id, m.attempts, v.ast, coalesce(v.worker, ''), v.token, m.started_at,
           coalesce(v.fin, now()), v.err, v.tb
    FROM moved m JOIN v ON v.id = m.id
)"""
# The result's columns, assigned by the outcome's own UPDATE of the job row (``Job.result*``):
# the attempt's number (unchanged by the move), its status, the handler's JSON and the time.
_RESULT_COLUMNS = {
    "result_attempt": _Sql("j.attempts"),
    "result_status": _Sql("v.ast"),
    "result": _Sql("v.res"),
    "result_at": _NOW,
}


def _end_attempts(
    ends: Sequence[AttemptEnd],
    *,
    to: JobStatus,
    event: EventType | None = None,
    assign: Mapping[str, Any] | None = None,
    per_row: Mapping[str, tuple[str, Sequence[Any]]] | None = None,
    backoffs: Sequence[float] | None = None,
    results: bool = True,
    record_error: bool = True,
    attempt_row: bool = True,
) -> list[Moved]:
    """Move the jobs of ``ends`` from RUNNING to ``to``, fenced by their lease tokens, with their attempt rows.

    The lease is cleared; ``isolated`` set per end (None: unchanged). A finished job (any ``to``
    but RETRYING) gets ``finished_at`` and, with ``results``, its result (``Job.result*``,
    written by the same UPDATE: an outcome that lost its lease writes none). Without
    ``attempt_row`` (``complete``) no ``JobAttempt`` row is written and the job keeps
    ``lease_owner`` and ``lease_token``, the record of the attempt with its result.
    ``record_error`` writes each end's error as the job's ``last_error`` and in its event.
    ``backoffs`` (seconds, aligned) go in the events as ``backoff_seconds``. One statement.
    """
    if not ends:
        return []
    columns: dict[str, Any] = {
        "lease_expires_at": _NULL,
        "isolated": _Sql("coalesce(v.iso, j.isolated)"),
        # The claim wrote its time; a run that began later (claimed ahead) brings its own.
        "started_at": _Sql("coalesce(v.started, j.started_at)"),
    }
    if attempt_row:
        columns.update(lease_owner=_NULL, lease_token=_NULL)
    if record_error:
        columns["last_error"] = _Sql("v.err")
    inputs: dict[str, tuple[str, Sequence[Any]]] = {
        "err": ("text", [e.error for e in ends]),
        "iso": ("bool", [e.isolated for e in ends]),
        "ast": ("text", [AttemptStatus(e.status).value for e in ends]),
        "started": ("timestamptz", [e.started_at for e in ends]),
    }
    also = []
    if attempt_row:
        inputs.update(
            worker=("text", [e.worker for e in ends]),
            fin=("timestamptz", [e.finished_at for e in ends]),
            tb=("text", [e.traceback for e in ends]),
        )
        also.append(_ATTEMPT_ROW)
    inputs.update(per_row or {})
    if to != JobStatus.RETRYING:
        columns["finished_at"] = _NOW
        if results:
            inputs["res"] = (
                "jsonb",
                [Jsonb(e.result) if e.status == AttemptStatus.SUCCEEDED else None for e in ends],
            )
            columns.update(_RESULT_COLUMNS)
    payloads: list[dict[str, Any]] = []
    for i, end in enumerate(ends):
        payload: dict[str, Any] = {"error": end.error} if record_error and end.error else {}
        if backoffs is not None:
            payload["backoff_seconds"] = backoffs[i]
        if end.reason:
            payload["reason"] = end.reason
        payloads.append(payload)
    return _transition(
        job_ids=[e.job_id for e in ends],
        to=to,
        expected=JobStatus.RUNNING,
        event=event,
        assign={**columns, **(assign or {})},
        per_row=inputs,
        lease_tokens=[e.lease_token for e in ends],
        event_payloads=payloads,
        also=also,
    )


# -- the scheduler's and people's verbs ----------------------------------------------------------


def promote(job_ids: Sequence[uuid.UUID], *, source: JobStatus) -> list[Moved]:
    """SCHEDULED or RETRYING (``source``) -> QUEUED for jobs that came due; JOB_QUEUED. One statement.

    The caller picks due jobs (``maintenance.promoter``); ``scheduled_at`` stays the due time.
    """
    if JobStatus(source) not in (JobStatus.SCHEDULED, JobStatus.RETRYING):
        raise IllegalTransition(f"only SCHEDULED and RETRYING jobs are promoted, not {source}")
    return _transition(job_ids=job_ids, to=JobStatus.QUEUED, expected=source)


def cancel(job_id: uuid.UUID) -> Moved | None:
    """CREATED/SCHEDULED/QUEUED/RETRYING -> CANCELLED now, finished; JOB_CANCELLED. None from any other state.

    A RUNNING job is stopped by its worker instead: ``request_cancel``, then ``cancel_running``.
    """
    return _transition_one(job_id=job_id, to=JobStatus.CANCELLED, expected=CANCELLABLE, assign={"finished_at": _NOW})


def request_cancel(job_id: uuid.UUID) -> bool:
    """Ask the worker running ``job_id`` to stop it (``cancel_requested``); return False unless it is RUNNING.

    Not a status change and no event: the worker that holds the lease sees the request at its
    next heartbeat and makes the RUNNING -> CANCELLED move (``cancel_running``); a run that
    fails meanwhile ends CANCELLED too (``retry.after_failed_attempt``).
    """
    with connection.cursor() as cursor:
        cursor.execute("UPDATE stint_job SET cancel_requested = true WHERE id = %s AND status = 'RUNNING'", [job_id])
        return cursor.rowcount > 0


# A fresh run: due now, the attempt budget counted from here, no stale cancel request.
_FRESH_RUN = {
    "scheduled_at": _NOW,
    "attempts_base": _Sql("j.attempts"),
    "finished_at": _NULL,
    "cancel_requested": False,
}


def retry_failed(job_id: uuid.UUID, *, reason: str = "manual_retry") -> Moved | None:
    """FAILED -> RETRYING, due now with a fresh attempt budget; JOB_RETRIED with ``reason``. None otherwise.

    A stale ``cancel_requested`` from the failed run is cleared so the new run is not cancelled at once.
    """
    return _transition_one(
        job_id=job_id,
        to=JobStatus.RETRYING,
        expected=JobStatus.FAILED,
        assign=_FRESH_RUN,
        event_payload={"reason": reason},
    )


def recover(job_id: uuid.UUID, *, reason: str | None = None) -> Moved | None:
    """DEAD -> QUEUED with a fresh attempt budget; JOB_RECOVERED (with ``reason`` when given). None otherwise."""
    return _transition_one(
        job_id=job_id,
        to=JobStatus.QUEUED,
        expected=JobStatus.DEAD,
        event=EventType.JOB_RECOVERED,
        assign=_FRESH_RUN,
        event_payload={"reason": reason} if reason else None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """A job to insert. ``scheduled_at`` None (or not in the future, by the database clock) queues it now."""

    id: uuid.UUID
    owner_id: int | None
    name: str
    type: str
    payload: Any
    priority: int
    queue: str
    scheduled_at: Any  # aware datetime or None
    max_retries: int
    timeout_seconds: int
    idempotency_key: str | None = None
    schedule_id: int | None = None
    fire_time: Any = None  # aware datetime or None
    trace_context: dict[str, str] | None = None  # W3C context of the creating span (scheduler.tracing)
    payload_json: str | None = None  # ``payload`` as JSON text when validation already encoded it (jobspec)


@dataclass(frozen=True, slots=True, kw_only=True)
class Inserted:
    """A job ``insert_jobs`` created: its id, status and the database clock's times."""

    id: uuid.UUID
    status: str
    scheduled_at: Any  # aware datetime
    created_at: Any  # aware datetime


def create_jobs(jobs: Sequence[NewJob]) -> list[tuple[uuid.UUID, str]]:
    """Insert ``jobs`` as ``insert_jobs`` does (no queue rows, no NOTIFY); return (id, status) of each inserted."""
    return [(row.id, row.status) for row in insert_jobs(jobs)]


def insert_jobs(jobs: Sequence[NewJob], *, ensure_queues: bool = False, notify: bool = False) -> list[Inserted]:
    """Insert ``jobs`` in one statement with their JOB_CREATED and JOB_QUEUED/JOB_SCHEDULED events.

    A job whose ``scheduled_at`` is missing or already due (by the database's ``now()``) is
    inserted QUEUED, otherwise SCHEDULED; ``scheduled_at`` defaults to ``now()``. A job whose
    (schedule, fire_time) already exists is skipped (the cron guard). ``ensure_queues`` also
    inserts the ``stint_queue`` rows of new queue names (sorted, so two batches naming the same
    new queues wait on each other instead of deadlocking); ``notify`` sends one NOTIFY on
    ``notify.CHANNEL`` naming the queues that gained QUEUED jobs (PostgreSQL delivers it at
    commit). Outside ``transaction.atomic`` the statement is its own transaction: one round trip.
    The inserted jobs count in ``jobs_created_total`` once the transaction commits (every path that
    creates jobs comes here: enqueues, cron fires, schedule triggers). Returns an ``Inserted`` row
    for each inserted job, in no particular order.
    """
    if not jobs:
        return []
    single = len(jobs) == 1
    if single:  # scalars: no document to encode here or to decode there (a third of one enqueue's time)
        job = jobs[0]
        params = dict(zip(_INSERT_PARAMS, _insert_values(job), strict=True))
        # Always text (one prepared statement), encoded once: by validation when it ran.
        params["payloads"] = job.payload_json if job.payload_json is not None else json.dumps(job.payload)
        if job.trace_context is not None:
            params["traces"] = Jsonb(job.trace_context)
    else:
        params = {
            "rows": _rows_document(
                [(column, kind, [getattr(j, attr) for j in jobs]) for _, column, kind, attr in _INSERT_COLUMNS]
            )
        }
    created = [
        Inserted(id=r[0], status=r[1], scheduled_at=r[2], created_at=r[3])
        for r in prepared.fetchall(_insert_sql(ensure_queues=ensure_queues, notify=notify, single=single), params)
    ]
    metrics.jobs_created_on_commit(jobs, (row.id for row in created))
    return created


# The ``v`` columns of ``_insert_sql``: (parameter, column, SQL type, the ``NewJob`` attribute it takes).
# One job binds a scalar per column, several one document of rows (``_rows_document``).
_INSERT_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("ids", "id", "uuid", "id"),
    ("owners", "owner_id", "bigint", "owner_id"),
    ("names", "name", "text", "name"),
    ("types", "type", "text", "type"),
    ("payloads", "payload", "jsonb", "payload"),
    ("prios", "priority", "smallint", "priority"),
    ("queues", "queue", "text", "queue"),
    ("sched", "sched", "timestamptz", "scheduled_at"),
    ("maxr", "max_retries", "smallint", "max_retries"),
    ("tmo", "timeout_seconds", "int", "timeout_seconds"),
    ("keys", "idem", "text", "idempotency_key"),
    ("schedules", "schedule_id", "bigint", "schedule_id"),
    ("fires", "fire_time", "timestamptz", "fire_time"),
    ("traces", "trace_context", "jsonb", "trace_context"),
)
_INSERT_PARAMS = tuple(name for name, _, _, _ in _INSERT_COLUMNS)
_insert_values = operator.attrgetter(*(attr for _, _, _, attr in _INSERT_COLUMNS))  # one job's, in C


@functools.cache
def _insert_sql(*, ensure_queues: bool, notify: bool, single: bool) -> str:
    """The one INSERT statement of new jobs (``insert_jobs``): built here, and only here.

    ``single``: one job's scalar parameters in a ``VALUES`` row; otherwise one jsonb document of rows.
    """
    created = EventType.JOB_CREATED
    queued = TRANSITIONS[(JobStatus.CREATED, JobStatus.QUEUED)]
    scheduled = TRANSITIONS[(JobStatus.CREATED, JobStatus.SCHEDULED)]
    # Data-modifying CTEs always run; a SELECT CTE runs only when the final SELECT reads it.
    queues_cte = (
        f""", q AS (
            INSERT INTO stint_queue (name, paused, created_at, updated_at)
            SELECT {"" if single else "DISTINCT "}queue, false, now(), now() FROM v{"" if single else " ORDER BY 1"}
            ON CONFLICT (name) DO NOTHING
        )"""  # noqa: S608 - only constants are interpolated
        if ensure_queues
        else ""
    )
    # One job: its queue (none when not QUEUED). Several: one NOTIFY naming their queues. Both
    # after the transaction's token (scheduler.notify.PAYLOAD_TOKEN_SQL).
    notified, notified_having = (
        (f"{PAYLOAD_TOKEN_SQL} || queue", "")
        if single
        else (
            f"left({PAYLOAD_TOKEN_SQL} || string_agg(DISTINCT queue, ',' ORDER BY queue), 7900)",
            " HAVING count(*) > 0",
        )
    )
    notify_cte = (
        f""", n AS (
            SELECT true AS sent FROM (
                SELECT pg_notify('{CHANNEL}', {notified})
                FROM ins WHERE status = 'QUEUED'{notified_having}
            ) notified
        )"""  # noqa: S608 - only a constant is interpolated
        if notify
        else ""
    )
    common = {"job": "ins.id", "owner": "ins.owner_id", "attempt": "0", "row": "ins.", "extra": "NULL"}
    # Each job's two events, in their order: a job's pair stays together, sequence 1 then 2.
    first = PACKED_EVENT_SQL.format(event=f"'{created}'", sequence="1", source="''", to="'CREATED'", **common)
    second = PACKED_EVENT_SQL.format(
        event=f"CASE ins.status WHEN 'QUEUED' THEN '{queued}' ELSE '{scheduled}' END",
        sequence="2",
        source="'CREATED'",
        to="ins.status",
        **common,
    )
    if single:  # one job, one row (none when the cron guard skipped it)
        events, source, having = f"2, ARRAY[{first}, {second}]", "ins", ""
    else:  # one row for the batch: its pairs, flattened in job id order
        events = "count(*), array_agg(pair.event ORDER BY ins.id, pair.n)"
        source = f"ins CROSS JOIN LATERAL (VALUES (1, {first}), (2, {second})) AS pair(n, event)"
        having = " HAVING count(*) > 0"
    names = ", ".join(column for _, column, _, _ in _INSERT_COLUMNS)
    if single:
        values = ", ".join(f"%({name})s::{kind}" for name, _, kind, _ in _INSERT_COLUMNS)
        rows = f"SELECT * FROM (VALUES ({values})) AS v({names})"  # noqa: S608 - constants only
    else:
        rows = _from_document((column, kind) for _, column, kind, _ in _INSERT_COLUMNS)
    # The final SELECT reads n's column, so PostgreSQL cannot leave the NOTIFY out.
    notify_join = ", n.sent FROM ins LEFT JOIN n ON true" if notify else " FROM ins"
    return f"""
        WITH v AS (
            {rows}
        ){queues_cte}, ins AS (
            INSERT INTO stint_job (id, owner_id, name, type, payload, status, priority, queue, scheduled_at,
                                   attempts, attempts_base, max_retries, timeout_seconds, cancel_requested,
                                   idempotency_key, schedule_id, fire_time, event_sequence, created_at,
                                   updated_at, last_error, trace_context)
            SELECT id, owner_id, name, type, payload,
                   CASE WHEN sched IS NULL OR sched <= now() THEN 'QUEUED' ELSE 'SCHEDULED' END,
                   priority, queue, coalesce(sched, now()), 0, 0, max_retries, timeout_seconds, false,
                   idem, schedule_id, fire_time, 2, now(), now(), '', trace_context
            FROM v
            ON CONFLICT (schedule_id, fire_time) WHERE schedule_id IS NOT NULL DO NOTHING
            RETURNING id, owner_id, status, type, queue, priority, scheduled_at, created_at
        ), ev AS (
            INSERT INTO stint_outbox (schema_version, occurred_at, event_count, packed_events)
            SELECT {SCHEMA_VERSION}, now(), {events}
            FROM {source}{having}
        ){notify_cte}
        SELECT ins.id, ins.status, ins.scheduled_at, ins.created_at{notify_join}
    """  # noqa: S608 - only constants are interpolated


@dataclass(slots=True, kw_only=True, unsafe_hash=True)  # not frozen: see HOT_PATH_RECORDS
class Claimed:
    """A job a worker now holds: everything it needs to run it without another query."""

    id: uuid.UUID
    type: str
    payload: Any
    attempt: int
    lease_token: uuid.UUID
    timeout_seconds: int
    owner_id: int | None
    max_retries: int
    attempts_base: int
    queue: str
    priority: int
    scheduled_at: Any  # aware datetime: when it became due
    started_at: Any  # aware datetime, database clock
    worker: str = ""  # the worker id holding the lease (written with the attempt at its outcome)

    @property
    def attempts_left(self) -> int:
        """Attempts remaining after this one in the budget of 1 + max_retries."""
        return retry.attempts_left(
            attempts=self.attempt, attempts_base=self.attempts_base, max_retries=self.max_retries
        )


# The queues paused now, read by the claim statement itself (a hashed SubPlan: read once per
# statement, from its snapshot). A pause is honoured by every claim statement that starts after it
# committed, whatever paused list the worker last read (each poll interval); a claim whose statement
# had begun before that commit may still take the queue's jobs: it was in flight. NOT IN, not
# ``<> ALL(ARRAY(SELECT ...))``: the planner estimates a comparison with values it cannot know from
# the column's statistics, and with one queue (one distinct value) it took ``<> ALL`` to pass no job
# at all, so once the table was analyzed every claim read the whole table and sorted it (10-50 ms
# per claim in a 20,000-job drain); a SubPlan's selectivity is a fixed guess. ``name`` is the
# primary key (never NULL), so NOT IN has no NULL surprise.
NOT_PAUSED = "{column} NOT IN (SELECT pq.name FROM stint_queue pq WHERE pq.paused)"


def _candidates_where(
    queues: Sequence[str] | None, paused: Sequence[str], *, isolated: bool, include_held: bool
) -> str:
    """The WHERE clause of a claim's candidates (``%(queues)s`` and ``%(paused)s`` bound by the caller)."""
    where = "status = 'QUEUED' AND " + ("isolated" if isolated else "NOT isolated")
    if not (isolated or include_held):
        where += " AND NOT flow_held"
    if queues:
        where += " AND queue = ANY(%(queues)s::text[])"
    if paused:
        # NOT IN a subquery, as NOT_PAUSED and for its reason: a prepared claim's generic plan does not
        # know the list, and NOT (queue = ANY(list)) was estimated to pass almost no job.
        where += " AND queue NOT IN (SELECT unnest(%(paused)s::text[]))"
    return where + " AND " + NOT_PAUSED.format(column="queue")


def claim_keys_ahead(
    *,
    limit: int,
    queues: Sequence[str] | None,
    paused: Sequence[str] = (),
    isolated: bool = False,
    flow: tuple[str, Mapping[str, Any]] | None = None,
) -> list[tuple[int, Any, Any]]:
    """Return the claim keys (priority, scheduled_at, created_at) of the first ``limit`` jobs ``claim`` would take.

    Same arguments as ``claim``; reads without locking (a snapshot: some may be claimed by
    others by the time the caller acts on it). The flow-limited claim compares them with the
    limited jobs it may admit, so that its two phases together take jobs in claim order.
    """
    if limit <= 0:
        return []
    flow_filter, flow_params = flow or ("", {})
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT priority, scheduled_at, created_at FROM stint_job
            WHERE {_candidates_where(queues, paused, isolated=isolated, include_held=False)} {flow_filter}
            ORDER BY {CLAIM_ORDER}
            LIMIT %(limit)s
            """,  # noqa: S608 - only constant filters are interpolated
            {"limit": limit, "queues": list(queues or []), "paused": list(paused), **flow_params},
        )
        return cursor.fetchall()


def claim(
    *,
    worker_id: str,
    limit: int,
    lease_seconds: float,
    queues: Sequence[str] | None,
    paused: Sequence[str] = (),
    isolated: bool = False,
    flow: tuple[str, Mapping[str, Any]] | None = None,
    include_held: bool = False,
) -> list[Claimed]:
    """Lease up to ``limit`` QUEUED jobs in one statement (QUEUED -> RUNNING) and return them.

    Candidates are ordered by priority, highest first (HIGH > MEDIUM > LOW, any integer from -100
    to 100 in between), then ``scheduled_at``, then ``created_at`` (the partial index
    ``job_claim_scan_desc`` serves exactly this order), and
    locked with ``FOR UPDATE SKIP LOCKED`` so concurrent workers never claim the same job. Each
    claimed job gets attempts + 1, a new fencing ``lease_token``, ``lease_owner = worker_id``
    and ``lease_expires_at = now() + lease_seconds``; its JOB_STARTED event is written by the
    same statement. Its ``JobAttempt`` row is written once, by the verb that ends the attempt:
    until then the job row itself (attempts, lease_owner, started_at) is the running attempt.
    ``queues`` None means every queue; ``paused`` queues are skipped, and so is every queue whose
    pause had committed when the statement began (``NOT_PAUSED``: read in the statement, so the
    worker's paused list, re-read each poll, cannot be stale against a pause). ``isolated`` False
    (ordinary workers) claims only jobs that are not isolated; True (a supervisor's isolation
    slot) only isolated ones, through their own small partial index. ``flow``
    (``scheduler.flow.claim``): an extra ``AND ...`` filter on the candidates and its named
    parameters (flow-limited jobs left out, or exactly the admitted ones). Jobs a flow limit holds
    (``flow_held``) are left out, so the scan reads only the index's unheld part, unless
    ``include_held`` (the limited phase's claim of the jobs it admitted) or ``isolated`` (isolated
    jobs are never held). One statement: its own transaction in autocommit, or part of the caller's
    (the flow claim's, which may have waited for a limit's lock: with ``flow`` the lease and
    ``started_at`` count from this statement, ``statement_timestamp()``, not the transaction's start).
    """
    if limit <= 0:
        return []
    flow_filter, flow_params = flow or ("", {})
    # A flow claim runs in a transaction that may have waited for a limit's lock: its lease and
    # start count from this statement. An unlimited claim is its own transaction: now() is the same.
    clock = "statement_timestamp()" if flow else "now()"
    sql = f"""
        WITH cand AS (
            SELECT id FROM stint_job
            WHERE {_candidates_where(queues, paused, isolated=isolated, include_held=include_held)} {flow_filter}
            ORDER BY {CLAIM_ORDER}
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ), moved AS (
            UPDATE stint_job j
            SET status = 'RUNNING', attempts = j.attempts + 1, lease_owner = %(worker)s,
                lease_token = gen_random_uuid(),
                lease_expires_at = {clock} + make_interval(secs => %(lease)s),
                started_at = {clock}, finished_at = NULL, updated_at = now(),
                event_sequence = j.event_sequence + 1, flow_held = false
            FROM cand WHERE j.id = cand.id
            RETURNING j.id, j.type, j.payload, j.attempts, j.lease_token, j.timeout_seconds, j.owner_id,
                      j.max_retries, j.attempts_base, j.queue, j.priority, j.scheduled_at, j.started_at,
                      j.event_sequence
        ), ev AS ({_outbox_row(source="'QUEUED'", to="'RUNNING'", extra="%(extra)s::jsonb")}
        )
        SELECT id, type, payload, attempts, lease_token, timeout_seconds, owner_id, max_retries, attempts_base,
               queue, priority, scheduled_at, started_at
        FROM moved
    """  # noqa: S608 - only constant filters are interpolated
    params = {
        "limit": limit,
        "worker": worker_id,
        "extra": json.dumps({"worker": worker_id}),  # the events' payload: type, queue, priority, worker
        "lease": float(lease_seconds),
        "queues": list(queues or []),
        "paused": list(paused),
        "event": str(TRANSITIONS[(JobStatus.QUEUED, JobStatus.RUNNING)]),
        **flow_params,
    }
    rows = prepared.fetchall(sql, params)
    try:
        # Django's psycopg backend loads jsonb as text; decode it here once.
        payloads = [json.loads(r[2]) if isinstance(r[2], str) else r[2] for r in rows]
    except (ValueError, RecursionError):  # a payload Python cannot read: that job alone (UnreadablePayload)
        payloads = [_claimed_payload(r[2]) for r in rows]
    return [
        Claimed(
            id=r[0],
            type=r[1],
            payload=payload,
            attempt=r[3],
            lease_token=r[4],
            timeout_seconds=r[5],
            owner_id=r[6],
            max_retries=r[7],
            attempts_base=r[8],
            queue=r[9],
            priority=r[10],
            scheduled_at=r[11],
            started_at=r[12],
            worker=worker_id,
        )
        for r, payload in zip(rows, payloads, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class UnreadablePayload:
    """The payload of a claimed job that Python's json cannot read; ``why`` says why (``stored_json.unreadable_why``).

    ``jsonb`` holds what Python refuses to read: an integer of more than 4,300 digits
    (``sys.get_int_max_str_digits()``), nesting past the interpreter's recursion limit. Enqueue
    refuses both (``jobspec.payload_json``), so such a row was written by hand or by SQL. Raising
    out of the claim, after it committed, killed the worker process on every claim that met the
    job, and cost each job claimed beside it an attempt; the worker fails this job alone, for good,
    without running it (``InFlight.start``).
    """

    why: str


def _claimed_payload(value: Any) -> Any:
    """A claimed row's payload decoded (``json.loads`` of jsonb's text), or ``UnreadablePayload`` saying why not."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:
        return UnreadablePayload(why=unreadable_why(exc))  # the words the API's ``unreadable`` and the pages use
