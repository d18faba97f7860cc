"""Load for a scenario: jobs offered through the REST API (POST /api/jobs) and ``scheduler.enqueue_many``, paced.

Every job whose creation returned 2xx (API) or returned normally (enqueue) is recorded in
``created``: those are the jobs invariant I1 holds the system to. A request that failed or
timed out is counted, not recorded (its job may or may not exist; both are allowed). A third of
the API jobs with an ``Idempotency-Key`` are sent twice: the replay must answer with the same job.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter
from typing import Any

import requests

from chaos.plan import JOB_TYPE, JobSpec

logger = logging.getLogger(__name__)

ENQUEUE_TICK = 0.1  # seconds between enqueue_many batches
API_TIMEOUT = 10.0  # seconds
API_THREADS = 2


class Load:
    """Offers ``jobs`` evenly over ``seconds`` from ``start()``; ``stats`` and ``created`` are read after ``join()``."""

    def __init__(self, *, jobs: list[JobSpec], seconds: float, web_url: str, token: str, owner_id: int) -> None:
        self.seconds = seconds
        self.web_url = web_url
        self.token = token
        self.owner_id = owner_id
        self.api_jobs = [j for j in jobs if j.via == "api"]
        self.enqueue_jobs = [j for j in jobs if j.via != "api"]
        self.created: set[str] = set()
        self.stats: Counter[str] = Counter()
        self.anomalies: list[str] = []
        self.lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    @property
    def offered(self) -> int:
        """Jobs offered so far (API requests sent + jobs handed to enqueue)."""
        with self.lock:
            return self.stats["offered"]

    def start(self) -> None:
        """Start the enqueue thread and the API threads."""
        self.t0 = time.monotonic()
        self._threads = [threading.Thread(target=self._enqueue_loop, name="chaos-enqueue", daemon=True)]
        for k in range(API_THREADS):
            share = self.api_jobs[k::API_THREADS]
            self._threads.append(
                threading.Thread(target=self._api_loop, args=(share,), name=f"chaos-api-{k}", daemon=True)
            )
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float = 120.0) -> None:
        """Wait for every thread (each stops once its jobs are offered)."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.stats[key] += n

    @staticmethod
    def _scheduled_at(spec: JobSpec) -> dt.datetime | None:
        if not spec.delay_seconds:
            return None
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=spec.delay_seconds)

    def _enqueue_loop(self) -> None:
        from django.db import connection

        from scheduler.enqueuing import enqueue_many

        jobs = self.enqueue_jobs
        if not jobs:
            return
        ticks = max(1, int(self.seconds / ENQUEUE_TICK))
        per_tick = len(jobs) / ticks
        sent = 0
        for tick in range(ticks):
            target = self.t0 + tick * ENQUEUE_TICK
            while (now := time.monotonic()) < target:
                time.sleep(min(target - now, 0.01))
            upto = len(jobs) if tick == ticks - 1 else round((tick + 1) * per_tick)
            batch, sent = jobs[sent:upto], upto
            if not batch:
                continue
            items = [
                {
                    "type": JOB_TYPE,
                    "payload": spec.payload,
                    "priority": spec.priority,
                    "max_retries": spec.max_retries,
                    "scheduled_at": self._scheduled_at(spec),
                    "name": "chaos",
                }
                for spec in batch
            ]
            self._count("offered", len(items))
            try:
                ids = enqueue_many(items, owner=self.owner_id)
            except Exception as exc:  # noqa: BLE001 - a failed enqueue is an outcome to count, not a crash
                self._count(f"enqueue_error:{type(exc).__name__}", len(items))
                connection.close()
                continue
            with self.lock:
                self.created.update(str(i) for i in ids)
                self.stats["created"] += len(ids)
        connection.close()

    def _api_loop(self, jobs: list[JobSpec]) -> None:
        if not jobs:
            return
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.token}"
        interval = self.seconds / len(jobs)
        for n, spec in enumerate(jobs):
            target = self.t0 + n * interval
            while (now := time.monotonic()) < target:
                time.sleep(min(target - now, 0.01))
            body: dict[str, Any] = {
                "name": "chaos",
                "type": JOB_TYPE,
                "payload": spec.payload,
                "priority": spec.priority,
                "max_retries": spec.max_retries,
            }
            at = self._scheduled_at(spec)
            if at is not None:
                body["scheduled_at"] = at.isoformat()
            headers = {"Idempotency-Key": spec.idempotency_key} if spec.idempotency_key else {}
            self._count("offered")
            job_id = self._post(session, body, headers)
            if job_id and spec.idempotency_key and n % 3 == 0:
                replay = self._post(session, body, headers, replay=True)
                if replay and replay != job_id:
                    with self.lock:
                        self.anomalies.append(
                            f"Idempotency-Key {spec.idempotency_key}: replay gave {replay}, not {job_id}"
                        )
        session.close()

    def _post(self, session: requests.Session, body: dict, headers: dict, *, replay: bool = False) -> str | None:
        try:
            response = session.post(f"{self.web_url}/api/jobs", json=body, headers=headers, timeout=API_TIMEOUT)
        except requests.RequestException as exc:
            self._count(f"api_error:{type(exc).__name__}")
            return None
        self._count(f"api_{response.status_code}{'_replay' if replay else ''}")
        if response.status_code not in (200, 201):
            return None
        try:
            job_id = str(response.json()["id"])
        except (ValueError, KeyError, TypeError):
            with self.lock:
                self.anomalies.append(f"2xx without a job id: {response.text[:200]}")
            return None
        if not replay:
            with self.lock:
                self.created.add(job_id)
                self.stats["created"] += 1
        return job_id
