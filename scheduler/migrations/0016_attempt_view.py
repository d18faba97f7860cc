# A successful attempt is no longer written as a stint_job_attempt row (issue 13): the job row is
# its record. `complete` (scheduler.lifecycle) keeps lease_owner and lease_token on a SUCCESS job
# (the worker and the lease its successful attempt ran under) next to result_attempt, started_at
# and finished_at. The row cost a drain about 10 us of PostgreSQL's time a job (a heap tuple, two
# index entries and their WAL) of about 75. The view stint_attempt (model scheduler.Attempt) is
# every attempt a worker ended, whichever way it is kept: the rows of stint_job_attempt, and the
# successful attempt of each SUCCESS job that has no row for it (jobs finished before this
# migration keep theirs). Its `id` is the row's id as text, or the job's id for an attempt kept in
# the job row. Going back writes the rows the view makes up and clears those jobs' leases.
# A later migration that changes the type of a column the view reads (of stint_job_attempt, or
# stint_job's id, status, result_*, lease_owner, lease_token, started_at, finished_at) must drop
# the view first and create it again after: PostgreSQL refuses to alter a column a view uses.

from django.db import migrations, models

VIEW = """
CREATE VIEW stint_attempt AS
SELECT a.id::text AS id, a.job_id, a.attempt_number, a.status, a.worker, a.lease_token, a.started_at,
       a.finished_at, a.error, a.traceback
FROM stint_job_attempt a
UNION ALL
SELECT j.id::text, j.id, j.result_attempt, j.result_status, coalesce(j.lease_owner, ''), j.lease_token,
       j.started_at, j.finished_at, '', ''
FROM stint_job j
WHERE j.status = 'SUCCESS' AND j.result_status = 'SUCCEEDED'
  AND NOT EXISTS (SELECT 1 FROM stint_job_attempt a WHERE a.job_id = j.id AND a.attempt_number = j.result_attempt);
"""

BACKWARD = """
INSERT INTO stint_job_attempt (job_id, attempt_number, status, worker, lease_token, started_at, finished_at,
                               error, traceback)
SELECT job_id, attempt_number, status, worker, lease_token, coalesce(started_at, finished_at), finished_at, error,
       traceback
FROM stint_attempt WHERE id !~ '^[0-9]+$';
UPDATE stint_job SET lease_owner = NULL, lease_token = NULL WHERE status = 'SUCCESS' AND lease_token IS NOT NULL;
DROP VIEW stint_attempt;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0015_job_id_uuid7"),
    ]

    operations = [
        migrations.RunSQL(VIEW, BACKWARD),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                ("id", models.TextField(primary_key=True, serialize=False)),
                ("attempt_number", models.PositiveIntegerField()),
                ("status", models.CharField(max_length=10)),
                ("worker", models.CharField(max_length=100)),
                ("lease_token", models.UUIDField(null=True)),
                ("started_at", models.DateTimeField(null=True)),
                ("finished_at", models.DateTimeField(null=True)),
                ("error", models.TextField()),
                ("traceback", models.TextField()),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=models.DO_NOTHING,
                        related_name="attempts_made",
                        to="scheduler.job",
                    ),
                ),
            ],
            options={
                "db_table": "stint_attempt",
                "ordering": ["job", "attempt_number"],
                "managed": False,
            },
        ),
    ]
