"""The Markdown report of `make bench` from a results document (no processes, no servers)."""

from __future__ import annotations

from bench import side_by_side


def _s(*values: float) -> dict:
    ordered = sorted(values)
    return {"median": ordered[len(ordered) // 2], "min": ordered[0], "max": ordered[-1], "n": len(values)}


def _document(lag200: dict, stint_relay: dict | None = None) -> dict:
    summary = {
        "drain": {"pgqueuer": {"drain_jobs_per_s": _s(6600, 6700, 6500), "wal_bytes_per_job": _s(1738)}},
        "lag200": {"pgqueuer": lag200},
    }
    scenarios = {"drain": {}, "lag200": {}}
    if stint_relay is not None:
        summary["relay"] = {"stint": stint_relay}
        scenarios["relay"] = {}
    return {
        "command": "make bench",
        "stamp": "20261201-000000",
        "machine": {"cpus": 2, "memory_gb": 23.5, "platform": "Linux"},
        "postgres": "PostgreSQL 15",
        "processes": 2,
        "repetitions": 3,
        "systems": [{"key": "pgqueuer", "label": "PgQueuer", "settings": "batch 10"}],
        "scenarios": scenarios,
        "summary": summary,
        "errors": [],
    }


def test_rows_show_median_and_range_and_lag_percentiles():
    lag = {
        "p50_ms": _s(1.1, 1.0, 1.2),
        "p95_ms": _s(1.8),
        "p99_ms": _s(2.0, 1.9, 2.3),
        "achieved_jobs_per_s": _s(200),
        "verdicts": ["ok", "ok", "ok"],
    }
    text = side_by_side.render(_document(lag))
    row = next(line for line in text.splitlines() if line.startswith("| PgQueuer"))
    assert "6,600 (6,500–6,700)" in row
    assert "1.1 / 1.8 / 2.0 ms (p99 1.9–2.3)" in row
    assert "- PgQueuer: batch 10" in text


def test_a_lag_cell_says_when_the_system_or_the_producer_did_not_keep_up():
    base = {"p50_ms": _s(450), "p95_ms": _s(900), "p99_ms": _s(2500), "achieved_jobs_per_s": _s(200)}
    assert "saturated (1/3)" in side_by_side.render(_document({**base, "verdicts": ["ok", "saturated", "ok"]}))
    assert "backlog: p99 2.5 s (3/3)" in side_by_side.render(_document({**base, "verdicts": ["backlog"] * 3}))
    short = {**base, "p99_ms": _s(9.0), "achieved_jobs_per_s": _s(180), "verdicts": ["producer"]}
    assert "producer short of the rate in 1/1 (lowest 180/s)" in side_by_side.render(_document(short))


def test_stint_only_figures_get_their_own_table():
    relay = {"drain_jobs_per_s": _s(4700), "audit_behind_s": _s(12.5)}
    text = side_by_side.render(_document({"verdicts": []}, stint_relay=relay))
    assert "Stint only:" in text
    assert any("audit trail behind at drain end" in line and "12.50 s" in line for line in text.splitlines())


def test_each_repetition_rotates_the_order_of_the_systems() -> None:
    systems = ["pgqueuer", "celery", "stint"]

    orders = [side_by_side.rotation(systems, rep) for rep in (1, 2, 3, 4)]

    assert orders == [
        ["pgqueuer", "celery", "stint"],
        ["celery", "stint", "pgqueuer"],
        ["stint", "pgqueuer", "celery"],
        ["pgqueuer", "celery", "stint"],
    ]
    assert side_by_side.rotation([], 2) == []
