"""Name every PostgreSQL connection after the Stint process and role that opened it (``application_name``).

``pg_stat_activity``, the server's logs and ``pg_locks`` then say which process holds a
connection or a lock: ``stint-web``, ``stint-scheduler``, ``stint-worker-supervisor``,
``stint-worker`` (a worker process), ``stint-worker-isolation`` (the isolation slot),
``stint-worker-child`` (a process-pool child), ``stint-worker-listen`` (a worker's LISTEN
connection), ``stint-scheduler-leader-lock`` (the advisory-lock fallback of leadership),
``stint-audit-consumer``, ``stint-manage-<command>`` for other management commands.

It is set once per process, centrally: ``config.settings`` puts ``application_name`` into the
database ``OPTIONS`` (Django passes them to libpq as connection parameters, so no statement is
spent on it), from ``STINT_DB_ROLE`` or, unset, from the command line (``role_from_argv``). A
process whose role is not its command line's (a worker process or pool child spawned by
``run_workers``: ``spawn`` hands them the parent's ``sys.argv``) calls ``set_process_role`` at
its entry point, before it opens a connection. A connection opened outside Django (LISTEN, the
leader lock) takes ``application_name_for(suffix)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

PREFIX = "stint-"
MAX_BYTES = 63  # PostgreSQL keeps NAMEDATALEN - 1 bytes of application_name
ROLE_VARIABLE = "STINT_DB_ROLE"
WSGI_SERVERS = ("gunicorn", "uwsgi", "waitress", "mod_wsgi")  # programs whose process is the web role
# Management commands that are long-running Stint processes, and the role each connection carries.
COMMAND_ROLES = {
    "run_scheduler": "scheduler",
    "run_workers": "worker-supervisor",
    "run_audit_consumer": "audit-consumer",
    "runserver": "web",
}


def role_from_argv(argv: Sequence[str]) -> str:
    """Return the role of a process started with ``argv`` (``sys.argv``).

    ``manage.py <command>``: the command's role (``COMMAND_ROLES``) or ``manage-<command>``;
    a WSGI server (``WSGI_SERVERS``): ``web``; pytest: ``test``; anything else: ``python``.
    """
    program = os.path.basename(argv[0]) if argv else ""
    if program.startswith(WSGI_SERVERS):
        return "web"
    if program in ("pytest", "py.test") or "pytest" in argv[:2] or program == "__main__.py" and "pytest" in argv[0]:
        return "test"
    if program == "manage.py" or program.endswith("django-admin"):
        command = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else ""  # Django's own rule
        return COMMAND_ROLES.get(command, f"manage-{command}" if command else "manage")
    return "python"


def application_name(role: str) -> str:
    """Return ``stint-<role>``, cut to what PostgreSQL keeps (63 bytes, ASCII printable)."""
    name = "".join(c if " " <= c <= "~" else "?" for c in f"{PREFIX}{role}")
    return name[:MAX_BYTES]


def default_application_name(argv: Sequence[str], environ: dict[str, str] | os._Environ[str]) -> str:
    """The name ``config.settings`` sets: ``STINT_DB_ROLE`` if set, else the command line's role."""
    return application_name(environ.get(ROLE_VARIABLE) or role_from_argv(argv))


def set_process_role(role: str) -> None:
    """Name this process's Django connections ``stint-<role>`` from now on (call before any query).

    Changes the ``OPTIONS`` of every configured database (settings and live wrappers share the
    dict) and closes this thread's open connections, so the next query connects under the new
    name. The environment is left alone: processes this one starts name their own role.
    """
    from django.conf import settings
    from django.db import connections

    name = application_name(role)
    for alias, database in settings.DATABASES.items():
        database.setdefault("OPTIONS", {})["application_name"] = name
        wrapper = connections[alias]
        wrapper.settings_dict.setdefault("OPTIONS", {})["application_name"] = name
        wrapper.close()


def application_name_for(suffix: str) -> str:
    """The name of a connection this process opens outside Django: its own name plus ``-<suffix>``."""
    from django.conf import settings

    own = settings.DATABASES["default"].get("OPTIONS", {}).get("application_name") or application_name("python")
    return application_name(f"{own.removeprefix(PREFIX)}-{suffix}")
