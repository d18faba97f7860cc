"""Celery agent (runs in Celery's venv): the ``noop`` task on a Redis broker, seeding and producing.

Worker: ``celery -A bench.peers.celery_agent worker --pool prefork --concurrency N
--prefetch-multiplier 128 --without-gossip --without-mingle --without-heartbeat``: Celery's
optimizing guide asks for a large prefetch multiplier ("64, or 128") when tasks are many and short.
No result backend and early acknowledgement: Celery's defaults. Broker URL from ``CELERY_BROKER_URL``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from celery import Celery  # noqa: E402 - after the path is set

from bench import probe  # noqa: E402

app = Celery("bench", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15"))
app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@app.task(name="noop")
def noop(i: int) -> None:
    """Record the start; nothing else."""
    probe.started(i)


def main() -> None:
    """Dispatch ``setup`` | ``seed count=N first=K`` | ``produce out=F rate=R seconds=S``."""
    command, args = sys.argv[1], probe.agent_args(sys.argv[2:])
    if command == "setup":
        with app.connection_for_write() as conn:
            conn.default_channel.client.flushdb()  # the bench's own Redis database: old messages go
    elif command == "seed":
        count, first = int(args["count"]), int(args.get("first", 0))
        with app.producer_or_acquire() as producer:
            for seq in range(first, first + count):
                noop.apply_async((seq,), producer=producer)
    elif command == "produce":
        probe.produce(
            lambda seq: noop.delay(seq),
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
