"""``manage.py run_workers``: a supervisor over worker processes that lease and run jobs until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError

from core.command_line import configure_verbosity, int_range, non_negative_float, port, seconds_at_least
from core.stop_signals import install_stop_handlers
from scheduler.conf import conf
from scheduler.jobspec import QUEUE_NAME
from scheduler.management.long_running import LongRunningCommand
from scheduler.workers.runner import DEFAULT_PROCESS_SLOTS, DEFAULT_THREAD_SLOTS, WorkerOptions, default_concurrency
from scheduler.workers.supervisor import DEFAULT_ISOLATION_SLOTS, Supervisor, SupervisorOptions, default_processes

MAX_PROCESSES = 256  # worker processes, isolation slots, or pool children per process (--pool processes)
MAX_CONCURRENCY = 1000  # thread slots per process


def queue_list(text: str) -> list[str]:
    """argparse type: comma-separated queue names, each one a job could be given (``jobspec.QUEUE_NAME``).

    A name no job can have (``a b``, ``*``, a byte that is not UTF-8) would leave the workers
    waiting for ever, or fail their registration in a loop: it is a usage error.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one queue name")
    for name in names:
        if not QUEUE_NAME.fullmatch(name):
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a queue name: 1-100 of the characters A-Z a-z 0-9 _ . : -"
            )
    return names


class Command(LongRunningCommand):
    """Run a worker supervisor: ``--processes N --concurrency M --queues a,b --pool threads|processes``."""

    help = (
        "Supervise worker processes that lease due jobs with FOR UPDATE SKIP LOCKED and run them in bounded "
        "pools; a process that dies is replaced and its jobs rescued at once."
    )

    def add_arguments(self, parser: Any) -> None:
        """Declare the options."""
        parser.add_argument(
            "--processes",
            type=int_range(1, MAX_PROCESSES),
            default=None,
            help=f"worker processes (default: one per CPU core, here {default_processes()})",
        )
        parser.add_argument(
            "--concurrency",
            type=int_range(1, MAX_CONCURRENCY),
            default=None,
            help=f"pool slots per process (default {DEFAULT_THREAD_SLOTS} threads, or {DEFAULT_PROCESS_SLOTS} "
            "child processes with --pool processes)",
        )
        parser.add_argument("--queues", type=queue_list, default=None, help="comma-separated (default: all)")
        parser.add_argument("--pool", choices=["threads", "processes"], default="threads")
        parser.add_argument(
            "--isolation-slots",
            type=int_range(1, MAX_PROCESSES),
            default=DEFAULT_ISOLATION_SLOTS,
            help=f"jobs the isolation process runs at once, each in a process of its own (default "
            f"{DEFAULT_ISOLATION_SLOTS})",
        )
        parser.add_argument("--poll-seconds", type=seconds_at_least(0.01), default=None)
        parser.add_argument("--heartbeat-seconds", type=seconds_at_least(0.1), default=None)
        parser.add_argument(
            "--grace-seconds",
            type=non_negative_float,
            default=None,
            help="shutdown grace period (0: hand back at once)",
        )
        parser.add_argument("--metrics-port", type=port, default=0, help="serve Prometheus metrics (0: off)")

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the supervisor, install signal handlers, run it."""
        level = configure_verbosity(options["verbosity"])
        c = conf()
        grace = c.shutdown_grace_seconds if options["grace_seconds"] is None else options["grace_seconds"]
        heartbeat = options["heartbeat_seconds"] or c.heartbeat_seconds
        if heartbeat >= c.lease_seconds:
            # A lease would lapse between two heartbeats: running jobs rescued and run twice.
            raise CommandError(
                f"--heartbeat-seconds ({heartbeat:g}) must be less than the lease, "
                f"STINT_LEASE_SECONDS ({c.lease_seconds})"
            )
        if options["pool"] == "processes" and (options["concurrency"] or 0) > MAX_PROCESSES:
            raise CommandError(f"--concurrency with --pool processes must be from 1 to {MAX_PROCESSES}")
        supervisor = Supervisor(
            SupervisorOptions(
                processes=options["processes"] or default_processes(),
                isolation_slots=options["isolation_slots"],
                log_level=level,
                metrics_port=options["metrics_port"],
                worker=WorkerOptions(
                    concurrency=options["concurrency"] or default_concurrency(options["pool"]),
                    queues=options["queues"],
                    pool=options["pool"],
                    poll_seconds=options["poll_seconds"] or c.poll_seconds,
                    heartbeat_seconds=heartbeat,
                    grace_seconds=grace,
                ),
            )
        )
        install_stop_handlers(supervisor.stop, name="run_workers")
        supervisor.run()
