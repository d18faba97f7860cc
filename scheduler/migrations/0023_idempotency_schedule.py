# POST /api/schedules honours an Idempotency-Key (as POST /api/jobs does), with the same records:
# stint_idempotency gets a schedule_id beside its job_id, and a check that a record names at most
# one of them. The column is nullable without a default (no table rewrite). The check is added
# NOT VALID, then validated in a statement of its own (this migration is not atomic): a table
# holding a day of keys is scanned under SHARE UPDATE EXCLUSIVE, which lets requests go on writing
# keys, not under the ACCESS EXCLUSIVE lock of a plain ADD CONSTRAINT. Reversible: the check and
# the column are dropped (records of schedules then read as records without a job, which the
# protocol of the older release deletes and starts over, as it does any such record).

import django.db.models.deletion
from django.db import migrations, models

ADD_CHECK = (
    "ALTER TABLE stint_idempotency ADD CONSTRAINT idempotency_one_target"
    " CHECK (job_id IS NULL OR schedule_id IS NULL) NOT VALID"
)
DROP_CHECK = "ALTER TABLE stint_idempotency DROP CONSTRAINT IF EXISTS idempotency_one_target"
VALIDATE_CHECK = "ALTER TABLE stint_idempotency VALIDATE CONSTRAINT idempotency_one_target"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler", "0022_no_statistics_for_documents"),
    ]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="schedule",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="scheduler.cronschedule",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="idempotencyrecord",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("job__isnull", True), ("schedule__isnull", True), _connector="OR"),
                        name="idempotency_one_target",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(ADD_CHECK, DROP_CHECK),
                migrations.RunSQL(VALIDATE_CHECK, migrations.RunSQL.noop),
            ],
        ),
    ]
