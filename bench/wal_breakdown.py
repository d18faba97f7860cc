"""Where a drain's WAL goes: pg_waldump over a bench run's range, summed by relation and record kind.

Usage (after a run with the WAL kept):
    BENCH_WAL_KEEP_SIZE=2GB .venv/bin/python bench/side_by_side.py --only stint --scenarios drain --reps 1
    .venv/bin/python bench/wal_breakdown.py .bench/results/<stamp>.json [--rep 0] [--jobs N]

Reads ``wal_lsn_range`` of the drain's repetition from the results JSON, runs Debian's
``pg_waldump`` on ``.bench/pg/pg_wal`` over it and prints, per relation (by relfilenode, named
from the bench PostgreSQL's ``stint`` template database when it is running, else by number) and
per record kind (Heap INSERT, Btree INSERT_LEAF...), the bytes and bytes per job, full-page images
included. A record without a block reference (commits, running xacts) counts under ``-``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WALDUMP = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_waldump"))
LINE = re.compile(r"rmgr: (\S+)\s+len \(rec/tot\):\s+\d+/\s*(\d+),.*?desc: (\S+)(.*)$")
REL = re.compile(r"blkref #0: rel \d+/\d+/(\d+)(?: fork (\w+))?")


def lsn(value: int) -> str:
    """``pg_lsn`` text of a byte position."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def names(pg_url: str | None) -> dict[str, str]:
    """relfilenode -> relation name, from the bench's template database (empty when unreachable)."""
    if not pg_url:
        return {}
    try:
        import psycopg

        with psycopg.connect(pg_url, connect_timeout=3) as conn:
            rows = conn.execute("SELECT pg_relation_filenode(oid)::text, relname FROM pg_class").fetchall()
            toast = conn.execute(
                "SELECT pg_relation_filenode(t.oid)::text, c.relname || ' (toast)' FROM pg_class c"
                " JOIN pg_class t ON t.oid = c.reltoastrelid"
            ).fetchall()
            toast_idx = conn.execute(
                "SELECT pg_relation_filenode(i.indexrelid)::text, c.relname || ' (toast index)' FROM pg_class c"
                " JOIN pg_index i ON i.indrelid = c.reltoastrelid"
            ).fetchall()
    except Exception as exc:  # noqa: BLE001 - names are a convenience
        print(f"(relation names unavailable: {exc})", file=sys.stderr)
        return {}
    return {str(k): v for k, v in [*rows, *toast, *toast_idx] if k is not None}


def _stint():
    from bench.peers import systems

    return systems.by_key()["stint"]


def main(argv: list[str] | None = None) -> int:
    """Print the breakdown; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--scenario", default="drain")
    parser.add_argument("--rep", type=int, default=0)
    parser.add_argument("--pg-url", default=None, help="a URL of the stint template database, for names")
    args = parser.parse_args(argv)
    run = json.loads(args.results.read_text())["runs"][args.scenario]["stint"][args.rep]
    start, end = run["wal_lsn_range"]
    jobs = run["jobs"]
    dump = subprocess.run(
        [str(WALDUMP[-1]), "-p", str(ROOT / ".bench" / "pg" / "pg_wal"), "-s", lsn(start), "-e", lsn(end)],
        capture_output=True,
        text=True,
        check=False,
    )
    by_rel: dict[str, int] = collections.Counter()
    by_kind: dict[tuple[str, str], int] = collections.Counter()
    count: dict[tuple[str, str], int] = collections.Counter()
    for text in dump.stdout.splitlines():
        match = LINE.search(text)
        if not match:
            continue
        rmgr, total, desc, rest = match.group(1), int(match.group(2)), match.group(3), match.group(4)
        rel = REL.search(rest)
        relname = rel.group(1) if rel else "-"
        by_rel[relname] += total
        by_kind[(relname, f"{rmgr} {desc}")] += total
        count[(relname, f"{rmgr} {desc}")] += 1
    if args.pg_url:
        named = names(args.pg_url)
    else:  # the bench's own PostgreSQL, started (or reused) for the lookup
        sys.path.insert(0, str(ROOT))
        from bench import scenarios, servers

        running = servers.start(ROOT / ".bench")
        try:
            named = names(running.url(scenarios.template_name(_stint())))
        finally:
            running.stop()
    total = sum(by_rel.values())
    print(f"WAL {end - start} B over {jobs} jobs = {(end - start) / jobs:.0f} B/job; parsed records {total} B")
    for relname, size in sorted(by_rel.items(), key=lambda kv: -kv[1]):
        print(f"{named.get(relname, relname):45} {size / jobs:7.0f} B/job  {100 * size / total:5.1f}%")
        for (r, kind), bytes_ in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            if r == relname and bytes_ / jobs >= 5:
                print(f"    {kind:41} {bytes_ / jobs:7.0f} B/job  {count[(r, kind)] / jobs:6.3f} records/job")
    if dump.returncode:
        print(dump.stderr.strip().splitlines()[-1] if dump.stderr.strip() else "pg_waldump failed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
