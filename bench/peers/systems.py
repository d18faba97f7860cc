"""The systems `make bench` runs side by side: how to install, set up, seed, produce, start and watch each.

A ``System`` is data plus three small functions; adding a variant (another batch size, another
pool) is one more entry in ``SYSTEMS``. Each runs ``--processes`` worker OS processes (2 by
default) with the throughput settings its own documentation recommends, stated in ``settings``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import ROOT, Ctx

VENV_REQUIREMENTS: dict[str, tuple[str, ...]] = {  # pinned: the newest releases on the package index
    "pgqueuer": ("pgqueuer==1.6.0", "asyncpg==0.32.0"),
    "procrastinate": ("procrastinate==3.10.0", "psycopg[binary,pool]==3.3.9"),
    "celery": ("celery[redis]==5.7.0",),
    "django-tasks-db": (
        "django-tasks-db[compat]==0.13.0",
        "django-tasks==0.12.0",
        "Django==5.2.19",
        "psycopg[binary]==3.3.9",
    ),
}

STINT_SLOTS = 100  # thread slots per worker process (the "100 thread slots per process")
PGQ_DEFAULT_BATCH = 10  # PgQueuer's default --batch-size
PROCRASTINATE_CONCURRENCY = 10  # sub-workers per procrastinate worker process
CELERY_PREFETCH = 128  # Celery's optimizing guide: "64, or 128" for many short tasks


@dataclass(frozen=True, slots=True, kw_only=True)
class System:
    """One system under test."""

    key: str  # command-line name (--only)
    label: str  # table row
    settings: str  # the throughput settings, stated in the output
    venv: str | None  # VENV_REQUIREMENTS key; None: the project's .venv (Stint)
    agent: str  # path under the project root of its agent script
    worker_commands: Callable[[Ctx, str], list[list[str]]]  # (ctx, python) -> argv per OS process
    env: Callable[[Ctx, str], dict[str, str]]  # (ctx, database url) -> environment entries
    remaining_sql: str | None  # jobs not finished yet; None: no durable record (done = all started)
    uses_postgres: bool = True
    uses_redis_broker: bool = False
    tags: frozenset[str] = field(default_factory=frozenset)

    def agent_argv(self, ctx: Ctx, *args: str) -> list[str]:
        """The argv running this system's agent with ``args`` in its interpreter."""
        return [str(ctx.python(self.venv)), str(ROOT / self.agent), *args]


def _bin(ctx: Ctx, venv: str, name: str) -> str:
    return str(Path(ctx.python(venv)).parent / name)


def _peer_env(url: str) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def stint_env(ctx: Ctx, url: str) -> dict[str, str]:
    """Stint's processes: production-like settings (DEBUG off), the bench's handler app, its servers."""
    return {
        "DATABASE_URL": url,
        "REDIS_URL": ctx.servers.redis_url.rsplit("/", 1)[0] + "/1",
        "KAFKA_BOOTSTRAP_SERVERS": ctx.servers.kafka,
        "STINT_EXTRA_APPS": "bench",
        "DEBUG": "false",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONUNBUFFERED": "1",
    }


def stint_workers(ctx: Ctx, python: str) -> list[list[str]]:
    """``run_workers``: one supervisor of N processes when it has ``--processes``, else N processes."""
    base = [python, str(ROOT / "manage.py"), "run_workers", "--concurrency", str(STINT_SLOTS), "-v", "0"]
    if ctx.stint_processes_flag:
        return [[*base, "--processes", str(ctx.processes)]]
    return [list(base) for _ in range(ctx.processes)]


def pgqueuer_workers(batch: int) -> Callable[[Ctx, str], list[list[str]]]:
    """PgQueuer worker processes with ``batch_size=batch`` (see pgqueuer_agent.py for why not ``pgq run``)."""

    def commands(ctx: Ctx, python: str) -> list[list[str]]:
        return [[python, str(ROOT / "bench/peers/pgqueuer_agent.py"), "worker", f"batch={batch}"]] * ctx.processes

    return commands


def procrastinate_workers(ctx: Ctx, python: str) -> list[list[str]]:
    """``procrastinate worker`` processes with async sub-workers."""
    argv = [_bin(ctx, "procrastinate", "procrastinate"), "--app=bench.peers.procrastinate_agent.app", "worker"]
    return [[*argv, "--concurrency", str(PROCRASTINATE_CONCURRENCY)] for _ in range(ctx.processes)]


def celery_workers(pool: str) -> Callable[[Ctx, str], list[list[str]]]:
    """``celery worker`` with a prefork pool of N children (plus its consumer parent), or N solo workers."""

    def commands(ctx: Ctx, python: str) -> list[list[str]]:
        argv = [_bin(ctx, "celery", "celery"), "-A", "bench.peers.celery_agent", "worker", "--pool", pool]
        argv += ["--prefetch-multiplier", str(CELERY_PREFETCH), "--without-gossip", "--without-mingle"]
        argv += ["--without-heartbeat", "--loglevel", "WARNING"]
        if pool == "prefork":
            return [[*argv, "--concurrency", str(ctx.processes)]]
        # Solo workers need distinct node names on one host.
        return [[*argv, "--hostname", f"solo{i}@%h"] for i in range(ctx.processes)]

    return commands


def djt_workers(ctx: Ctx, python: str) -> list[list[str]]:
    """``db_worker`` processes (one task at a time each)."""
    return [[python, "-m", "django", "db_worker", "--no-reload", "--no-startup-delay"] for _ in range(ctx.processes)]


def _pg_env(ctx: Ctx, url: str) -> dict[str, str]:
    return {**_peer_env(url), "PGDSN": url}


SYSTEMS: list[System] = [
    System(
        key="pgqueuer",
        label="PgQueuer 1.6.0 defaults",
        settings=f"pgqueuer.run (= pgq run), asyncpg, batch_size {PGQ_DEFAULT_BATCH} (default), `pgq autovac` applied",
        venv="pgqueuer",
        agent="bench/peers/pgqueuer_agent.py",
        worker_commands=pgqueuer_workers(PGQ_DEFAULT_BATCH),
        env=_pg_env,
        remaining_sql="SELECT count(*) FROM pgqueuer",
    ),
    System(
        key="pgqueuer-b100",
        label="PgQueuer 1.6.0 batch 100",
        settings="pgqueuer.run (= pgq run), asyncpg, batch_size 100, `pgq autovac` applied",
        venv="pgqueuer",
        agent="bench/peers/pgqueuer_agent.py",
        worker_commands=pgqueuer_workers(100),
        env=_pg_env,
        remaining_sql="SELECT count(*) FROM pgqueuer",
    ),
    System(
        key="celery",
        label="Celery 5.7.0 + Redis",
        settings=(
            f"prefork pool, --concurrency N children (+1 consumer process), --prefetch-multiplier {CELERY_PREFETCH},"
            " no result backend, early ack (defaults), without gossip/mingle/heartbeat"
        ),
        venv="celery",
        agent="bench/peers/celery_agent.py",
        worker_commands=celery_workers("prefork"),
        env=lambda ctx, url: {
            **_peer_env(url),
            "CELERY_BROKER_URL": ctx.servers.redis_url.rsplit("/", 1)[0] + "/2",
        },
        remaining_sql=None,
        uses_postgres=False,
        uses_redis_broker=True,
    ),
    System(
        key="celery-solo",
        label="Celery 5.7.0 + Redis, solo pool",
        settings=f"N `celery worker --pool solo` processes, --prefetch-multiplier {CELERY_PREFETCH}, as above",
        venv="celery",
        agent="bench/peers/celery_agent.py",
        worker_commands=celery_workers("solo"),
        env=lambda ctx, url: {
            **_peer_env(url),
            "CELERY_BROKER_URL": ctx.servers.redis_url.rsplit("/", 1)[0] + "/2",
        },
        remaining_sql=None,
        uses_postgres=False,
        uses_redis_broker=True,
        tags=frozenset({"variant"}),
    ),
    System(
        key="procrastinate",
        label="Procrastinate 3.10.0",
        settings=(
            f"procrastinate worker --concurrency {PROCRASTINATE_CONCURRENCY} (async sub-workers), async no-op task,"
            " LISTEN/NOTIFY on, jobs kept (delete_jobs=never, default); producer: SyncPsycopgConnector"
        ),
        venv="procrastinate",
        agent="bench/peers/procrastinate_agent.py",
        worker_commands=procrastinate_workers,
        env=_pg_env,
        remaining_sql="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    ),
    System(
        key="django-tasks",
        label="django-tasks-db 0.13.0",
        settings=(
            "db_worker --no-reload --no-startup-delay, --interval 1 (default), one task at a time;"
            " CONN_MAX_AGE 600 (persistent connections, Django's advice for performance)"
        ),
        venv="django-tasks-db",
        agent="bench/peers/djt_agent.py",
        worker_commands=djt_workers,
        env=lambda ctx, url: {
            **_peer_env(url),
            "DJT_DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "bench.peers.djt_settings",
        },
        remaining_sql=("SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status IN ('READY', 'RUNNING')"),
    ),
    System(
        key="stint",
        label="Stint",
        settings=(
            f"run_workers --concurrency {STINT_SLOTS} (thread slots per process), DEBUG off, no scheduler,"
            " relay or audit consumer (see the Stint-only figures for those)"
        ),
        venv=None,
        agent="bench/peers/stint_agent.py",
        worker_commands=stint_workers,
        env=stint_env,
        remaining_sql="SELECT count(*) FROM stint_job WHERE status NOT IN ('SUCCESS', 'FAILED', 'DEAD', 'CANCELLED')",
        tags=frozenset({"stint"}),
    ),
]


def by_key() -> dict[str, System]:
    """SYSTEMS by key."""
    return {s.key: s for s in SYSTEMS}
