"""``manage.py run_scheduler``: promote due jobs, rescue expired leases, fire cron as leader, relay the outbox."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from core.command_line import configure_verbosity, port, positive_float
from core.stop_signals import install_stop_handlers
from scheduler.leadership import Leadership
from scheduler.maintenance import default_services, leader_services
from scheduler.maintenance.loop import SchedulerLoop


class Command(BaseCommand):
    """Run the scheduler's maintenance loop until SIGTERM/SIGINT. Any number may run at once."""

    help = "Promote due jobs, rescue expired leases, fire cron schedules (leader only), relay the outbox."

    def add_arguments(self, parser: Any) -> None:
        """Declare the options."""
        parser.add_argument("--tick-seconds", type=positive_float, default=0.2, help="loop tick (default 0.2 s)")
        parser.add_argument("--metrics-port", type=port, default=0, help="serve Prometheus metrics (0: off)")

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the loop, install signal handlers, run it."""
        configure_verbosity(options["verbosity"])
        leadership = Leadership(role="cron")
        loop = SchedulerLoop(
            services=default_services(),
            leader_services=leader_services(leadership),
            leadership=leadership,
            tick_seconds=options["tick_seconds"],
        )
        if options["metrics_port"]:
            from scheduler.metrics import serve

            serve(
                options["metrics_port"], role="scheduler", cluster_state=True
            )  # the scheduler also reports cluster gauges
        install_stop_handlers(loop.stop, name="run_scheduler")
        loop.run()
