"""Stint as the engine behind Django's Tasks framework (``"BACKEND": "stint_tasks.backend.StintBackend"``).

Each ``@task`` call becomes a Stint job whose type is the task's import path, run by ``run_workers``
like any job (leases, retries, timeouts, rescue, the audit trail, the console, the metrics). Works on
Django 6 (``django.tasks``) and on Django 5.2 through the ``django-tasks`` backport (``compat``).
"""
