"""Request ids: take the caller's ``X-Request-ID`` (or make one), log it on every line, echo it back."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from core.log_context import log_context

REQUEST_ID_HEADER = "X-Request-ID"
# What a proxy or client may send: 1-128 characters of letters, digits and . _ : - (UUIDs, trace
# ids, ULIDs). Anything else (too long, spaces, control characters that could forge log lines)
# is replaced by a fresh id rather than logged.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id_from(value: str | None) -> str:
    """Return ``value`` if it is an acceptable request id, else a new uuid4 string."""
    if value and REQUEST_ID_PATTERN.fullmatch(value):
        return value
    return str(uuid.uuid4())


class RequestIdMiddleware:
    """Set ``request.request_id``, bind it to the request's log lines and send it as ``X-Request-ID``.

    Placed right after django-prometheus's first middleware so every later middleware, view and
    Django's own ``django.request`` warnings log with it.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        """Run the request inside its log context and echo the id on the response."""
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]
        with log_context(request_id=request_id):
            response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request_id
        return response
