"""Two last guards between a request and a 500: text PostgreSQL cannot store, and a database that is down.

``BadTextMiddleware`` answers 400 to any request whose query string or urlencoded form carries a
NUL character or a lone UTF-16 surrogate, before a view passes it to the database (PostgreSQL's
text types refuse NUL; a surrogate cannot be encoded): the console's list filters, bulk pages
and forms take their values straight from the request. ``DatabaseUnavailableMiddleware`` turns
a connection-level database error raised by a view (``OperationalError``, ``InterfaceError``)
into a 503 that says so, JSON under ``/api/`` (DESIGN.md's error shape), instead of Django's 500
page. Both answer JSON under ``/api/`` and a short text page elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, QueryDict

from core.dberrors import db_error_summary
from core.errors import json_or_page
from core.parsers import has_lone_surrogate

logger = logging.getLogger(__name__)

BAD_TEXT_MESSAGE = "The request's parameters contain a NUL character or an unpaired surrogate, which cannot be stored."
UNAVAILABLE_MESSAGE = "The database is unavailable; nothing was changed by this request. Try again shortly."


def _answer(request: HttpRequest, *, status: int, message: str) -> HttpResponse:
    page = HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
    return json_or_page(request, status, message, page)


def _bad(items: QueryDict) -> bool:
    return any("\x00" in text or has_lone_surrogate(text) for key, values in items.lists() for text in (key, *values))


class BadTextMiddleware:
    """400 for a NUL or a lone surrogate in the query string or an urlencoded form body (see the module)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        form = request.content_type == "application/x-www-form-urlencoded" and request.method == "POST"
        if _bad(request.GET) or (form and _bad(request.POST)):
            return _answer(request, status=400, message=BAD_TEXT_MESSAGE)
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
