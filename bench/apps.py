"""App config for the benchmark handler (installed only when STINT_EXTRA_APPS names ``bench``)."""

from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    """Registers the LOADTEST handler."""

    name = "bench"
    default_auto_field = "django.db.models.BigAutoField"
