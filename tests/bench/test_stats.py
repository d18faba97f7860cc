"""The pure parts of `make bench`: percentiles, summaries, /proc parsing, lag verdicts, drain rate, tables."""

from __future__ import annotations

import pytest

from bench import stats

PROC_STAT = """cpu  100 5 50 800 20 3 2 0 0 0
cpu0 50 2 25 400 10 1 1 0 0 0
intr 12345
"""


def test_percentile_is_nearest_rank():
    values = list(range(1, 201))  # 1..200
    assert stats.percentile(values, 0.99) == 198
    assert stats.percentile(values, 0.50) == 100
    assert stats.percentile([7.0], 0.99) == 7.0
    assert stats.percentile([], 0.5) is None


def test_summarize_skips_unmeasured_repetitions():
    summary = stats.summarize([3.0, None, 1.0, 2.0])
    assert (summary.median, summary.low, summary.high, summary.n) == (2.0, 1.0, 3.0, 3)
    assert stats.summarize([None]).n == 0


def test_machine_ticks_count_busy_without_idle_and_iowait():
    busy, total = stats.machine_ticks(PROC_STAT)
    assert total == 100 + 5 + 50 + 800 + 20 + 3 + 2 + 0
    assert busy == total - 800 - 20


def test_busy_percent_between_two_readings():
    assert stats.busy_percent((100, 1000), (150, 1100)) == 50.0
    assert stats.busy_percent((100, 1000), (100, 1000)) is None


def test_pid_stat_reads_ppid_and_cpu_after_a_command_with_spaces_and_parentheses():
    text = "4242 (celery (worker) x) S 4200 4242 4242 0 -1 4194560 10 0 0 0 70 30 0 0 20 0 3 0 1 2 3"
    assert stats.pid_stat(text) == (4200, 100)


def test_descendants_follow_the_tree_from_the_roots_only():
    parents = {10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert stats.descendants(parents, [10]) == {10, 11, 12}
    assert stats.descendants(parents, [99]) == set()


def test_cpu_percent_counts_new_processes_from_zero():
    before = {1: 100}
    after = {1: 150, 2: 50}  # pid 2 was born in the window
    assert stats.cpu_percent(before, after, seconds=1.0, hz=100) == 100.0


def test_parse_starts_skips_a_torn_line():
    assert stats.parse_starts("1 10.5\n2 10.6\n3") == [(1, 10.5), (2, 10.6)]


def test_parse_produced_maps_seq_to_commit_time():
    assert stats.parse_produced("5 1.000100 0.999 1.0002\n") == {5: 1.0001}


def _run(offered: float, lag: float, n: int = 100, missing: int = 0) -> stats.LagFigures:
    produced = {i: 1000.0 + i / offered for i in range(n)}
    starts = {i: t + lag for i, t in produced.items() if i < n - missing}
    return stats.lag_figures(produced, starts, offered=offered, warmup_seconds=10 / offered)


def test_lag_figures_leave_out_the_warm_up_and_measure_from_the_commit():
    figures = _run(200.0, 0.002)
    assert figures.measured == 90
    assert figures.p50_ms == pytest.approx(2.0)
    assert figures.p99_ms == pytest.approx(2.0)
    assert figures.achieved == pytest.approx(200.0, rel=1e-3)
    assert figures.verdict == "ok"


def test_lag_verdicts():
    assert _run(200.0, 0.002, missing=3).verdict == "saturated"
    assert _run(200.0, 2.5).verdict == "backlog"
    # The producer committed at 180/s when 200/s was offered.
    produced = {i: 1000.0 + i / 180.0 for i in range(100)}
    short = stats.lag_figures(produced, {i: t + 0.001 for i, t in produced.items()}, offered=200.0, warmup_seconds=0)
    assert short.verdict == "producer"
    # A producer so slow that nothing was committed after the warm-up.
    assert stats.lag_figures({0: 1.0}, {0: 1.001}, offered=500.0, warmup_seconds=1.0).verdict == "producer"


def test_drain_rate_opens_when_every_process_has_started():
    starts = {1: [10.0, 10.5, 11.0], 2: [10.5, 11.0]}
    rate, opened = stats.drain_rate(starts, jobs=5, end=12.5)
    assert opened == 10.5
    assert rate == pytest.approx((5 - 1) / 2.0)  # the job started at 10.0 is outside the window
    assert stats.drain_rate({}, jobs=5, end=1.0) == (None, 1.0)


def test_cell_and_table_text():
    assert stats.cell(stats.summarize([5369.0, 5100.0, 5500.0])) == "5,369 (5,100–5,500)"
    assert stats.cell(stats.summarize([1.25]), digits=1, unit=" ms") == "1.2 ms"
    assert stats.cell(stats.summarize([None])) == "–"
    table = stats.markdown_table(["a", "b"], [["1", "x|y"]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]
