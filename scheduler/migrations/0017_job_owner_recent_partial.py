# job_owner_recent (owner, created_at desc) leaves out jobs without an owner (issue 13): jobs
# enqueued by code (scheduler.enqueue, enqueue_many, Django's Tasks) have none and are never
# listed by owner, yet each of their row versions (insert, claim, outcome: none of them HOT) wrote an
# entry here. Every query by owner (owner_id = %s, owner_id > %s, owner_id IS NOT NULL) implies the
# predicate, so the partial index serves them all. Built concurrently under a new name, then the old
# one dropped concurrently and the new one renamed, so that jobs keep flowing on a large table.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler", "0016_attempt_view"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["owner", "-created_at"],
                name="job_owner_recent_partial",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="job_owner_recent"),
        migrations.RenameIndex(model_name="job", new_name="job_owner_recent", old_name="job_owner_recent_partial"),
    ]
