"""Run Django's own ``tests/tasks`` modules (from the Django sdist) against the Stint backend and a real worker.

Usage (``make tasks-conformance`` downloads the sdist and runs this inside the dev stack)::

    python -m conformance.run --tests-dir .conformance/django-6.0.10/tests

Nothing of Django's test code is copied: the modules are imported from the unpacked sdist. Every
``TASKS`` setting their test classes and methods override (class decorators, method decorators)
is retargeted before they run: Django's dummy backend becomes ``conformance.backends.ResultsBackend``
and its immediate backend ``WaitingBackend``, both the Stint backend. Around the immediate
backend's test classes a ``run_workers`` process against the test database runs the tasks;
under the dummy backend's, nothing runs (its contract). Prints Django's test report, then one JSON line of counts
per module; exits 0 (the counts, not the exit status, are the result: failures are explained in
the README).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["tasks.test_tasks", "tasks.test_dummy_backend", "tasks.test_immediate_backend"]
REPLACE = {
    "django.tasks.backends.dummy.DummyBackend": "conformance.backends.ResultsBackend",
    "django.tasks.backends.immediate.ImmediateBackend": "conformance.backends.WaitingBackend",
}
READY_WAIT = 60.0  # seconds for the worker to register


def _retarget_tasks(value: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    return {
        alias: {**params, "BACKEND": REPLACE.get(params.get("BACKEND"), params.get("BACKEND")), "OPTIONS": options}
        if params.get("BACKEND") in REPLACE
        else params
        for alias, params in value.items()
    }


def retarget(module: Any, options: dict[str, Any]) -> int:
    """Point every ``TASKS`` override of ``module``'s test classes and methods at Stint; return how many."""
    from django.test import SimpleTestCase, override_settings

    count = 0
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, SimpleTestCase)):
            continue
        cls.databases = {"default"}  # enqueue writes jobs (Django's in-memory backends needed no database)
        overridden = getattr(cls, "_overridden_settings", None) or {}
        if "TASKS" in overridden:
            overridden["TASKS"] = _retarget_tasks(overridden["TASKS"], options)
            count += 1
        for attr in vars(cls).values():
            for cell in getattr(attr, "__closure__", None) or ():
                contents = cell.cell_contents
                if isinstance(contents, override_settings) and "TASKS" in contents.options:
                    contents.options["TASKS"] = _retarget_tasks(contents.options["TASKS"], options)
                    count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    """Import, retarget and run the modules; print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests-dir", required=True, type=Path, help="the sdist's tests/ directory")
    args = parser.parse_args(argv)
    tests_dir = args.tests_dir.resolve()
    sys.path[:0] = [str(tests_dir), str(ROOT)]
    os.environ["DJANGO_SETTINGS_MODULE"] = "conformance.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.test.runner import DiscoverRunner

    modules = {name: importlib.import_module(name) for name in MODULES}
    for module in modules.values():
        retarget(module, settings.CONFORMANCE_OPTIONS)
    outcome: dict[str, Any] = {}

    worker = Worker(tests_dir)
    for cls in vars(modules["tasks.test_immediate_backend"]).values():
        if isinstance(cls, type) and cls.__module__ == "tasks.test_immediate_backend":
            worker.around(cls)

    class Runner(DiscoverRunner):
        def run_suite(self, suite: Any, **kwargs: Any) -> Any:
            outcome["ids"] = [test.id() for test in _flatten(suite)]
            outcome["result"] = result = super().run_suite(suite, **kwargs)
            return result

    Runner(verbosity=2, interactive=False).run_tests(MODULES)
    result = outcome["result"]
    bad = {t.id() for t, _ in result.failures} | {t.id() for t, _ in result.errors}
    for name in MODULES:
        ran = [i for i in outcome["ids"] if i.startswith(name + ".")]
        failing = sorted(i.removeprefix(name + ".") for i in bad if i.startswith(name + "."))
        print(json.dumps({"module": name, "ran": len(ran), "passed": len(ran) - len(failing), "failing": failing}))
    totals = {"ran": result.testsRun, "failures": len(result.failures), "errors": len(result.errors)}
    print(json.dumps({**totals, "skipped": len(result.skipped), "passed": result.testsRun - len(bad)}))
    return 0


class Worker:
    """A ``run_workers`` process against the test database, around the immediate backend's test classes."""

    def __init__(self, tests_dir: Path) -> None:
        self.tests_dir = tests_dir
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from django.db import connection

        from conformance import backends
        from scheduler.models import WorkerNode
        from tests.support.subprocess_env import database_url

        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(self.tests_dir)]),
            "STINT_POLL_SECONDS": "0.2",
            "LOG_LEVEL": "WARNING",
        }
        self.popen = subprocess.Popen(
            [sys.executable, "manage.py", "run_workers", "--concurrency=4", "--grace-seconds=2"],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + READY_WAIT
        while not WorkerNode.objects.filter(pid=self.popen.pid, stopped_at__isnull=True).exists():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the worker did not start")
            time.sleep(0.1)
        connection.close()
        backends.worker_running = True

    def stop(self) -> None:
        from conformance import backends

        backends.worker_running = False
        if self.popen is None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            from core.process_sessions import signal_session

            signal_session(self.popen.pid, signal.SIGKILL)  # the session of the process we started
            self.popen.wait()
        self.popen = None

    def around(self, cls: type) -> None:
        """Start the worker before ``cls``'s tests and stop it after them."""
        set_up, tear_down = cls.setUpClass.__func__, cls.tearDownClass.__func__  # type: ignore[attr-defined]
        worker = self

        def setUpClass(klass: type) -> None:  # noqa: N802 - unittest's name
            worker.start()
            set_up(klass)

        def tearDownClass(klass: type) -> None:  # noqa: N802
            try:
                tear_down(klass)
            finally:
                worker.stop()

        cls.setUpClass = classmethod(setUpClass)  # type: ignore[assignment]
        cls.tearDownClass = classmethod(tearDownClass)  # type: ignore[assignment]


def _flatten(suite: Any) -> list[Any]:
    tests = []
    for item in suite:
        tests.extend(_flatten(item) if hasattr(item, "__iter__") else [item])
    return tests


if __name__ == "__main__":
    raise SystemExit(main())
