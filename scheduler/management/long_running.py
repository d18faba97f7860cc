"""How the long-running commands' processes end: ``run_scheduler``, ``run_workers``, ``run_audit_consumer``."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from core.stop_signals import exit_now


class LongRunningCommand(BaseCommand):
    """A command whose process ends as soon as it has stopped, without the interpreter's teardown.

    Run as ``manage.py <command>``, Django's ``run_from_argv`` returns after ``handle`` (and after
    closing the database connections), and the interpreter then tears itself down: 0.94 s from
    run_workers' "supervisor ... stopped" line to its ``exit_group`` (strace, 2026-12-03), all of
    it freeing the objects of some 1,000 modules after the work is done. Deploys, ``make run``'s
    Ctrl-C and every test that stops one of these processes waited for it. Here the process exports
    its last spans, flushes its logs and standard streams and ends with ``os._exit(0)``
    (``exit_now``), as its worker processes and pool children already do; nothing of Stint's
    waits on an ``atexit`` hook (its stop paths release the leader lock, hand back jobs, close the
    Kafka clients and the database connections first). A command that fails (``CommandError``,
    ``SystemExit``, any exception) takes the ordinary path with its exit code. ``call_command``
    does not use ``run_from_argv``: an in-process call returns as before.
    """

    def run_from_argv(self, argv: list[str]) -> None:
        """Run the command from ``argv`` (``manage.py``'s), then end the process with exit code 0."""
        super().run_from_argv(argv)
        from scheduler import tracing

        tracing.shutdown()  # export the last spans: exit_now skips the atexit hook that would
        exit_now(0)
