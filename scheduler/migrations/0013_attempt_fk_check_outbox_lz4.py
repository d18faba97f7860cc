# Two costs of a drain's statements (issue 13), both measured with a 100,000-job drain of one
# `run_workers` of two processes on the bench's PostgreSQL 15:
#
# - stint_job_attempt.job_id loses its database constraint (the ForeignKey stays, with
#   db_constraint=False): each attempt row queued a deferred check that looked its job up with
#   FOR KEY SHARE at commit, though the only statement inserting attempt rows takes their jobs
#   from the rows it has just locked and updated (scheduler.lifecycle._ATTEMPT_ROW). Deleting a
#   job still deletes its attempts (the pruner's statement; Django's collector elsewhere).
# - stint_outbox.events is compressed with lz4 instead of pglz where the server has lz4 (Debian's and
#   most distributions' builds; the embedded dev-stack server has not, and keeps pglz): each outbox
#   row of a drain holds ~100 events (~30 kB of JSON) and pglz spent about 2 us an event on it.
#   Rows written before keep their pglz values; both read the same.

import django.db.models.deletion
from django.db import migrations, models

LZ4 = """
DO $$
BEGIN
    ALTER TABLE stint_outbox ALTER COLUMN events SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'this PostgreSQL has no lz4: stint_outbox.events stays compressed with pglz';
END
$$;
"""

DEFAULT_COMPRESSION = "ALTER TABLE stint_outbox ALTER COLUMN events SET COMPRESSION default;"


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0012_job_result_in_row"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobattempt",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="attempt_set",
                to="scheduler.job",
            ),
        ),
        migrations.RunSQL(LZ4, DEFAULT_COMPRESSION),
    ]
