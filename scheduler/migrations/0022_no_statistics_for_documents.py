# ANALYZE (autoanalyze, after 10% of a table's rows changed) samples 30,000 rows and, for each
# column, sorts the sample's distinct values to build its statistics. For a jsonb document that is
# tens of thousands of jsonb comparisons: in a drain of 40,000 jobs the autoanalyze of stint_job
# took about 15% of PostgreSQL's CPU samples, most of it comparing payloads (every payload is
# distinct). No plan reads these statistics: no query filters, joins or sorts on these columns
# through an index, and the one filter on a document (the console's payload search,
# ``payload @> ...``) runs on rows another index already chose. So the documents are left out of
# ANALYZE (statistics target 0); the columns the planner needs (status, queue, type, priority,
# the times, owner) keep theirs. ALTER COLUMN ... SET STATISTICS takes a SHARE UPDATE EXCLUSIVE
# lock: reads and writes go on while it runs.

from django.db import migrations

# (table, column) left out of ANALYZE
DOCUMENTS = [
    ("stint_job", "payload"),
    ("stint_job", "result"),
    ("stint_job", "progress"),
    ("stint_job", "trace_context"),
    ("stint_outbox", "events"),
    ("stint_outbox", "packed_events"),
]


def _statistics(target: int) -> list[str]:
    tables: dict[str, list[str]] = {}
    for table, column in DOCUMENTS:
        tables.setdefault(table, []).append(column)
    return [
        f"ALTER TABLE {table} " + ", ".join(f"ALTER COLUMN {column} SET STATISTICS {target}" for column in columns)
        for table, columns in tables.items()
    ]


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0021_admin_log_indexes")]

    operations = [migrations.RunSQL(_statistics(0), _statistics(-1))]
