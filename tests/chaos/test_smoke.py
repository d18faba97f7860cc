"""A two-scenario smoke of ``make chaos`` on one host: the harness and Stint's promises end to end, in ``make test``.

The short profile (22 scenarios on three network namespaces, about 10 minutes) does not fit the
suite's time; this runs the same harness (``python -m chaos``: its own PostgreSQL, Redis and
broker, a real cluster, load through the API and ``enqueue_many``, seeded faults, invariants
I1-I8) with the ``smoke`` profile and two scenarios: a worker process SIGKILLed mid-job (its
supervisor rescues its jobs at once) and ``pg_terminate_backend`` of every client connection,
twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("worker-kill", "pg-terminate")
TIMEOUT_SECONDS = 300  # a hung run fails here instead of hanging the suite


@pytest.mark.slow
def test_worker_sigkill_and_terminated_connections_lose_nothing_and_run_nothing_twice():
    command = [sys.executable, "-m", "chaos", "--one-host", "--profile", "smoke"]
    for name in SCENARIOS:
        command += ["--scenario", name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_SETTINGS_MODULE"))}
    run = subprocess.run(  # noqa: S603 - our own harness
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False
    )
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    report = f"stdout:\n{run.stdout[-6000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert [r["scenario"] for r in rows] == list(SCENARIOS), report
    for row in rows:
        assert row["status"] == "pass", (row["scenario"], row["failed_invariants"], row["violations"], row["errors"])
        assert row["faults_injected"] == len(row["faults"]) > 0, row["faults"]
        assert (row["lost"], row["duplicates"], row["audit_gaps"]) == (0, 0, 0)
    kill = rows[0]["faults"][0]["detail"]
    assert kill.startswith("SIGKILL worker@") and "worker process" in kill, kill
    assert rows[0]["attempts"].get("LOST", 0) >= 1, rows[0]["attempts"]  # the kill hit a job mid-run
    assert run.returncode == 0, report
