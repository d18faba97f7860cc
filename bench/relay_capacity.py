"""`python bench/relay_capacity.py`: how fast the outbox relay and the audit consumer drain a backlog; prints JSON.

Usage (inside the dev stack): python -m devstack run -- .venv/bin/python bench/relay_capacity.py [--events N]

Creates the database ``stint_bench_relay`` next to DATABASE_URL's (dropping an old one) and a fresh
topic, inserts ``--events`` outbox rows (default 60,000) in one statement, then, in this process,
runs ``OutboxRelay.run_once`` until every row is published, and an ``AuditConsumer`` until every
event is stored. Reports each one's events/s and its process CPU seconds (this process's, librdkafka's
threads included; PostgreSQL's and the broker's are not). Unlike the ``relay`` scenario of
``make bench``, whose relay can go no faster than the drain writes events, this measures capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_stack import fresh_database, provision_topic, setup_django  # noqa: E402 - after the path fix

BENCH_DB = "stint_bench_relay"
TIMEOUT_SECONDS = 300.0  # give up on either phase after this long
# Outbox rows of 100 events each, as a worker's outcome batches write them.
_INSERT_SQL = """
    INSERT INTO stint_outbox (schema_version, occurred_at, event_count, events)
    SELECT 1, now(), count(*), jsonb_agg(jsonb_build_object(
        'event_id', gen_random_uuid(), 'event_type', 'JOB_COMPLETED', 'job_id', gen_random_uuid(), 'owner_id', 1,
        'sequence', 3, 'attempt', 1, 'from_status', 'RUNNING', 'to_status', 'SUCCESS',
        'payload', '{"type": "DEMO_TASK", "queue": "default", "priority": "MEDIUM", "result": {"echo": null}}'::jsonb))
    FROM generate_series(0, %s - 1) AS n
    GROUP BY n / 100
"""


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=60_000, help="outbox events, rows of 100 (default 60,000)")
    return parser.parse_args()


def _timed(step: Callable[[], int], total: int) -> dict[str, float]:
    """Call ``step()`` (returns rows done) until ``total`` are done; return events/s and CPU seconds."""
    done, started, cpu = 0, time.perf_counter(), time.process_time()
    deadline = started + TIMEOUT_SECONDS
    while done < total and time.perf_counter() < deadline:
        done += step()
    wall = time.perf_counter() - started
    return {
        "events": done,
        "seconds": round(wall, 2),
        "events_per_s": round(done / wall) if wall else 0,
        "cpu_seconds": round(time.process_time() - cpu, 2),
    }


def main() -> int:
    args = _args()
    base_url, bootstrap = os.environ.get("DATABASE_URL"), os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not base_url or not bootstrap:
        print("DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS must be set (python -m devstack run -- ...)", file=sys.stderr)
        return 2
    topic = f"bench-relay-{uuid.uuid4().hex[:8]}"
    setup_django(
        {
            **os.environ,
            "DATABASE_URL": fresh_database(base_url, BENCH_DB),
            "KAFKA_TOPIC": topic,
            "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
    )
    from django.db import connection

    from audit.consumer import AuditConsumer
    from scheduler.maintenance.relay import OutboxRelay

    provision_topic({**os.environ, "KAFKA_TOPIC": topic})  # neither the relay nor the consumer creates it
    relay = OutboxRelay()
    relay.run_once()  # connects the producer before the clock starts
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, [args.events])
        cursor.execute("VACUUM ANALYZE stint_outbox")
    relay_figures = _timed(relay.run_once, args.events)
    relay.close()

    consumer = AuditConsumer(group_id=topic)
    consumer.start()
    first, deadline = 0, time.monotonic() + TIMEOUT_SECONDS
    while not first and time.monotonic() < deadline:  # the group join (seconds on Tansu) is not its speed
        first = consumer.run_once(timeout=1.0)
    consumer_figures = _timed(consumer.run_once, args.events - first)
    consumer.close()
    print(json.dumps({"benchmark": "relay_capacity", "relay": relay_figures, "audit_consumer": consumer_figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
