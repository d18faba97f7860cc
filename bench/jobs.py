"""The benchmark handlers: LOADTEST (records each execution in a side table) and BENCH_NOOP (`make bench`)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from bench import probe
from scheduler.exceptions import RetryableError
from scheduler.registry import JobContext, handler

SIDE_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS stint_bench_execution (
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    executions int NOT NULL DEFAULT 1,
    PRIMARY KEY (job_id, attempt)
)
"""


@handler("LOADTEST", backoff_base_seconds=0.2, backoff_max_seconds=1.0)
def loadtest(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Record (job, attempt) once per execution; fail per ``mode``: ok, fail_once, always_fail.

    ``record`` False skips the side table (the pure no-op run). ``sleep_seconds`` sleeps first.
    """
    payload = payload or {}
    if payload.get("sleep_seconds"):
        ctx.sleep(float(payload["sleep_seconds"]))
    if payload.get("record", True):
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO stint_bench_execution (job_id, attempt) VALUES (%s, %s)"
                " ON CONFLICT (job_id, attempt) DO UPDATE SET executions = stint_bench_execution.executions + 1",
                [ctx.job_id, ctx.attempt],
            )
    mode = payload.get("mode", "ok")
    if mode == "always_fail" or (mode == "fail_once" and ctx.attempt == 1):
        raise RetryableError(f"LOADTEST {mode} on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@handler("BENCH_NOOP")
def bench_noop(payload: dict[str, Any], ctx: JobContext) -> None:
    """`make bench`'s no-op: record the start (``payload["i"]``) with ``bench.probe``, return nothing."""
    probe.started(int((payload or {}).get("i", -1)))
