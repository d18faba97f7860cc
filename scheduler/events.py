"""The lifecycle-event contract: the JSON of a message on ``job-lifecycle-events``, shared by relay and consumer.

The outbox relay (``scheduler.maintenance.relay``) encodes the events of outbox rows with
``MESSAGE_SQL`` (one message per event, whatever the row holds): the database builds each
message's JSON text itself, so the relay's Python only hands bytes to the
producer. The audit consumer (``audit.consumer.parse_event``) reads the same shape back.
docs/events.md documents every field.
"""

from __future__ import annotations

from typing import Any, TypedDict

SCHEMA_VERSION = 1
HEADER_EVENT_TYPE = "event_type"  # the message header naming the event type (the value's ``event_type``)


class LifecycleEvent(TypedDict):
    """The JSON value of a message on ``job-lifecycle-events`` (schema_version 1)."""

    schema_version: int
    event_id: str  # uuid; unique per event, the consumer's dedup key
    event_type: str  # JOB_CREATED, JOB_QUEUED, ... (scheduler.states.EventType)
    job_id: str  # uuid; also the message key
    owner_id: int | None
    sequence: int  # 1, 2, 3, ... per job, gapless, in transition order
    attempt: int  # the job's attempt number after the transition (0 before the first run)
    from_status: str | None  # None for JOB_CREATED
    to_status: str
    occurred_at: str  # ISO 8601 UTC ("...Z"), the database clock of the transition's transaction
    payload: dict[str, Any]  # type, queue, priority, plus event-specific fields


# ``occurred_at`` as Python's ``isoformat()`` writes it in UTC, with ``Z``: microseconds only when nonzero.
_OCCURRED_AT_SQL = """to_char(o.occurred_at AT TIME ZONE 'UTC',
    CASE WHEN extract(microseconds FROM o.occurred_at) %% 1000000 = 0
         THEN 'YYYY-MM-DD"T"HH24:MI:SS"Z"' ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"' END)"""

# An outbox row ``o`` (``stint_outbox``) holds the events one statement wrote, packed
# (``packed_events``, an array of ``stint_packed_event``: claims, transitions, new jobs) or as a JSON
# array (``events``: rows written before migration 0014, and the reconciler's repair copies);
# ``occurred_at`` and ``schema_version`` are the row's. ``EVENTS_OF`` joins each row to its events
# ``e``, rendered from either form by the SQL function ``stint_outbox_entries``: the fields of
# ``scheduler.models.EVENT_KEYS`` as columns (``e.event_id`` uuid, ``e.event_type``, ``e.job_id``
# uuid, ``e.owner_id``, ``e.sequence``, ``e.attempt``, ``e.from_status`` ('' for none),
# ``e.to_status``, ``e.payload`` jsonb) and the 1-based ``e.position``, the order the relay
# produces them in (a job's events in sequence order). A query reading ``o`` from a subquery
# selects both columns.
EVENTS_OF = "CROSS JOIN LATERAL stint_outbox_entries(o.events, o.packed_events) AS e"

# The event ``e`` as an entry of the JSON form (``scheduler.models.EVENT_KEYS``): jsonb.
ENTRY_SQL = (
    "jsonb_build_object('event_id', e.event_id, 'event_type', e.event_type, 'job_id', e.job_id,"
    " 'owner_id', e.owner_id, 'sequence', e.sequence, 'attempt', e.attempt, 'from_status', e.from_status,"
    " 'to_status', e.to_status, 'payload', e.payload)"
)

# The message value of the event ``e`` of outbox row ``o`` (a ``LifecycleEvent``) as JSON text,
# its key (the job id) and its event type, in that order. Written for a cursor with parameters
# (``%%`` is ``%``).
MESSAGE_SQL = f"""
    json_build_object(
        'schema_version', o.schema_version,
        'event_id', e.event_id,
        'event_type', e.event_type,
        'job_id', e.job_id,
        'owner_id', e.owner_id,
        'sequence', e.sequence,
        'attempt', e.attempt,
        'from_status', nullif(e.from_status, ''),
        'to_status', e.to_status,
        'occurred_at', {_OCCURRED_AT_SQL},
        'payload', e.payload
    )::text,
    e.job_id::text,
    e.event_type
"""


def outbox_message(*, outbox_id: int, position: int = 1) -> tuple[str, str, str] | None:
    """Return ``(value, key, event_type)`` of event ``position`` (1-based) of outbox row ``outbox_id``, or None.

    ``value`` is the ``LifecycleEvent`` JSON text, ``key`` the job id, exactly as the relay sends
    it. None when the row or the position does not exist. For inspection and tests; the relay
    encodes its whole batch in its lease statement.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {MESSAGE_SQL} FROM stint_outbox o {EVENTS_OF} WHERE o.id = %s AND e.position = %s",  # noqa: S608
            [outbox_id, position],
        )
        row = cursor.fetchone()
    return (row[0], row[1], row[2]) if row is not None else None
