"""Answer an oversized request body with 413 before anything reads it: JSON under /api/, a readable page elsewhere.

Without this, the first middleware that touches ``request.POST`` or ``request.body`` (CSRF,
sessions, a form) raises Django's ``RequestDataTooBig`` for a body over
``DATA_UPLOAD_MAX_MEMORY_SIZE`` and the client gets Django's HTML "Bad Request (400)", on the API
too. Limits: ``core.parsers.api_body_limit()`` (64 KB) under /api/, Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (2.5 MB) elsewhere. Only the declared ``Content-Length`` is
checked here; a chunked API body is bounded by the parser as it is read
(``core.parsers.SafeJSONParser``), and Django's WSGI request reads no more than the declared
length anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse

from core.errors import error_body
from core.parsers import api_body_limit

PAYLOAD_TOO_LARGE = 413
API_PREFIX = "/api/"


def payload_too_large(request: HttpRequest, *, limit: int, declared: int | None = None) -> HttpResponse:
    """Return the 413 for ``request``: DESIGN.md's JSON error under /api/, the readable error page elsewhere."""
    size = f"{declared} bytes" if declared is not None else "over the limit"
    message = f"The request body is {size}; the limit is {limit} bytes."
    if request.path.startswith(API_PREFIX):
        return JsonResponse(error_body(code="payload_too_large", message=message), status=PAYLOAD_TOO_LARGE)
    response = TemplateResponse(
        request, "pages/error.html", {"title": "Too much data", "message": message}, status=PAYLOAD_TOO_LARGE
    )
    return response.render()


class RequestBodyLimitMiddleware:
    """Refuse with 413 a request whose ``Content-Length`` is over its path's limit (module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        """Answer 413 at once for a declared oversized body; otherwise pass the request on."""
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0  # what Django itself reads for a malformed length
        if request.path.startswith(API_PREFIX):
            limit = api_body_limit()
        else:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and declared > limit:
            return payload_too_large(request, limit=limit, declared=declared)
        return self.get_response(request)
