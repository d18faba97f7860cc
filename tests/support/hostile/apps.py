"""App config of the hostile test handlers (installed only when STINT_EXTRA_APPS names ``tests.support.hostile``)."""

from __future__ import annotations

from django.apps import AppConfig


class HostileConfig(AppConfig):
    """Registers the HOSTILE_* handlers from ``jobs.py``."""

    name = "tests.support.hostile"
    label = "hostile"
    default_auto_field = "django.db.models.BigAutoField"
