# The events of a claim, a transition or new jobs are stored packed (issue 13): one composite value
# per event (type stint_packed_event) in the array column stint_outbox.packed_events, instead of a
# JSON object each in `events`. Building the JSON cost a drain's statements about 6 us an event
# (two events a job), the packed value about 1.5; the JSON is now built where it is read: the SQL
# function stint_outbox_entries(events, packed_events) returns a row's events as rows of the fields
# of scheduler.models.EVENT_KEYS (and their position), whichever form the row holds, and every
# reader (the relay, the reconciler, the job pruner, the view stint_outbox_event) reads through it.
# A packed event's event_id is derived from its job id and sequence: the md5 of
# "<job_id>/<sequence>" as an RFC 9562 version 8 uuid (version and variant nibbles set to 8). An
# event has one (job, sequence) pair, so the id is unique per event like a random one, and the same
# every time the row is rendered. Rows written in the JSON form (earlier rows, the reconciler's
# repair copies) keep it; exactly one of the two columns is set. Going back unpacks packed rows
# into JSON with the same ids and restores 0010's view.

import importlib

from django.db import migrations, models

import scheduler.states

STRIDE = 1 << 20  # scheduler.models.EVENT_ID_STRIDE
# The priority label of a packed event's payload, as scheduler.states.priority_label names it.
PRIORITY = (
    "(CASE p.priority "
    + " ".join(f"WHEN {int(p)} THEN '{p.name}'" for p in scheduler.states.Priority)
    + " ELSE (p.priority::text) END)"
)

# The view as migration 0010 made it (reading the JSON form only), restored going back.
VIEW_0010 = importlib.import_module("scheduler.migrations.0010_outbox_event_batches").VIEW

# A rendered event (a row ``e`` of stint_outbox_entries) as the JSON entry of the JSON form.
ENTRY = (
    "jsonb_build_object('event_id', e.event_id, 'event_type', e.event_type, 'job_id', e.job_id,"
    " 'owner_id', e.owner_id, 'sequence', e.sequence, 'attempt', e.attempt, 'from_status', e.from_status,"
    " 'to_status', e.to_status, 'payload', e.payload)"
)

FORWARD = f"""
CREATE TYPE stint_packed_event AS (
    event_type text, job_id uuid, owner_id bigint, sequence integer, attempt integer,
    from_status text, to_status text, type text, queue text, priority smallint, extra jsonb
);
ALTER TABLE stint_outbox ADD COLUMN packed_events stint_packed_event[],
    ALTER COLUMN events DROP NOT NULL,
    ADD CONSTRAINT stint_outbox_one_form CHECK ((events IS NULL) <> (packed_events IS NULL));
DO $$
BEGIN
    ALTER TABLE stint_outbox ALTER COLUMN packed_events SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'this PostgreSQL has no lz4: stint_outbox.packed_events is compressed with pglz';
END
$$;
CREATE FUNCTION stint_outbox_entries(events jsonb, packed stint_packed_event[])
RETURNS TABLE (event_id uuid, event_type text, job_id uuid, owner_id bigint, sequence integer, attempt integer,
               from_status text, to_status text, payload jsonb, "position" bigint)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT (e.ev->>'event_id')::uuid, e.ev->>'event_type', (e.ev->>'job_id')::uuid, (e.ev->>'owner_id')::bigint,
           (e.ev->>'sequence')::integer, (e.ev->>'attempt')::integer, coalesce(e.ev->>'from_status', ''),
           e.ev->>'to_status', coalesce(e.ev->'payload', '{{}}'::jsonb), e.ord
    FROM jsonb_array_elements(events) WITH ORDINALITY AS e(ev, ord)
    UNION ALL
    SELECT overlay(overlay(md5(p.job_id::text || '/' || p.sequence::text) PLACING '8' FROM 13) PLACING '8' FROM 17)::uuid,
           p.event_type, p.job_id, p.owner_id, p.sequence, p.attempt, p.from_status, p.to_status,
           jsonb_build_object('type', p.type, 'queue', p.queue, 'priority', {PRIORITY}) || coalesce(p.extra, '{{}}'::jsonb),
           p.ord
    FROM unnest(packed) WITH ORDINALITY AS p(event_type, job_id, owner_id, sequence, attempt, from_status,
                                            to_status, type, queue, priority, extra, ord)
$fn$;
CREATE OR REPLACE VIEW stint_outbox_event AS
SELECT o.id * {STRIDE} + e.position AS id,
       o.id AS outbox_id,
       e.position::integer AS position,
       e.event_id,
       e.event_type::varchar(32) AS event_type,
       e.job_id,
       e.owner_id,
       e.sequence,
       e.attempt,
       e.from_status::varchar(10) AS from_status,
       e.to_status::varchar(10) AS to_status,
       o.schema_version,
       e.payload,
       o.occurred_at,
       o.published_at
FROM stint_outbox o CROSS JOIN LATERAL stint_outbox_entries(o.events, o.packed_events) AS e;
"""

BACKWARD = f"""
DROP VIEW stint_outbox_event;
{VIEW_0010};
UPDATE stint_outbox o SET events = (
           SELECT jsonb_agg({ENTRY} ORDER BY e.position) FROM stint_outbox_entries(NULL, o.packed_events) e),
       packed_events = NULL
WHERE packed_events IS NOT NULL;
DROP FUNCTION stint_outbox_entries(jsonb, stint_packed_event[]);
ALTER TABLE stint_outbox DROP CONSTRAINT stint_outbox_one_form, DROP COLUMN packed_events,
    ALTER COLUMN events SET NOT NULL;
DROP TYPE stint_packed_event;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0013_attempt_fk_check_outbox_lz4"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name="outboxbatch", name="events", field=models.JSONField(null=True)),
            ],
            database_operations=[migrations.RunSQL(FORWARD, reverse_sql=BACKWARD)],
        ),
    ]
