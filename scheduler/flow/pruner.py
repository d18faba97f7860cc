"""Retention of the rate limits' admission log and pacing state, in bounded batches.

A claim under a rate limit deletes that limit's rows older than its window; this service
(``run_scheduler``) removes what no claim will: rows of a limit since removed or shortened,
older than ``flow.limits.MAX_PERIOD_SECONDS`` (the longest window a limit may have). It also
removes pacing rows (``stint_flow_pace``) whose arrival time is that far in the past: such a
row paces nothing (``claim.pace_start`` reads a past arrival time as none), so only limits
since removed or idle leave them.
"""

from __future__ import annotations

import datetime as dt

from django.db import connection

from scheduler.flow.limits import MAX_PERIOD_SECONDS

BATCH = 10_000  # rows deleted per run at most


class AdmissionPruner:
    """Delete admission-log and pacing rows older than the longest window a limit may have (``run_once``)."""

    name = "flow-admission-pruner"
    interval_seconds = 60.0
    leader_only = False

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete up to ``BATCH`` rows of each table older than ``MAX_PERIOD_SECONDS`` (a day); return how many.

        ``now`` (aware) defaults to the database clock.
        """
        with connection.cursor() as cursor:
            cursor.execute(
                """
                DELETE FROM stint_flow_pace WHERE key IN (
                    SELECT key FROM stint_flow_pace
                    WHERE tat < coalesce(%s, now()) - make_interval(secs => %s)
                    LIMIT %s
                    FOR UPDATE SKIP LOCKED
                )
                """,
                [now, MAX_PERIOD_SECONDS, BATCH],
            )
            paces = cursor.rowcount
            cursor.execute(
                """
                DELETE FROM stint_flow_admission WHERE id IN (
                    SELECT id FROM stint_flow_admission
                    WHERE admitted_at < coalesce(%s, now()) - make_interval(secs => %s)
                    LIMIT %s
                )
                """,
                [now, MAX_PERIOD_SECONDS, BATCH],
            )
            return paces + cursor.rowcount
