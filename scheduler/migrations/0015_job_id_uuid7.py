# New jobs get time-ordered ids (scheduler.ids.new_job_id, RFC 9562 version 7) instead of random
# ones (issue 13): the default only; existing ids stay. No change to the database.

import scheduler.ids
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0014_outbox_packed_events"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="id",
            field=models.UUIDField(default=scheduler.ids.new_job_id, editable=False, primary_key=True, serialize=False),
        ),
    ]
