"""Procrastinate agent (runs in Procrastinate's venv): the ``noop`` task, schema, seeding and producing.

Worker: ``procrastinate --app=bench.peers.procrastinate_agent.app worker --concurrency N``.
Producers defer synchronously through a ``SyncPsycopgConnector`` (Procrastinate's documented
choice for synchronous code); the worker opens the app with the async ``PsycopgConnector``.
DSN from ``PGDSN``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import procrastinate  # noqa: E402 - after the path is set

from bench import probe  # noqa: E402

SEED_CHUNK = 1000  # jobs per batch_defer

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("PGDSN", "")))


@app.task(name="noop")
async def noop(i: int) -> None:
    """Record the start; nothing else."""
    probe.started(i)


@contextlib.contextmanager
def _sync_app() -> Iterator[procrastinate.App]:
    """The app with a SyncPsycopgConnector, opened (its tasks stay bound to it)."""
    with app.replace_connector(procrastinate.SyncPsycopgConnector(conninfo=os.environ["PGDSN"])) as sync_app:
        with sync_app.open():
            yield sync_app


def main() -> None:
    """Dispatch ``setup`` | ``seed count=N first=K`` | ``produce out=F rate=R seconds=S``."""
    command, args = sys.argv[1], probe.agent_args(sys.argv[2:])
    if command == "setup":
        with app.open():
            app.schema_manager.apply_schema()
    elif command == "seed":
        count, first = int(args["count"]), int(args.get("first", 0))
        with _sync_app():
            for start in range(first, first + count, SEED_CHUNK):
                noop.batch_defer(*({"i": s} for s in range(start, min(first + count, start + SEED_CHUNK))))
    elif command == "produce":
        with _sync_app():
            probe.produce(
                lambda seq: noop.defer(i=seq),
                out=Path(args["out"]),
                rate=float(args.get("rate", 0)),
                seconds=float(args.get("seconds", 0)),
                count=int(args.get("count", 0)),
                first_seq=int(args.get("first", 0)),
            )
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
