"""A stand-in for a host cut off mid-transaction (finding F6): lock some of a scenario's jobs, then sit idle.

The runner starts it on host 3 (``python -m chaos.holder OWNER_ID LIMIT``) right before it cuts that
host off from the database host (scenario ``partition-h3-long``). It connects as every Stint
process does (Django's connection: config.db_session's keepalives, ``tcp_user_timeout`` and
idle-in-transaction bound), locks ``FOR UPDATE`` up to LIMIT of the owner's jobs that are due to
move next (QUEUED, or SCHEDULED/RETRYING and due within 20 s: what a worker or a promoter takes;
it tries again every 50 ms for up to 5 s until it holds one), prints
``{"locked": {job id: row version}}`` as one JSON line and waits with its transaction open until
it is killed. A promoter caught by the cut holds its rows the same way, but only for
milliseconds, so a cut rarely catches one; this holder makes every run show whether the server
ends a vanished client's session, and releases its locks, within the keepalive bounds.
"""

from __future__ import annotations

import json
import os
import sys
import time

SEARCH_SECONDS = 5.0  # how long it looks for a job to lock

_LOCK_SQL = """
    SELECT id, xmin::text FROM stint_job
    WHERE owner_id = %s
      AND (status = 'QUEUED' OR (status IN ('SCHEDULED', 'RETRYING') AND scheduled_at <= now() + interval '20 seconds'))
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
"""


def main(argv: list[str]) -> int:
    """Lock the jobs, report them on stdout, then wait forever (the runner kills this process)."""
    owner_id, limit = int(argv[0]), int(argv[1])
    os.environ.setdefault("STINT_DB_ROLE", "chaos-holder")
    import django

    django.setup()
    from django.db import connection, transaction

    deadline = time.monotonic() + SEARCH_SECONDS
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_LOCK_SQL, [owner_id, limit])
            locked = {str(job_id): version for job_id, version in cursor.fetchall()}
            if locked or time.monotonic() > deadline:
                print(json.dumps({"locked": locked}), flush=True)  # noqa: T201 - the runner reads it
                while True:
                    time.sleep(1)
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
