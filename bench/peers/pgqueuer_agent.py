"""PgQueuer agent (runs in PgQueuer's venv): the ``noop`` entrypoint, schema install, seeding and producing.

Worker: ``pgqueuer_agent.py worker batch=N``, i.e. ``pgqueuer.run(factory, batch_size=N)``, the
programmatic twin of ``pgq run`` (its guide: "identical runtime behavior"); ``pgq run`` itself
fails in 1.6.0 on its default ``--log-level`` ('str' object has no attribute 'name'). One asyncpg
connection per QueueManager, as its performance guide recommends. DSN from ``PGDSN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import asyncpg  # noqa: E402 - after the path is set
from pgqueuer import PgQueuer  # noqa: E402
from pgqueuer.db import AsyncpgDriver  # noqa: E402
from pgqueuer.models import Job  # noqa: E402
from pgqueuer.queries import Queries  # noqa: E402

from bench import probe  # noqa: E402

ENTRYPOINT = "noop"
SEED_CHUNK = 1000  # jobs per batch insert


@contextlib.asynccontextmanager
async def factory() -> AsyncIterator[PgQueuer]:
    """Yield the consumer: one entrypoint whose handler only records its start."""
    connection = await asyncpg.connect(os.environ["PGDSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        probe.started(int(job.payload or b"-1"))

    try:
        yield pgq
    finally:
        await connection.close()


async def _queries() -> tuple[asyncpg.Connection, Queries]:
    connection = await asyncpg.connect(os.environ["PGDSN"])
    return connection, Queries(AsyncpgDriver(connection))


async def seed(count: int, first: int) -> None:
    """Pre-enqueue ``count`` jobs with PgQueuer's batch enqueue (lists of entrypoints and payloads)."""
    connection, queries = await _queries()
    for start in range(first, first + count, SEED_CHUNK):
        seqs = range(start, min(first + count, start + SEED_CHUNK))
        await queries.enqueue([ENTRYPOINT] * len(seqs), [str(s).encode() for s in seqs], [0] * len(seqs))
    await connection.close()


async def produce(args: dict[str, str]) -> None:
    """One ``Queries.enqueue(entrypoint, payload)`` per job (one statement, autocommit)."""
    connection, queries = await _queries()

    async def one(seq: int) -> None:
        await queries.enqueue(ENTRYPOINT, str(seq).encode())

    await probe.produce_async(
        one,
        out=Path(args["out"]),
        rate=float(args.get("rate", 0)),
        seconds=float(args.get("seconds", 0)),
        count=int(args.get("count", 0)),
        first_seq=int(args.get("first", 0)),
    )
    await connection.close()


def main() -> None:
    """Dispatch ``setup`` | ``seed count=N first=K`` | ``produce out=F rate=R seconds=S`` | ``worker batch=N``."""
    command, args = sys.argv[1], probe.agent_args(sys.argv[2:])
    if command == "setup":
        pgq = str(Path(sys.executable).parent / "pgq")
        # The schema, then the autovacuum settings its performance guide's checklist asks for.
        subprocess.run([pgq, "install"], check=True, env=os.environ)
        subprocess.run([pgq, "autovac"], check=True, env=os.environ)
    elif command == "seed":
        asyncio.run(seed(int(args["count"]), int(args.get("first", 0))))
    elif command == "produce":
        asyncio.run(produce(args))
    elif command == "worker":
        import pgqueuer

        asyncio.run(pgqueuer.run("bench.peers.pgqueuer_agent:factory", batch_size=int(args["batch"])))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
