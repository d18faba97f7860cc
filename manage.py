#!/usr/bin/env python
"""Django's command-line utility for Stint."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a management command with the project's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    from core.command_line import settings_load_or_exit

    settings_load_or_exit()  # settings that cannot load: one line, not a traceback

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
