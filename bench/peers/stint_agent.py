"""Stint agent (runs in the project's .venv): schema, seeding and producing for the BENCH_NOOP handler.

Workers: ``manage.py run_workers`` (see ``systems.py``). Producers call ``scheduler.enqueue()``, the
API a Django view would call; the commit time is taken from the connection's commit, so the
read-back ``enqueue`` does after its commit is not counted as pickup lag. ``seed`` uses
``enqueue_many`` (one statement per 1,000 jobs); ``seed at=EPOCH`` makes them delayed jobs.
Settings from the environment (``DATABASE_URL`` etc., set by the harness).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from bench import probe  # noqa: E402 - after the path is set

SEED_CHUNK = 1000  # jobs per enqueue_many transaction
JOB_TYPE = "BENCH_NOOP"


def main() -> None:
    """Dispatch a sub-command.

    ``setup`` | ``seed count=N first=K [at=EPOCH]`` | ``produce out=F rate=R seconds=S`` |
    ``events since=EPOCH`` (bench.event_stack.event_figures as JSON) |
    ``user username=U password=P``.
    """
    import django

    django.setup()
    command, args = sys.argv[1], probe.agent_args(sys.argv[2:])
    if command == "setup":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    elif command == "seed":
        from scheduler.enqueuing import enqueue_many

        count, first = int(args["count"]), int(args.get("first", 0))
        at = dt.datetime.fromtimestamp(float(args["at"]), tz=dt.UTC) if args.get("at") else None
        for start in range(first, first + count, SEED_CHUNK):
            jobs = [
                {"type": JOB_TYPE, "payload": {"i": s}, "scheduled_at": at}
                for s in range(start, min(first + count, start + SEED_CHUNK))
            ]
            enqueue_many(jobs)
    elif command == "produce":
        import scheduler

        clock = probe.django_commit_clock()
        probe.produce(
            lambda seq: scheduler.enqueue(JOB_TYPE, {"i": seq}),
            out=Path(args["out"]),
            rate=float(args.get("rate", 0)),
            seconds=float(args.get("seconds", 0)),
            count=int(args.get("count", 0)),
            first_seq=int(args.get("first", 0)),
            commit_clock=clock,
        )
    elif command == "events":
        import json

        from bench.event_stack import audit_complete, event_figures

        since = dt.datetime.fromtimestamp(float(args["since"]), tz=dt.UTC)
        print(json.dumps({"audit_complete": audit_complete(), **event_figures(since=since)}))
    elif command == "user":
        from accounts.models import User

        User.objects.create_user(username=args["username"], password=args["password"])
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
