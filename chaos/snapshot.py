"""Read one scenario's rows from PostgreSQL into a ``chaos.invariants.Snapshot`` (and the instrumentation it needs).

The suite installs, in its own database only, two triggers that log what the invariants need
and Stint does not keep: every write accepted to ``stint_leader_fence`` (``chaos_fence_log``, in
lock order) and the transaction that inserted each cron fire (``chaos_cron_insert``).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg

from chaos.invariants import AttemptRow, EventRow, FenceRow, JobRow, ScheduleRow, Snapshot

INSTRUMENTATION_DDL = """
CREATE TABLE IF NOT EXISTS chaos_fence_log (
    seq bigserial PRIMARY KEY,
    txid bigint NOT NULL,
    token bigint NOT NULL,
    holder text NOT NULL DEFAULT '',
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION chaos_log_fence() RETURNS trigger AS $$
BEGIN
    INSERT INTO chaos_fence_log (txid, token, holder) VALUES (txid_current(), NEW.token, NEW.holder);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS chaos_fence ON stint_leader_fence;
CREATE TRIGGER chaos_fence AFTER INSERT OR UPDATE ON stint_leader_fence
    FOR EACH ROW EXECUTE FUNCTION chaos_log_fence();
CREATE TABLE IF NOT EXISTS chaos_cron_insert (
    job_id uuid PRIMARY KEY,
    txid bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION chaos_log_cron() RETURNS trigger AS $$
BEGIN
    INSERT INTO chaos_cron_insert (job_id, txid) VALUES (NEW.id, txid_current());
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS chaos_cron ON stint_job;
CREATE TRIGGER chaos_cron AFTER INSERT ON stint_job
    FOR EACH ROW WHEN (NEW.schedule_id IS NOT NULL) EXECUTE FUNCTION chaos_log_cron();
"""

FINISHED_SQL = "('SUCCESS', 'FAILED', 'DEAD', 'CANCELLED')"


def backlog(conn: psycopg.Connection, owner_id: int) -> dict[str, int]:
    """The owner's unfinished jobs, unpublished events and events missing from the audit table."""
    row = conn.execute(
        f"""
        SELECT
          (SELECT count(*) FROM stint_job WHERE owner_id = %(o)s AND status NOT IN {FINISHED_SQL}
             AND NOT (status IN ('SCHEDULED', 'RETRYING') AND scheduled_at > now() + interval '1 hour')),
          (SELECT count(*) FROM stint_outbox_event WHERE owner_id = %(o)s AND published_at IS NULL),
          (SELECT count(*) FROM stint_outbox_event o WHERE o.owner_id = %(o)s
             AND NOT EXISTS (SELECT 1 FROM stint_audit_event a WHERE a.event_id = o.event_id))
        """,  # noqa: S608 - a constant list
        {"o": owner_id},
    ).fetchone()
    return {"unfinished": row[0], "unpublished": row[1], "unaudited": row[2]}


def term_starts(conn: psycopg.Connection) -> list[tuple[dt.datetime, int, str]]:
    """Each leadership term the database accepted: (time, token, holder), from the fence log."""
    rows = conn.execute("SELECT at, token, holder FROM chaos_fence_log ORDER BY seq").fetchall()
    starts, last = [], None
    for at, token, holder in rows:
        if last is None or token != last:
            starts.append((at, token, holder))
        last = token
    return starts


def collect(
    conn: psycopg.Connection,
    *,
    owner_id: int,
    created: set[str],
    kafka: dict[str, int],
    schedules: list[ScheduleRow],
    outage_windows: list[tuple[dt.datetime, dt.datetime]],
    dead_windows: list[tuple[dt.datetime, dt.datetime]],
    recovery_seconds: float | None,
    recovery_bound: float,
    worker_kills: int = 0,
    rescued_at_once: bool = False,
) -> Snapshot:
    """Read the owner's jobs, attempts, results, effects, events, audit rows and cron fires into a Snapshot."""
    o = {"o": owner_id}
    jobs = {}
    for r in conn.execute(
        """
        SELECT id::text, status, attempts, attempts_base, max_retries, event_sequence, payload,
               status = 'RUNNING' AND lease_expires_at < now(),
               status IN ('SCHEDULED', 'RETRYING') AND scheduled_at > now() + interval '1 hour',
               schedule_id, fire_time
        FROM stint_job WHERE owner_id = %(o)s
        """,
        o,
    ):
        payload: Any = r[6]
        if isinstance(payload, str):
            payload = json.loads(payload)
        jobs[r[0]] = JobRow(
            id=r[0],
            status=r[1],
            attempts=r[2],
            attempts_base=r[3],
            max_retries=r[4],
            event_sequence=r[5],
            payload=payload if isinstance(payload, dict) else {},
            lease_expired=bool(r[7]),
            due_later=bool(r[8]),
            schedule_id=r[9],
            fire_time=r[10],
        )
    attempts = [
        AttemptRow(job_id=r[0], number=r[1], status=r[2], error=r[3])
        for r in conn.execute(
            """
            SELECT a.job_id::text, a.attempt_number, a.status, a.error FROM stint_attempt a
            JOIN stint_job j ON j.id = a.job_id WHERE j.owner_id = %(o)s
            """,
            o,
        )
    ]
    results = {
        r[0]: (r[1], r[2])
        for r in conn.execute(
            """
            SELECT j.id::text, j.result_attempt, j.result_status FROM stint_job j
            WHERE j.owner_id = %(o)s AND j.result_attempt IS NOT NULL
            """,
            o,
        )
    }
    effects = [
        (r[0], r[1], r[2])
        for r in conn.execute(
            """
            SELECT e.job_id::text, e.attempt, e.executions FROM chaos_effect e
            JOIN stint_job j ON j.id = e.job_id WHERE j.owner_id = %(o)s
            """,
            o,
        )
    ]
    outbox = [
        EventRow(
            job_id=r[0], event_id=r[1], sequence=r[2], attempt=r[3], from_status=r[4], to_status=r[5], published=r[6]
        )
        for r in conn.execute(
            """
            SELECT job_id::text, event_id::text, sequence, attempt, from_status, to_status, published_at IS NOT NULL
            FROM stint_outbox_event WHERE owner_id = %(o)s
            """,
            o,
        )
    ]
    audit = [
        (r[0], r[1], r[2])
        for r in conn.execute(
            "SELECT job_id::text, event_id::text, sequence FROM stint_audit_event WHERE owner_id = %(o)s", o
        )
    ]
    fence_log = [
        FenceRow(seq=r[0], txid=r[1], token=r[2]) for r in conn.execute("SELECT seq, txid, token FROM chaos_fence_log")
    ]
    cron_txids = {
        r[0]: r[1]
        for r in conn.execute(
            """
            SELECT c.job_id::text, c.txid FROM chaos_cron_insert c
            JOIN stint_job j ON j.id = c.job_id WHERE j.owner_id = %(o)s
            """,
            o,
        )
    }
    running_past_lease = [
        r[0]
        for r in conn.execute("SELECT id::text FROM stint_job WHERE status = 'RUNNING' AND lease_expires_at < now()")
    ]
    outbox_ids = {e.event_id for e in outbox}
    return Snapshot(
        created=created,
        jobs=jobs,
        attempts=attempts,
        results=results,
        effects=effects,
        outbox=outbox,
        audit=audit,
        kafka={k: v for k, v in kafka.items() if k in outbox_ids},
        schedules=schedules,
        fence_log=fence_log,
        cron_txids=cron_txids,
        outage_windows=outage_windows,
        dead_windows=dead_windows,
        running_past_lease=running_past_lease,
        recovery_seconds=recovery_seconds,
        recovery_bound=recovery_bound,
        worker_kills=worker_kills,
        rescued_at_once=rescued_at_once,
    )
