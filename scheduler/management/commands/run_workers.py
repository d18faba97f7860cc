"""``manage.py run_workers``: lease and run jobs in a bounded pool until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from scheduler.conf import conf
from scheduler.management.commands._signals import (
    configure_verbosity,
    install_stop_handlers,
    port,
    positive_float,
    positive_int,
)
from scheduler.workers.runner import Worker, WorkerOptions


def queue_list(text: str) -> list[str]:
    """argparse type: comma-separated queue names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one queue name")
    return names


class Command(BaseCommand):
    """Run a worker process: ``--concurrency N --queues a,b --pool threads|processes``."""

    help = "Lease due jobs with FOR UPDATE SKIP LOCKED and run them in a bounded pool."

    def add_arguments(self, parser: Any) -> None:
        """Declare the options."""
        parser.add_argument("--concurrency", type=positive_int, default=5, help="pool slots (default 5)")
        parser.add_argument("--queues", type=queue_list, default=None, help="comma-separated (default: all)")
        parser.add_argument("--pool", choices=["threads", "processes"], default="threads")
        parser.add_argument("--poll-seconds", type=positive_float, default=None)
        parser.add_argument("--heartbeat-seconds", type=positive_float, default=None)
        parser.add_argument("--grace-seconds", type=float, default=None, help="shutdown grace period")
        parser.add_argument("--metrics-port", type=port, default=0, help="serve Prometheus metrics (0: off)")

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the worker, install signal handlers, run it."""
        configure_verbosity(options["verbosity"])
        c = conf()
        grace = c.shutdown_grace_seconds if options["grace_seconds"] is None else options["grace_seconds"]
        worker = Worker(
            WorkerOptions(
                concurrency=options["concurrency"],
                queues=options["queues"],
                pool=options["pool"],
                poll_seconds=options["poll_seconds"] or c.poll_seconds,
                heartbeat_seconds=options["heartbeat_seconds"] or c.heartbeat_seconds,
                grace_seconds=grace,
            )
        )
        if options["metrics_port"]:
            from scheduler.metrics import serve

            serve(options["metrics_port"])
        install_stop_handlers(worker.stop, name="run_workers")
        worker.run()
