"""The commands' option types, run_scheduler's leader TTL and unloadable settings: clear errors, never a traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from core.command_line import positive_float

ROOT = Path(__file__).resolve().parents[2]  # manage.py's directory


@pytest.mark.parametrize("text", ["0", "-1", "inf", "-inf", "nan", "1e999", "abc", ""])
def test_positive_float_refuses_what_is_not_a_finite_positive_number(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        positive_float(text)


@pytest.mark.parametrize(("text", "value"), [("0.5", 0.5), ("10", 10.0), ("1e-3", 0.001)])
def test_positive_float_takes_finite_positive_numbers(text: str, value: float) -> None:
    assert positive_float(text) == value


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--leader-ttl-seconds=0.4", "--tick-seconds=0.2"], "must exceed two ticks"),
        (["--leader-ttl-seconds=1", "--tick-seconds=0.5"], "must exceed two ticks"),
        (["--leader-ttl-seconds=3601"], "must be at most 3600"),
        (["--leader-ttl-seconds=inf"], "must be a finite number > 0"),
        (["--leader-ttl-seconds=ten"], "is not a number"),
    ],
)
def test_run_scheduler_refuses_a_leader_ttl_it_could_not_keep(argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("run_scheduler", *argv)


@pytest.mark.parametrize(
    ("command", "argv", "message"),
    [
        ("run_workers", ["--grace-seconds=nan"], "must be a finite number >= 0"),
        ("run_workers", ["--grace-seconds=-1"], "must be a finite number >= 0"),
        ("run_workers", ["--poll-seconds=inf"], "must be from 0.01"),
        ("create_topics", ["--timeout=-1"], "must be a finite number > 0"),
        ("run_workers", ["--poll-seconds=1e300"], "must be from 0.01 to 604800"),
        ("run_workers", ["--poll-seconds=1e-9"], "must be from 0.01 to 604800"),
        ("run_workers", ["--heartbeat-seconds=0.001"], "must be from 0.1 to 604800"),
        ("run_scheduler", ["--tick-seconds=1e-9"], "must be from 0.01 to 604800"),
        ("run_workers", ["--grace-seconds=1e300"], "at most 604800"),
        ("run_scheduler", ["--tick-seconds=1e300"], "must be from 0.01 to 604800"),
        ("run_workers", ["--processes=99999999999"], "must be from 1 to 256"),
        ("run_workers", ["--processes=0"], "must be from 1 to 256"),
        ("run_workers", ["--concurrency=100000"], "must be from 1 to 1000"),
        ("run_workers", ["--pool=processes", "--concurrency=300"], "must be from 1 to 256"),
        ("run_workers", ["--isolation-slots=100000"], "must be from 1 to 256"),
        ("run_workers", ["--heartbeat-seconds=30"], "must be less than the lease"),
        ("create_topics", ["--timeout=nan"], "must be a finite number > 0"),
        ("run_audit_consumer", ["--poll-timeout=1e-9"], "must be from 0.01 to 604800"),
    ],
)
def test_other_commands_refuse_endless_or_negative_seconds(command: str, argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command(command, *argv)


@pytest.mark.parametrize("queues", ["a\udc80b", "a b", "*", "%", "bad/name", "x" * 101, "ok,a\x00b"])
def test_run_workers_refuses_a_queue_no_job_can_have(queues: str) -> None:
    with pytest.raises(CommandError, match="is not a queue name"):
        call_command("run_workers", f"--queues={queues}")


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["", "x" * 151, "a\udc80", "a b", "a\x00"])
def test_ensure_admin_refuses_a_username_the_user_model_would_not_take(name: str) -> None:
    with pytest.raises(CommandError, match="--username"):
        call_command("ensure_admin", f"--username={name}")


@pytest.mark.django_db
def test_ensure_admin_refuses_a_password_variable_that_is_not_utf8(monkeypatch) -> None:
    # os.environ holds a non-UTF-8 byte as a lone surrogate: hashing it was a UnicodeEncodeError traceback.
    monkeypatch.setenv("STINT_ADMIN_PASSWORD", "pass\udcffword-long-enough")
    with pytest.raises(CommandError, match="STINT_ADMIN_PASSWORD is not UTF-8 text"):
        call_command("ensure_admin", "--username=breaker_admin")
    assert not get_user_model().objects.filter(username="breaker_admin").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("short1", "This password is too short. It must contain at least 8 characters."),
        ("password123", "This password is too common."),
        ("8675309240", "This password is entirely numeric."),
        ("site_admin_x", "The password is too similar to the username."),
    ],
    ids=["short", "common", "numeric", "like the username"],
)
def test_ensure_admin_refuses_a_password_the_password_validators_refuse(monkeypatch, password: str, why: str) -> None:
    # STINT_ADMIN_PASSWORD=admin made an ADMIN whose password the console's own forms would refuse.
    monkeypatch.setenv("STINT_ADMIN_PASSWORD", password)
    with pytest.raises(CommandError) as raised:
        call_command("ensure_admin", "--username=site_admin")

    message = str(raised.value)
    assert message.startswith("STINT_ADMIN_PASSWORD is refused by the password validators: ")
    assert why in message and "\n" not in message
    assert not get_user_model().objects.filter(username="site_admin").exists()


@pytest.mark.django_db
def test_ensure_admin_takes_a_password_the_validators_accept_and_leaves_an_existing_accounts_alone(monkeypatch) -> None:
    monkeypatch.setenv("STINT_ADMIN_PASSWORD", "correct horse battery staple")
    call_command("ensure_admin", "--username=site_admin")
    admin = get_user_model().objects.get(username="site_admin")
    assert admin.check_password("correct horse battery staple")

    monkeypatch.setenv("STINT_ADMIN_PASSWORD", "short1")  # not set on an account that exists: nothing to refuse
    call_command("ensure_admin", "--username=site_admin")
    admin.refresh_from_db()
    assert admin.check_password("correct horse battery staple")


@pytest.mark.django_db
@pytest.mark.parametrize("taken", ["site_admin", "Site_Admin"], ids=["same name", "other letter case"])
def test_ensure_admin_neither_calls_a_users_account_an_admin_nor_promotes_it(monkeypatch, taken: str) -> None:
    # Anyone may register the name through the public API. Before: "ADMIN account 'site_admin' already
    # exists." over a USER (exit 0, and no ADMIN), or, for the name in another letter case (one name to
    # the database's case-insensitive unique index), an IntegrityError traceback.
    from accounts.services import user_register

    user_register(username=taken, password="correct horse battery staple")
    monkeypatch.setenv("STINT_ADMIN_PASSWORD", "another horse battery staple")
    with pytest.raises(CommandError) as raised:
        call_command("ensure_admin", "--username=site_admin")

    message = str(raised.value)
    assert f"'{taken}' exists but is not an ADMIN" in message and "\n" not in message
    (account,) = get_user_model().objects.filter(username__iexact="site_admin")
    assert (account.username, account.role, account.is_staff, account.is_superuser) == (taken, "USER", False, False)
    assert account.check_password("correct horse battery staple")


@pytest.mark.django_db
@pytest.mark.parametrize("owner", ["a\udc80", "a\x00b"])
def test_sync_periodic_tasks_names_nobody_for_an_owner_postgresql_cannot_be_sent(owner: str) -> None:
    with pytest.raises(CommandError, match="no user named"):
        call_command("sync_periodic_tasks", f"--owner={owner}")


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("argv", [["check"], ["run_workers", "--queues=default"], ["help"], []], ids=" ".join)
def test_settings_that_cannot_be_imported_are_one_line_and_a_failure_not_a_traceback(argv: list[str]) -> None:
    # Before: a 20-line ModuleNotFoundError traceback, or (help) the core commands and exit 0.
    result = _manage(*argv, DJANGO_SETTINGS_MODULE="nope")

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "manage.py: cannot load the settings module 'nope' (DJANGO_SETTINGS_MODULE):"
        " ModuleNotFoundError: No module named 'nope'"
    ]
    assert result.stdout == ""


def test_settings_that_refuse_a_value_are_one_line_naming_it() -> None:
    result = _manage("check", DJANGO_SETTINGS_MODULE="config.settings", LOG_LEVEL="loud")

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "manage.py: cannot load the settings module 'config.settings' (DJANGO_SETTINGS_MODULE): ImproperlyConfigured:"
        " LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL (got 'LOUD')"
    ]
