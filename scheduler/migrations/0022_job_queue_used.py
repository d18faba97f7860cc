# A flow limit's or a pause's name is "in use" when a job of any status names it (README, Flow
# control; selectors.flow_names_in_use): one index probe per name, on a table of millions of jobs.
# Partial: jobs of the default queue (always in use) write no entry. Built concurrently: jobs keep
# flowing on a large table.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler", "0021_admin_log_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("queue", "default"), _negated=True),
                fields=["queue"],
                name="job_queue_used",
            ),
        ),
    ]
