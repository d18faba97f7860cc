"""App config for the example tasks."""

from __future__ import annotations

from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    """Example Django tasks (sync, async, with context, failing, periodic) running on Stint."""

    name = "examples"
    verbose_name = "Example tasks"
