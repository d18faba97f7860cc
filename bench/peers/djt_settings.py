"""Django settings of the django-tasks database-backend peer (its own venv and database; nothing of Stint)."""

from __future__ import annotations

import os

SECRET_KEY = "bench-only-not-secret-0123456789abcdef"  # noqa: S105 - a local benchmark
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
# Persistent connections: db_worker closes "old" connections after every task, which with Django's
# default CONN_MAX_AGE of 0 means one new connection per task.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("PGDATABASE", ""),
        "CONN_MAX_AGE": 600,
        "CONN_HEALTH_CHECKS": True,
    }
}
if os.environ.get("DJT_DATABASE_URL"):
    from urllib.parse import urlsplit

    _url = urlsplit(os.environ["DJT_DATABASE_URL"])
    DATABASES["default"].update(
        {"NAME": _url.path.lstrip("/"), "USER": _url.username or "", "HOST": _url.hostname, "PORT": _url.port}
    )
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
