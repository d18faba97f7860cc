"""Render every API error in one JSON shape: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

_CODES_BY_STATUS = {
    400: "validation_error",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    503: "service_unavailable",
}


def error_body(*, code: str, message: str, details: Any = None) -> dict[str, Any]:
    """Build the error envelope of DESIGN.md.

    Returns ``{"error": {"code": str, "message": str, "details": Any}}``.
    """
    return {"error": {"code": code, "message": message, "details": details}}


def _first_message(detail: Any) -> str:
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    if isinstance(detail, dict) and detail:
        key, value = next(iter(detail.items()))
        inner = _first_message(value)
        return inner if key in ("non_field_errors", "detail") else f"{key}: {inner}"
    return str(detail)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler that wraps every error in the envelope of ``error_body``.

    Domain errors (``scheduler.exceptions.StintError`` and subclasses) carry their own
    ``http_status`` and ``code``; DRF and Django errors keep DRF's status. Returns None for
    anything else so that a real bug still surfaces as a 500.
    """
    http_status = getattr(exc, "http_status", None)
    if http_status is not None:
        return Response(
            error_body(code=exc.code, message=str(exc), details=getattr(exc, "details", None)),
            status=http_status,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    code = _CODES_BY_STATUS.get(response.status_code, "error")
    details: Any = None
    if isinstance(exc, exceptions.ValidationError):
        message = _first_message(detail)
        details = detail
    else:
        message = str(detail.get("detail", detail)) if isinstance(detail, dict) else str(detail)
        exc_code = getattr(getattr(exc, "detail", None), "code", None)
        if isinstance(detail, dict) and isinstance(detail.get("code"), str):
            exc_code = detail["code"]
        if response.status_code == status.HTTP_401_UNAUTHORIZED and exc_code:
            code = str(exc_code)
        if isinstance(detail, dict):
            extra = {k: v for k, v in detail.items() if k not in ("detail", "code")}
            details = extra or None
        if response.status_code == status.HTTP_401_UNAUTHORIZED and _says_expired(detail):
            message = _expired_message(context)
        if isinstance(exc, exceptions.NotAuthenticated):
            code, message = _not_authenticated(context)
        elif code == "bad_authorization_header" and BEARER_HINT not in message:
            message = f"{message.rstrip('.')}: {BEARER_HINT}."
        if isinstance(exc, exceptions.UnsupportedMediaType):
            message = _unsupported_media_type_message(message, context)
    response.data = error_body(code=code, message=message, details=details)
    return response


def _says_expired(detail: Any) -> bool:
    """True when simplejwt's 401 detail (its ``detail`` or any of its per-token ``messages``) says expired."""
    texts: list[str] = []
    if isinstance(detail, dict):
        texts.append(str(detail.get("detail", "")))
        for item in detail.get("messages") or []:
            if isinstance(item, dict):
                texts.append(str(item.get("message", "")))
    return any("expired" in text.lower() for text in texts)


def _expired_message(context: dict[str, Any]) -> str:
    """The 401 message for an expired token: what expired and what to do (refresh, or sign in again)."""
    request = context.get("request")
    if request is not None and request.path.rstrip("/").endswith("/auth/refresh"):
        return "Token expired: this refresh token is past its lifetime; sign in again (POST /api/auth/login)."
    return (
        "Token expired: the access token is past its lifetime; get a new one from POST /api/auth/refresh "
        "with your refresh token (or sign in again)."
    )


BEARER_HINT = "send 'Authorization: Bearer <access token>', a JWT from POST /api/auth/login"


JSON_HINT = "send the body as JSON, with the header 'Content-Type: application/json'"


def _unsupported_media_type_message(message: str, context: dict[str, Any]) -> str:
    """Return the 415 message, with what to send when it is DRF's "Unsupported media type" for a body type.

    Every API body is JSON (``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``), and the usual cause is
    ``curl -d '{...}'`` without ``-H 'Content-Type: application/json'``, which sends a form: DRF's
    message named the type it got but not the one to send. A 415 with a message of its own (an
    unusable ``charset``, ``core.parsers.declared_charset``) is returned unchanged.
    """
    request = context.get("request")
    default = str(exceptions.UnsupportedMediaType(getattr(request, "content_type", "")).detail)
    if message != default:
        return message
    return f"{message.rstrip('.')}: {JSON_HINT}."


def _not_authenticated(context: dict[str, Any]) -> tuple[str, str]:
    """Return the 401 code and message for a request that carried no usable credentials.

    SimpleJWT ignores an Authorization header whose scheme is not one of ``AUTH_HEADER_TYPES``
    (``Token ...``, ``Basic ...``, a bare token), so DRF said "credentials were not provided",
    which does not tell a client who did send a header what is wrong with it: name its scheme
    (code ``bad_authorization_header``, SimpleJWT's own code for a malformed header).
    """
    request = context.get("request")
    header = str(getattr(request, "META", {}).get("HTTP_AUTHORIZATION", "")).strip()
    if not header:
        return "not_authenticated", f"Authentication credentials were not provided: {BEARER_HINT}."
    scheme = header.split()[0][:40]
    message = f"The Authorization header must use the Bearer scheme, not {scheme!r}: {BEARER_HINT}."
    return "bad_authorization_header", message


def json_or_page(
    request: HttpRequest, status_code: int, message: str, default: Any, *, details: Any = None
) -> HttpResponse:
    """Answer ``status_code`` with the JSON error envelope (and ``details``) under /api/, ``default`` elsewhere.

    The envelope's code follows the status (``_CODES_BY_STATUS``, e.g. 400 ``validation_error``,
    503 ``service_unavailable``; ``server_error`` for any other).
    """
    if request.path.startswith("/api/"):
        code = _CODES_BY_STATUS.get(status_code, "server_error")
        return JsonResponse(error_body(code=code, message=message, details=details), status=status_code)
    return default


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Answer Django's own 400s (e.g. ``SuspiciousOperation``) as JSON under /api/; a body too big as the 413.

    ``RequestDataTooBig`` reaches here when a body without a usable ``Content-Length`` grows past
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``core.body_limit`` refuses the declared ones earlier).
    """
    from django.conf import settings
    from django.core.exceptions import RequestDataTooBig
    from django.views.defaults import bad_request

    if isinstance(exception, RequestDataTooBig):
        from core.body_limit import payload_too_large

        return payload_too_large(request, limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if request.path.startswith("/api/"):
        return json_or_page(request, 400, "Bad request.", None)
    return bad_request(request, exception)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Answer 404 as JSON under /api/ and as Django's page elsewhere."""
    from django.views.defaults import page_not_found

    if request.path.startswith("/api/"):
        return json_or_page(request, 404, "Not found.", None)
    return page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    """Answer 500 as JSON under /api/ and as Django's page elsewhere."""
    from django.views.defaults import server_error

    if request.path.startswith("/api/"):
        return JsonResponse(error_body(code="server_error", message="Internal server error."), status=500)
    return server_error(request)


SLASH_HINT = "Stint's API paths end without a slash, except /api/schema/ and /api/docs/."


def _slash_twin(request: HttpRequest) -> str | None:
    """Return the request's path with its trailing slash added or removed if that path exists, else None.

    ``APPEND_SLASH`` never helps under /api/: the catch-all ``api/<path:path>`` matches every
    path, and a redirect could not carry a POST's body anyway. So the 404 names the path meant.
    """
    info = request.path_info
    twin_info = info[:-1] if info.endswith("/") else info + "/"
    try:
        match = resolve(twin_info)
    except Resolver404:
        return None
    if match.func is api_not_found:
        return None
    return request.path[:-1] if request.path.endswith("/") else request.path + "/"


@csrf_exempt  # it changes nothing; without this a POST would get the CSRF failure page instead
def api_not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    """Answer any unknown path under /api/ (any method) with the JSON 404, in DEBUG too.

    A path that exists with its trailing slash added or removed (``/api/jobs/``, ``/api/docs``)
    is a 404 whose message and ``details.path`` name that path.
    """
    meant = _slash_twin(request)
    if meant is None:
        return JsonResponse(error_body(code="not_found", message="Not found."), status=404)
    message = f"Not found. Did you mean {meant}? {SLASH_HINT}"
    return JsonResponse(error_body(code="not_found", message=message, details={"path": meant}), status=404)
