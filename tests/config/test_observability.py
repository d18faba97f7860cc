"""The web process's /metrics (open in development, restricted in production), request ids and JSON logs."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.http import HttpResponse
from django.test import RequestFactory
from pythonjsonlogger.json import JsonFormatter

from core.log_context import ContextFilter, PlainFormatter, bound_fields, log_context
from core.request_id import RequestIdMiddleware
from scheduler.enqueuing import enqueue
from scheduler.states import JobStatus
from tests.support.processes import Processes, status_is, wait_until, worker_of

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t" * 40


# -- /metrics ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_are_open_in_development_and_hold_http_and_job_metrics(client, settings) -> None:
    settings.METRICS_RESTRICTED = False
    client.get("/no/such/page")

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert "django_http_requests_total_by_method_total{" in text  # django-prometheus
    assert "# TYPE jobs_created_total counter" in text  # scheduler.metrics, same registry
    assert "# TYPE rate_limit_rejections_total counter" in text


@pytest.mark.django_db
def test_the_web_exports_no_worker_or_scheduler_family_it_does_not_measure(client, settings) -> None:
    settings.METRICS_RESTRICTED = False

    text = client.get("/metrics").content.decode()

    families = {line.split()[2].removesuffix("_total") for line in text.splitlines() if line.startswith("# TYPE ")}
    for foreign in (
        "worker_slots_busy",
        "worker_slots_total",
        "worker_stuck_threads",
        "scheduler_is_leader",
        "leases_rescued",
        "cron_fires",
        "jobs_queue_depth",
        "workers_active",
        "outbox_backlog",
        "audit_events_stored",
    ):
        assert foreign not in families, foreign
    assert {"jobs_created", "rate_limit_rejections", "rate_limit_backend_errors"} <= families


@pytest.mark.django_db
def test_restricted_metrics_refuse_everyone_without_an_allowed_address_or_the_token(client, settings) -> None:
    settings.METRICS_RESTRICTED = True
    settings.METRICS_ALLOWED_IPS = []
    settings.METRICS_BEARER_TOKEN = ""

    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    assert b"jobs_created" not in response.content


@pytest.mark.django_db
def test_restricted_metrics_admit_the_bearer_token_only(client, settings) -> None:
    settings.METRICS_RESTRICTED = True
    settings.METRICS_ALLOWED_IPS = []
    settings.METRICS_BEARER_TOKEN = TOKEN

    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN[:-1]}").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 403
    assert client.get("/metrics").status_code == 403


@pytest.mark.django_db
def test_restricted_metrics_admit_allowed_peers_by_socket_address_not_forwarded_headers(client, settings) -> None:
    settings.METRICS_RESTRICTED = True
    settings.METRICS_ALLOWED_IPS = ["10.20.0.0/16", "192.0.2.7", "2001:db8::/32"]
    settings.METRICS_BEARER_TOKEN = ""

    assert client.get("/metrics", REMOTE_ADDR="10.20.3.4").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="2001:db8::5").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:10.20.0.9").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.21.0.1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="10.20.3.4").status_code == 403


@pytest.mark.django_db
def test_metrics_accept_only_safe_methods(client, settings) -> None:
    settings.METRICS_RESTRICTED = False

    assert client.post("/metrics").status_code == 405


def settings_in_subprocess(env: dict[str, str], expression: str) -> subprocess.CompletedProcess[str]:
    """Import the settings with ``env`` (on top of a minimal environment) and print ``expression``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "METRICS_", "LOG_"))}
    code = f"import django; django.setup(); from django.conf import settings; print({expression})"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


PRODUCTION_ENV = {
    "DJANGO_ENV": "production",
    "SECRET_KEY": "s" * 40,
    "JWT_SIGNING_KEY": "j" * 40,
    "ALLOWED_HOSTS": "example.org",
}


def test_metrics_are_restricted_and_logs_are_json_by_default_in_production() -> None:
    prod = settings_in_subprocess(PRODUCTION_ENV, "settings.METRICS_RESTRICTED, settings.LOG_FORMAT")
    dev = settings_in_subprocess({"DJANGO_ENV": "development"}, "settings.METRICS_RESTRICTED, settings.LOG_FORMAT")

    assert prod.stdout.strip() == "True json", prod.stderr
    assert dev.stdout.strip() == "False plain", dev.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"METRICS_ALLOWED_IPS": "10.0.0.0/8,not-an-address"}, "METRICS_ALLOWED_IPS"),
        ({"METRICS_BEARER_TOKEN": "short"}, "METRICS_BEARER_TOKEN"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
    ],
)
def test_bad_observability_settings_refuse_to_start(env: dict[str, str], message: str) -> None:
    result = settings_in_subprocess(env, "1")

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


# -- request ids -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_valid_request_id_is_echoed(client) -> None:
    response = client.get("/metrics", HTTP_X_REQUEST_ID="req-42.abc:DEF_9")

    assert response["X-Request-ID"] == "req-42.abc:DEF_9"


@pytest.mark.django_db
def test_a_missing_request_id_is_generated_fresh_for_each_request(client) -> None:
    first = client.get("/metrics")["X-Request-ID"]
    second = client.get("/no/such/page")["X-Request-ID"]

    assert uuid.UUID(first).version == 4
    assert uuid.UUID(second).version == 4
    assert first != second


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["a" * 129, "has space", "line\nbreak", 'quote"', "semi;colon", "é"])
def test_an_unacceptable_request_id_is_replaced(client, bad: str) -> None:
    response = client.get("/metrics", HTTP_X_REQUEST_ID=bad)

    assert uuid.UUID(response["X-Request-ID"]).version == 4


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """Capture root-logger records through the settings' JSON formatter and context filter."""
    spec = {k: v for k, v in django_settings.LOGGING["formatters"]["json"].items() if k != "()"}
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter(**spec))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)


def records(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def test_lines_logged_during_a_request_carry_its_request_id(json_lines: io.StringIO) -> None:
    log = logging.getLogger("tests.observability")

    def view(request):
        log.warning("inside the view")
        return HttpResponse("ok")

    response = RequestIdMiddleware(view)(RequestFactory().get("/", HTTP_X_REQUEST_ID="req-7"))
    log.warning("after the request")

    assert response["X-Request-ID"] == "req-7"
    inside, after = records(json_lines)
    assert inside["message"] == "inside the view"
    assert inside["request_id"] == "req-7"
    assert inside["level"] == "WARNING"
    assert inside["logger"] == "tests.observability"
    assert "timestamp" in inside
    assert "request_id" not in after


@pytest.mark.django_db
def test_djangos_own_error_lines_carry_the_request_id(client, json_lines: io.StringIO) -> None:
    client.get("/no/such/page", HTTP_X_REQUEST_ID="req-404")

    (line,) = [r for r in records(json_lines) if r["logger"] == "django.request"]
    assert line["request_id"] == "req-404"
    assert line["status_code"] == 404


def test_a_django_log_line_is_written_once_under_debug(settings) -> None:
    """Django's own console handler (DEBUG only) would print each of its lines a second time beside the root's."""
    settings.DEBUG = True
    record = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "Bad Request: %s", ("/x",), None)
    writers = []
    logger: logging.Logger | None = logging.getLogger("django.request")
    while logger is not None:
        writers += [
            h
            for h in logger.handlers
            if not type(h).__module__.startswith("_pytest") and record.levelno >= h.level and h.filter(record)
        ]
        logger = logger.parent if logger.propagate else None

    assert len(writers) == 1, writers
    assert writers[0] in logging.getLogger().handlers


def test_explicit_extra_fields_win_over_bound_ones(json_lines: io.StringIO) -> None:
    log = logging.getLogger("tests.observability")

    with log_context(job_id="bound", attempt=1, worker=None):
        log.warning("one", extra={"job_id": "explicit"})

    (line,) = records(json_lines)
    assert line["job_id"] == "explicit"
    assert line["attempt"] == 1
    assert "worker" not in line


def test_nested_contexts_add_to_the_outer_fields_and_restore_them_on_exit_even_after_an_error(
    json_lines: io.StringIO,
) -> None:
    log = logging.getLogger("tests.observability")

    with log_context(request_id="r-1", job_id="outer"):
        with pytest.raises(RuntimeError), log_context(job_id="inner", attempt=2, worker=None):
            log.warning("inside")
            raise RuntimeError
        log.warning("after")
    log.warning("outside")

    inside, after, outside = records(json_lines)
    assert (inside["request_id"], inside["job_id"], inside["attempt"]) == ("r-1", "inner", 2)
    assert (after["request_id"], after["job_id"]) == ("r-1", "outer")
    assert "attempt" not in after and "worker" not in inside
    assert "job_id" not in outside and "request_id" not in outside


def test_a_context_takes_any_field_name_and_one_instance_may_be_entered_inside_itself() -> None:
    context = log_context(self="s", fields="f")

    with context:
        with context:
            assert dict(bound_fields()) == {"self": "s", "fields": "f"}
        assert dict(bound_fields()) == {"self": "s", "fields": "f"}
    assert dict(bound_fields()) == {}


def test_the_plain_format_appends_the_fields_that_apply() -> None:
    formatter = PlainFormatter(fmt="%(levelname)s %(message)s")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "job done", None, None)
    record.job_id, record.attempt, record.worker = "j-1", 2, "host:1:ab"
    bare = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)

    assert formatter.format(record) == "INFO job done [job_id=j-1 attempt=2 worker=host:1:ab]"
    assert formatter.format(bare) == "INFO hello"


@pytest.mark.slow
def test_a_real_worker_writes_json_lines_with_job_id_attempt_and_worker(procs: Processes) -> None:
    procs.env["LOG_FORMAT"] = "json"
    proc = procs.worker(concurrency=1)
    worker_id = worker_of(proc)
    job = enqueue("DEMO_TASK", {"fail_times": 1}, max_retries=1)

    def outcome_lines() -> list[dict]:
        lines = [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]
        return [r for r in lines if r.get("job_id") == str(job.id)]

    from scheduler.maintenance.promoter import DuePromoter

    wait_until(status_is(job, JobStatus.SUCCESS), what="the job succeeded on its retry", each=DuePromoter().run_once)
    lines = wait_until(lambda: (found := outcome_lines()) and len(found) >= 2 and found, what="two outcome lines")

    every = [json.loads(line) for line in proc.output().splitlines() if line.strip()]  # every line is JSON
    assert all({"timestamp", "level", "logger", "message"} <= set(r) for r in every)
    assert [(r["attempt"], r["worker"]) for r in lines] == [(1, worker_id), (2, worker_id)]
    assert "RETRYABLE" in lines[0]["message"]
    assert "SUCCEEDED" in lines[1]["message"]
