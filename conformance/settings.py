"""Settings for the conformance run: the project's, with every task on Stint and Django's test tasks discoverable.

Django's test tasks live in ``tasks/tasks.py`` of its source tree (``tasks.tasks.*``): the driver puts
that tree on ``sys.path`` (and on the worker's ``PYTHONPATH``) and lists the module here.
"""

from __future__ import annotations

from config.settings import *  # noqa: F403

# Django's test tasks never expect a retry (its backends have none): one attempt each.
CONFORMANCE_OPTIONS = {"defaults": {"max_retries": 0}, "modules": ["tasks.tasks"]}
TASKS = {
    "default": {
        "BACKEND": "conformance.backends.ResultsBackend",
        "QUEUES": [],
        "OPTIONS": CONFORMANCE_OPTIONS,
    }
}
USE_TZ = True
