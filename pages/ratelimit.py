"""Rate limits for the pages' writes: the same Redis budgets as the API (``core.throttling``).

A signed-in user's page writes count against their ``user`` budget, shared with their API calls,
so a second client cannot double anyone's allowance; sign-in and registration count against the
``auth`` budget of the client address, as the API's login and register do. Redis away: allowed
(fail open), exactly as in the API.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from core.metrics import rate_limit_rejections_total
from core.throttling import (
    REQUEST_ATTR,
    RateLimitDecision,
    rate_for_scope,
    rate_identity,
    window_hit,
)

TOO_MANY_REQUESTS = 429
AUTH_SCOPE = "auth"  # the per-address budget of every view that takes a password (API, pages, admin)


def rate_limit_hit(request: HttpRequest, *, scope: str) -> RateLimitDecision | None:
    """Count one request in ``scope`` for this caller; return the decision (None: unlimited or Redis away).

    The decision is left on the request, so ``RateLimitHeadersMiddleware`` sends the
    ``X-RateLimit-*`` and ``Retry-After`` headers as it does for the API.
    """
    rate = rate_for_scope(scope)
    if rate is None:
        return None
    identity = rate_identity(scope=scope, user=getattr(request, "user", None), request=request)
    decision = window_hit(scope=scope, identity=identity, rate=rate)
    if decision is not None:
        setattr(request, REQUEST_ATTR, decision)
        if not decision.allowed:
            rate_limit_rejections_total.labels(scope=scope).inc()
    return decision


def too_many_requests(request: HttpRequest, decision: RateLimitDecision) -> HttpResponse:
    """Render the readable 429 page: how long to wait, no traceback."""
    return TemplateResponse(
        request,
        "pages/error.html",
        {
            "title": "Too many requests",
            "message": f"You are going faster than the limit of {decision.limit} requests. "
            f"Please wait {decision.reset_seconds} seconds and try again.",
        },
        status=TOO_MANY_REQUESTS,
    )


def limit_posts(scope: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Decorate a view so that its POSTs count against ``scope`` and answer 429 once it is spent."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method == "POST":
                decision = rate_limit_hit(request, scope=scope)
                if decision is not None and not decision.allowed:
                    return too_many_requests(request, decision)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate
