"""The Stint backend with the inspection hooks Django's tests use on its reference backends.

Django's ``tests/tasks`` drive two in-memory backends: the dummy one (``results``, ``clear()``) and
the immediate one (the task has run by the time ``enqueue`` returns). These subclasses give the
Stint backend those two shapes over Stint's real tables and real worker processes, so the same
test bodies can run unchanged. Conformance only: nothing in the product uses them.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connection, connections

from scheduler.models import Job
from stint_tasks.backend import StintBackend

FINISH_WAIT = 60.0  # seconds a worker gets to finish one enqueued task
# Set by the driver while a worker runs (around the immediate backend's test classes only: under
# the dummy backend's tests nothing may run, as with Django's dummy backend).
worker_running = False


def _off_the_event_loop(func: Any) -> Any:
    """Run ``func()`` here, or in a thread when called from inside an event loop (Django's async tests do)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return func()  # same connection, so the caller's uncommitted transaction is visible

    def call() -> Any:
        try:
            return func()
        finally:
            connections.close_all()  # this thread ends here: its connections must not outlive it

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


class ResultsBackend(StintBackend):
    """The dummy backend's view: ``results`` lists every task job's ``TaskResult``; ``clear()`` deletes them."""

    @property
    def results(self) -> list[Any]:
        """Every task job as a ``TaskResult``, oldest first."""

        def read() -> list[Any]:
            ids = Job.objects.filter(type__contains=".").order_by("created_at").values_list("id", flat=True)
            return [self.get_result(str(i)) for i in ids]

        return _off_the_event_loop(read)

    def clear(self) -> None:
        """Delete every job."""
        _off_the_event_loop(lambda: Job.objects.all().delete())


class WaitingBackend(ResultsBackend):
    """The immediate backend's contract on a real worker: ``enqueue`` returns once the worker finished the task.

    Inside a transaction the job cannot be seen by a worker before the commit, so the result is
    returned as enqueued (READY).
    """

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Enqueue, then poll the result until it is finished (``FINISH_WAIT`` s at most)."""
        result = super().enqueue(task, args, kwargs)
        if connection.in_atomic_block or not worker_running:
            return result
        deadline = time.monotonic() + FINISH_WAIT
        while not result.is_finished and time.monotonic() < deadline:
            time.sleep(0.02)
            result.refresh()
        return result
