"""The harness's own choices that decide whether a scenario tests Stint or an artifact of the harness."""

from __future__ import annotations

from chaos import plan
from chaos.cluster import is_worker_cmdline, supports_processes
from chaos.hosts import Hosts
from chaos.servers import Postgres


def _setting(argv: list[str], name: str) -> str | None:
    values = [
        argv[i + 1].split("=", 1)[1]
        for i, a in enumerate(argv[:-1])
        if a == "-c" and argv[i + 1].startswith(name + "=")
    ]
    return values[-1] if values else None


def test_the_chaos_postgres_commits_durably_like_production(tmp_path):
    """A commit acknowledged to a client survives the pg-restart scenario's immediate stop.

    With synchronous_commit off, the last commits' WAL dies with the server's shared memory on
    SIGQUIT: rows a client was told were committed vanish (F4 was this harness artifact).
    fsync stays off: the scenario kills processes, never the OS, so the page cache survives.
    """
    argv = Postgres(Hosts.single("t", "test"), tmp_path).argv()
    assert _setting(argv, "synchronous_commit") == "on"
    assert _setting(argv, "fsync") == "off"


def test_a_worker_fault_hits_only_a_worker_process_of_the_supervisor():
    spawn = (
        "/venv/bin/python -c from multiprocessing.spawn import spawn_main;"
        " spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork"
    )
    tracker = "/venv/bin/python -c from multiprocessing.resource_tracker import main;main(5)"
    assert is_worker_cmdline(spawn)
    assert not is_worker_cmdline(tracker)
    assert not is_worker_cmdline("/venv/bin/python manage.py run_workers --processes 2")


def test_the_cluster_runs_supervised_workers_because_run_workers_has_processes():
    """The in-process reading of ``run_workers``' options finds ``--processes`` (read from its parser)."""
    assert supports_processes()


def test_worker_term_signals_a_supervisor_and_a_whole_process_group():
    """Worker processes ignore SIGTERM (their supervisor decides): a SIGTERM to one of them alone tests nothing."""
    for seed in (1, 2, 3):
        faults = plan.fault_schedule("worker-term", plan.PROFILES["short"], seed)
        assert [f.action for f in faults] == ["sigterm", "sigterm-group"]
        assert {f.target for f in faults} == {"worker@h2", "worker@h3"}
