"""Handlers that attack their worker: exit, interrupt, crash the process, return what PostgreSQL refuses.

Discovered like any app's ``jobs.py`` when the app is installed (``STINT_EXTRA_APPS=tests.support.hostile``):
the tests install it in the worker processes they start, the way a user plugs in their own app.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import json
import multiprocessing.connection
import os
import re
import resource
import signal
import sys
import threading
import time
import uuid
from typing import Any

from django.db import connection, transaction

from scheduler.errors import RetryAfter
from scheduler.registry import JobContext, handler

CRASH_TABLE = "hostile_crash"  # (job id, attempt, when), written by HOSTILE_CRASH just before it dies
WAIT_LIMIT = 15.0  # seconds HOSTILE_CRASH waits at most for its neighbours to start


@handler("HOSTILE_SYS_EXIT")
def sys_exit(payload: Any, ctx: JobContext) -> None:
    """Call ``sys.exit(3)``."""
    sys.exit(3)


@handler("HOSTILE_KEYBOARD_INTERRUPT")
def keyboard_interrupt(payload: Any, ctx: JobContext) -> None:
    """Raise ``KeyboardInterrupt``."""
    raise KeyboardInterrupt


@handler("HOSTILE_SIGSTOP")
def sigstop(payload: Any, ctx: JobContext) -> str:
    """On its first attempt, stop its own process with SIGSTOP (it never continues by itself)."""
    if ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    return "ran"


@handler("HOSTILE_FORGED_REPORTS")
def forged_reports(payload: Any, ctx: JobContext) -> str:
    """In a pool child: write reports for a job it is not running to every pipe it can find, then return."""
    forged = json.dumps([str(uuid.uuid4()), "SUCCEEDED", {"forged": True}, "", "", None]).encode()
    for pipe in (o for o in gc.get_objects() if isinstance(o, multiprocessing.connection.Connection)):
        with contextlib.suppress(OSError, ValueError):
            pipe.send_bytes(forged)
    time.sleep(payload.get("then_sleep", 0))
    return "honest"


@handler("HOSTILE_CLOSE_FDS")
def close_fds(payload: Any, ctx: JobContext) -> str:
    """Close every file descriptor above stderr it can (its pipe to the worker among them), then sleep ``sleep`` s."""
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    time.sleep(payload.get("sleep", 0))
    return "slept"


@handler("HOSTILE_FORK_AND_EXIT")
def fork_and_exit(payload: Any, ctx: JobContext) -> None:
    """Fork a child that sleeps ``sleep`` s holding every inherited descriptor, then exit with code 1.

    With ``pid_file``, the fork's pid is first written to ``<pid_file>.<attempt>``; with ``then``
    "hang", the handler waits for ever instead of exiting (until its process is killed).
    """
    pid = os.fork()
    if pid == 0:
        time.sleep(payload.get("sleep", 0))
        os._exit(0)
    if payload.get("pid_file"):  # written whole, then renamed: a reader never sees it half written
        path = f"{payload['pid_file']}.{ctx.attempt}"
        with open(f"{path}.part", "w") as out:
            out.write(str(pid))
        os.replace(f"{path}.part", path)
    if payload.get("then") == "hang":
        threading.Event().wait()
    os._exit(1)


@handler("HOSTILE_SIGNAL_GROUP")
def signal_group(payload: dict[str, Any], ctx: JobContext) -> str:
    """On its first attempt, send ``signal`` (a name, "SIGKILL") to its own process group, as ``how`` says.

    "killpg": ``os.killpg(os.getpgrp(), sig)``; "kill0": ``os.kill(0, sig)`` (the same group). Each
    process of ``run_workers`` that runs handlers leads its own group, so this reaches the
    handler's own process only. Returns "signalled" if it is still alive after (an ignored
    signal), "ran" on later attempts. With ``only_own_group``, it raises instead of signalling a
    group its process does not lead (a pool in a test's own process: the test runner's group).
    """
    if ctx.attempt > 1:
        return "ran"
    if payload.get("only_own_group") and os.getpgrp() != os.getpid():
        raise RuntimeError("its process group is not its own: not signalled")
    sig = signal.Signals[payload["signal"]]
    if payload["how"] == "killpg":
        os.killpg(os.getpgrp(), sig)
    else:
        os.kill(0, sig)
    time.sleep(0.5)  # a fatal signal is delivered at once; an ignored one leaves this to return
    return "signalled"


@handler("HOSTILE_LOCK_JOBS")
def lock_jobs(payload: Any, ctx: JobContext) -> str:
    """Lock Stint's job table (ACCESS EXCLUSIVE: not even a read passes) for ``sleep`` s, then return."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("LOCK TABLE stint_job IN ACCESS EXCLUSIVE MODE")
        time.sleep(payload.get("sleep", 0))
    return "unlocked"


def _forever() -> None:
    threading.Event().wait()


@handler("HOSTILE_LINGER")
def linger(payload: Any, ctx: JobContext) -> str:
    """Leave a non-daemon thread that never ends and an exit hook that never returns in its process, then return."""
    threading.Thread(target=_forever, name="hostile-linger", daemon=False).start()
    atexit.register(_forever)
    return "left them"


@handler("HOSTILE_CLOSE_STDIO")
def close_stdio(payload: Any, ctx: JobContext) -> str:
    """Close its process's ``sys.stdout`` and ``sys.stderr`` (where the log handlers write), then return."""
    sys.stdout.close()
    sys.stderr.close()
    return "closed"


class ExitOnUnpickle(str):
    """A string that, unpickled, ends the unpickling process with exit code 7."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (os._exit, (7,))


@handler("HOSTILE_PICKLE_RESULT")
def pickle_result(payload: Any, ctx: JobContext) -> str:
    """Return valid JSON (a str) that runs ``os._exit(7)`` in whichever process unpickles it."""
    return ExitOnUnpickle("hello")


@handler("HOSTILE_NUL_ERROR")
def nul_error(payload: Any, ctx: JobContext) -> None:
    """Raise an error whose message (and so its traceback) holds NUL bytes and a lone surrogate."""
    raise ValueError("bad\x00byte \ud800 here\x00")


@handler("HOSTILE_HUGE_ERROR")
def huge_error(payload: Any, ctx: JobContext) -> None:
    """Raise an error whose message is ``payload["megabytes"]`` MB long (a handler quoting a whole file)."""
    raise ValueError("x" * (payload["megabytes"] * 1024 * 1024))


@handler("HOSTILE_NUL_RESULT")
def nul_result(payload: Any, ctx: JobContext) -> dict[str, str]:
    """Return valid JSON that ``jsonb`` refuses: a string holding U+0000."""
    return {"text": "a\u0000b"}


@handler("HOSTILE_CRASH")
def crash(payload: dict[str, Any], ctx: JobContext) -> None:
    """Kill the whole process: ``how`` "exit" (``os._exit(1)``), "exit0" (``os._exit(0)``) or "segv" (SIGSEGV).

    On its first attempt it first waits (at most ``WAIT_LIMIT``) until ``neighbours`` other
    jobs are RUNNING, so that they share its process when it dies. Just before dying it writes
    the database's clock to ``CRASH_TABLE``: the tests measure how soon rescue followed.
    """
    if ctx.attempt == 1 and payload.get("neighbours"):
        deadline = time.monotonic() + WAIT_LIMIT
        while time.monotonic() < deadline and _running_besides(ctx.job_id) < payload["neighbours"]:
            time.sleep(0.05)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {CRASH_TABLE}"
            " (job_id uuid, attempt int, at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        cursor.execute(f"INSERT INTO {CRASH_TABLE} (job_id, attempt) VALUES (%s, %s)", [ctx.job_id, ctx.attempt])  # noqa: S608
    if payload.get("how") == "segv":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the working directory
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)  # the signal is delivered at once; never reached
    os._exit(0 if payload.get("how") == "exit0" else 1)


def _running_besides(job_id: Any) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM stint_job WHERE status = 'RUNNING' AND id <> %s", [job_id])
        return cursor.fetchone()[0]


@handler("HOSTILE_HOLD_GIL")
def hold_gil(payload: dict[str, Any], ctx: JobContext) -> str:
    """On its first attempt, hold its process's GIL without a break: no other thread of the process runs meanwhile.

    ``how`` "sleep" (default): libc's ``usleep`` through ``ctypes.pythonapi``, which keeps the GIL
    (a C extension's long call), for ``seconds``; "regex": a catastrophically backtracking
    ``re.match``, which ``_sre`` runs to the end holding the GIL, on ``size`` characters (each one
    more about doubles its time: 24 took 1 s, 26 took 4 s here). Later attempts return at once.
    """
    if ctx.attempt == 1:
        if payload.get("how", "sleep") == "regex":
            re.match(r"(a+)+$", "a" * payload["size"] + "b")
        else:
            ctypes.pythonapi.usleep(int(payload["seconds"] * 1_000_000))
    return "held"


@handler("HOSTILE_BREAK_CONNECTION")
def break_connection(payload: dict[str, Any], ctx: JobContext) -> str:
    """Spoil its thread's Django connection as ``how`` says, then return; the thread's next job gets that connection.

    "close": ``connection.close()``; "raw_close": close the psycopg connection under Django;
    "no_autocommit": ``set_autocommit(False)`` and a query (a transaction left open);
    "no_autocommit_idle": ``set_autocommit(False)`` alone; "statement_timeout": ``SET statement_timeout = 1``;
    "atomic": enter ``transaction.atomic()`` and a query in it, never leaving the block.
    """
    how = payload["how"]
    connection.ensure_connection()
    if how == "close":
        connection.close()
    elif how == "raw_close":
        connection.connection.close()
    elif how.startswith("no_autocommit"):
        connection.set_autocommit(False)
        if how == "no_autocommit":
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
    elif how == "atomic":
        transaction.atomic().__enter__()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    elif how == "statement_timeout":
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 1")
    return how


@handler("HOSTILE_HANG")
def hang(payload: Any, ctx: JobContext) -> None:
    """Wait for ever, deaf to ``ctx.cancelled``: a call stuck without a timeout of its own."""
    threading.Event().wait()


class _UnreadableDelay(RetryAfter):
    """A ``RetryAfter`` whose delay attribute raises ``SystemExit`` when the worker reads it."""

    @property
    def delay_seconds(self) -> float:
        raise SystemExit("no delay for you")

    @delay_seconds.setter
    def delay_seconds(self, value: object) -> None:
        pass


@handler("HOSTILE_RETRY_AFTER")
def retry_after(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    """On attempts up to ``times`` (default 1), raise ``RetryAfter``; then return ``{"attempt": n}``.

    ``delay`` says what it asks for: "seconds" (default; ``payload["seconds"]``, the honest case),
    "huge" (``10**5000``: no float holds it) or "unreadable" (reading it raises ``SystemExit``).
    """
    if ctx.attempt <= payload.get("times", 1):
        delay = payload.get("delay", "seconds")
        if delay == "unreadable":
            raise _UnreadableDelay(1, "asked for something")
        asked = 10**5000 if delay == "huge" else payload["seconds"]
        raise RetryAfter(asked, f"asked for {delay}")
    return {"attempt": ctx.attempt}
