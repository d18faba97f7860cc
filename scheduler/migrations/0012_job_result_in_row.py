# A job's result moves into the job row (issue 13, "keep small results with the job"): the outcome's
# UPDATE of stint_job, which happens anyway, now sets result_at, result_attempt, result_status and
# result, where a separate stint_job_result row (heap, primary key, ON CONFLICT's HEAP_CONFIRM) cost
# about 240 WAL bytes per job (bench/wal_breakdown.py, a 20,000-job drain). Existing results are
# copied into their jobs' rows, then stint_job_result is dropped (nothing else reads it). With the
# attempt insert below, a drain's WAL fell from 2,231 to 1,975 bytes per job (the job row's update
# grew by about 40 bytes).
#
# Attempt rows are now inserted without ON CONFLICT (scheduler.lifecycle._ATTEMPT_ROW). The only
# rows that statement could meet are those written at claim by releases before the
# attempt-at-outcome change, for jobs still RUNNING at that attempt: they are deleted here (the job
# row describes a running attempt, selectors.job_running_attempt; its outcome or rescue writes the
# row). Those releases cannot claim again after 0010 (their claim writes outbox columns that 0010
# dropped), and the workers of the release before this one write stint_job_result: stop the
# workers and the scheduler before migrating, as for 0010.

from django.db import migrations, models

import scheduler.states

FORWARD = """
UPDATE stint_job j
SET result_at = r.created_at, result_attempt = r.attempt, result_status = r.status, result = r.result
FROM stint_job_result r WHERE r.job_id = j.id;
DELETE FROM stint_job_attempt a USING stint_job j
WHERE a.job_id = j.id AND j.status = 'RUNNING' AND a.attempt_number = j.attempts AND a.status = 'RUNNING';
"""

BACKWARD = """
INSERT INTO stint_job_result (job_id, attempt, status, result, created_at)
SELECT id, result_attempt, result_status, result, result_at FROM stint_job WHERE result_attempt IS NOT NULL;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0011_job_fillfactor"),
    ]

    operations = [
        # The old table's reverse accessor was named ``result``: free the name (no SQL).
        migrations.AlterField(
            model_name="jobresult",
            name="job",
            field=models.OneToOneField(
                on_delete=models.deletion.CASCADE,
                primary_key=True,
                related_name="+",
                serialize=False,
                to="scheduler.job",
            ),
        ),
        # Added in this order (8-byte aligned first) so the row carries little padding.
        migrations.AddField(
            model_name="job",
            name="result_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="result_attempt",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="result_status",
            field=models.CharField(
                blank=True, choices=scheduler.states.AttemptStatus.choices, max_length=10, null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="result",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunSQL(FORWARD, reverse_sql=BACKWARD),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(result_attempt__isnull=False, result_status__isnull=False, result_at__isnull=False)
                | models.Q(
                    result_attempt__isnull=True, result_status__isnull=True, result_at__isnull=True, result__isnull=True
                ),
                name="job_result_whole",
            ),
        ),
        migrations.DeleteModel(name="JobResult"),
    ]
