"""What a worker's claim loop waits on: its LISTEN connection and a self-pipe, in one ``poll``.

The claim loop used to sleep on a ``threading.Event`` that a listener thread set when a NOTIFY
arrived: every notified job then waited for two threads to be scheduled in turn (the listener,
then the claim loop) before its claim was even sent, and on two busy cores that hand-off made a
large part of the pickup lag's tail. Now the claim loop itself waits, in one ``poll``, for
the LISTEN connection's socket and for a ``Waker`` (a socket pair that other threads make
readable: a slot freed, a stop was asked for), and reads the notifications itself.

- ``Waker``: ``threading.Event``'s ``set``/``clear``/``is_set``, plus a file descriptor that is
  readable while it is set.
- ``Listener``: the LISTEN connection (psycopg, autocommit), read without blocking
  (``PQconsumeInput`` and ``PQnotifies``, libpq's asynchronous notification API:
  https://www.postgresql.org/docs/current/libpq-notify.html). It is opened, and reopened when
  lost, by a short-lived thread (a connect can block for minutes), ``retry_seconds`` after a
  failed attempt; until it is back the worker polls.
"""

from __future__ import annotations

import logging
import math
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

logger = logging.getLogger(__name__)


class Waker:
    """A flag like ``threading.Event`` whose socket (``fileno()``) is readable while it is set.

    Thread-safe. The socket exists between ``open()`` and ``close()``; the flag works without it.
    ``set`` costs one ``send`` of a byte when the flag was clear and nothing when it was already
    set; ``clear`` reads the bytes back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None

    def open(self) -> None:
        """Make the socket pair (readable at once if the flag is set)."""
        with self._lock:
            if self._reader is not None:
                return
            self._reader, self._writer = socket.socketpair()
            self._reader.setblocking(False)
            self._writer.setblocking(False)
            if self._set:
                self._writer.send(b"\0")

    def fileno(self) -> int:
        """The descriptor to wait on (readable while set). Raises ``RuntimeError`` before ``open()``."""
        if self._reader is None:
            raise RuntimeError("Waker.open() was not called")
        return self._reader.fileno()

    def is_set(self) -> bool:
        """True between ``set`` and the next ``clear``."""
        return self._set

    def set(self) -> None:
        """Set the flag and make ``fileno()`` readable (a waiting ``poll`` returns)."""
        if self._set:  # a concurrent clear() is followed by its caller's look at what we changed before
            return
        with self._lock:
            if self._set:
                return
            self._set = True
            if self._writer is not None:
                try:
                    self._writer.send(b"\0")
                except (BlockingIOError, InterruptedError):  # bytes are in the pair already: readable
                    pass

    def clear(self) -> None:
        """Clear the flag and read the socket empty."""
        with self._lock:
            if not self._set:
                return
            self._set = False
            if self._reader is not None:
                try:
                    while self._reader.recv(4096):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass

    def close(self) -> None:
        """Close the socket pair; the flag goes on working."""
        with self._lock:
            for sock in (self._reader, self._writer):
                if sock is not None:
                    sock.close()
            self._reader = self._writer = None


class Listener:
    """A LISTEN connection read without blocking by one thread, opened and reopened in the background.

    ``conninfo``: psycopg ``connect()`` keyword arguments; ``channel``: the channel name (an SQL
    identifier, not quoted here); ``on_notify(payload)`` is called for each notification read
    (payload: str), and ``on_connect()`` each time LISTEN begins (anything sent while nobody
    listened was missed), both in the thread that calls ``ensure`` and ``read``. Opening the
    connection and sending LISTEN can block for minutes (a pooler queueing new clients, a dropped
    SYN: psycopg's ``connect_timeout`` defaults to 130 s), so a short-lived thread does it and
    calls ``wake()`` when it is done, either way; the owner adopts the connection at its next
    ``ensure``. Meanwhile the owner polls.
    """

    def __init__(
        self,
        conninfo: dict[str, Any],
        channel: str,
        *,
        on_notify: Callable[[str], None],
        on_connect: Callable[[], None],
        wake: Callable[[], None],
        retry_seconds: float,
        name: str,
    ) -> None:
        """``retry_seconds``: at least this long after a failed attempt before the next; ``name``: for the logs."""
        self._conninfo = conninfo
        self._channel = channel
        self._on_notify = on_notify
        self._on_connect = on_connect
        self._wake = wake
        self._retry_seconds = retry_seconds
        self._name = name
        self._conn: psycopg.Connection | None = None  # the owner's
        self._encoding = "utf-8"
        self._lock = threading.Lock()  # guards the four below, shared with the connecting thread
        self._opened: psycopg.Connection | None = None  # opened by the connecting thread, not yet adopted
        self._connecting = False
        self._closed = False
        self._next_attempt = 0.0

    def seconds_to_retry(self) -> float | None:
        """Seconds until ``ensure`` should run again to open or adopt a connection (0: now).

        None while connected, and while an attempt is under way (it calls ``wake()`` when done).
        """
        if self._conn is not None:
            return None
        with self._lock:
            if self._opened is not None:
                return 0.0
            if self._connecting or self._closed:
                return None
            return max(0.0, self._next_attempt - time.monotonic())

    def fileno(self) -> int | None:
        """The connection's socket, or None while there is none."""
        return self._conn.pgconn.socket if self._conn is not None else None

    def ensure(self) -> bool:
        """Adopt a connection opened in the background (True), or start opening one; never blocks or raises.

        An attempt starts when none is open or under way and ``retry_seconds`` have passed since
        the last failed one; a failure is logged by the attempt's thread.
        """
        if self._conn is not None:
            return False
        with self._lock:
            conn, self._opened = self._opened, None
            if conn is None:
                if self._connecting or self._closed or time.monotonic() < self._next_attempt:
                    return False
                self._connecting = True
        if conn is None:
            threading.Thread(target=self._open, name="stint-listen-connect", daemon=True).start()
            return False
        self._conn = conn
        self._encoding = conn.info.encoding
        self._on_connect()
        return True

    def _open(self) -> None:
        conn: psycopg.Connection | None = None
        try:
            conn = psycopg.connect(autocommit=True, **self._conninfo)
            conn.execute(f"LISTEN {self._channel}")
        except Exception as exc:  # noqa: BLE001 - any failure must leave a retry due, never a stuck attempt
            logger.warning("%s: cannot LISTEN (%s); polling until it is back", self._name, exc)
            _close_quietly(conn)
            conn = None
        with self._lock:
            self._connecting = False
            closed = self._closed
            if conn is None:
                self._next_attempt = time.monotonic() + self._retry_seconds
            elif not closed:
                self._opened = conn
        if closed:
            _close_quietly(conn)
        else:
            self._wake()

    def read(self) -> bool:
        """Read what the server sent without blocking and pass each notification on; False when the connection was lost.

        A lost connection is closed (``ensure`` reopens it later) and logged; it never raises.
        """
        conn = self._conn
        if conn is None:
            return False
        pgconn = conn.pgconn
        try:
            pgconn.consume_input()
            while (note := pgconn.notifies()) is not None:
                self._on_notify(note.extra.decode(self._encoding, "replace"))
            if pgconn.status == pq.ConnStatus.OK:
                return True
        except psycopg.Error:
            pass
        logger.warning("%s: LISTEN connection lost; polling until it is back", self._name)
        self.close()
        return False

    def close(self) -> None:
        """Close the connection, if any; a connection still being opened is closed when it opens."""
        conn, self._conn = self._conn, None
        _close_quietly(conn)

    def shut(self) -> None:
        """Close for good: no more attempts, and what an attempt under way opens is closed."""
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, None
        _close_quietly(opened)
        self.close()


def _close_quietly(conn: psycopg.Connection | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except psycopg.Error:
            pass


class WaitSet:
    """One ``poll`` over a ``Waker`` and a ``Listener``'s socket, which may come and go.

    ``poll(2)`` keeps no state in the kernel, so a new connection that reuses the old socket's
    number needs nothing; timeouts are whole milliseconds, rounded up.
    """

    def __init__(self, waker: Waker, listener: Listener) -> None:
        self._listener = listener
        self._poll = select.poll()
        self._poll.register(waker.fileno(), select.POLLIN)
        self._listening: int | None = None

    def wait(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: no limit) for the waker or the connection; read its notifications.

        Returns when the waker is set, when the connection has input (its notifications are then
        passed to the listener's ``on_notify``) or when the time is up.
        """
        fd = self._listener.fileno()
        if fd != self._listening:
            if self._listening is not None:
                self._poll.unregister(self._listening)
            if fd is not None:
                self._poll.register(fd, select.POLLIN)
            self._listening = fd
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        for ready, _ in self._poll.poll(ms):
            if ready == fd:
                self._listener.read()
