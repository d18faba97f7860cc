# The limited phase of a flow-limited claim reads each limit's held jobs on their own (README, Flow
# limits; scheduler.flow.claim), so that one full limit's held backlog no longer hides the held jobs
# of another limit with room behind it. Two partial indexes over held QUEUED jobs only (by type, by
# queue, each in claim order): no entry for any job that is not held, so enqueues and claims of
# other jobs write nothing more. Built concurrently: jobs keep flowing on a large table.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler", "0019_job_flow_held"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("flow_held", True), ("status", "QUEUED")),
                fields=["type", "-priority", "scheduled_at", "created_at"],
                name="job_held_by_type",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("flow_held", True), ("status", "QUEUED")),
                fields=["queue", "-priority", "scheduled_at", "created_at"],
                name="job_held_by_queue",
            ),
        ),
    ]
