# The audit trail's event payloads are left out of ANALYZE, as the job documents are
# (scheduler migration 0022 says why): the audit consumer inserts about five rows per job, so
# autoanalyze samples this table often, and no plan reads the payload's statistics.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_quarantine")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE stint_audit_event ALTER COLUMN payload SET STATISTICS 0",
            "ALTER TABLE stint_audit_event ALTER COLUMN payload SET STATISTICS -1",
        )
    ]
