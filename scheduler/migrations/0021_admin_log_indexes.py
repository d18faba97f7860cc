# The operator action history is django.contrib.admin's LogEntry (scheduler.action_log): a bulk
# cancel writes one entry per job, so the table reaches millions of rows. Django indexes only its
# foreign keys: an object's History page (content_type_id = %s AND object_id = %s) then read every
# entry of that model, and the admin index's "Recent actions" (user_id = %s ORDER BY action_time
# DESC LIMIT 10) every entry of that user. Built concurrently: the table may already be large.

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler", "0020_job_held_by_limit"),
        ("admin", "0003_logentry_add_action_flag_choices"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS stint_admin_log_object"
            " ON django_admin_log (content_type_id, object_id)",
            "DROP INDEX CONCURRENTLY IF EXISTS stint_admin_log_object",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS stint_admin_log_user_recent"
            " ON django_admin_log (user_id, action_time DESC)",
            "DROP INDEX CONCURRENTLY IF EXISTS stint_admin_log_user_recent",
        ),
    ]
