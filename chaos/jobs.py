"""The CHAOS handler: records each execution in a side-effect table keyed by (job, attempt), then obeys its payload."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.db import connection

from scheduler.exceptions import RetryableError
from scheduler.registry import JobContext, handler

EFFECT_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS chaos_effect (
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    executions int NOT NULL DEFAULT 1,
    first_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, attempt)
)
"""


@handler("CHAOS", timeout_seconds=60, backoff_base_seconds=0.2, backoff_max_seconds=1.0)
def chaos(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Sleep ``sleep`` seconds, record the side effect of (job, attempt), then end as ``mode`` and ``fail`` say.

    ``mode``: ``ok`` returns ``{"attempt": n}`` unless ``n`` is in ``fail`` (then a retryable
    error); ``exit`` calls ``os._exit(1)``; ``sysexit`` raises ``SystemExit(3)``; ``nul`` raises
    an error whose message holds U+0000. The side effect is written before the ending, in its
    own autocommit statement, so an execution is visible even when its outcome is lost.
    """
    payload = payload or {}
    if payload.get("sleep"):
        ctx.sleep(float(payload["sleep"]))
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chaos_effect (job_id, attempt) VALUES (%s, %s)"
            " ON CONFLICT (job_id, attempt) DO UPDATE SET executions = chaos_effect.executions + 1",
            [ctx.job_id, ctx.attempt],
        )
    mode = payload.get("mode", "ok")
    if mode == "exit":
        os._exit(1)
    if mode == "sysexit":
        sys.exit(3)
    if mode == "nul":
        raise RetryableError("poison error with a NUL byte: \x00 end")
    if ctx.attempt in payload.get("fail", ()):
        raise RetryableError(f"planned failure on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}
