"""App config of the chaos suite's handler (installed only when STINT_EXTRA_APPS names ``chaos``)."""

from __future__ import annotations

import os

from django.apps import AppConfig


class ChaosConfig(AppConfig):
    """Registers the CHAOS handler; arms the failpoints when ``STINT_CHAOS_FAILPOINTS`` names a directory."""

    name = "chaos"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Install the failpoints of ``chaos.failpoints`` in this process if the suite asked for them."""
        directory = os.environ.get("STINT_CHAOS_FAILPOINTS", "")
        if directory:
            from chaos.failpoints import install

            install(directory)
