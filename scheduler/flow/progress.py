"""Progress from inside a handler: ``ctx.progress(percent, message)``, written rate-limited and fenced.

A handler may call ``ctx.progress`` as often as it likes; the database sees at most one write
per job every ``MIN_INTERVAL_SECONDS``, and the latest value always reaches it within that
interval (a background writer flushes what a burst of calls left pending). Each write is
``UPDATE stint_job SET progress = ... WHERE id = ... AND lease_token = ... AND status =
'RUNNING'``: not a status change (``lifecycle`` stays the only writer of status), and fenced,
so a run whose lease was rescued cannot overwrite the newer attempt's progress. ``at`` is the
database clock. A write that fails (the database unreachable) is logged and dropped: progress
is advisory and must never fail the job.
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
    due: float  # monotonic time at which it may be written


def checked(percent: float, message: str) -> dict:
    """Return the stored form ``{"percent": float 0-100, "message": str}``; raise ValueError otherwise.

    ``percent`` is a real number from 0 to 100 (not a bool); ``message`` a string, cut to
    ``MAX_MESSAGE_CHARS`` and made storable (NUL removed).
    """
    if isinstance(percent, bool) or not isinstance(percent, int | float) or not math.isfinite(percent):
        raise ValueError("progress percent must be a number from 0 to 100")
    if not 0 <= percent <= 100:
        raise ValueError("progress percent must be from 0 to 100")
    if not isinstance(message, str):
        raise ValueError("progress message must be a string")
    from scheduler.leasing import storable_text

    return {"percent": round(float(percent), 2), "message": storable_text(message[:MAX_MESSAGE_CHARS])}


class ProgressWriter:
    """Rate-limits progress writes per job and flushes the last pending value of each in a background thread."""

    def __init__(self, interval: float = MIN_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[uuid.UUID, float] = {}
        self._pending: dict[uuid.UUID, _Pending] = {}
        self._thread: threading.Thread | None = None

    def report(self, *, job_id: uuid.UUID, lease_token: uuid.UUID, percent: float, message: str = "") -> None:
        """Record progress of the run holding ``lease_token``; write now or within ``interval`` seconds.

        Raises ValueError for a bad ``percent`` or ``message`` (the handler's bug, its to see).
        """
        value = checked(percent, message)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(job_id)
            if last is None or now - last >= self.interval:
                self._last[job_id] = now
                self._pending.pop(job_id, None)
                write_now = True
            else:
                self._pending[job_id] = _Pending(token=lease_token, value=value, due=last + self.interval)
                write_now = False
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._flush_loop, name="stint-progress", daemon=True)
                    self._thread.start()
        if write_now:
            _write(job_id, lease_token, value)
        if len(self._last) > 10_000:  # a long-lived worker: forget jobs not heard of for a while
            with self._lock:
                cutoff = now - 60 * self.interval
                self._last = {k: v for k, v in self._last.items() if v >= cutoff}

    def join(self, timeout: float | None = None) -> None:
        """Wait until the background writer has flushed everything pending and stopped (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _flush_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._pending:
                        self._thread = None
                        return
                    now = time.monotonic()
                    due = [(k, p) for k, p in self._pending.items() if p.due <= now]
                    for job_id, _ in due:
                        del self._pending[job_id]
                        self._last[job_id] = now
                    wait = min((p.due for p in self._pending.values()), default=now + self.interval) - now
                for job_id, pending in due:
                    _write(job_id, pending.token, pending.value)
                if not due:
                    time.sleep(max(0.01, min(wait, self.interval)))
        finally:
            connection.close()  # this thread's own connection: it ends here


def _write(job_id: uuid.UUID, lease_token: uuid.UUID, value: dict) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE stint_job SET progress = %s::jsonb || jsonb_build_object('at', now())
                WHERE id = %s AND lease_token = %s AND status = 'RUNNING'
                """,
                [Jsonb(value), job_id, lease_token],
            )
    except DatabaseError:
        logger.warning("job %s: progress not written (database error)", job_id, extra={"job_id": str(job_id)})
        connection.close()


writer = ProgressWriter()
