# Jobs held back by a flow limit leave the claim index's part that ordinary claims read (README,
# Flow limits): ``flow_held`` marks them, and the claim index keys on it first, so a claim of
# other jobs no longer walks past a held-back backlog (bench/held_backlog.py). The column is added
# with a constant default (no table rewrite). The index is built concurrently under a new name,
# then the old one dropped concurrently and the new one renamed, so that jobs keep flowing on a
# large table; between the two, claims use either.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler", "0018_leader_fence_handover"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="flow_held",
            field=models.BooleanField(db_default=False, default=False),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "QUEUED")),
                fields=["flow_held", "-priority", "scheduled_at", "created_at"],
                name="job_claim_scan_held",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="job_claim_scan_desc"),
        migrations.RenameIndex(model_name="job", new_name="job_claim_scan_desc", old_name="job_claim_scan_held"),
    ]
