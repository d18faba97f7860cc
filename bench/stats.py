"""Pure arithmetic and text of `make bench`: percentiles, repetition summaries, /proc parsing, lag, tables.

Nothing here touches a process, a file or a clock: the harness reads, this module computes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the nearest-rank ``q``-quantile (0 < q <= 1) of ``values``, or None when empty.

    Nearest rank (the smallest value with at least q of the values at or below it), so a p99 of
    200 samples is the 198th smallest: an observed value, never an interpolation.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """The repetitions of one figure: median, min and max of the values that were measured."""

    median: float | None
    low: float | None
    high: float | None
    n: int  # repetitions with a value

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON shape: median, min, max, n."""
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def summarize(values: Iterable[float | None]) -> Summary:
    """Summarize repetitions, skipping None (a repetition where the figure could not be measured)."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return Summary(median=None, low=None, high=None, n=0)
    return Summary(median=statistics.median(present), low=min(present), high=max(present), n=len(present))


# ---------------------------------------------------------------------------------------------
# /proc parsing (Linux proc(5)).


def machine_ticks(proc_stat: str) -> tuple[int, int]:
    """Return (busy, total) clock ticks of all CPUs from the text of /proc/stat.

    Busy is everything but idle and iowait (proc(5): the ``cpu`` line's 4th and 5th fields);
    guest time is already inside user time, so it is not added again.
    """
    for line in proc_stat.splitlines():
        if line.startswith("cpu "):
            fields = [int(x) for x in line.split()[1:]]
            total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
            return total - idle, total
    raise ValueError("no aggregate cpu line in /proc/stat")


def busy_percent(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Return the machine's busy share in percent between two ``machine_ticks`` readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return round(100.0 * busy / total, 1) if total > 0 else None


def pid_stat(text: str) -> tuple[int, int]:
    """Return (ppid, utime + stime ticks) from the text of /proc/<pid>/stat.

    The command name (2nd field) may hold spaces and parentheses, so fields are counted after
    the last ``)``: state is the 1st there, ppid the 2nd, utime the 12th and stime the 13th.
    """
    rest = text.rpartition(")")[2].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """Return ``roots`` and every process below them, given a pid -> ppid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [r for r in roots if r in parents]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def cpu_percent(before: Mapping[int, int], after: Mapping[int, int], seconds: float, hz: int) -> float | None:
    """Return CPU use in percent of one core of the processes in ``after`` over ``seconds``.

    ``before``/``after`` map pid -> utime+stime ticks; a pid born in between counts from 0.
    """
    if seconds <= 0:
        return None
    ticks = sum(max(0, t - before.get(pid, 0)) for pid, t in after.items())
    return round(100.0 * ticks / hz / seconds, 1)


# ---------------------------------------------------------------------------------------------
# Records of the probe (bench/probe.py).


def parse_starts(text: str) -> list[tuple[int, float]]:
    """Parse a handler start file: lines ``"<seq> <time>"``; a torn last line is skipped."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                rows.append((int(parts[0]), float(parts[1])))
            except ValueError:
                continue
    return rows


def parse_produced(text: str) -> dict[int, float]:
    """Parse a producer file: lines ``"<seq> <commit> <call start> <call end>"``; return seq -> commit time."""
    produced = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4:
            produced[int(parts[0])] = float(parts[1])
    return produced


@dataclass(frozen=True, slots=True, kw_only=True)
class LagFigures:
    """Pickup lag of one run at an offered rate."""

    offered: float  # jobs/s
    achieved: float | None  # jobs/s the producer committed over the measured window
    measured: int  # jobs in the measured window
    started: int  # of those, jobs whose handler started
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    verdict: str  # "ok", "producer" (fell short of the offered rate), "backlog", "saturated"

    def as_dict(self) -> dict[str, Any]:
        """JSON shape."""
        return {
            "offered_jobs_per_s": self.offered,
            "achieved_jobs_per_s": self.achieved,
            "measured_jobs": self.measured,
            "started_jobs": self.started,
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
            "verdict": self.verdict,
        }


PRODUCER_SHORTFALL = 0.95  # below this share of the offered rate the producer "did not reach" it
BACKLOG_MS = 1000.0  # a p99 above this (1 s) at a reachable rate means jobs queue up: "backlog"


def lag_figures(
    produced: Mapping[int, float], starts: Mapping[int, float], *, offered: float, warmup_seconds: float
) -> LagFigures:
    """Compute pickup lag (handler start - commit) of the jobs committed after the first ``warmup_seconds``.

    Verdicts: "saturated" when some measured job never started, "backlog" when the p99 exceeds
    BACKLOG_MS (jobs wait behind each other: the system does not keep up), "producer" when the
    producer committed less than PRODUCER_SHORTFALL of the offered rate (or nothing after the
    warm-up), else "ok".
    """
    first = min(produced.values(), default=0.0)
    window = {seq: t for seq, t in produced.items() if t >= first + warmup_seconds}
    lags = [(starts[seq] - t) * 1000.0 for seq, t in window.items() if seq in starts]
    achieved = None
    if len(window) > 1:
        span = max(window.values()) - min(window.values())
        achieved = round((len(window) - 1) / span, 1) if span > 0 else None
    p99 = percentile(lags, 0.99)
    if not window:
        verdict = "producer"
    elif len(lags) < len(window):
        verdict = "saturated"
    elif p99 is not None and p99 > BACKLOG_MS:
        verdict = "backlog"
    elif achieved is not None and achieved < PRODUCER_SHORTFALL * offered:
        verdict = "producer"
    else:
        verdict = "ok"

    def r(v: float | None) -> float | None:
        return round(v, 2) if v is not None else None

    return LagFigures(
        offered=offered,
        achieved=achieved,
        measured=len(window),
        started=len(lags),
        p50_ms=r(percentile(lags, 0.50)),
        p95_ms=r(percentile(lags, 0.95)),
        p99_ms=r(p99),
        max_ms=r(max(lags) if lags else None),
        verdict=verdict,
    )


def drain_rate(starts_by_pid: Mapping[int, Sequence[float]], *, jobs: int, end: float) -> tuple[float | None, float]:
    """Return (jobs/s, window start) of a drain of ``jobs`` pre-enqueued jobs that was done at ``end``.

    The window opens when the last worker process started its first job (every process is up:
    start-up time is not throughput) and closes at ``end`` (when the system's own record said every
    job was finished); jobs started before the window opened are not counted.
    """
    firsts = [min(ts) for ts in starts_by_pid.values() if ts]
    if not firsts:
        return None, end
    opened = max(firsts)
    before = sum(1 for ts in starts_by_pid.values() for t in ts if t < opened)
    span = end - opened
    return (round((jobs - before) / span, 1) if span > 0 else None), opened


# ---------------------------------------------------------------------------------------------
# Text.


def number(value: float | None, digits: int = 0) -> str:
    """Format with thousands separators and ``digits`` decimals; None as an en dash."""
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def cell(summary: Summary, *, digits: int = 0, unit: str = "") -> str:
    """Render ``median (min–max)`` (or the median alone for one repetition; "–" when not measured)."""
    if summary.median is None:
        return "–"
    text = number(summary.median, digits) + unit
    if summary.n > 1 and summary.low != summary.high:
        text += f" ({number(summary.low, digits)}–{number(summary.high, digits)})"
    return text


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return a GitHub-flavoured Markdown table; pipes inside cells are escaped."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])
