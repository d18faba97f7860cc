"""Job ids: time-ordered UUIDs (RFC 9562 version 7), so that a job's index entries land beside its neighbours'.

A random (version 4) id puts every new job, and every later row version of it, on a random leaf
of the job table's primary key and of the attempts' (job, attempt number) index; jobs are
claimed roughly in creation order, so with version 7 ids a drain walks those indexes instead of
hopping across them, and the claim and the outcome find their leaf pages already in memory.
"""

from __future__ import annotations

import uuid

from uuid_utils import compat


def new_job_id() -> uuid.UUID:
    """Return a new job id: a ``uuid.UUID`` of version 7 (RFC 9562, section 5.7).

    48 bits of Unix time in milliseconds, then random bits; ids made by one process increase
    (``uuid_utils`` keeps a counter within a millisecond). Unique like a random UUID; it tells
    the time of its creation to the millisecond, which the job's ``created_at`` shows anyway.
    """
    return compat.uuid7()


def short_job_id(job_id: uuid.UUID | str) -> str:
    """The 8 hex digits the lists show for a job id (its last 8, e.g. "92cf1d36").

    The start of a version 7 id is its creation time, shared by the jobs made in the same minute;
    its end is random. The operator console finds a job by these digits (or by any 8 or more
    from either end of the id).
    """
    return str(job_id)[-8:]
