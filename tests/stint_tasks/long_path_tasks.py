"""A task module the backend refuses: its one task's import path (102 characters) is longer than a job type holds.

Importing it raises ``InvalidTask``; the system check test lists it in ``OPTIONS['modules']``.
"""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def a_task_whose_import_path_is_longer_than_the_job_type_column_can_hold() -> None:
    return None
