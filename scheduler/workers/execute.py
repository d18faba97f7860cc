"""Run one handler for one claimed job and turn whatever happened into a ``Report``."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import traceback
from typing import Any

import psycopg
from django.db import DatabaseError, close_old_connections, connections
from psycopg.pq import TransactionStatus

from core.db_threads import opened_a_connection
from core.log_context import log_context
from core.parsers import MAX_INT_DIGITS, has_lone_surrogate, has_long_integer, has_nul
from scheduler import tracing
from scheduler.exceptions import JobCancelled, PermanentError, RetryAfter, UnknownJobType
from scheduler.flow.progress import writer as progress_writer
from scheduler.leasing import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS, Outcome, Report
from scheduler.lifecycle import Claimed
from scheduler.registry import CancelFlag, JobContext, resolve
from scheduler.retry import asked_delay

logger = logging.getLogger("scheduler.handler")

# A handler's result must be JSON PostgreSQL can store: NaN and infinities are refused here.
_encode_result = json.JSONEncoder(allow_nan=False).encode
# Bytes of a result's JSON a job keeps (ASCII-escaped, as encoded here). A result is for a summary
# (a count, an id, a URL), not a file: a larger one fails the run for good before it is written,
# instead of holding the worker's memory and every outcome batch it joins (jsonb refuses 256 MB).
MAX_RESULT_BYTES = 1024 * 1024
# The error of a job whose handler raised JobCancelled with no cancel requested (README, handlers).
SELF_CANCELLED = "cancelled by the handler"

# The name a class was created with, read past a metaclass: ``type(exc).__name__`` runs a
# metaclass's ``__name__`` property first, and a handler's may raise anything.
_class_name = type.__dict__["__name__"].__get__


def run_handler(job: Claimed, cancel_flag: CancelFlag, *, pool_slot: bool = False) -> Report:
    """Run the handler (``_run_handler``) inside the attempt's trace span when tracing is on; never raises.

    The tracing hook (``scheduler.tracing``): off, it adds one ``None`` check per job.

    When a handler calls ``os.fork()`` and the child returns (or raises) instead of exiting, that
    child ends here with ``os._exit(0)``, so it never goes on to run the worker's code (claim,
    record outcomes) beside its parent, with signals ignored and a database connection open.

    ``pool_slot``: the caller is a pool's slot thread or pool child, which runs nothing but
    handlers, so an ``atomic`` block still open after the handler is the handler's and is rolled
    back (``_close_open_transactions``); False (a test calling this inside its own transaction)
    leaves connections in an ``atomic`` block alone.
    """
    pid = os.getpid()
    try:
        if not tracing.enabled():
            return _run_handler(job, cancel_flag, pool_slot)
        with tracing.attempt_span(job) as span:
            report = _run_handler(job, cancel_flag, pool_slot)
            tracing.record_outcome(span, report)
        return report
    finally:
        if os.getpid() != pid:  # a forked child of the handler
            os._exit(0)
        if progress_writer.has_pending():  # the handler's last ctx.progress, before the outcome ends the run
            try:
                progress_writer.flush_job(job.id)
            except Exception:  # never let progress cost the outcome
                logger.exception("job %s: its last progress was not written", job.id)


def checked_result(result: Any) -> tuple[Any, str | None]:
    """Return ``(value, None)`` for a handler's ``result`` a job can keep, or ``(None, why)`` for one it cannot.

    ``value`` is the JSON that was checked, parsed back into plain values (None stays None):
    what a job keeps is exactly what passed, not the handler's object, which the outcome's writer
    (the worker's flusher thread) would otherwise encode again, and a dict subclass's ``items()``
    could then raise, hang that thread or grow past the limit, as could a dict the handler's own
    thread went on filling after it returned.

    Refused: what JSON cannot encode (NaN and infinities, non-JSON types, nesting past Python's
    recursion limit), JSON over ``MAX_RESULT_BYTES`` (ASCII-escaped), and any string (key or
    value) holding U+0000 or a lone UTF-16 surrogate, which PostgreSQL's ``jsonb`` refuses (the
    escape ``\\u0000`` is the only way the encoded text can hold one; a surrogate pair, e.g. an
    emoji, is fine), and an integer of more than ``core.parsers.MAX_INT_DIGITS`` (4,300) digits:
    PostgreSQL stores it, but no process keeping Python's default limit can read the job back (a
    handler can lift the limit in its own process). Checked before the outcome is written, so a
    refusal costs this job alone, not a retry of the worker's whole outcome batch
    (``leasing.record_batch`` still isolates what PostgreSQL refuses for other reasons, e.g.
    nesting past its stack depth).
    """
    if result is None:
        return None, None
    try:
        text = _encode_result(result)  # ensure_ascii: one character, one byte
        if len(text) > MAX_RESULT_BYTES:
            return None, f"result is {len(text):,} bytes of JSON, over the {MAX_RESULT_BYTES:,} a job keeps"
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        return None, f"result is not JSON: {exc}"
    if "\\u0000" in text and has_nul(value):
        return None, "result holds U+0000, which PostgreSQL cannot store"
    if "\\ud" in text and has_lone_surrogate(value):
        return None, "result holds a lone UTF-16 surrogate, which PostgreSQL cannot store"
    if has_long_integer(text, value):
        return None, f"result holds an integer of more than {MAX_INT_DIGITS:,} digits, which Python cannot read"
    return value, None


def _run_handler(job: Claimed, cancel_flag: CancelFlag, pool_slot: bool) -> Report:
    """Call the handler for ``job.type`` (``registry.resolve``) with (payload, context); never raises.

    Returns SUCCEEDED with the result as the JSON that was checked (plain values); CANCELLED when
    the handler raised ``JobCancelled`` (error "cancelled" after a cancel request, else
    ``SELF_CANCELLED`` and the exception's message: the handler cancelled its own job); PERMANENT
    for ``PermanentError``, an unknown type or a result that is not JSON; RETRYABLE for
    ``RetryAfter``, with the delay it asked for (``_retry_after``), and for any other
    exception, with its traceback, ``BaseException`` included (``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``...): handlers are hostile, and a pool slot must keep
    serving whatever its handler raised. The error is cut to ``leasing.MAX_ERROR_CHARS`` and the
    traceback to its last ``leasing.MAX_TRACEBACK_CHARS`` here, where they are made.

    What the handler sets in its context variables (``contextvars``: Django's ``timezone.activate``
    and ``translation.activate`` among them) ends with its run, as its database session state does
    (``_reset_sessions``): the slot's next job starts in Django's defaults.
    """
    job_id = str(job.id)
    ctx = JobContext(
        job_id=job.id,
        attempt=job.attempt,
        owner_id=job.owner_id,
        logger=logging.LoggerAdapter(logger, {"job_id": job_id, "attempt": job.attempt}),
        cancel_flag=cancel_flag,
        lease_token=job.lease_token,  # ctx.progress writes are fenced by it (scheduler.flow.progress)
        attempts_left=job.attempts_left,
    )
    try:
        spec = resolve(job.type)
        # Every line the handler logs, through any logger, carries the job id and attempt. The
        # handler runs in a copy of the context: Django keeps the active time zone and language in
        # context variables, and one a handler activated would otherwise hold for the slot's next
        # jobs (a copy costs a few ns: it shares the mapping until a variable is set).
        with log_context(job_id=job_id, attempt=job.attempt):
            result = contextvars.copy_context().run(spec.func, job.payload, ctx)
        result, problem = checked_result(result)
        if problem is not None:
            return Report(job=job, outcome=Outcome.PERMANENT, error=problem)
        return Report(job=job, outcome=Outcome.SUCCEEDED, result=result)
    except JobCancelled as exc:
        # Raised after a cancel request (ctx.check_cancelled, ctx.sleep) or, with no request, by the
        # handler's own choice: a self-cancel, whose reason is the job's error. Neither is retried.
        if cancel_flag.is_set():
            return Report(job=job, outcome=Outcome.CANCELLED, error="cancelled")
        try:
            reason = _message(exc)[:MAX_ERROR_CHARS]
        except BaseException:  # noqa: BLE001 - a handler's __str__ may raise anything, even SystemExit
            reason = ""
        error = f"{SELF_CANCELLED}: {reason}" if reason else SELF_CANCELLED
        return Report(job=job, outcome=Outcome.CANCELLED, error=error[:MAX_ERROR_CHARS])
    except (PermanentError, UnknownJobType) as exc:
        return Report(job=job, outcome=Outcome.PERMANENT, error=_describe(exc), traceback=_format_traceback())
    except RetryAfter as exc:  # retryable, after the delay the handler asked for
        seconds, error = _retry_after(exc)
        return Report(
            job=job, outcome=Outcome.RETRYABLE, error=error, traceback=_format_traceback(), retry_after=seconds
        )
    except Exception as exc:  # any handler error is retryable unless it says otherwise
        return Report(job=job, outcome=Outcome.RETRYABLE, error=_describe(exc), traceback=_format_traceback())
    except BaseException as exc:
        # Deliberately BaseException, unlike everywhere else (STYLE.md): a handler's sys.exit(),
        # KeyboardInterrupt or GeneratorExit would otherwise end the pool thread (or pool child)
        # and lose its slot in silence. Nothing the worker itself needs is swallowed here: signals
        # are delivered to the main thread only, and pool children ignore SIGINT and SIGTERM, so
        # these exceptions can only come from the handler's own code.
        return Report(job=job, outcome=Outcome.RETRYABLE, error=_describe(exc), traceback=_format_traceback())
    finally:
        # A connection the handler opened is closed if it broke or is older than CONN_MAX_AGE, as
        # Django does after a request, or if the handler left a transaction open in it; a thread
        # that never opened one has nothing to check (``core.db_threads``).
        if opened_a_connection():
            try:
                close_old_connections()
                _close_open_transactions(job, pool_slot=pool_slot)
                _reset_sessions()
            except Exception:  # closing a broken connection failed: the report must still be returned
                logger.exception("job %s: closing its thread's database connection failed", job.id)


def _close_open_transactions(job: Claimed, *, pool_slot: bool) -> None:
    """Close each connection of this thread that the handler left inside a transaction, rolling it back.

    A raw ``BEGIN`` without its ``COMMIT`` would otherwise run the thread's next jobs inside that
    transaction, holding its locks and leaving their writes uncommitted. A connection the handler
    closed or broke under Django (psycopg's status ``UNKNOWN``) is closed too, and logged as such.
    A connection in an ``atomic`` block is the handler's in a ``pool_slot`` (a block entered and
    never left: ``_leave_atomic_blocks``); otherwise it belongs to the caller (a test's transaction).
    """
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            if pool_slot:
                logger.warning(
                    "job %s left an atomic block open; it was rolled back and its connection closed",
                    job.id,
                    extra={"job_id": str(job.id), "attempt": job.attempt},
                )
                _leave_atomic_blocks(conn)
            continue
        raw = conn.connection
        info = getattr(raw, "info", None)
        if info is None or info.transaction_status == TransactionStatus.IDLE:
            continue
        extra = {"job_id": str(job.id), "attempt": job.attempt}
        if info.transaction_status == TransactionStatus.UNKNOWN:
            logger.warning("job %s left its database connection closed or broken; it was replaced", job.id, extra=extra)
        else:
            logger.warning(
                "job %s left a database transaction open (%s); its connection was closed and the transaction"
                " rolled back",
                job.id,
                info.transaction_status.name,
                extra=extra,
            )
        conn.close()


def _leave_atomic_blocks(conn: Any) -> None:
    """Leave every ``atomic`` block of ``conn`` (Django's connection wrapper), rolling back, and close it.

    A handler that entered ``transaction.atomic()`` without leaving it (``__enter__`` alone, a
    generator never resumed) left the wrapper inside the block: Django's ``close_old_connections``
    closes such a connection (its autocommit is off) but keeps it marked inside the block, so every
    later query of the thread failed with "the connection is closed", for good. The blocks are left
    as Django's ``TestCase`` leaves its own (``set_rollback``, then each ``__exit__``, innermost
    first); if that fails (a block list the handler tampered with), the wrapper's transaction state
    is reset by hand. The next query of the thread opens a new connection.
    """
    try:
        conn.needs_rollback = True
        while conn.in_atomic_block and conn.atomic_blocks:
            conn.atomic_blocks[-1].__exit__(None, None, None)
    except Exception:  # noqa: S110 - reset by hand below
        pass
    finally:
        if conn.in_atomic_block:
            conn.atomic_blocks, conn.savepoint_ids = [], []
            conn.in_atomic_block = conn.needs_rollback = False
        conn.closed_in_transaction = False
        conn.close()


# What a handler may have changed in its thread's session, put back before the thread's next job
# (which reuses the connection for up to CONN_MAX_AGE): SET parameters (statement_timeout,
# search_path, default_transaction_read_only...), SET ROLE and SET SESSION AUTHORIZATION, temporary
# tables (one named stint_job would hide the real one), prepared statements, advisory locks,
# LISTENs. DISCARD ALL does all of that (PostgreSQL docs, DISCARD); the startup options
# (keepalives, idle_in_transaction_session_timeout) are the session's defaults, so it keeps them,
# and psycopg clears its own prepared-statement cache when it sees DISCARD ALL succeed. One round
# trip, only in a thread that has a connection.
_RESET_SESSION = "DISCARD ALL"


def _reset_sessions() -> None:
    """Reset the session of each idle connection of this thread (``_RESET_SESSION``), then Django's time zone.

    A session setting or an advisory lock a handler left behind would otherwise apply to the
    next jobs that the thread runs (seen: ``SET statement_timeout = 1`` cancelling the next job's
    every query). Connections inside a transaction were closed by ``_close_open_transactions``;
    one in an ``atomic`` block belongs to the caller (a test's transaction) and is left alone.
    A connection whose reset fails (the handler ended its backend, say) is closed: the thread's
    next job opens a fresh session.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        try:
            with conn.cursor() as cursor:
                cursor.execute(_RESET_SESSION)
            conn.init_connection_state()  # DISCARD ALL also reset the time zone (and role) Django set
        except (DatabaseError, psycopg.Error):
            # Inside a transaction block (a handler turned autocommit off), say; or a cancel left
            # pending by the handler's own statement_timeout firing at the end of DISCARD ALL, which
            # hits Django's SET TIME ZONE on the raw connection (a psycopg error, not Django's).
            conn.close()


def _format_traceback() -> str:
    """The traceback being handled, as ``exception_traceback`` keeps it."""
    return exception_traceback(sys.exc_info()[1])


def exception_traceback(exc: BaseException | None) -> str:
    """The last ``MAX_TRACEBACK_CHARS`` of ``exc``'s traceback, each part of it cut (``_cut_part``); never raises.

    Cut here, in the slot thread or pool child that ran the handler, so a huge message (100 MB)
    never travels in the report: a pool child's pipe, the worker's outcome batch. Its message line
    is cut like the error, so the frames above it stay in the traceback kept. A line saying why
    when it cannot be formatted (hostile): formatting reads the exception's attributes
    (``__notes__``, its chain), which a handler's exception class may turn into properties that
    raise; that error would escape ``run_handler`` and end the pool thread or pool child instead of
    being the run's outcome. ``stint_tasks`` hands the same text to ``task_finished`` receivers.
    """
    try:
        formatted = traceback.TracebackException.from_exception(exc).format()
        return "".join(_cut_part(part) for part in formatted)[-MAX_TRACEBACK_CHARS:]
    except BaseException as failure:  # noqa: BLE001 - a handler's property may raise anything, even SystemExit
        return f"its traceback could not be formatted: {_class_name(type(failure))}"


def _cut_part(part: str) -> str:
    """One part of a formatted traceback (a frame, a message) cut to ``MAX_ERROR_CHARS``, saying how much went."""
    if len(part) <= MAX_ERROR_CHARS:
        return part
    return f"{part[:MAX_ERROR_CHARS]}... [{len(part) - MAX_ERROR_CHARS:,} characters cut]\n"


def exception_message(exc: BaseException) -> str:
    """The message of a handler's exception cut to ``MAX_ERROR_CHARS`` (``_message``), or why it cannot be read.

    "(its message could not be read: SystemExit)" when its ``__str__`` raises; never raises.
    """
    try:
        return _message(exc)[:MAX_ERROR_CHARS]
    except BaseException as failure:  # noqa: BLE001 - a handler's __str__ may raise anything, even SystemExit
        return f"(its message could not be read: {_class_name(type(failure))})"


def _message(exc: BaseException) -> str:
    """The message of a handler's exception as a plain ``str`` ("" for none); raises what its ``__str__`` raises.

    A plain ``str`` whatever the handler's ``__str__`` returned: a ``str`` subclass could raise from
    its own formatting or truth value, outside any handler of the handler's errors, and end the
    pool thread (or pool child) with the job's error unread.
    """
    return str.__str__(str(exc))  # a subclass instance is copied into a plain str


def _retry_after(exc: RetryAfter) -> tuple[float | None, str]:
    """``(seconds, error)`` of a handler's ``RetryAfter``: the delay it asked for (``retry.asked_delay``), or None.

    Read here, where the handler ran: its ``delay_seconds`` may be any object, or a property that
    raises (anything, ``SystemExit`` included) or never returns, and only a plain float in range
    travels on to the outcome's writer. ``error`` is ``_describe``'s, then what became of the delay:
    ``RetryAfter: busy (retried in 30 s, as the handler asked)``, ``... (retried in 604800 s: it asked
    for more than 604800 s)``, or ``... (its delay is NaN: retried after the job type's backoff
    instead)``; with no message, ``RetryAfter: retried in 30 s, as the handler asked`` (the class
    name stays the text before the first colon, as for any error). The message is cut so that
    this note fits in ``MAX_ERROR_CHARS``.
    """
    try:
        asked = exc.delay_seconds
    except BaseException as failure:  # noqa: BLE001 - a handler's property may raise anything, even SystemExit
        seconds, note = None, f"could not be read ({_class_name(type(failure))})"
    else:
        seconds, note = asked_delay(asked)
    if seconds is None:
        became = f"its delay {note}: retried after the job type's backoff instead"
    else:
        became = f"retried in {seconds:.10g} s" + (f": {note}" if note else ", as the handler asked")
    described, name = _describe(exc), _class_name(type(exc))
    if described == name:  # no message
        return seconds, f"{name}: {became}"[:MAX_ERROR_CHARS]
    room = max(0, MAX_ERROR_CHARS - len(became) - 3)
    return seconds, f"{described[:room]} ({became})"


def _describe(exc: BaseException) -> str:
    """``"Type: message"`` of a handler's exception, cut to ``MAX_ERROR_CHARS``; its type alone when ``str()`` raises.

    Cut before it is joined, so a huge message is not copied whole, and here, where the handler
    ran, so it never travels in the report (``_format_traceback``).
    """
    name = _class_name(type(exc))
    try:
        text = _message(exc)[:MAX_ERROR_CHARS]
    except BaseException as failure:  # noqa: BLE001 - a handler's __str__ may raise anything, even SystemExit
        return f"{name} (its message could not be read: {_class_name(type(failure))})"[:MAX_ERROR_CHARS]
    return (f"{name}: {text}" if text else name)[:MAX_ERROR_CHARS]
