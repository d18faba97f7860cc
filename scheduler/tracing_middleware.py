"""A SERVER span per web request while tracing is on (``scheduler.tracing``); a pass-through while it is off.

It continues an incoming W3C ``traceparent`` (a client's or a proxy's trace), so a job created
by the request carries that trace's context and its attempts link back to it. Attributes follow
OpenTelemetry's HTTP semantic conventions (method, route, path, status code). Our own small
middleware rather than ``opentelemetry-instrumentation-django``: that package is a 0.x beta that
patches Django at import; this needs one span.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from scheduler import tracing


class TraceRequestMiddleware:
    """Wrap each request in a SERVER span named ``{METHOD} {route}`` when tracing is on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        """Pass through when tracing is off; otherwise run the request inside its span."""
        if not tracing.enabled():
            return self.get_response(request)
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = {k.lower(): v for k, v in request.headers.items() if k.lower() in ("traceparent", "tracestate")}
        parent = TraceContextTextMapPropagator().extract(carrier)
        with tracing._tracer.start_as_current_span(
            request.method or "HTTP",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": request.method or "", "url.path": request.path[:2000]},
        ) as span:
            response = self.get_response(request)
            match = getattr(request, "resolver_match", None)
            route = getattr(match, "route", None)
            if route:
                span.update_name(f"{request.method} /{route}")
                span.set_attribute("http.route", f"/{route}")
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response
