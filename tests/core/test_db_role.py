"""Every database connection names its Stint process and role in ``application_name`` (core.db_role)."""

from __future__ import annotations

import pytest
from django.db import connection

from core.db_role import application_name, default_application_name, role_from_argv
from scheduler.enqueuing import enqueue
from scheduler.states import JobStatus
from tests.support.processes import Processes, status_is, wait_until


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["manage.py", "run_scheduler", "--metrics-port", "9101"], "scheduler"),
        (["/srv/manage.py", "run_workers", "-v", "2"], "worker-supervisor"),
        (["manage.py", "--help"], "manage"),
        (["manage.py", "run_audit_consumer"], "audit-consumer"),
        (["manage.py", "runserver", "127.0.0.1:8000"], "web"),
        (["/usr/local/bin/gunicorn", "--config", "docker/gunicorn.conf.py", "config.wsgi"], "web"),
        (["/usr/bin/uwsgi", "--module", "config.wsgi"], "web"),
        (["manage.py", "migrate", "--noinput"], "manage-migrate"),
        (["manage.py"], "manage"),
        (["/x/site-packages/pytest/__main__.py", "-q"], "test"),
        ([], "python"),
    ],
)
def test_the_role_comes_from_the_command_line(argv, role):
    assert role_from_argv(argv) == role


def test_the_environment_overrides_and_names_stay_within_what_postgresql_keeps():
    assert default_application_name(["manage.py", "run_scheduler"], {}) == "stint-scheduler"
    assert default_application_name(["manage.py", "run_scheduler"], {"STINT_DB_ROLE": "web"}) == "stint-web"
    assert application_name("x" * 100) == "stint-" + "x" * 57
    assert application_name("caf\u00e9\n") == "stint-caf??"


@pytest.mark.django_db
def test_this_process_connects_under_its_name():
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('application_name')")
        assert cursor.fetchone()[0] == "stint-test"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_each_real_process_and_connection_carries_its_own_name(procs: Processes) -> None:  # noqa: F811
    procs.worker(concurrency=1, pool="processes")
    procs.scheduler()
    job = enqueue("REPORT", {})  # its handler queries the database from the pool child
    wait_until(status_is(job, JobStatus.SUCCESS), what="the REPORT job to succeed")

    def names() -> set[str]:
        with connection.cursor() as cursor:
            # Client backends only: an autovacuum worker visiting the test database has no name (seen in CI).
            cursor.execute(
                "SELECT DISTINCT application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND backend_type = 'client backend'"
            )
            return {row[0] for row in cursor.fetchall()}

    wanted = {"stint-worker", "stint-worker-listen", "stint-worker-child", "stint-scheduler"}
    seen: set[str] = set()

    def all_seen() -> bool:
        seen.update(names())
        return wanted <= seen

    try:
        wait_until(all_seen, what=f"connections named {wanted}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; seen: {sorted(seen)}") from None
    assert not {n for n in seen if not n.startswith("stint-")}, seen  # no anonymous connection of ours
