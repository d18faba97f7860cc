"""Claim index upkeep: VACUUM ``stint_job`` when claims read too many pages of dead entries.

Every claim walks the partial index ``job_claim_scan_desc`` (QUEUED jobs in claim order) from its
start. A job that leaves QUEUED leaves its entry there, dead, until a VACUUM of ``stint_job``
with index cleanup removes it; finished jobs are older than the queued ones, so their entries
come first and every claim reads past all of them. Autovacuum removes them late: with finished
jobs kept for days (``STINT_RETENTION_*_DAYS``) it vacuums ``stint_job`` after a fifth of its
rows changed (hours of jobs); and a VACUUM run more often (by hand, or with a lower
``autovacuum_vacuum_scale_factor``) finds the recent jobs' dead rows on fewer than 2% of a large
table's pages and then skips its indexes altogether (PostgreSQL 14+, ``INDEX_CLEANUP AUTO``:
"index scan bypassed"; seen on a table of 3 million kept jobs and 30,000 recent ones), so it
leaves every dead entry of the claim index where it was. Measured on a 2-core
machine (``bench/claim_dead_entries.py``): a claim of one job took 0.56 ms on a fresh table,
10.7 ms after a million finished jobs, 0.74 ms after a ``VACUUM (INDEX_CLEANUP ON)`` of 2.5 s.

So once a minute this service asks PostgreSQL how many buffers the claim's index scan reads
before its first QUEUED job (``EXPLAIN (ANALYZE, BUFFERS)`` of the candidate query, no lock
taken; in whichever part of the index reads more: the unheld jobs every claim reads, or the
jobs a flow limit holds, which the limited phase reads too), reports it in
``claim_index_pages_read``, and at ``SCHEDULER["CLAIM_INDEX_VACUUM_PAGES"]`` or more
(``STINT_CLAIM_INDEX_VACUUM_PAGES``, default 500 pages: about 100,000 finished jobs;
0 turns it off) runs ``VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) stint_job``: it takes no lock that
blocks reads or writes, and it is skipped while another VACUUM of the table runs (autovacuum,
another scheduler), and without the session's ``statement_timeout``. A VACUUM that left claims
reading a threshold of pages or more (skipped, or the entries still visible to an old
transaction) is logged, and the next waits until claims read another threshold of pages.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time

from scheduler import metrics
from scheduler.conf import conf
from scheduler.lifecycle import CLAIM_ORDER

logger = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 60.0
# The claim's candidate scan (lifecycle.claim), for one job: what each claim reads before its first,
# in the index's unheld part (every claim) and in its held part (the limited phase of a flow-limited
# claim, scheduler.flow.claim, reads both). A held backlog drained after a VACUUM leaves its dead
# entries in the held part only: the unheld part's probe alone would never see them.
_PROBE_SQL = [
    f"""
    EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
    SELECT id FROM stint_job WHERE status = 'QUEUED' AND NOT isolated AND flow_held = {held}
    ORDER BY {CLAIM_ORDER} LIMIT 1
    """  # noqa: S608 - a constant
    for held in ("false", "true")
]


class ClaimIndexUpkeep:
    """Background service: VACUUM ``stint_job`` (index cleanup) when claims read ``CLAIM_INDEX_VACUUM_PAGES`` pages."""

    name = "claim_index_upkeep"
    interval_seconds = CHECK_INTERVAL_SECONDS
    leader_only = False  # a second scheduler's VACUUM is skipped (SKIP_LOCKED), its probe is one claim's reads

    def __init__(self, *, vacuum_pages: int | None = None) -> None:
        """``vacuum_pages``: the threshold in pages (default ``conf().claim_index_vacuum_pages``; 0: off)."""
        self.vacuum_pages = conf().claim_index_vacuum_pages if vacuum_pages is None else vacuum_pages
        # Pages a VACUUM could not remove: the next one waits until claims read a threshold more.
        self._unremovable = 0

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Probe the claim's scan; VACUUM at the threshold. Return 1 if a VACUUM cut the pages read below it, else 0.

        ``now`` is unused (the ``Service`` signature).

        Raises only database errors.
        """
        if self.vacuum_pages <= 0:
            return 0
        pages = pages_read_by_a_claim()
        metrics.claim_index_pages_read.set(pages)
        if pages < self._unremovable:  # something else removed them meanwhile (autovacuum): start over
            self._unremovable = 0
        if pages - self._unremovable < self.vacuum_pages:
            return 0
        started = time.monotonic()
        _vacuum_job_table()
        after = pages_read_by_a_claim()
        metrics.claim_index_pages_read.set(after)
        if after >= self.vacuum_pages:
            # PostgreSQL skipped the table with only a warning (another VACUUM held it: SKIP_LOCKED;
            # or this role does not own it), or could not remove most entries: a transaction that
            # began before those jobs finished may still see them. Not again every minute on a
            # large table: only once claims read another threshold of pages.
            self._unremovable = after
            logger.warning(
                "claim index upkeep: a claim reads %d pages and VACUUM stint_job left %d of them"
                " (another VACUUM of the table was running, this database role does not own it, or an"
                " old transaction or replication slot still holds them: see pg_stat_activity.backend_xmin)",
                pages,
                after,
            )
            return 0
        self._unremovable = 0
        metrics.claim_index_vacuums_total.inc()
        logger.info(
            "claim index upkeep: a claim read %d pages; VACUUM (INDEX_CLEANUP ON) stint_job took %.2f s, now %d",
            pages,
            time.monotonic() - started,
            after,
        )
        return 1


def pages_read_by_a_claim() -> int:
    """The buffers (8 kB pages, index and table) the claim's candidate scan reads to find its first job.

    The larger of the two parts of ``job_claim_scan_desc``: the unheld one (every claim reads it)
    and the held one (the limited phase of a flow-limited claim reads it too). Runs each part's scan
    twice under ``EXPLAIN (ANALYZE, BUFFERS)`` (the second is reported), as an index scan, in a
    transaction of its own: no row is locked. Raises only database errors.
    """
    from django.db import connection, transaction

    pages = 0
    with transaction.atomic(), connection.cursor() as cursor:
        # The index walk a claim makes with up-to-date statistics, whatever the planner would
        # guess for this one-row query on a table it has not analyzed yet.
        cursor.execute("SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)")
        for sql in _PROBE_SQL:
            # Twice: the first scan after jobs left QUEUED also reads their rows, to learn they are
            # dead, and marks their entries; the workers' claims do that as they go, so a claim in
            # steady state reads what the second scan reads.
            cursor.execute(sql)
            cursor.execute(sql)
            (document,) = cursor.fetchone()
            plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
            pages = max(pages, int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)))
    return pages


def _vacuum_job_table() -> None:
    from django.db import connection

    # Outside a transaction block (VACUUM cannot run in one): the service thread is in autocommit.
    # Without a statement_timeout: one set for the application's queries (the role's, or the
    # connection's options) would cancel a VACUUM of a large table every minute, work wasted.
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout'), set_config('statement_timeout', '0', false)")
        (timeout, _) = cursor.fetchone()
        try:
            cursor.execute("VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) stint_job")
        finally:
            cursor.execute("SELECT set_config('statement_timeout', %s, false)", [timeout])
