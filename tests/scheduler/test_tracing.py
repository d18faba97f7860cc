"""Traces (scheduler.tracing): the request's context travels with the job, each attempt is a span linked to it,
a cron fire is a span its job links to, OTLP export when configured, and no per-job cost when off."""

from __future__ import annotations

import datetime as dt
import http.server
import threading
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from scheduler import leasing, schedules, tracing
from scheduler.enqueuing import enqueue
from scheduler.maintenance.cron_firer import CronFirer
from scheduler.models import CronSchedule, Job
from scheduler.workers.execute import run_handler
from tests.support.leadership import an_hour_ago_on_the_minute

pytestmark = pytest.mark.django_db

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, exporting each span as it ends to the SDK's in-memory exporter."""
    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter, batch=False)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def claim_one(queue: str = "default"):
    (claimed,) = leasing.claim_jobs(worker_id="w-trace", limit=1, queues=[queue])
    return claimed


def named(exporter: InMemorySpanExporter, prefix: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_a_requests_trace_travels_with_its_job_and_each_attempt_is_a_span_linked_to_it(user_api, spans):
    created = user_api.post(
        "/api/jobs",
        {"type": "DEMO_TASK", "payload": {"result": 1}, "queue": "traced"},
        format="json",
        HTTP_TRACEPARENT=TRACEPARENT,
    )
    assert created.status_code == 201
    (server,) = named(spans, "POST")
    assert server.kind == SpanKind.SERVER and server.name == "POST /api/jobs"
    assert f"{server.context.trace_id:032x}" == TRACE_ID  # continues the caller's trace
    assert f"{server.parent.span_id:016x}" == PARENT_SPAN_ID
    assert server.attributes["http.response.status_code"] == 201
    job = Job.objects.get(id=created.json()["id"])
    carried = job.trace_context["traceparent"]
    assert carried.split("-")[1] == TRACE_ID and carried.split("-")[2] == f"{server.context.span_id:016x}"

    report = run_handler(claim_one("traced"), threading.Event())

    assert report.outcome == "SUCCEEDED"
    (attempt,) = named(spans, "stint.job")
    assert attempt.name == "stint.job DEMO_TASK" and attempt.kind == SpanKind.CONSUMER
    assert attempt.parent is None  # its own trace: the request is a link, not a parent
    assert [(link.context.trace_id, link.context.span_id) for link in attempt.links] == [
        (server.context.trace_id, server.context.span_id)
    ]
    attrs = attempt.attributes
    assert (attrs["stint.job.id"], attrs["stint.attempt"], attrs["stint.queue"]) == (str(job.id), 1, "traced")
    assert attrs["stint.outcome"] == "SUCCEEDED" and attempt.status.status_code == StatusCode.OK
    assert attrs["stint.queue_wait_seconds"] >= 0 and attrs["stint.run_seconds"] >= 0


def test_a_failed_attempt_span_says_so_and_counts_its_attempt(user, spans):
    job = enqueue("FAILING", {}, owner=user)  # no current span: the job carries no context
    assert Job.objects.get(id=job.id).trace_context is None

    run_handler(claim_one(), threading.Event())

    (attempt,) = named(spans, "stint.job")
    assert attempt.attributes["stint.outcome"] == "RETRYABLE"
    assert attempt.status.status_code == StatusCode.ERROR
    assert attempt.links == ()


def test_a_trace_context_python_cannot_read_costs_the_attempt_its_link_only(user, spans):
    """A ``trace_context`` edited by hand to nest past Python's limit raised RecursionError out of the span."""
    job = enqueue("DEMO_TASK", {}, owner=user)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE stint_job SET trace_context = (repeat('[', 5000) || repeat(']', 5000))::jsonb WHERE id = %s",
            [job.id],
        )

    report = run_handler(claim_one(), threading.Event())

    assert report.outcome == "SUCCEEDED"
    (attempt,) = named(spans, "stint.job")
    assert attempt.links == ()


def test_a_cron_fire_is_a_span_naming_its_schedule_and_the_fired_jobs_attempt_links_to_it(user, leader, spans):  # noqa: F811
    schedule = schedules.schedule_create(owner=user, name="nightly", cron="* * * * *", job={"type": "DEMO_TASK"})
    due = an_hour_ago_on_the_minute()  # due in the past, so its job is QUEUED at once
    CronSchedule.objects.filter(id=schedule.id).update(next_fire_at=due)
    leader.leading_since = due - dt.timedelta(hours=1)

    assert CronFirer(leadership=leader).run_once(now=due + dt.timedelta(seconds=1)) == 1

    (fire,) = named(spans, "stint.cron.fire")
    assert fire.attributes["stint.schedule.id"] == schedule.id
    assert fire.attributes["stint.schedule.name"] == "nightly"
    assert fire.attributes["stint.fire_time"] == due.isoformat()
    run_handler(claim_one(), threading.Event())
    (attempt,) = named(spans, "stint.job")
    assert attempt.links[0].context.span_id == fire.context.span_id
    assert attempt.attributes["stint.schedule.id"] == schedule.id


def test_tracing_is_off_by_default_and_then_costs_no_query_per_job(user, django_assert_num_queries):
    assert settings.STINT_TRACING_ENABLED is False and not tracing.enabled()
    enqueue("DEMO_TASK", {}, owner=user)
    claimed = claim_one()
    assert Job.objects.get(id=claimed.id).trace_context is None

    with django_assert_num_queries(0):
        report = run_handler(claimed, threading.Event())

    assert report.outcome == "SUCCEEDED"


def test_spans_are_exported_over_otlp_http_when_configured(user):
    received: list[tuple[str, str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracing.configure(exporter=OTLPSpanExporter(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces"))
        enqueue("DEMO_TASK", {}, owner=user)
        run_handler(claim_one(), threading.Event())
        tracing.shutdown()  # flushes the batch processor
    finally:
        server.shutdown()
        server.server_close()
        tracing.shutdown()

    assert received and received[0][0] == "/v1/traces" and received[0][1] == "application/x-protobuf"
    request = ExportTraceServiceRequest()
    request.ParseFromString(received[0][2])
    names = [span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    assert names == ["stint.job DEMO_TASK"]
    resource = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "stint"
