# The outbox holds the events of one statement in ONE row (issue 13, "events of one batch in fewer
# rows"): stint_outbox keeps its id, occurred_at, schema_version and published_at, and its per-event
# columns become one entry of a JSON array `events` (scheduler.models.EVENT_KEYS). Existing rows
# become rows of one event each, keeping their ids (the reconciler's checkpoint stays valid). The
# index by (job_id, sequence) goes: one index entry per event was the outbox's largest WAL cost.
# The view stint_outbox_event reads the events one per row (model OutboxEvent, unmanaged).

from django.db import migrations, models

import scheduler.states

STRIDE = 1 << 20  # scheduler.models.EVENT_ID_STRIDE

VIEW = f"""
CREATE VIEW stint_outbox_event AS
SELECT o.id * {STRIDE} + e.ord AS id,
       o.id AS outbox_id,
       e.ord::integer AS position,
       (e.ev->>'event_id')::uuid AS event_id,
       (e.ev->>'event_type')::varchar(32) AS event_type,
       (e.ev->>'job_id')::uuid AS job_id,
       (e.ev->>'owner_id')::bigint AS owner_id,
       (e.ev->>'sequence')::integer AS sequence,
       (e.ev->>'attempt')::integer AS attempt,
       coalesce(e.ev->>'from_status', '')::varchar(10) AS from_status,
       (e.ev->>'to_status')::varchar(10) AS to_status,
       o.schema_version,
       coalesce(e.ev->'payload', '{{}}'::jsonb) AS payload,
       o.occurred_at,
       o.published_at
FROM stint_outbox o CROSS JOIN LATERAL jsonb_array_elements(o.events) WITH ORDINALITY AS e(ev, ord)
"""

FORWARD = f"""
ALTER TABLE stint_outbox ADD COLUMN events jsonb, ADD COLUMN event_count integer;
UPDATE stint_outbox SET event_count = 1, events = jsonb_build_array(jsonb_build_object(
    'event_id', event_id, 'event_type', event_type, 'job_id', job_id, 'owner_id', owner_id,
    'sequence', sequence, 'attempt', attempt, 'from_status', from_status, 'to_status', to_status,
    'payload', payload));
ALTER TABLE stint_outbox ALTER COLUMN events SET NOT NULL, ALTER COLUMN event_count SET NOT NULL,
    ADD CONSTRAINT stint_outbox_event_count_check CHECK (event_count >= 0);
ALTER TABLE stint_outbox DROP COLUMN event_id, DROP COLUMN event_type, DROP COLUMN job_id,
    DROP COLUMN owner_id, DROP COLUMN sequence, DROP COLUMN attempt, DROP COLUMN from_status,
    DROP COLUMN to_status, DROP COLUMN payload;
{VIEW};
"""

BACKWARD = """
DROP VIEW stint_outbox_event;
CREATE TABLE stint_outbox_old AS SELECT * FROM stint_outbox;
DELETE FROM stint_outbox;
ALTER TABLE stint_outbox DROP COLUMN events, DROP COLUMN event_count,
    ADD COLUMN event_id uuid, ADD COLUMN event_type varchar(32), ADD COLUMN job_id uuid,
    ADD COLUMN owner_id bigint, ADD COLUMN sequence integer CHECK (sequence >= 0),
    ADD COLUMN attempt integer CHECK (attempt >= 0), ADD COLUMN from_status varchar(10),
    ADD COLUMN to_status varchar(10), ADD COLUMN payload jsonb;
INSERT INTO stint_outbox (schema_version, occurred_at, published_at, event_id, event_type, job_id, owner_id,
                          sequence, attempt, from_status, to_status, payload)
SELECT o.schema_version, o.occurred_at, o.published_at, (e->>'event_id')::uuid, e->>'event_type',
       (e->>'job_id')::uuid, (e->>'owner_id')::bigint, (e->>'sequence')::int, (e->>'attempt')::int,
       coalesce(e->>'from_status', ''), e->>'to_status', coalesce(e->'payload', '{}'::jsonb)
FROM stint_outbox_old o CROSS JOIN LATERAL jsonb_array_elements(o.events) WITH ORDINALITY AS x(e, ord)
ORDER BY o.id, x.ord;
DROP TABLE stint_outbox_old;
ALTER TABLE stint_outbox ALTER COLUMN event_id SET NOT NULL, ALTER COLUMN event_type SET NOT NULL,
    ALTER COLUMN job_id SET NOT NULL, ALTER COLUMN sequence SET NOT NULL, ALTER COLUMN attempt SET NOT NULL,
    ALTER COLUMN from_status SET NOT NULL, ALTER COLUMN to_status SET NOT NULL, ALTER COLUMN payload SET NOT NULL;
CREATE INDEX outbox_job_sequence ON stint_outbox (job_id, sequence);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0009_job_fewer_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="outboxevent", name="outbox_job_sequence"),
                migrations.RenameModel(old_name="OutboxEvent", new_name="OutboxBatch"),
                *[
                    migrations.RemoveField(model_name="outboxbatch", name=name)
                    for name in (
                        "event_id",
                        "event_type",
                        "job_id",
                        "owner_id",
                        "sequence",
                        "attempt",
                        "from_status",
                        "to_status",
                        "payload",
                    )
                ],
                migrations.AddField(
                    model_name="outboxbatch",
                    name="event_count",
                    field=models.PositiveIntegerField(default=0),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="outboxbatch",
                    name="events",
                    field=models.JSONField(default=list),
                    preserve_default=False,
                ),
                migrations.CreateModel(
                    name="OutboxEvent",
                    fields=[
                        ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                        ("outbox_id", models.BigIntegerField()),
                        ("position", models.IntegerField()),
                        ("event_id", models.UUIDField()),
                        (
                            "event_type",
                            models.CharField(choices=scheduler.states.EventType.choices, max_length=32),
                        ),
                        ("job_id", models.UUIDField()),
                        ("owner_id", models.BigIntegerField(blank=True, null=True)),
                        ("sequence", models.PositiveIntegerField()),
                        ("attempt", models.PositiveIntegerField(default=0)),
                        ("from_status", models.CharField(blank=True, default="", max_length=10)),
                        ("to_status", models.CharField(max_length=10)),
                        ("schema_version", models.PositiveSmallIntegerField(default=1)),
                        ("payload", models.JSONField(blank=True, default=dict)),
                        ("occurred_at", models.DateTimeField()),
                        ("published_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={"db_table": "stint_outbox_event", "managed": False},
                ),
            ],
            database_operations=[migrations.RunSQL(FORWARD, reverse_sql=BACKWARD)],
        ),
    ]
