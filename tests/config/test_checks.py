"""Tests for config/checks.py: ``check --deploy`` refuses the example files' placeholder secrets."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import environ
import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from config.checks import DATABASE_PASSWORD, placeholder_errors, placeholder_secrets, secrets_in_use

ROOT = Path(__file__).resolve().parents[2]
DOCKER_EXAMPLE = ROOT / "docker" / ".env.example"
EXAMPLE = ROOT / ".env.example"
# The variables behind each secret the check reads (DATABASE_URL: its password).
SECRET_VARIABLES = ("SECRET_KEY", "JWT_SIGNING_KEY", "STINT_ADMIN_PASSWORD", "METRICS_BEARER_TOKEN", "DATABASE_URL")


def example_values(path: Path) -> dict[str, str]:
    """``NAME=value`` of an example file, commented-out lines (``# NAME=value``) included."""
    return dict(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=(.*)$", path.read_text(), re.MULTILINE))


def placeholders_refused_by_check_deploy(env: dict[str, str]) -> list[str]:
    """Run ``manage.py check --deploy`` with exactly ``env``; it must fail: the stint.E001 names, in order."""
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    return re.findall(r"\(stint\.E001\) (.+?) is still a placeholder", result.stderr)


def stint_errors() -> list[checks.CheckMessage]:
    return [m for m in placeholder_secrets() if m.id == "stint.E001"]


def errors_with(settings, variable: str, value: str) -> list[checks.CheckMessage]:
    """The check's errors with ``variable`` set to ``value`` (DATABASE_URL: its password, as settings read it)."""
    if variable != "DATABASE_URL":
        setattr(settings, variable, value)
        return stint_errors()
    # DATABASES cannot be overridden in a test: the secrets as the check reads them, with this password.
    password = environ.Env.db_url_config(value)["PASSWORD"]
    return placeholder_errors([(what, password if what == DATABASE_PASSWORD else v) for what, v in secrets_in_use()])


@pytest.fixture(autouse=True)
def fresh_secrets(settings) -> None:
    """Secrets of a real deployment (the test settings run on the dev stack's fixed keys)."""
    for variable in ("SECRET_KEY", "JWT_SIGNING_KEY", "STINT_ADMIN_PASSWORD", "METRICS_BEARER_TOKEN"):
        setattr(settings, variable, secrets.token_urlsafe(48))


def test_fresh_secrets_pass() -> None:
    assert stint_errors() == []


def test_the_dev_stacks_fixed_keys_are_refused(settings) -> None:
    from config import settings as config_settings

    settings.SECRET_KEY = config_settings._DEV_SECRET
    settings.JWT_SIGNING_KEY = config_settings._DEV_JWT_KEY

    assert [e.msg.split(" is ")[0] for e in stint_errors()] == ["SECRET_KEY", "JWT_SIGNING_KEY"]


@pytest.mark.parametrize(("path", "variable"), [(p, v) for p in (DOCKER_EXAMPLE, EXAMPLE) for v in SECRET_VARIABLES])
def test_every_placeholder_secret_of_the_example_files_is_refused(settings, path: Path, variable: str) -> None:
    value = example_values(path).get(variable, "")
    if not value:  # the file leaves it empty (unset): nothing to refuse
        assert path == EXAMPLE and variable in ("STINT_ADMIN_PASSWORD", "METRICS_BEARER_TOKEN")
        return
    errors = errors_with(settings, variable, value)

    assert len(errors) == 1
    name = DATABASE_PASSWORD if variable == "DATABASE_URL" else variable
    assert errors[0].msg.startswith(f"{name} is still a placeholder of docker/.env.example or .env.example")
    assert value not in errors[0].msg + str(errors[0].hint)  # a check's output never echoes a secret


def test_a_placeholder_edited_but_still_marked_change_me_is_refused(settings) -> None:
    settings.STINT_ADMIN_PASSWORD = "Change-Me-please-2026"

    assert [e.msg.split(" is ")[0] for e in stint_errors()] == ["STINT_ADMIN_PASSWORD"]


def test_the_check_runs_only_with_deploy(settings) -> None:
    settings.METRICS_BEARER_TOKEN = example_values(DOCKER_EXAMPLE)["METRICS_BEARER_TOKEN"]

    call_command("check", tags=["security"])  # without --deploy: not run
    with pytest.raises(SystemCheckError, match=r"stint\.E001.*METRICS_BEARER_TOKEN is still a placeholder"):
        call_command("check", deploy=True, tags=["security"])


def test_manage_check_deploy_refuses_docker_env_example_as_shipped() -> None:
    # docker compose passes docker/.env to every Stint process; copied without editing, it passed.
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(ROOT)),
        **example_values(DOCKER_EXAMPLE),
        "DJANGO_ENV": "production",  # as compose.yaml sets them
        "REDIS_URL": "redis://redis:6379/0",
        "KAFKA_BOOTSTRAP_SERVERS": "kafka:9092",
    }

    refused = placeholders_refused_by_check_deploy(env)
    assert sorted(refused) == sorted(
        ["SECRET_KEY", "JWT_SIGNING_KEY", "STINT_ADMIN_PASSWORD", "METRICS_BEARER_TOKEN", "DATABASE_URL's password"]
    )


def test_manage_check_deploy_refuses_a_placeholder_password_given_as_a_database_url_parameter() -> None:
    # libpq takes the password from the URL's query too (?password=...), which django-environ keeps in
    # OPTIONS: the check read only the user-info password, and this one passed.
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(ROOT)),
        "DJANGO_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(48),
        "JWT_SIGNING_KEY": secrets.token_urlsafe(48),
        "ALLOWED_HOSTS": "stint.example.com",
        "DATABASE_URL": "postgres://stint@postgres:5432/stint?password=change-me-postgres-password",
    }

    assert placeholders_refused_by_check_deploy(env) == ["DATABASE_URL's password"]
