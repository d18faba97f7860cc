"""How late an idle scheduler promotes delayed jobs: JOB_QUEUED's time minus the jobs' due time.

Usage: python -m devstack run -- .venv/bin/python bench/promotion_lag.py [--jobs 2000] [--fractions 0.13,0.47,0.81]

Starts ``run_scheduler`` on a fresh database, lets it go idle, then schedules ``--jobs`` jobs due
at one instant (a whole second plus each fraction: delayed jobs are not always due on a whole
second) and reads, from the database alone, when each job's SCHEDULED -> QUEUED event occurred
(the promoting transaction's start) relative to its ``scheduled_at``. No workers run, so the
figure is the promoter's own delay, not the drain's: on a shared machine it is far steadier than
the bench's "all started after due". Prints one JSON line per instant.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_stack import ROOT, bench_environment, setup_django  # noqa: E402 - after the path fix

LEAD_SECONDS = 4  # the scheduler is idle (polling about once a second) well before the instant


def main() -> int:
    """Run the measurement; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--fractions", default="0.13,0.47,0.81")
    args = parser.parse_args()
    env = bench_environment(
        "stint_bench_promotion",
        run_with="python -m devstack run -- .venv/bin/python bench/promotion_lag.py",
        STINT_OUTBOX_RELAY_INTERVAL_SECONDS="3600",
    )
    if env is None:
        return 2
    setup_django(env)
    import datetime as dt

    from django.db import connection

    from scheduler.enqueuing import enqueue_many

    scheduler = subprocess.Popen(
        [sys.executable, "manage.py", "run_scheduler", "-v", "0"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(LEAD_SECONDS)
        for fraction in (float(f) for f in args.fractions.split(",")):
            due = math.floor(time.time()) + LEAD_SECONDS + fraction
            at = dt.datetime.fromtimestamp(due, tz=dt.UTC)
            enqueue_many([{"type": "DEMO_TASK", "scheduled_at": at} for _ in range(args.jobs)])
            time.sleep(max(0.0, due - time.time()) + 3)
            with connection.cursor() as cursor:
                cursor.execute(
                    """
                    SELECT count(*), min(lag), percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), max(lag)
                    FROM (
                        SELECT extract(epoch FROM e.occurred_at - j.scheduled_at) AS lag
                        FROM stint_outbox_event e JOIN stint_job j ON j.id = e.job_id
                        WHERE e.event_type = 'JOB_QUEUED' AND e.from_status = 'SCHEDULED' AND j.scheduled_at = %s
                    ) promoted
                    """,
                    [at],
                )
                n, low, p50, high = cursor.fetchone()
            print(
                json.dumps(
                    {
                        "due_fraction": fraction,
                        "jobs": args.jobs,
                        "promoted": n,
                        "promoted_after_due_s": {
                            "min": round(float(low), 3) if low is not None else None,
                            "p50": round(float(p50), 3) if p50 is not None else None,
                            "max": round(float(high), 3) if high is not None else None,
                        },
                    }
                ),
                flush=True,
            )
    finally:
        scheduler.terminate()
        scheduler.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
