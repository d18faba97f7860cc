"""django-tasks agent (runs in its venv): the ``noop`` @task on the DatabaseBackend, schema, seeding, producing.

Worker: ``python -m django db_worker --no-reload --no-startup-delay`` with
``DJANGO_SETTINGS_MODULE=bench.peers.djt_settings``; each db_worker runs one task at a time and,
with an empty queue, polls every ``--interval`` seconds (default 1). DSN from ``DJT_DATABASE_URL``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.peers.djt_settings")

from bench import probe  # noqa: E402 - after the path is set

SEED_CHUNK = 2000  # rows per bulk insert


def main() -> None:
    """Dispatch ``setup`` | ``seed count=N first=K`` | ``produce out=F rate=R seconds=S``."""
    import django

    django.setup()
    from bench.peers.djt_tasks import noop

    command, args = sys.argv[1], probe.agent_args(sys.argv[2:])
    if command == "setup":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    elif command == "seed":
        from django_tasks_db.models import DBTaskResult, get_date_max

        # The rows Task.enqueue() writes (DatabaseBackend._task_to_db_task, with the pre_save hook's
        # run_after for "no run_after"), in bulk: seeding is not measured.
        count, first = int(args["count"]), int(args.get("first", 0))
        rows = [
            DBTaskResult(
                args_kwargs={"args": [s], "kwargs": {}},
                priority=noop.priority,
                task_path=noop.module_path,
                queue_name=noop.queue_name,
                run_after=noop.run_after or get_date_max(),
                backend_name=noop.backend,
            )
            for s in range(first, first + count)
        ]
        DBTaskResult.objects.bulk_create(rows, batch_size=SEED_CHUNK)
    elif command == "produce":
        clock = probe.django_commit_clock()
        probe.produce(
            lambda seq: noop.enqueue(seq),
            out=Path(args["out"]),
            rate=float(args.get("rate", 0)),
            seconds=float(args.get("seconds", 0)),
            count=int(args.get("count", 0)),
            first_seq=int(args.get("first", 0)),
            commit_clock=clock,
        )
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
