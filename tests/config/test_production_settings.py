"""Production settings (DJANGO_ENV=production), loaded in fresh interpreters as a deployment would."""

from __future__ import annotations

import json
import os
import re
import runpy
import secrets
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SETUP = "import django; django.setup()"
SHOW = (
    "import json, django; django.setup(); from django.conf import settings as s; print(json.dumps({k: getattr(s, k)"
    " for k in ('DEBUG', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS',"
    " 'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_PROXY_SSL_HEADER', 'TRUSTED_PROXY_COUNT')}))"
)


def _production_env(**overrides: str | None) -> dict[str, str]:
    """Return a production environment: fresh keys, this run's servers; an override of None unsets a variable."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(PROJECT_ROOT)),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DJANGO_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "JWT_SIGNING_KEY": secrets.token_urlsafe(40),
        "ALLOWED_HOSTS": "stint.example.com",
        "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://stint@127.0.0.1:5432/stint"),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def _production(*args: str, **overrides: str | None) -> subprocess.CompletedProcess:
    """Run ``python *args`` in the project with a production environment; an override of None unsets a variable."""
    env = _production_env(**overrides)
    return subprocess.run(
        [sys.executable, *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_check_deploy_is_clean():
    result = _production("manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SECRET_KEY": None}, "SECRET_KEY must be set to at least 32 bytes"),
        ({"SECRET_KEY": "x" * 31}, "SECRET_KEY must be set to at least 32 bytes"),
        ({"JWT_SIGNING_KEY": None}, "JWT_SIGNING_KEY must be set to at least 32 bytes"),
        ({"JWT_SIGNING_KEY": "é" * 15}, "JWT_SIGNING_KEY must be set to at least 32 bytes"),  # 30 bytes
        ({"SECRET_KEY": "k" * 40, "JWT_SIGNING_KEY": "k" * 40}, "JWT_SIGNING_KEY must differ from SECRET_KEY"),
        ({"DEBUG": "true"}, "DEBUG must be off in production"),
        # The reconciler's checkpoint must not pass a mark that commits late (scheduler.maintenance.reconciler).
        ({"STINT_AUDIT_RECONCILE_AFTER_SECONDS": "69"}, "must be at least STINT_OUTBOX_LOCK_HOLD_SECONDS + 10 (70)"),
        (
            {"STINT_OUTBOX_LOCK_HOLD_SECONDS": "10", "STINT_AUDIT_RECONCILE_AFTER_SECONDS": "19"},
            "must be at least STINT_OUTBOX_LOCK_HOLD_SECONDS + 10 (20)",
        ),
        ({"STINT_OUTBOX_LOCK_HOLD_SECONDS": "7"}, "must exceed the delivery timeout"),
        # A value that is not a number names its variable (a bare ValueError from int() did not).
        ({"STINT_CLAIM_INDEX_VACUUM_PAGES": "abc"}, "STINT_CLAIM_INDEX_VACUUM_PAGES: 'abc' is not a whole number"),
        ({"STINT_LEASE_SECONDS": ""}, "STINT_LEASE_SECONDS: '' is not a whole number"),
        ({"STINT_HEARTBEAT_SECONDS": "ten"}, "STINT_HEARTBEAT_SECONDS: could not convert string to float"),
        # Aging within the priority column's range (the job_priority_range constraint, -100..100).
        ({"STINT_AGING_MAX_PRIORITY": "101"}, "STINT_AGING_MAX_PRIORITY must be from -100 to 100 (got 101)"),
        ({"STINT_AGING_MAX_PRIORITY": "-101"}, "STINT_AGING_MAX_PRIORITY must be from -100 to 100 (got -101)"),
        ({"STINT_AGING_STEP": "0"}, "STINT_AGING_STEP must be from 1 to 200 (got 0)"),
        ({"STINT_AGING_STEP": "201"}, "STINT_AGING_STEP must be from 1 to 200 (got 201)"),
        ({"STINT_AGING_SECONDS": "-1"}, "STINT_AGING_SECONDS must be from 0 to 315360000 (got -1)"),
        ({"STINT_QUEUE_RETENTION_DAYS": "-1"}, "STINT_QUEUE_RETENTION_DAYS must be from 0 to 36500 (got -1)"),
        # Published outbox rows pruned before the reconciler's grace: a lost event was never repaired.
        (
            {"STINT_OUTBOX_RETENTION_DAYS": "0"},
            "STINT_OUTBOX_RETENTION_DAYS (0) must keep published events longer than"
            " STINT_AUDIT_RECONCILE_AFTER_SECONDS (300 s)",
        ),
        ({"STINT_OUTBOX_RETENTION_DAYS": "-7"}, "STINT_OUTBOX_RETENTION_DAYS (-7) must keep published events"),
        (
            {"STINT_OUTBOX_RETENTION_DAYS": "1", "STINT_AUDIT_RECONCILE_AFTER_SECONDS": "86400"},
            "STINT_OUTBOX_RETENTION_DAYS (1) must keep published events longer than"
            " STINT_AUDIT_RECONCILE_AFTER_SECONDS (86400 s)",
        ),
        (
            {"STINT_AUDIT_QUARANTINE_RETENTION_DAYS": "-1"},
            "STINT_AUDIT_QUARANTINE_RETENTION_DAYS must be from 0 to 36500 (got -1)",
        ),
        # A rate limit the throttle cannot read was found only by the first request: every API call,
        # sign-in and console login answered 500.
        ({"STINT_RATE_LIMIT_USER": "abc"}, "STINT_RATE_LIMIT_USER: Bad rate limit 'abc'"),
        ({"STINT_RATE_LIMIT_AUTH": "10/fortnight"}, "STINT_RATE_LIMIT_AUTH: Bad rate limit '10/fortnight'"),
        (
            {"STINT_RATE_LIMIT_USER": "0/min"},
            "STINT_RATE_LIMIT_USER: Bad rate limit '0/min': the count must be at least 1",
        ),
        # Numbers that started cleanly and then gave wrong answers or failed deep inside: a page size of 0
        # listed no results under a count, an idempotency TTL of 0 let a replayed key create a second
        # job, a batch size of 0 relayed nothing to Kafka, a huge token lifetime was an OverflowError.
        ({"API_PAGE_SIZE": "0"}, "API_PAGE_SIZE must be from 1 to 10000 (got 0)"),
        ({"STINT_IDEMPOTENCY_TTL_SECONDS": "-1"}, "STINT_IDEMPOTENCY_TTL_SECONDS must be from 1 to 315360000 (got -1)"),
        ({"STINT_OUTBOX_BATCH_SIZE": "0"}, "STINT_OUTBOX_BATCH_SIZE must be from 1 to 1000000 (got 0)"),
        (
            {"JWT_ACCESS_LIFETIME_SECONDS": "99999999999999999999"},
            "JWT_ACCESS_LIFETIME_SECONDS must be from 1 to 315360000 (got 99999999999999999999)",
        ),
        ({"JWT_REFRESH_LIFETIME_SECONDS": "0"}, "JWT_REFRESH_LIFETIME_SECONDS must be from 1 to 315360000 (got 0)"),
        ({"STINT_LEASE_SECONDS": "0"}, "STINT_LEASE_SECONDS must be from 1 to 86400 (got 0)"),
        ({"STINT_HEARTBEAT_SECONDS": "-1"}, "STINT_HEARTBEAT_SECONDS must be from 0.1 to 86400 (got -1.0)"),
        ({"STINT_POLL_SECONDS": "0"}, "STINT_POLL_SECONDS must be from 0.01 to 604800 (got 0.0)"),
        ({"STINT_MAX_PAYLOAD_BYTES": "0"}, "STINT_MAX_PAYLOAD_BYTES must be from 1 to 67108864 (got 0)"),
        ({"KAFKA_TOPIC_PARTITIONS": "0"}, "KAFKA_TOPIC_PARTITIONS must be from 1 to 10000 (got 0)"),
        # redis-py raised ValueError on every connect (no fail-open path catches it): every login was a 500.
        ({"REDIS_SOCKET_TIMEOUT": "-1"}, "REDIS_SOCKET_TIMEOUT must be from 0.001 to 3600 (got -1.0)"),
        ({"REDIS_SOCKET_TIMEOUT": "0"}, "REDIS_SOCKET_TIMEOUT must be from 0.001 to 3600 (got 0.0)"),
        ({"STINT_MAX_SCHEDULES_PER_USER": "-1"}, "STINT_MAX_SCHEDULES_PER_USER must be 0 or more"),
        (
            {"STINT_WORKER_DEAD_AFTER_SECONDS": "5", "STINT_HEARTBEAT_SECONDS": "10"},
            "STINT_WORKER_DEAD_AFTER_SECONDS (5) must exceed STINT_HEARTBEAT_SECONDS (10)",
        ),
        # django-environ's float dropped every character but digits, "," "." and "-": 500ms was 500 s.
        ({"STINT_HEARTBEAT_SECONDS": "500ms"}, "STINT_HEARTBEAT_SECONDS: could not convert string to float: '500ms'"),
        ({"STINT_POLL_SECONDS": "0x10"}, "STINT_POLL_SECONDS: could not convert string to float: '0x10'"),
        ({"STINT_BACKOFF_BASE_SECONDS": "nan"}, "STINT_BACKOFF_BASE_SECONDS: 'nan' is not a finite number"),
        # An integer setting given a fraction or a word said "invalid literal for int() with base 10: '1.5'".
        (
            {"STINT_MIN_SCHEDULE_INTERVAL_SECONDS": "1.5"},
            "STINT_MIN_SCHEDULE_INTERVAL_SECONDS: '1.5' is not a whole number",
        ),
        ({"KAFKA_DELIVERY_TIMEOUT_MS": "abc"}, "KAFKA_DELIVERY_TIMEOUT_MS: 'abc' is not a whole number"),
        # A backoff the database cannot add to now() (timestamp out of range) failed every rescue of a
        # retried job, its neighbours' with it; a negative one raised in retry.backoff the same way.
        ({"STINT_BACKOFF_BASE_SECONDS": "-1"}, "STINT_BACKOFF_BASE_SECONDS must be from 0 to 604800 (got -1.0)"),
        (
            {"STINT_BACKOFF_BASE_SECONDS": "1e15"},
            "STINT_BACKOFF_BASE_SECONDS must be from 0 to 604800 (got 1000000000000000.0)",
        ),
        ({"STINT_BACKOFF_MAX_SECONDS": "-0.5"}, "STINT_BACKOFF_MAX_SECONDS must be from 0 to 604800 (got -0.5)"),
        ({"STINT_SHUTDOWN_GRACE_SECONDS": "-1"}, "STINT_SHUTDOWN_GRACE_SECONDS must be from 0 to 604800 (got -1.0)"),
        # Numbers nothing refused until they failed in a client library, a server or a sleep: librdkafka
        # refuses these timeouts when the relay or consumer is made (and reads 0 as "never"), PostgreSQL
        # refuses a timeout past INT_MAX ms at every connect, an age of 1e13 s or 1e7 days is "timestamp
        # out of range" in every prune or liveness query, an Event.wait(1e20) an OverflowError that ends
        # the relay's thread; a negative max-age is an invalid HSTS header, a negative connection age or
        # proxy count means nothing.
        ({"KAFKA_DELIVERY_TIMEOUT_MS": "-1"}, "KAFKA_DELIVERY_TIMEOUT_MS must be from 1000 to 3600000 (got -1)"),
        ({"KAFKA_DELIVERY_TIMEOUT_MS": "0"}, "KAFKA_DELIVERY_TIMEOUT_MS must be from 1000 to 3600000 (got 0)"),
        ({"KAFKA_SESSION_TIMEOUT_MS": "-1"}, "KAFKA_SESSION_TIMEOUT_MS must be from 3001 to 300000 (got -1)"),
        ({"KAFKA_SESSION_TIMEOUT_MS": "3000"}, "KAFKA_SESSION_TIMEOUT_MS must be from 3001 to 300000 (got 3000)"),
        ({"KAFKA_SESSION_TIMEOUT_MS": "300001"}, "KAFKA_SESSION_TIMEOUT_MS must be from 3001 to 300000 (got 300001)"),
        ({"DB_CONN_MAX_AGE": "-1"}, "DB_CONN_MAX_AGE must be from 0 to 315360000 (got -1)"),
        ({"DB_CONN_MAX_AGE": "1" + "0" * 400}, "DB_CONN_MAX_AGE must be from 0 to 315360000 (got 1000"),
        ({"SECURE_HSTS_SECONDS": "-1"}, "SECURE_HSTS_SECONDS must be 0 or more (got -1)"),
        ({"TRUSTED_PROXY_COUNT": "-1"}, "TRUSTED_PROXY_COUNT must be 0 or more (got -1)"),
        (
            {"STINT_DB_IDLE_IN_TRANSACTION_SECONDS": "2147484"},
            "STINT_DB_IDLE_IN_TRANSACTION_SECONDS must be from 0 to 2147483 (got 2147484.0)",
        ),
        (
            {"STINT_DB_IDLE_IN_TRANSACTION_SECONDS": "-1"},
            "STINT_DB_IDLE_IN_TRANSACTION_SECONDS must be from 0 to 2147483 (got -1.0)",
        ),
        (
            {"STINT_OUTBOX_LOCK_HOLD_SECONDS": "2147484"},
            "STINT_OUTBOX_LOCK_HOLD_SECONDS must be from 1 to 2147483 (got 2147484)",
        ),
        (
            {"STINT_OUTBOX_RELAY_INTERVAL_SECONDS": "0"},
            "STINT_OUTBOX_RELAY_INTERVAL_SECONDS must be from 0.01 to 604800 (got 0.0)",
        ),
        (
            {"STINT_OUTBOX_RELAY_INTERVAL_SECONDS": "1e20"},
            "STINT_OUTBOX_RELAY_INTERVAL_SECONDS must be from 0.01 to 604800 (got 1e+20)",
        ),
        (
            {"STINT_OUTBOX_RETENTION_DAYS": "10000000"},
            "STINT_OUTBOX_RETENTION_DAYS must be from 1 to 36500 (got 10000000)",
        ),
        (
            {"STINT_AUDIT_QUARANTINE_RETENTION_DAYS": "10000000"},
            "STINT_AUDIT_QUARANTINE_RETENTION_DAYS must be from 0 to 36500 (got 10000000)",
        ),
        ({"STINT_RETENTION_DEAD_DAYS": "10000000"}, "STINT_RETENTION_DEAD_DAYS must be from 0 to 36500 (got 10000000)"),
        (
            {"STINT_QUEUE_RETENTION_DAYS": "10000000"},
            "STINT_QUEUE_RETENTION_DAYS must be from 0 to 36500 (got 10000000)",
        ),
        (
            {"STINT_OPERATOR_LOG_RETENTION_DAYS": "10000000"},
            "STINT_OPERATOR_LOG_RETENTION_DAYS must be from 0 to 36500 (got 10000000)",
        ),
        (
            {"STINT_AGING_SECONDS": "10000000000000"},
            "STINT_AGING_SECONDS must be from 0 to 315360000 (got 10000000000000)",
        ),
        (
            {"STINT_WORKER_DEAD_AFTER_SECONDS": "10000000000000"},
            "STINT_WORKER_DEAD_AFTER_SECONDS must be from 1 to 604800 (got 10000000000000)",
        ),
        # django-environ's bool read anything but its true words as false: a typo opened /metrics to all.
        ({"METRICS_RESTRICTED": "ture"}, "METRICS_RESTRICTED: 'ture' is not a boolean"),
        ({"SECURE_SSL_REDIRECT": "enabled"}, "SECURE_SSL_REDIRECT: 'enabled' is not a boolean"),
        # urllib's "Port could not be cast to integer value", from inside django-environ, named nothing.
        ({"DATABASE_URL": "postgres://u@db:notaport/stint"}, "DATABASE_URL: Port could not be cast to integer"),
        ({"DATABASE_URL": "postgres://u@db:99999/stint"}, "DATABASE_URL: Port out of range 0-65535"),
        ({"DATABASE_URL": "garbage"}, "DATABASE_URL: 'garbage' is not a PostgreSQL URL"),
        # logging.config's "ValueError: Unable to configure root logger", deep in django.setup(), named nothing.
        ({"LOG_LEVEL": "BOGUS"}, "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL (got 'BOGUS')"),
        # "ModuleNotFoundError: No module named 'reprots'" from deep in django.setup(), naming no variable.
        (
            {"STINT_EXTRA_APPS": "tests.support.hostile,reprots"},
            "STINT_EXTRA_APPS: 'reprots' is not a module or app config that can be imported",
        ),
        # A byte that is not UTF-8 (Python reads it as a lone surrogate) passed, then every database
        # connection or Kafka message failed with a UnicodeEncodeError; a production key was a traceback.
        ({"STINT_EXTRA_APPS": "a\udcffb"}, "STINT_EXTRA_APPS holds bytes that are not UTF-8: set it as UTF-8 text"),
        ({"DATABASE_URL": "postgres://stint:p\udce4ss@db:5432/stint"}, "DATABASE_URL holds bytes that are not UTF-8"),
        ({"SECRET_KEY": "\udcff" * 40}, "SECRET_KEY holds bytes that are not UTF-8"),
        ({"KAFKA_TOPIC": "job-\udce9vents"}, "KAFKA_TOPIC holds bytes that are not UTF-8"),
    ],
)
def test_start_up_refuses_unsafe_settings(overrides, message):
    """Each refusal is raised by the settings module itself, the first thing ``django.setup()`` imports.

    The module runs here, as a new module under the production environment alone (``os.environ``
    swapped for the duration): a fresh interpreter per case cost 0.6-1.3 s each. The start-up
    path in a fresh interpreter is covered by ``test_a_refused_setting_stops_start_up_in_a_fresh_interpreter``.
    """
    with pytest.raises(ImproperlyConfigured) as refused:
        _settings_in_process(**overrides)
    assert message in str(refused.value)


def _settings_in_process(**overrides: str | None) -> dict:
    """Run the settings module here under the production environment alone; return its globals."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_production_env(**overrides))
    try:
        # A fresh interpreter prints django-environ's warnings (this suite makes them errors) and goes on.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return runpy.run_path(str(PROJECT_ROOT / "config" / "settings.py"), run_name="config_settings_under_test")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_lowest_sensible_numbers_are_accepted():
    """Each bound's low end starts: 0 keeps no connection, sends no HSTS, trusts no proxy, keeps quarantine forever."""
    loaded = _settings_in_process(
        DB_CONN_MAX_AGE="0",
        SECURE_HSTS_SECONDS="0",
        TRUSTED_PROXY_COUNT="0",
        STINT_DB_IDLE_IN_TRANSACTION_SECONDS="0",
        STINT_AUDIT_QUARANTINE_RETENTION_DAYS="0",
        STINT_RETENTION_SUCCESS_DAYS="0",
        KAFKA_SESSION_TIMEOUT_MS="3001",
        KAFKA_DELIVERY_TIMEOUT_MS="1000",
        STINT_OUTBOX_LOCK_HOLD_SECONDS="4",
        STINT_AUDIT_RECONCILE_AFTER_SECONDS="14",
        STINT_OUTBOX_RETENTION_DAYS="1",
    )
    assert loaded["DATABASES"]["default"]["CONN_MAX_AGE"] == 0
    assert "idle_in_transaction_session_timeout" not in loaded["DATABASES"]["default"]["OPTIONS"]["options"]
    assert (loaded["SECURE_HSTS_SECONDS"], loaded["TRUSTED_PROXY_COUNT"]) == (0, 0)
    assert (loaded["KAFKA_SESSION_TIMEOUT_MS"], loaded["KAFKA_DELIVERY_TIMEOUT_MS"]) == (3001, 1000)
    assert (loaded["AUDIT_QUARANTINE_RETENTION_DAYS"], loaded["SCHEDULER"]["RETENTION_SUCCESS_DAYS"]) == (0, 0)


def test_extra_apps_are_modules_or_app_config_paths():
    apps = _settings_in_process(STINT_EXTRA_APPS="examples,tests.support.hostile.apps.HostileConfig")["INSTALLED_APPS"]
    assert apps[-2:] == ["examples", "tests.support.hostile.apps.HostileConfig"]


def test_connection_parameters_in_database_url_win_and_its_options_go_in_front():
    url = "postgres://stint@db.example:5432/stint?connect_timeout=12&keepalives_idle=30&options=-c%20search_path%3Dx"
    options = _settings_in_process(DATABASE_URL=url)["DATABASES"]["default"]["OPTIONS"]
    assert (options["connect_timeout"], options["keepalives_idle"]) == (12, 30)
    assert options["options"].startswith("-c search_path=x -c tcp_keepalives_idle=")
    default = _settings_in_process(DATABASE_URL="postgres://stint@db.example:5432/stint")["DATABASES"]["default"]
    assert (default["OPTIONS"]["connect_timeout"], default["OPTIONS"]["keepalives_idle"]) == (5, 10)


def test_a_refused_setting_stops_start_up_in_a_fresh_interpreter():
    result = _production("-c", SETUP, STINT_LEASE_SECONDS="0")
    assert result.returncode != 0
    assert "ImproperlyConfigured: STINT_LEASE_SECONDS must be from 1 to 86400 (got 0)" in result.stderr


def test_manage_check_refuses_aging_past_the_priority_range():
    """The reported settings: ``manage.py check`` passed, then every reprioritizer run failed on job_priority_range."""
    result = _production(
        "manage.py", "check", STINT_AGING_SECONDS="1", STINT_AGING_STEP="100", STINT_AGING_MAX_PRIORITY="500"
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: STINT_AGING_MAX_PRIORITY must be from -100 to 100 (got 500)" in result.stderr


def test_the_aging_bounds_are_the_priority_columns():
    from config import settings as project_settings
    from scheduler.states import PRIORITY_MAX, PRIORITY_MIN

    assert (project_settings._PRIORITY_MIN, project_settings._PRIORITY_MAX) == (PRIORITY_MIN, PRIORITY_MAX)


def test_a_log_level_in_lower_case_is_read_as_its_name():
    result = _production("-c", SETUP + "; import logging; print(logging.getLogger().level)", LOG_LEVEL="warning")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(30)]  # logging.WARNING


def test_a_number_of_seconds_is_read_as_python_reads_it():
    show = SETUP + "; from django.conf import settings as s; print(s.SCHEDULER['POLL_SECONDS'], s.REDIS_SOCKET_TIMEOUT)"
    result = _production("-c", show, STINT_POLL_SECONDS="1e3", REDIS_SOCKET_TIMEOUT=" 0.25 ")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1000.0", "0.25"]  # django-environ read 1e3 as 13.0


def test_a_boolean_is_read_in_any_of_its_usual_words():
    show = SETUP + "; from django.conf import settings as s; print(s.METRICS_RESTRICTED, s.SECURE_HSTS_PRELOAD)"
    result = _production("-c", show, METRICS_RESTRICTED=" Off ", SECURE_HSTS_PRELOAD="YES", DEBUG="0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_a_short_reconcile_grace_is_accepted_with_a_short_enough_lock_hold():
    """The chaos cluster's timing (chaos.plan): a 10 s lock hold allows a 20 s grace."""
    result = _production("-c", SETUP, STINT_OUTBOX_LOCK_HOLD_SECONDS="10", STINT_AUDIT_RECONCILE_AFTER_SECONDS="20")
    assert result.returncode == 0, result.stderr


def test_production_defaults_are_hardened():
    result = _production("-c", SHOW)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_PROXY_SSL_HEADER": None,  # X-Forwarded-Proto is trusted only when configured
        "TRUSTED_PROXY_COUNT": 0,  # X-Forwarded-For likewise
    }


def test_proxy_headers_are_trusted_only_when_configured():
    result = _production("-c", SHOW, SECURE_PROXY_SSL_HEADER="true", TRUSTED_PROXY_COUNT="1")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert shown["TRUSTED_PROXY_COUNT"] == 1


def test_env_example_lists_every_setting():
    source = (PROJECT_ROOT / "config" / "settings.py").read_text()
    read = set(re.findall(r"""\benv(?:\.\w+)?\(\s*["']([A-Z][A-Z0-9_]*)["']""", source))
    listed = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", (PROJECT_ROOT / ".env.example").read_text(), re.MULTILINE))
    assert read, "no env reads found: the pattern is out of date"
    assert read - listed == set(), "settings read from the environment but missing from .env.example"
