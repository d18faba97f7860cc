"""Progress from inside a handler: ``ctx.progress(percent, message)``, written rate-limited and fenced.

A handler may call ``ctx.progress`` as often as it likes; each worker process writes the
latest value of every job that reported, all in one statement, once per ``MIN_INTERVAL_SECONDS``
(as a heartbeat carries every lease in one statement). The write is
``UPDATE stint_job SET progress = ... WHERE id = ... AND lease_token = ... AND status =
'RUNNING'``: not a status change (``lifecycle`` stays the only writer of status), and fenced,
so a run whose lease was rescued cannot overwrite the newer attempt's progress. ``at`` is the
database clock. A write that fails (the database unreachable) is logged and dropped: progress
is advisory and must never fail the job. A value reported less than an interval before the run
ended may not be written (the job is no longer RUNNING); its result says the rest.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass

from django.db import DatabaseError, connection
from psycopg.types.json import Jsonb

logger = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 1.0  # seconds between two progress writes of one job (well under a heartbeat)
MAX_MESSAGE_CHARS = 500  # characters of a progress message kept


@dataclass(slots=True)
class _Pending:
    token: uuid.UUID
    value: dict


def checked(percent: float, message: str) -> dict:
    """Return the stored form ``{"percent": float 0-100, "message": str}``; raise ValueError otherwise.

    ``percent`` is a real number from 0 to 100 (not a bool); ``message`` a string, cut to
    ``MAX_MESSAGE_CHARS`` and made storable (NUL removed).
    """
    if isinstance(percent, bool) or not isinstance(percent, int | float):
        raise ValueError("progress percent must be a number from 0 to 100")
    # The number itself, as a plain float: float(percent) would ask a subclass's __float__, which may
    # say NaN after the check (jsonb then refuses the writer's one statement for every job's progress).
    try:
        value = (float.__float__ if isinstance(percent, float) else int.__float__)(percent)
    except OverflowError:  # an int past the float range
        raise ValueError("progress percent must be from 0 to 100") from None
    if not math.isfinite(value):
        raise ValueError("progress percent must be a number from 0 to 100")
    if not 0 <= value <= 100:
        raise ValueError("progress percent must be from 0 to 100")
    if not isinstance(message, str):
        raise ValueError("progress message must be a string")
    from scheduler.leasing import storable_text

    return {"percent": round(value, 2), "message": storable_text(message[:MAX_MESSAGE_CHARS])}


class ProgressWriter:
    """Collects the latest progress of each running job and writes them all in one statement per interval.

    One background thread per process, alive only while progress is pending: however many jobs
    report, the database sees one ``UPDATE`` per ``interval`` from this process (the way a
    heartbeat carries every lease), each job's latest value within ``interval`` of its report.
    """

    def __init__(self, interval: float = MIN_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._pending: dict[uuid.UUID, _Pending] = {}
        self._thread: threading.Thread | None = None

    def report(self, *, job_id: uuid.UUID, lease_token: uuid.UUID, percent: float, message: str = "") -> None:
        """Record progress of the run holding ``lease_token``; it is written within ``interval`` seconds.

        Raises ValueError for a bad ``percent`` or ``message`` (the handler's bug, its to see).
        """
        value = checked(percent, message)
        with self._lock:
            self._pending[job_id] = _Pending(token=lease_token, value=value)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._flush_loop, name="stint-progress", daemon=True)
                self._thread.start()

    def flush(self) -> int:
        """Write everything pending now, in one statement; return how many jobs it named."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if batch:
            _write(batch)
        return len(batch)

    def has_pending(self) -> bool:
        """True while some job's progress waits to be written (a lock-free read: a hint, not a promise)."""
        return bool(self._pending)

    def flush_job(self, job_id: uuid.UUID) -> bool:
        """Write ``job_id``'s pending progress now, if it has any; return whether it had.

        The worker calls it as the handler returns, while the job is still RUNNING under its lease,
        so the last value a handler reported is not lost to the once-a-second batch (the write is
        fenced on RUNNING and would miss a job that has already finished).
        """
        with self._lock:
            pending = self._pending.pop(job_id, None)
        if pending is None:
            return False
        _write({job_id: pending})
        return True

    def join(self, timeout: float | None = None) -> None:
        """Wait until the background writer has flushed everything pending and stopped (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _flush_loop(self) -> None:
        try:
            while True:
                time.sleep(self.interval)
                with self._lock:
                    if not self._pending:
                        self._thread = None
                        return
                self.flush()
        finally:
            connection.close()  # this thread's own connection: it ends here


def _write(batch: dict[uuid.UUID, _Pending]) -> None:
    ids = list(batch)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE stint_job j SET progress = v.value || jsonb_build_object('at', now())
                FROM unnest(%s::uuid[], %s::uuid[], %s::jsonb[]) AS v(id, token, value)
                WHERE j.id = v.id AND j.lease_token = v.token AND j.status = 'RUNNING'
                """,
                [ids, [batch[i].token for i in ids], [Jsonb(batch[i].value) for i in ids]],
            )
    except DatabaseError:
        logger.warning("progress of %d jobs not written (database error)", len(ids))
        connection.close()


writer = ProgressWriter()
