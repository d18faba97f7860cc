"""``manage.py sync_periodic_tasks --owner USERNAME``: create or update the schedules of ``OPTIONS['periodic']``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.parsers import is_storable_text
from scheduler.exceptions import StintError
from stint_tasks.periodic import sync_periodic


class Command(BaseCommand):
    """Thin: find the owner, call ``stint_tasks.periodic.sync_periodic``, report."""

    help = "Create or update the Stint schedules declared in each Stint TASKS backend's OPTIONS['periodic']."

    def add_arguments(self, parser: CommandParser) -> None:
        """``--owner``: the user who owns the schedules (default ``admin``)."""
        parser.add_argument("--owner", default="admin", help="username owning the schedules (default: admin)")

    def handle(self, *args: Any, **options: Any) -> None:
        """Sync, then print one line per schedule."""
        owner = options["owner"]
        # A name PostgreSQL cannot be sent (a NUL, a lone surrogate from a byte that is not UTF-8) names nobody.
        user = get_user_model().objects.filter(username=owner).first() if is_storable_text(owner) else None
        if user is None:
            raise CommandError(f"no user named {options['owner']!r}")
        try:
            synced = sync_periodic(owner=user)
        except (StintError, TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        for schedule in synced:
            timing = schedule.cron or f"every {schedule.interval_seconds} s"
            self.stdout.write(f"periodic task {schedule.name}: {schedule.job_type} ({timing}, {schedule.timezone})")
