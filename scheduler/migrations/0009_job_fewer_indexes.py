# Drops the single-column indexes of Job.owner and Job.schedule: every job row version writes an
# entry in each index, and job_owner_recent / job_unique_schedule_fire already serve those lookups.
# Only the indexes go: the foreign-key constraints stay as they are (no re-validation scan).

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0008_flow_control"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="jobs",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="schedule",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="jobs",
                        to="scheduler.cronschedule",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS stint_job_owner_id_2c73a784",
                    reverse_sql="CREATE INDEX IF NOT EXISTS stint_job_owner_id_2c73a784 ON stint_job (owner_id)",
                ),
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS stint_job_schedule_id_9934ea4b",
                    reverse_sql="CREATE INDEX IF NOT EXISTS stint_job_schedule_id_9934ea4b ON stint_job (schedule_id)",
                ),
            ],
        ),
    ]
