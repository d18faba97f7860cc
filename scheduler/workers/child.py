"""Entry point of a worker process started by the ``run_workers`` supervisor.

Only the standard library is imported at the top: the process imports this module to find its
entry point before Django is set up, and Stint's models cannot be imported before that.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from core.stop_signals import exit_now, install_stack_dump
from scheduler.workers.process_group import ignore_stop_signals, lead_own_group

logger = logging.getLogger(__name__)

# Messages on the supervisor's pipe: to the process, STOP (drain within the grace period) or
# FORCE (hand back at once); from it, READY (registered, claiming).
STOP = "stop"
FORCE = "force"
READY = "ready"
# Seconds between two pulses of a worker process, at most (a quarter of its heartbeat interval
# when that is shorter): its supervisor reads the pulse to see whether any thread of it runs.
PULSE_SECONDS = 1.0
# Allocations of container objects (net of frees) between two collections of the youngest
# generation of Python's cyclic garbage collector in a worker process (Python's default: 700).
# A claim of a few hundred jobs makes thousands (the rows, Claimed, Running and Report objects,
# payloads), so at 700 nearly every claim and outcome batch triggered collections that walked
# every job still in flight; most of those objects are freed by reference counting long before
# 20,000 more are made. Cyclic garbage waits for that many allocations at most.
GC_YOUNG_THRESHOLD = 20_000
_sleep = time.sleep  # bound at import: a handler that replaces time.sleep must not stop the pulse


def make_worker_id(pid: int, token: str) -> str:
    """Return the id of the worker process ``pid`` on this host: ``hostname:pid:token``.

    It names the worker in leases (``lease_owner``), attempts and its ``WorkerNode``; a
    supervisor computes it for the process it starts, to find that process's jobs if it dies.
    """
    return f"{socket.gethostname()}:{pid}:{token}"


def worker_process_main(
    control: Connection,
    options: dict[str, Any],
    token: str,
    log_level: int,
    board: tuple[Any, int, int] | None = None,
    pulse: Any = None,
    ahead: Any = None,
    waiting: Any = None,
) -> None:
    """Run one ``Worker`` with ``options`` (``WorkerOptions`` fields) until told to stop.

    ``board``: (its supervisor's ``ClaimBoard`` array, this process's row, rows), or None.
    ``pulse``: a shared double (``multiprocessing`` ``RawValue``) that a thread of this process
    sets to ``time.monotonic()`` every ``pulse_seconds(heartbeat)``, or None (``_pulse``).
    ``ahead``: a shared bool the worker sets once it claims jobs ahead of its free slots, or None.
    ``waiting``: a shared byte array for its ``waiting_board.WaitingBoard`` (a thread pool's), or None.

    Its id is ``make_worker_id(its pid, token)``. The options come as a dict: a ``WorkerOptions``
    could not be unpickled before Django is set up.

    It first leads a process group of its own (``process_group.lead_own_group``): a handler that
    signals its group reaches this process alone, not its supervisor and the other worker processes.
    SIGINT, SIGTERM and SIGHUP are ignored: process managers signal every process of the unit (and a
    handler its own group), and the supervisor decides (STOP, then FORCE on ``control``). When ``control`` closes, the
    supervisor is gone (even SIGKILLed): the worker then drains and exits like on STOP, so no
    worker process outlives its supervisor by more than the grace period. It exits through
    ``exit_now``, so nothing a handler left in the process holds up that exit.
    """
    lead_own_group()
    ignore_stop_signals()  # the supervisor decides; it started us with them blocked (stop_signals_held)
    install_stack_dump()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from core.db_role import set_process_role

    set_process_role("worker-isolation" if options.get("isolation") else "worker")
    from core.command_line import STINT_LOGGERS

    for name in STINT_LOGGERS:  # the supervisor's -v level, on the project's loggers (not the root's)
        logging.getLogger(name).setLevel(log_level)
    # A record a log handler cannot write is dropped, not raised: handlers share this process's
    # streams, and logging's own report of the failure goes to sys.stderr, which a handler may have
    # closed too; raised, it ended the worker's next log call and the process with it.
    logging.raiseExceptions = False
    from scheduler.workers.claim_board import BoardView
    from scheduler.workers.runner import Worker, WorkerOptions

    if pulse is not None:
        interval = pulse_seconds(options["heartbeat_seconds"])
        threading.Thread(target=_pulse, args=(pulse, interval), name="stint-pulse", daemon=True).start()
    settle_gc()
    worker = Worker(
        WorkerOptions(**options),
        worker_id=make_worker_id(os.getpid(), token),
        ready=lambda: _send(control, READY),
        board=BoardView(*board) if board is not None else None,
        ahead_mark=ahead,
        waiting=waiting,
    )
    threading.Thread(target=_obey, args=(control, worker), name="stint-supervisor-watch", daemon=True).start()
    code = worker.run()
    from scheduler import tracing

    tracing.shutdown()  # export the last spans: exit_now skips the atexit hook that would
    exit_now(code)  # WEDGED_EXIT_CODE asks the supervisor for a fresh process


def settle_gc() -> None:
    """Move every object made so far out of the cyclic collector's reach, and make young collections rarer.

    Called once, after Django and the worker's modules are loaded: those objects (about 100,000)
    live as long as the process, and each full collection walked them all again (``gc.freeze``).
    Then ``GC_YOUNG_THRESHOLD``. A drain of 20,000 no-op jobs (2 processes x 100 slots): worker
    CPU 34.5 -> 27.5 us/job (freeze alone: 35.5 -> 31.0), medians of 3 interleaved pairs.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def pulse_seconds(heartbeat_seconds: float) -> float:
    """Seconds between two pulses of a worker process that heartbeats every ``heartbeat_seconds``."""
    return min(PULSE_SECONDS, heartbeat_seconds / 4)


def _pulse(pulse: Any, interval: float) -> None:
    """Set ``pulse`` to the monotonic time every ``interval`` seconds, for ever.

    Python code only, with no I/O: it stops exactly while some thread of the process holds the GIL
    without a break (a C call that never releases it: a catastrophic ``re`` backtrack, a long
    C-extension call) or the process is stopped. A database that hangs does not stop it (a
    query waits with the GIL released), unlike the heartbeat.
    """
    while True:
        pulse.value = time.monotonic()
        _sleep(interval)


def _obey(control: Connection, worker: Any) -> None:
    """Relay the supervisor's STOP and FORCE to ``worker``; stop it when the supervisor is gone."""
    while True:
        try:
            message = control.recv()
        except (EOFError, OSError):
            logger.warning("worker %s: its supervisor is gone; stopping", worker.id)
            worker.stop()
            return
        worker.stop(force=message == FORCE)


def _send(control: Connection, message: str) -> None:
    try:
        control.send(message)
    except (OSError, ValueError):  # the supervisor is gone; _obey stops the worker
        pass
