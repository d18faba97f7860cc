"""`make bench`: Stint and its peers on one PostgreSQL at CPU parity, interleaved repetitions, one table.

Usage: python bench/side_by_side.py [--quick] [--reps N] [--only stint,pgqueuer] [--scenarios drain,lag200]
                                    [--processes N]
       python bench/side_by_side.py --render .bench/results/<stamp>.json

Starts the benchmark's own PostgreSQL (pg_stat_statements preloaded), Redis and broker under
``.bench/`` (bench/servers.py), installs each peer in its own venv under ``.bench/venvs/``
(pinned versions), installs each system's schema once into a template database, then runs every
scenario (bench/scenarios.py) for every system it applies to: repetition 1 of every scenario and
system, then repetition 2, and so on. Each scenario run gets a fresh copy of the template
database. Progress is printed as it goes; the results land in ``.bench/results/<stamp>.json``
and ``.md`` (the Markdown tables, also printed at the end). docs/benchmarks.md explains the columns.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness, scenarios, servers, stats, venvs  # noqa: E402 - after the path is set
from bench.peers import systems  # noqa: E402

BENCH_DIR = ROOT / ".bench"


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition: a smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3; 1 with --quick)")
    parser.add_argument("--only", type=_names(systems.by_key()), default=None, help="systems, comma-separated")
    parser.add_argument("--scenarios", type=_names(scenarios.SCENARIOS), default=None, help="scenarios")
    parser.add_argument("--processes", type=int, default=2, help="worker OS processes per system (default 2)")
    parser.add_argument("--render", type=Path, default=None, help="print the Markdown of a results JSON and exit")
    return parser.parse_args(argv)


def _names(known: dict[str, Any]) -> Any:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {', '.join(known)}")
        return names

    return parse


def rotation(chosen: list[Any], rep: int) -> list[Any]:
    """The systems in the order repetition ``rep`` (1-based) runs them: rotated by ``rep - 1``.

    Each system runs right after a different one in each repetition, so none always follows the
    same neighbour (whose leftovers, a warm or a cold cache, would land on it every time).
    """
    if not chosen:
        return []
    shift = (rep - 1) % len(chosen)
    return chosen[shift:] + chosen[:shift]


def _has_processes_flag() -> bool:
    """Whether this checkout's ``run_workers`` is a supervisor with ``--processes``."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "run_workers", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    return "--processes" in result.stdout


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 when every scenario run produced its figures, 1 otherwise."""
    args = _args(argv)
    if args.render is not None:
        print(render(json.loads(args.render.read_text())))
        return 0
    reps = args.reps or (1 if args.quick else 3)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = BENCH_DIR / "results" / stamp
    run_dir.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in systems.SYSTEMS if args.only is None or s.key in args.only]
    wanted = [
        sc
        for name, sc in scenarios.SCENARIOS.items()
        # Named with --scenarios, a scenario runs even when --quick would leave it out.
        if ((name in args.scenarios) if args.scenarios is not None else (sc.quick or not args.quick))
    ]
    bench_servers = servers.start(BENCH_DIR)
    ctx = harness.Ctx(servers=bench_servers, run_dir=run_dir, processes=args.processes, quick=args.quick)
    ctx.say(f"make bench: {len(chosen)} systems, {len(wanted)} scenarios, {reps} repetition(s); logs in {run_dir}")
    ctx.say(bench_servers.postgres.settings_text())
    results: dict[str, dict[str, list[dict[str, Any]]]] = {sc.name: {} for sc in wanted}
    errors: list[str] = []
    try:
        for venv in sorted({s.venv for s in chosen if s.venv}):
            ctx.say(f"venv {venv}: {' '.join(systems.VENV_REQUIREMENTS[venv])}")
            ctx.pythons[venv] = venvs.ensure(
                BENCH_DIR / "venvs" / venv, systems.VENV_REQUIREMENTS[venv], log=ctx.logfile(f"pip-{venv}")
            )
        ctx.stint_processes_flag = _has_processes_flag()
        ctx.say(
            f"run_workers --processes: {'yes (one supervisor)' if ctx.stint_processes_flag else 'no (N processes)'}"
        )
        for system in chosen:
            ctx.say(f"schema: {system.label}")
            scenarios.prepare(ctx, system)
        for rep in range(1, reps + 1):
            for sc in wanted:
                for system in rotation(chosen, rep):
                    if not sc.applies(system):
                        continue
                    ctx.say(f"rep {rep}/{reps} {sc.name}: {system.label} ...")
                    started = time.monotonic()
                    try:
                        figures = sc.run(ctx, system, rep)
                    except Exception as exc:  # one failed run must not lose the others' figures
                        errors.append(f"rep {rep} {sc.name} {system.key}: {exc}")
                        ctx.say(f"  FAILED: {exc}")
                        (run_dir / "logs").mkdir(exist_ok=True)
                        with open(ctx.logfile("errors"), "a") as log:
                            log.write(f"== rep {rep} {sc.name} {system.key}\n{traceback.format_exc()}\n")
                        figures = {"error": str(exc)}
                    finally:
                        try:
                            scenarios.clean_up(ctx, system)
                        except Exception as exc:  # the next run recreates it anyway
                            ctx.say(f"  could not drop {system.key}'s database: {exc}")
                    figures["seconds"] = round(time.monotonic() - started, 1)
                    results[sc.name].setdefault(system.key, []).append(figures)
                    shown = {f.key: figures.get(f.key) for f in sc.figures if figures.get(f.key) is not None}
                    if "verdict" in figures:
                        shown["verdict"] = figures["verdict"]
                    ctx.say(f"  {json.dumps(shown)}")
                    # Every repetition's figures so far, so that an interrupted run still leaves them.
                    (run_dir / "partial.json").write_text(json.dumps(results, default=str) + "\n")
    finally:
        bench_servers.stop()
    document = _document(ctx, args, reps, chosen, wanted, results, errors, stamp)
    markdown = render(document)
    (BENCH_DIR / "results" / f"{stamp}.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    (BENCH_DIR / "results" / f"{stamp}.md").write_text(markdown + "\n")
    print("\n" + markdown)
    print(f"\nresults: {BENCH_DIR / 'results' / stamp}.json and .md")
    return 1 if errors else 0


def _document(
    ctx: harness.Ctx,
    args: argparse.Namespace,
    reps: int,
    chosen: list[systems.System],
    wanted: list[scenarios.Scenario],
    results: dict[str, dict[str, list[dict[str, Any]]]],
    errors: list[str],
    stamp: str,
) -> dict[str, Any]:
    """The results document (written as JSON): context, every repetition's figures, their summaries."""
    summaries: dict[str, dict[str, dict[str, Any]]] = {}
    for sc in wanted:
        for key, runs in results[sc.name].items():
            keys = {k for r in runs for k, v in r.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            summaries.setdefault(sc.name, {})[key] = {
                k: stats.summarize(r.get(k) for r in runs).as_dict() for k in sorted(keys)
            }
            verdicts = [r.get("verdict") for r in runs if r.get("verdict")]
            if verdicts:
                summaries[sc.name][key]["verdicts"] = verdicts
    return {
        "stamp": stamp,
        "command": "make bench" + (f' ARGS="{" ".join(sys.argv[1:])}"' if sys.argv[1:] else ""),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        },
        "postgres": ctx.servers.postgres.settings_text(),
        "processes": ctx.processes,
        "stint_supervisor": ctx.stint_processes_flag,
        "repetitions": reps,
        "quick": ctx.quick,
        "systems": [{"key": s.key, "label": s.label, "settings": s.settings} for s in chosen],
        "scenarios": {
            sc.name: {"title": sc.title, "figures": [f.key for f in sc.figures], "notes": sc.notes} for sc in wanted
        },
        "runs": results,
        "summary": summaries,
        "errors": errors,
    }


def _lag_cell(summary: dict[str, Any] | None) -> str:
    """``p50 / p95 / p99 ms`` (medians; p99's range), or what went wrong in any repetition."""
    if not summary:
        return "–"
    verdicts = summary.get("verdicts", [])
    bad = [v for v in verdicts if v != "ok"]
    med = {k: stats.Summary(**_s(summary.get(k))) for k in ("p50_ms", "p95_ms", "p99_ms", "achieved_jobs_per_s")}
    if any(v == "saturated" for v in bad):
        return f"saturated ({len(bad)}/{len(verdicts)})"
    if any(v == "backlog" for v in bad):
        return f"backlog: p99 {stats.number(med['p99_ms'].median / 1000, 1)} s ({len(bad)}/{len(verdicts)})"
    text = " / ".join(stats.number(med[k].median, 1) for k in ("p50_ms", "p95_ms", "p99_ms")) + " ms"
    if med["p99_ms"].n > 1 and med["p99_ms"].low != med["p99_ms"].high:
        text += f" (p99 {stats.number(med['p99_ms'].low, 1)}–{stats.number(med['p99_ms'].high, 1)})"
    if bad:
        lowest = stats.number(med["achieved_jobs_per_s"].low)
        text += f"; producer short of the rate in {len(bad)}/{len(verdicts)} (lowest {lowest}/s)"
    return text


def _s(d: dict[str, Any] | None) -> dict[str, Any]:
    if not d:
        return {"median": None, "low": None, "high": None, "n": 0}
    return {"median": d["median"], "low": d["min"], "high": d["max"], "n": d["n"]}


def _figure_cell(summary: dict[str, Any] | None, key: str, digits: int = 0, unit: str = "") -> str:
    if not summary or key not in summary:
        return "–"
    return stats.cell(stats.Summary(**_s(summary[key])), digits=digits, unit=unit)


def render(document: dict[str, Any]) -> str:
    """The Markdown report of a results document: the side-by-side table, Stint's figures, settings."""
    summary = document["summary"]
    labels = {s["key"]: s["label"] for s in document["systems"]}

    def get(scenario: str, key: str) -> dict[str, Any] | None:
        return summary.get(scenario, {}).get(key)

    header = [
        "system",
        "drain jobs/s",
        "enqueue jobs/s (1 producer)",
        "lag p50 / p95 / p99 @200/s",
        "lag @500/s",
        "CPU busy @200/s",
        "workers CPU @200/s",
        "commits/job",
        "statements/job",
        "WAL B/job",
        "idle CPU/worker",
    ]
    rows = []
    for key, label in labels.items():
        rows.append(
            [
                f"**{label}**" if key == "stint" else label,
                _figure_cell(get("drain", key), "drain_jobs_per_s"),
                _figure_cell(get("enqueue", key), "enqueue_jobs_per_s"),
                _lag_cell(get("lag200", key)),
                _lag_cell(get("lag500", key)),
                _figure_cell(get("lag200", key), "machine_busy_percent", unit="%"),
                _figure_cell(get("lag200", key), "workers_cpu_percent", unit="%"),
                _figure_cell(get("drain", key), "commits_per_job", 3),
                _figure_cell(get("drain", key), "statements_per_job", 3),
                _figure_cell(get("drain", key), "wal_bytes_per_job"),
                _figure_cell(get("idle", key), "workers_cpu_percent_each", 1, "%"),
            ]
        )
    parts = [
        f"## `{document['command']}` — {document['stamp']}",
        "",
        f"{document['machine']['cpus']} CPUs, {document['machine']['memory_gb']} GB, {document['machine']['platform']};"
        f" {document['postgres']}. {document['processes']} worker OS processes per system; median (min–max) of"
        f" {document['repetitions']} interleaved repetition(s).",
        "",
        stats.markdown_table(header, rows),
    ]
    stint_rows = []
    for name in document["scenarios"]:
        sc = scenarios.SCENARIOS[name]
        if not sc.stint_only:
            continue
        for figure in sc.figures:
            stint_rows.append(
                [sc.title, figure.title, _figure_cell(get(name, "stint"), figure.key, figure.digits, figure.unit)]
            )
    if get("idle", "stint") and "scheduler_cpu_percent" in get("idle", "stint"):
        stint_rows.append(
            ["Idle", "run_scheduler CPU", _figure_cell(get("idle", "stint"), "scheduler_cpu_percent", 1, "%")]
        )
    if stint_rows:
        parts += ["", "Stint only:", "", stats.markdown_table(["scenario", "figure", "median (min–max)"], stint_rows)]
    parts += ["", "Settings:", ""]
    parts += [f"- {s['label']}: {s['settings']}" for s in document["systems"]]
    if document["errors"]:
        parts += ["", "Failed runs:", ""] + [f"- {e}" for e in document["errors"]]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
