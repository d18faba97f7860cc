"""What a process loads at start: the imports every worker process pays for, twice per ``run_workers`` process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_worker_process_loads_neither_redis_nor_librdkafka() -> None:
    """Redis and Kafka clients are imported where they are used (rate limits, leader lock, relay, consumer).

    ``django.setup()`` loads the admin, which once imported the rate limiter's redis (8.x pulls in
    redis.asyncio and OpenTelemetry's metrics SDK) and the event trail's confluent_kafka: about
    0.3 s of every process start, paid by ``run_workers`` and by each worker process it spawns,
    which use neither.
    """
    code = (
        "import sys, django; django.setup(); "
        "import scheduler.management.commands.run_workers, scheduler.workers.supervisor; "
        "print(' '.join(sorted(m for m in ('redis', 'confluent_kafka', 'opentelemetry.sdk') if m in sys.modules)))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []
