"""The pickup floor: the least pickup lag a design can have on each transport, measured on one machine.

Usage: python -m devstack run -- .venv/bin/python bench/pickup_floor.py [--rates 200,500] [--seconds 10] [--reps 3]

`make bench` runs it as the Stint-only scenario ``floor`` against its own servers. One producer
(this process) sends one job at a time, paced to ``t0 + i / rate``; one consumer process (this
script with ``consume``) takes each job and notes when. Lag = taken - the producer's commit (when
its call returned), as `make bench` measures a system's pickup lag (``bench.probe``), with the
same arithmetic (``bench.stats.lag_figures``: the first second left out). No queue system is
involved, only the least work each path needs:

- ``redis``: LPUSH / BRPOP on one list. Celery's Redis transport: the worker is blocked in BRPOP
  and runs the task as it arrives (Celery solo acks early); nothing is written to disk.
- ``notify``: INSERT the job and ``pg_notify`` in one transaction (synchronous_commit on) / a
  LISTEN connection: when the notification arrives. What any PostgreSQL queue woken by NOTIFY
  waits for before it can even claim.
- ``claim``: as ``notify``, then the consumer leases the jobs with one autocommit statement
  (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``) on a second
  connection, synchronous_commit on: the lag when it returns. A queue that promises not to run
  a job twice after a database crash must have its lease durable before the handler starts,
  so this is the floor of Stint's pickup (and PgQueuer's), before any worker code runs.
- ``claim-async``: the same claim with synchronous_commit off, which does not wait for the WAL
  flush. Not durable (a server crash can forget the lease, and the job then runs again); shown
  only to say what the flush costs.

Prints one JSON line per (path, rate, repetition) while it runs, then a JSON summary: for each
path and rate the median of the repetitions' p50/p95/p99 in ms. Needs DATABASE_URL (a database
``stint_bench_floor`` is created next to it) and REDIS_URL (the list ``stint:bench:floor``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import probe  # noqa: E402
from bench.event_stack import fresh_database  # noqa: E402 - after the path fix
from bench.stats import lag_figures, parse_produced  # noqa: E402

PATHS = ("redis", "notify", "claim", "claim-async")
CHANNEL = "stint_bench_floor"
REDIS_KEY = "stint:bench:floor"
WARMUP_SECONDS = 1.0  # jobs produced in the first second are left out of the figures
STOP = "stop"
SCHEMA = """
    DROP TABLE IF EXISTS floor_job;
    CREATE TABLE floor_job (id bigserial PRIMARY KEY, seq integer NOT NULL, state text NOT NULL DEFAULT 'queued',
                            lease uuid);
    CREATE INDEX floor_job_queued ON floor_job (id) WHERE state = 'queued';
"""
PRODUCE_SQL = f"""
    WITH i AS (INSERT INTO floor_job (seq) VALUES (%s) RETURNING seq) SELECT pg_notify('{CHANNEL}', seq::text) FROM i
"""  # noqa: S608 - constant
CLAIM_SQL = """
    UPDATE floor_job SET state = 'running', lease = gen_random_uuid()
    WHERE id IN (SELECT id FROM floor_job WHERE state = 'queued' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
    RETURNING seq
"""


# ---------------------------------------------------------------------------------------------
# Consumer (a process of its own).


def consume(path: str, url: str, redis_url: str) -> None:
    """Take jobs until the producer's stop message; print one JSON object {seq: time taken (epoch s)}.

    Prints ``ready`` first, once it is blocked-ready (BRPOP issued, or LISTEN done).
    """
    taken: dict[int, float] = {}
    if path == "redis":
        import redis

        client = redis.Redis.from_url(redis_url)
        client.ping()
        print("ready", flush=True)
        while True:
            _, value = client.brpop([REDIS_KEY])
            now = time.time()
            if value == STOP.encode():
                break
            taken[int(value)] = now
    else:
        import psycopg

        listen = psycopg.connect(url, autocommit=True)
        listen.execute(f"LISTEN {CHANNEL}")
        claimer = psycopg.connect(url, autocommit=True)
        claimer.execute("SET synchronous_commit = " + ("off" if path == "claim-async" else "on"))
        print("ready", flush=True)
        stopping = False
        while not stopping:
            for note in listen.notifies(timeout=1.0):
                now = time.time()
                if note.payload == STOP:
                    stopping = True
                    break
                if path == "notify":
                    taken[int(note.payload)] = now
                    continue
                rows = claimer.execute(CLAIM_SQL).fetchall()
                now = time.time()
                for (seq,) in rows:
                    taken[seq] = now
    print(json.dumps(taken), flush=True)


# ---------------------------------------------------------------------------------------------
# Producer and figures.


def measure(path: str, rate: float, seconds: float, url: str, redis_url: str) -> dict[str, Any]:
    """Run one consumer for ``path`` and produce ``rate`` jobs/s for ``seconds``; return its lag figures.

    The dict: path, rate, produced and taken (jobs), and ``bench.stats.LagFigures.as_dict()``
    (p50_ms, p95_ms, p99_ms, the verdict...). Raises RuntimeError when the consumer does not start,
    ``subprocess.TimeoutExpired`` when it does not stop within 60 s of the producer's stop message.
    """
    import psycopg
    import redis

    if path != "redis":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SCHEMA)
    client = redis.Redis.from_url(redis_url)
    client.delete(REDIS_KEY)
    consumer = subprocess.Popen(
        [sys.executable, __file__, "consume", path, url, redis_url], stdout=subprocess.PIPE, text=True
    )
    try:
        if consumer.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {path} consumer did not start")
        committed = _produce(path, rate, seconds, url, client)
        out, _ = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    taken = {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}
    figures = lag_figures(committed, taken, offered=rate, warmup_seconds=WARMUP_SECONDS)
    return {"path": path, "rate": rate, "produced": len(committed), "taken": len(taken), **figures.as_dict()}


def _produce(path: str, rate: float, seconds: float, url: str, client: Any) -> dict[int, float]:
    """Send ``rate * seconds`` jobs on ``path`` on ``bench.probe``'s absolute schedule, then the stop message.

    Returns {seq: commit time (epoch seconds)}: when the job's LPUSH or COMMIT returned.
    """
    import psycopg

    conn = None if path == "redis" else psycopg.connect(url)

    def send(seq: int) -> None:
        if conn is None:
            client.lpush(REDIS_KEY, seq)
        else:
            conn.execute(PRODUCE_SQL, [seq])
            conn.commit()

    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "produced.txt"
            probe.produce(send, out=out, rate=rate, count=int(rate * seconds))
            committed = parse_produced(out.read_text())
        time.sleep(0.2)  # the last jobs are taken before the stop message
        if conn is None:
            client.lpush(REDIS_KEY, STOP)
        else:
            conn.execute("SELECT pg_notify(%s, %s)", [CHANNEL, STOP])
            conn.commit()
    finally:
        if conn is not None:
            conn.close()
    return committed


def main(argv: list[str] | None = None) -> int:
    """Measure every path at every rate, interleaved by repetition; print JSON lines and the summary."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "consume":
        consume(*args[1:4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="200,500", help="offered jobs/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds produced per measurement")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    opts = parser.parse_args(args)
    paths = [p for p in opts.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths: {', '.join(sorted(unknown))}")
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        print("DATABASE_URL and REDIS_URL must be set: python -m devstack run -- ...", file=sys.stderr)
        return 2
    url = fresh_database(os.environ["DATABASE_URL"], "stint_bench_floor")
    rates = [float(r) for r in opts.rates.split(",")]
    runs = []
    for _ in range(opts.reps):
        for rate in rates:
            for path in paths:
                result = measure(path, rate, opts.seconds, url, os.environ["REDIS_URL"])
                runs.append(result)
                print(json.dumps(result), flush=True)
    summary = {
        f"{path}@{rate:g}": {
            key: round(statistics.median(r[key] for r in runs if r["path"] == path and r["rate"] == rate), 3)
            for key in ("p50_ms", "p95_ms", "p99_ms")
        }
        for rate in rates
        for path in paths
    }
    print(json.dumps({"summary": summary, "reps": opts.reps, "seconds": opts.seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
