"""``manage.py run_audit_consumer``: store lifecycle events from Kafka in the audit table until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from audit.consumer import BATCH_SIZE, POLL_TIMEOUT_SECONDS, AuditConsumer
from core.command_line import configure_verbosity, port, positive_int, seconds_at_least
from core.stop_signals import install_stop_handlers
from scheduler.management.long_running import LongRunningCommand

logger = logging.getLogger(__name__)

MAX_BATCH_SIZE = 10_000


def batch_size(text: str) -> int:
    """argparse type: 1 to 10,000 messages."""
    import argparse

    value = positive_int(text)
    if value > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_BATCH_SIZE}")
    return value


class Command(LongRunningCommand):
    """Consume ``job-lifecycle-events`` in the ``stint-audit`` group; any number may run (one per partition)."""

    help = "Consume job lifecycle events from Kafka into the audit table (each event stored once)."

    def add_arguments(self, parser: Any) -> None:
        """Declare the options."""
        parser.add_argument(
            "--batch-size", type=batch_size, default=BATCH_SIZE, help=f"messages per poll (default {BATCH_SIZE})"
        )
        parser.add_argument(
            "--poll-timeout",
            type=seconds_at_least(0.01),  # a 1 ns poll would spin
            default=POLL_TIMEOUT_SECONDS,
            help=f"seconds a poll waits (default {POLL_TIMEOUT_SECONDS})",
        )
        parser.add_argument("--metrics-port", type=port, default=0, help="serve Prometheus metrics (0: off)")

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the consumer, install signal handlers, run it; exit 0 after a graceful stop."""
        configure_verbosity(options["verbosity"])
        stop_event = threading.Event()
        consumer = AuditConsumer(
            batch_size=options["batch_size"], poll_timeout=options["poll_timeout"], stop_event=stop_event
        )

        def stop(force: bool = False) -> None:
            if force:
                # The batch in hand is either committed or will be delivered again: safe to drop.
                os._exit(1)
            stop_event.set()

        if options["metrics_port"]:
            from scheduler.metrics import serve

            serve(options["metrics_port"], role="audit")
        install_stop_handlers(stop, name="run_audit_consumer")
        logger.info("audit consumer: group %s, topics %s", consumer.group_id, ", ".join(consumer.topics))
        consumer.run()
