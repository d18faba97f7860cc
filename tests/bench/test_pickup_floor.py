"""bench/pickup_floor.py on the real servers: every path takes each job exactly once (no timing asserted)."""

from __future__ import annotations

import os

import psycopg
import pytest

from bench import pickup_floor
from tests.support.subprocess_env import database_url

RATE = 100.0  # jobs/s
SECONDS = 1.5


@pytest.fixture
def floor_url(transactional_db):
    """The test database's URL; the floor table is dropped afterwards."""
    url = database_url()
    yield url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS floor_job")


@pytest.mark.parametrize("path", pickup_floor.PATHS)
def test_each_job_is_taken_once_and_its_lag_measured_after_the_warm_up(floor_url, path):
    result = pickup_floor.measure(path, RATE, SECONDS, floor_url, os.environ["REDIS_URL"])

    assert result["produced"] == result["taken"] == int(RATE * SECONDS)
    # The first second is the warm-up: only the jobs committed after it are measured, all of them taken.
    assert result["measured_jobs"] == result["started_jobs"] < result["produced"]
    assert result["p50_ms"] <= result["p95_ms"] <= result["p99_ms"] <= result["max_ms"]
    if path.startswith("claim"):
        with psycopg.connect(floor_url) as conn:
            leased, leases = conn.execute(
                "SELECT count(*) FILTER (WHERE state = 'running'), count(DISTINCT lease) FROM floor_job"
            ).fetchone()
        assert leased == leases == result["produced"]  # every job leased, each by one claim


def test_an_unknown_path_is_refused(capsys):
    with pytest.raises(SystemExit):
        pickup_floor.main(["--paths", "redis,kafka", "--reps", "1"])
    assert "unknown paths: kafka" in capsys.readouterr().err
