"""``manage.py run_scheduler``: promote due jobs, rescue expired leases, fire cron as leader, relay the outbox."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from core.command_line import configure_verbosity, port, positive_float, seconds_at_least
from core.stop_signals import install_stop_handlers
from scheduler.leadership import DEFAULT_TTL_SECONDS, Leadership
from scheduler.maintenance import default_services, leader_services
from scheduler.maintenance.loop import SchedulerLoop
from scheduler.management.long_running import LongRunningCommand

MAX_LEADER_TTL_SECONDS = 3600  # a failover slower than an hour is no failover


class Command(LongRunningCommand):
    """Run the scheduler's maintenance loop until SIGTERM/SIGINT. Any number may run at once."""

    help = "Promote due jobs, rescue expired leases, fire cron schedules (leader only), relay the outbox."

    def add_arguments(self, parser: Any) -> None:
        """Declare the options."""
        parser.add_argument(
            "--tick-seconds", type=seconds_at_least(0.01), default=0.2, help="loop tick (default 0.2 s)"
        )
        parser.add_argument("--metrics-port", type=port, default=0, help="serve Prometheus metrics (0: off)")
        parser.add_argument(
            "--leader-ttl-seconds",
            type=positive_float,
            default=DEFAULT_TTL_SECONDS,
            help=(
                f"TTL of the cron leader's lock (default {DEFAULT_TTL_SECONDS:g} s): a leader that dies is replaced"
                " within about this plus a tick; renewed every tick, so it must exceed two ticks"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the loop, install signal handlers, run it."""
        configure_verbosity(options["verbosity"])
        ttl, tick = options["leader_ttl_seconds"], options["tick_seconds"]
        if ttl > MAX_LEADER_TTL_SECONDS:
            raise CommandError(f"--leader-ttl-seconds ({ttl:g}) must be at most {MAX_LEADER_TTL_SECONDS} (an hour)")
        if ttl <= 2 * tick:
            raise CommandError(
                f"--leader-ttl-seconds ({ttl:g}) must exceed two ticks (--tick-seconds {tick:g}):"
                " a lock renewed every tick would otherwise expire between renewals"
            )
        leadership = Leadership(role="cron", ttl_seconds=ttl)
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
