"""OpenTelemetry traces of jobs: the creating request's context travels with the job; each attempt is a span.

Off by default. On (``STINT_OTEL_ENABLED``, or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` in the environment), every Stint process exports its
spans over OTLP/HTTP (``opentelemetry-exporter-otlp-proto-http``, which reads the standard
``OTEL_EXPORTER_OTLP_*`` variables) through a batch processor, under ``service.name``
``OTEL_SERVICE_NAME`` (default ``stint``) with ``stint.process`` naming the process role.

What is traced (W3C trace context, the OpenTelemetry specification's messaging pattern: the
consumer's span *links* to the producer's context rather than being its child, since a job may
run long after the request ended, and more than once):

- a web request is a SERVER span (``scheduler.tracing_middleware``), continuing an incoming
  ``traceparent``;
- an enqueue stores the current context (``traceparent``, ``tracestate``) in the job's
  ``trace_context`` (``attach_current``);
- a cron fire is a span of its own (``stint.cron.fire``, with the schedule's id and name and
  the fire time) whose context the fired job carries (``record_cron_fires``);
- each attempt is a CONSUMER span around the handler call (``attempt_span``): job id and type,
  queue, attempt number, queue wait (due to claim, seconds) and run time, the outcome, the
  schedule and fire time of a cron job, and a link to the context the job carries. Spans the
  handler makes are its children.

When tracing is off every hook costs one ``None`` check: no query, no allocation per job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from django.db import connection
from psycopg.types.json import Jsonb

logger = logging.getLogger(__name__)

SERVICE_NAME_DEFAULT = "stint"
TRACER_NAME = "stint"
_NO_SPAN: AbstractContextManager[None] = nullcontext()

_tracer: Any = None  # an opentelemetry Tracer while tracing is on; None means off
_provider: Any = None


def enabled() -> bool:
    """True while tracing is on in this process."""
    return _tracer is not None


def configure(*, exporter: Any = None, role: str | None = None, batch: bool = True) -> None:
    """Turn tracing on in this process, exporting to ``exporter`` (default: OTLP over HTTP).

    ``batch`` False exports each span as it ends (tests, with the SDK's ``InMemorySpanExporter``).
    The provider also becomes OpenTelemetry's global one the first time, so handlers' own
    spans (and any instrumentation a project adds) join the attempt's trace.
    """
    global _tracer, _provider
    from django.conf import settings
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    attributes = {"service.name": getattr(settings, "OTEL_SERVICE_NAME", "") or SERVICE_NAME_DEFAULT}
    if role:
        attributes["stint.process"] = role
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    shutdown()
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME)
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(provider)


def configure_from_settings() -> None:
    """Turn tracing on when ``settings.STINT_TRACING_ENABLED`` (called once per process, at app start)."""
    from django.conf import settings

    if not getattr(settings, "STINT_TRACING_ENABLED", False):
        return
    configure()


def shutdown() -> None:
    """Flush and stop the exporter, and turn tracing off in this process."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


# -- context at enqueue -------------------------------------------------------------------------


def current_context() -> dict[str, str] | None:
    """Return the current span's W3C context as ``{"traceparent", "tracestate"?}``, or None without one."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier if "traceparent" in carrier else None


def attach_current(created: Sequence[tuple[Any, str]]) -> None:
    """Store the current trace context in the jobs just created (``lifecycle.create_jobs``' (id, status) rows).

    The enqueue hook, in the caller's transaction: one ``UPDATE`` while tracing is on and a span
    is current; off, a ``None`` check and nothing else.
    """
    if _tracer is None or not created:
        return
    context = current_context()
    if context is None:
        return
    job_ids = [job_id for job_id, _ in created]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE stint_job SET trace_context = %s WHERE id = ANY(%s::uuid[])", [Jsonb(context), list(job_ids)]
        )


def record_cron_fires(jobs: Sequence[Any], inserted: Sequence[tuple[Any, str]]) -> None:
    """Make one ``stint.cron.fire`` span per fired job and store its context in the job (the cron hook).

    ``jobs`` are the ``lifecycle.NewJob`` rows the firer asked for, ``inserted`` the (id, status)
    that were created. The span names the schedule (``stint.schedule.id``, ``stint.schedule.name``)
    and the fire time; each attempt of the job links to it.
    """
    if _tracer is None or not inserted:
        return
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    by_id = {job.id: job for job in jobs}
    ids, contexts = [], []
    for job_id, status in inserted:
        job = by_id.get(job_id)
        if job is None:
            continue
        span = _tracer.start_span(
            "stint.cron.fire",
            kind=SpanKind.PRODUCER,
            attributes={
                "stint.schedule.id": int(job.schedule_id),
                "stint.schedule.name": job.name,
                "stint.fire_time": job.fire_time.isoformat() if job.fire_time else "",
                "stint.job.id": str(job_id),
                "stint.job.type": job.type,
                "stint.queue": job.queue,
                "stint.job.status": status,
            },
        )
        span.end()
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
        ids.append(job_id)
        contexts.append(Jsonb(carrier))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE stint_job j SET trace_context = v.ctx FROM unnest(%s::uuid[], %s::jsonb[]) AS v(id, ctx)"
            " WHERE j.id = v.id",
            [ids, contexts],
        )


# -- the attempt span ---------------------------------------------------------------------------


def attempt_span(job: Any) -> AbstractContextManager[Any]:
    """Return a context manager spanning one attempt of ``job`` (a ``lifecycle.Claimed``); yields the span.

    Off: a shared no-op context manager that yields None (no query, nothing allocated).
    """
    if _tracer is None:
        return _NO_SPAN
    return _attempt_span(job)


@contextmanager
def _attempt_span(job: Any) -> Iterator[Any]:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind

    links: list[Link] = []
    attributes: dict[str, Any] = {
        "stint.job.id": str(job.id),
        "stint.job.type": job.type,
        "stint.queue": job.queue,
        "stint.attempt": int(job.attempt),
        "stint.queue_wait_seconds": max(0.0, (job.started_at - job.scheduled_at).total_seconds()),
        "messaging.system": "stint",
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT trace_context, schedule_id, fire_time FROM stint_job WHERE id = %s", [job.id])
            row = cursor.fetchone()
    except Exception:  # tracing must never cost a job its run
        logger.warning("tracing: could not read the trace context of job %s", job.id, exc_info=True)
        row = None
    if row is not None:
        carried, schedule_id, fire_time = row
        parent = _span_context(carried)
        if parent is not None:
            links.append(Link(parent, attributes={"stint.link": "created_by"}))
        if schedule_id is not None:
            attributes["stint.schedule.id"] = int(schedule_id)
            attributes["stint.fire_time"] = fire_time.isoformat() if fire_time else ""
    started = time.monotonic()
    # A new trace root: the job's creator is a link, not a parent (it may have ended long ago).
    with _tracer.start_as_current_span(
        f"stint.job {job.type}",
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        finally:
            span.set_attribute("stint.run_seconds", round(time.monotonic() - started, 6))


def record_outcome(span: Any, report: Any) -> None:
    """Put a ``leasing.Report``'s outcome on the attempt span (``stint.outcome``; ERROR status unless it succeeded)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    outcome = str(getattr(report.outcome, "value", report.outcome))
    span.set_attribute("stint.outcome", outcome)
    if outcome in ("SUCCEEDED", "CANCELLED"):
        span.set_status(Status(StatusCode.OK))
    else:
        span.set_status(Status(StatusCode.ERROR, (report.error or outcome)[:500]))


def _span_context(carried: Any) -> Any:
    """The remote ``SpanContext`` a job's stored ``trace_context`` names, or None."""
    import json

    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if isinstance(carried, str):
        try:
            carried = json.loads(carried)
        except (ValueError, RecursionError):  # a row edited by hand (core.stored_json): no link, the job runs
            return None
    if not isinstance(carried, dict):
        return None
    carrier = {k: v for k, v in carried.items() if isinstance(k, str) and isinstance(v, str)}
    span_context = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    return span_context if span_context.is_valid else None
