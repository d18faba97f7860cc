"""The moving parts `make bench` shares between scenarios: context, processes, databases, counters, CPU.

Every figure comes from the kernel (/proc), from PostgreSQL's own statistics, or from the probe's
records (bench/probe.py); this module reads them, ``bench.stats`` computes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import stats
from bench.servers import Servers
from core.process_sessions import signal_session

ROOT = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")
STOP_SECONDS = 30.0  # a worker gets this long after SIGTERM before SIGKILL
POLL_SECONDS = 0.01  # how often a drain's end is polled


@dataclass(slots=True, kw_only=True)
class Ctx:
    """What every scenario may use: servers, interpreters, options and the run's directory."""

    servers: Servers
    run_dir: Path  # .bench/results/<stamp>/ : logs and probe files of this run
    processes: int  # worker OS processes per system
    quick: bool
    pythons: dict[str, Path] = field(default_factory=dict)  # venv name -> its python
    stint_processes_flag: bool = False  # run_workers has --processes (a supervisor)
    log_lines: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        """Print a progress line (and keep it for the run's log)."""
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        self.log_lines.append(line)
        print(line, flush=True)

    def python(self, venv: str | None) -> Path:
        """The interpreter of ``venv`` (None: the project's .venv, i.e. this one)."""
        return Path(sys.executable) if venv is None else self.pythons[venv]

    def logfile(self, name: str) -> Path:
        """A log file in the run directory (its directory created)."""
        path = self.run_dir / "logs" / f"{name}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


# ---------------------------------------------------------------------------------------------
# Databases and PostgreSQL's counters.


def admin(ctx: Ctx) -> psycopg.Connection:
    """An autocommit connection to the benchmark server's ``postgres`` database."""
    return psycopg.connect(ctx.servers.pg_url, autocommit=True)


def recreate(ctx: Ctx, name: str, *, template: str | None = None) -> str:
    """Drop and create database ``name`` (copying ``template`` if given); return its URL."""
    with admin(ctx) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return ctx.servers.url(name)


def drop(ctx: Ctx, name: str) -> None:
    """Drop database ``name`` if it exists."""
    with admin(ctx) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    """PostgreSQL's cumulative counters for one database at one instant."""

    commits: int  # pg_stat_database.xact_commit
    statements: int | None  # sum of pg_stat_statements.calls (None without the extension)
    wal_lsn: int  # pg_current_wal_lsn() in bytes (server-wide)


def counters(ctx: Ctx, database: str, *, exclude_user: str | None = None) -> Counters:
    """Read the counters of ``database`` (statements of ``exclude_user`` left out)."""
    with admin(ctx) as conn:
        commits = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [database]).fetchone()
        lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        statements = None
        if ctx.servers.postgres.has_pg_stat_statements:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            statements = conn.execute(
                """
                SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s
                JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = %s AND s.userid <> coalesce((SELECT oid FROM pg_roles WHERE rolname = %s), 0)
                  AND s.query NOT LIKE %s
                """,
                [database, exclude_user or "", RI_CHECK],
            ).fetchone()[0]
    return Counters(
        commits=int(commits[0]) if commits else 0,
        statements=int(statements) if statements is not None else None,
        wal_lsn=int(lsn[0]),
    )


def per_job(before: Counters, after: Counters, jobs: int, *, own_commits: int = 0) -> dict[str, float | None]:
    """Return commits, statements and WAL bytes per job between two readings.

    ``own_commits`` are the harness's own autocommit polls on that database, taken off the commits.
    """
    if jobs <= 0:
        return {"commits_per_job": None, "statements_per_job": None, "wal_bytes_per_job": None}
    statements = None if before.statements is None or after.statements is None else after.statements - before.statements
    return {
        "commits_per_job": round((after.commits - before.commits - own_commits) / jobs, 3),
        "statements_per_job": round(statements / jobs, 3) if statements is not None else None,
        "wal_bytes_per_job": round((after.wal_lsn - before.wal_lsn) / jobs),
    }


# PostgreSQL's own foreign-key checks: a deferred constraint's check runs at COMMIT, outside any
# client statement, so pg_stat_statements (track=top) lists it as top-level. It is no round trip.
RI_CHECK = "SELECT % FROM ONLY %FOR KEY SHARE OF x"

OBSERVER = "bench_observer"  # the role the harness polls with, so its statements are not counted


def observer(ctx: Ctx, database: str) -> psycopg.Connection:
    """An autocommit connection to ``database`` as OBSERVER (created on first use, superuser)."""
    with admin(ctx) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [OBSERVER]).fetchone() is None:
            conn.execute(f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER")
    url = ctx.servers.url(database).replace("postgres@", f"{OBSERVER}@", 1)
    return psycopg.connect(url, autocommit=True)


def autovacuum_runs(conn: psycopg.Connection) -> int:
    """Autovacuum and autoanalyze runs finished so far on the tables of ``conn``'s database.

    From ``pg_stat_user_tables`` (``autovacuum_count + autoanalyze_count``, cumulative since the
    database was created). Read before and after a measured window: a run that lands in a short
    window (autoanalyze after 10% of a table changed, at most once per ``autovacuum_naptime``,
    60 s) costs the system under test CPU there and not in another repetition.
    """
    row = conn.execute("SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables")
    return int(row.fetchone()[0])


def checkpoint(ctx: Ctx) -> None:
    """CHECKPOINT, so that every measured window starts with the same full-page-write state."""
    with admin(ctx) as conn:
        conn.execute("CHECKPOINT")


def backend_pids(ctx: Ctx, database: str) -> list[int]:
    """The server processes serving connections to ``database`` now."""
    with admin(ctx) as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [database])]


# ---------------------------------------------------------------------------------------------
# Processes and their CPU.


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def machine() -> tuple[int, int]:
    """(busy, total) ticks of the whole machine now."""
    return stats.machine_ticks(_read("/proc/stat") or "")


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, cpu ticks) of every process now."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            text = _read(f"/proc/{entry}/stat")
            if text:
                table[int(entry)] = stats.pid_stat(text)
    return table


def cpu_ticks(roots: Sequence[int], *, with_children: bool = True) -> dict[int, int]:
    """pid -> cpu ticks of ``roots`` (and their descendants)."""
    table = process_table()
    pids = stats.descendants({p: v[0] for p, v in table.items()}, roots) if with_children else set(roots)
    return {p: table[p][1] for p in pids if p in table}


class Group:
    """OS processes started for one system in one scenario; stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, ctx: Ctx, name: str, commands: Sequence[Sequence[str]], env: Mapping[str, str]) -> None:
        self.name = name
        ctx.logfile(name).parent.mkdir(parents=True, exist_ok=True)
        self.log = open(ctx.logfile(name), "ab")  # closed in stop()
        self.procs = [
            subprocess.Popen(
                list(argv), env=dict(env), cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
            )
            for argv in commands
        ]

    @property
    def pids(self) -> list[int]:
        """The started processes' pids (their children are found through /proc)."""
        return [p.pid for p in self.procs]

    def alive(self) -> bool:
        """Whether every started process is still running."""
        return all(p.poll() is None for p in self.procs)

    def stop(self, *, sig: int = signal.SIGTERM) -> list[int | None]:
        """Signal every process of each session started, wait STOP_SECONDS, SIGKILL what is left; return exit codes.

        Sessions, not process groups: ``run_workers``' worker processes lead groups of their own.
        """
        for proc in self.procs:
            if proc.poll() is None:
                signal_session(proc.pid, sig)
        deadline = time.monotonic() + STOP_SECONDS
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                signal_session(proc.pid, signal.SIGKILL)
                codes.append(proc.wait())
        self.log.close()
        return codes


def run_checked(ctx: Ctx, name: str, argv: Sequence[str], env: Mapping[str, str], *, timeout: float = 900) -> str:
    """Run one command to completion (an agent's setup/seed/produce); return its stdout.

    Raises RuntimeError with the log's tail when it fails.
    """
    log = ctx.logfile(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        result = subprocess.run(
            list(argv), env=dict(env), cwd=ROOT, stdout=subprocess.PIPE, stderr=err, timeout=timeout
        )
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{name} failed (exit {result.returncode}); last lines of {log}:\n{tail}")
    return result.stdout.decode(errors="replace")


# ---------------------------------------------------------------------------------------------
# The probe's records.


class Starts:
    """The handler start records under one probe directory, read incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._offsets: dict[Path, int] = {}
        self._tail: dict[Path, str] = {}
        self.by_seq: dict[int, float] = {}  # a job's first start
        self.by_pid: dict[int, list[float]] = {}
        self.records = 0  # every start, so that records - len(by_seq) jobs ran more than once

    def poll(self) -> int:
        """Read what was appended since the last poll; return how many distinct jobs have started."""
        for path in self.directory.glob("starts-*.txt"):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            if not chunk:
                continue
            self._offsets[path] = offset + len(chunk)
            text = self._tail.get(path, "") + chunk.decode("ascii", errors="replace")
            complete, _, rest = text.rpartition("\n")
            self._tail[path] = rest
            pid = int(path.stem.split("-", 1)[1])
            for seq, t in stats.parse_starts(complete):
                self.records += 1
                self.by_seq.setdefault(seq, t)
                self.by_pid.setdefault(pid, []).append(t)
        return len(self.by_seq)

    @property
    def repeated(self) -> int:
        """Starts beyond the first of their job (a job run twice: at-least-once delivery showing)."""
        return self.records - len(self.by_seq)

    def wait_for(self, count: int, *, timeout: float, alive: Callable[[], bool] = lambda: True) -> bool:
        """Poll until ``count`` jobs have started (True) or ``timeout`` seconds pass or ``alive()`` fails."""
        deadline = time.monotonic() + timeout
        while self.poll() < count:
            if time.monotonic() > deadline or not alive():
                return False
            time.sleep(0.02)
        return True


def probe_env(directory: Path) -> dict[str, str]:
    """The environment entries that make handlers write their start records into ``directory``."""
    return {"BENCH_PROBE_DIR": str(directory)}


@contextlib.contextmanager
def cpu_window(ctx: Ctx, roots: Callable[[], Sequence[int]], servers: Callable[[], Sequence[int]]) -> Iterator[dict]:
    """Measure machine busy %, the workers' CPU % (of one core) and their servers' CPU % over the block."""
    out: dict[str, Any] = {}
    machine0, t0 = machine(), time.monotonic()
    workers0 = cpu_ticks(roots())
    servers0 = cpu_ticks(servers(), with_children=False)
    yield out
    seconds = time.monotonic() - t0
    out["machine_busy_percent"] = stats.busy_percent(machine0, machine())
    out["workers_cpu_percent"] = stats.cpu_percent(workers0, cpu_ticks(roots()), seconds, HZ)
    out["server_cpu_percent"] = stats.cpu_percent(servers0, cpu_ticks(servers(), with_children=False), seconds, HZ)
