"""Two last guards between a request and a 500: text PostgreSQL cannot store, and a database that is down.

``BadTextMiddleware`` answers 400 to any request whose query string or urlencoded form carries a
NUL character or a lone UTF-16 surrogate, before a view passes it to the database (PostgreSQL's
text types refuse NUL; a surrogate cannot be encoded): the console's list filters, bulk pages
and forms take their values straight from the request. ``DatabaseUnavailableMiddleware`` turns
a connection-level database error raised by a view (``OperationalError``, ``InterfaceError``)
into a 503 that says so, JSON under ``/api/`` (DESIGN.md's error shape), instead of Django's 500
page. Both answer JSON under ``/api/`` and a short text page elsewhere.

``DatabaseDeadlineMiddleware`` bounds how long a request waits on a database that does not answer
(``STINT_REQUEST_DB_TIMEOUT_SECONDS``, default 30; 0: no bound). A frozen PostgreSQL (SIGSTOPped,
a stalled storage, a paused VM) keeps its sockets open and its kernel acknowledging, so neither
TCP keepalives nor ``tcp_user_timeout`` end the wait, and its ``statement_timeout`` is its own:
every request waited as long as the freeze, until gunicorn killed its worker (60 s) and every
request the worker held. Past the bound, one watchdog thread per process shuts down the socket of
each database connection of the request's thread: the query it waits on fails at once as a lost
connection, which ``DatabaseUnavailableMiddleware`` answers 503, and the request's thread closes
those connections (the next request opens new ones). A request that then connects again (Django's
health check of a persistent connection does) waits at most one more connect timeout
(``STINT_DB_CONNECT_TIMEOUT_SECONDS``). A request slower than the bound for any
other reason (a query that takes that long) is cut the same way: raise the bound for such a
deployment, below gunicorn's ``timeout``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, HttpResponse, QueryDict

from core.dberrors import db_error_summary
from core.errors import json_or_page
from core.parsers import has_lone_surrogate

logger = logging.getLogger(__name__)

BAD_TEXT_MESSAGE = "The request's parameters contain a NUL character or an unpaired surrogate, which cannot be stored."
# Not "nothing was changed": a connection cut after its COMMIT was sent (the deadline below, a lost
# link) may have committed. A job retried with the same Idempotency-Key is the same job (DESIGN.md).
UNAVAILABLE_MESSAGE = (
    "The database is unavailable, so this request may or may not have taken effect. Try again shortly;"
    " a job submitted again with the same Idempotency-Key header is not created twice."
)


def _answer(
    request: HttpRequest, *, status: int, message: str, details: dict[str, list[str]] | None = None
) -> HttpResponse:
    """``message`` as a plain-text page, or under /api/ as the error envelope; ``details`` names the fields."""
    page = HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
    if details:
        message = f"{next(iter(details))}: {message}"
    return json_or_page(request, status, message, page, details=details)


def _is_bad(text: str) -> bool:
    return "\x00" in text or has_lone_surrogate(text)


def _bad(items: QueryDict) -> list[str]:
    """The names in ``items`` whose name or a value holds a NUL or a lone surrogate, printable (``\\x00``)."""
    return [
        key.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")[:100]
        for key, values in items.lists()
        if any(_is_bad(text) for text in (key, *values))
    ]


class BadTextMiddleware:
    """400 for a NUL or a lone surrogate in the query string or an urlencoded form body (see the module)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        form = request.content_type == "application/x-www-form-urlencoded" and request.method == "POST"
        names = _bad(request.GET) or (_bad(request.POST) if form else [])
        if names:
            # The API's 400 names them, as its other 400s do: "status: ..." and details {"status": [...]}.
            return _answer(
                request, status=400, message=BAD_TEXT_MESSAGE, details={name: [BAD_TEXT_MESSAGE] for name in names}
            )
        return self.get_response(request)


class DatabaseUnavailableMiddleware:
    """503 for a view that met a database connection error (see the module); other errors pass on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """Answer 503 for ``OperationalError``/``InterfaceError``; None (Django's handling) otherwise."""
        if isinstance(exception, OperationalError | InterfaceError):
            # "database unavailable (...)", or what a lock timeout or a cancelled statement is.
            logger.error("%s while serving %s %s", db_error_summary(exception), request.method, request.path)
            response = _answer(request, status=503, message=UNAVAILABLE_MESSAGE)
            response["Retry-After"] = "5"
            return response
        return None


class _DeadlineWatchdog:
    """One daemon thread that cuts the database sockets of requests past their deadline (see the module)."""

    TICK_SECONDS = 0.25  # how late past its deadline a request may be cut

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, list[BaseDatabaseWrapper]]] = {}
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, wrappers: list[BaseDatabaseWrapper]) -> int:
        """Watch ``wrappers`` (a request thread's connections) until ``deadline`` (monotonic); return a token."""
        with self._lock:
            token = next(self._tokens)
            self._armed[token] = (deadline, wrappers)
            if self._thread is None or not self._thread.is_alive():  # none yet, or lost in a fork
                self._thread = threading.Thread(target=self._run, name="db-deadline", daemon=True)
                self._thread.start()
            return token

    def disarm(self, token: int) -> bool:
        """Stop watching ``token``; return True if its connections were cut."""
        with self._lock:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK_SECONDS)
            now = time.monotonic()
            with self._lock:  # cut under the lock: a request that disarms meanwhile waits, then closes
                for token, (deadline, wrappers) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        self._fired.add(token)
                        for wrapper in wrappers:
                            _cut(wrapper)


def _cut(wrapper: BaseDatabaseWrapper) -> None:
    """Shut down the socket of ``wrapper``'s open connection (if any): a read or write on it fails at once."""
    raw = wrapper.connection
    if raw is None:
        return
    with contextlib.suppress(Exception):  # closed meanwhile, or no socket: nothing to cut
        with socket.socket(fileno=os.dup(raw.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)


_watchdog = _DeadlineWatchdog()


class DatabaseDeadlineMiddleware:
    """Cut a request's database connections once it has run ``STINT_REQUEST_DB_TIMEOUT_SECONDS`` (see the module)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        seconds = float(getattr(settings, "STINT_REQUEST_DB_TIMEOUT_SECONDS", 0))
        if seconds <= 0:
            return self.get_response(request)
        wrappers = [connections[alias] for alias in connections]  # this thread's
        token = _watchdog.arm(time.monotonic() + seconds, wrappers)
        try:
            return self.get_response(request)
        finally:
            if _watchdog.disarm(token):
                logger.error(
                    "%s %s ran past %.0f s (STINT_REQUEST_DB_TIMEOUT_SECONDS): its database connections were cut",
                    request.method,
                    request.path,
                    seconds,
                )
                for wrapper in wrappers:
                    with contextlib.suppress(DatabaseError):
                        wrapper.close()
