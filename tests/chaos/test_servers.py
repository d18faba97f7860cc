"""The chaos cluster's servers: the pg-freeze scenario's PostgreSQL freezes as a whole, open connections too."""

from __future__ import annotations

import select

import psycopg
import pytest

from chaos.hosts import Hosts
from chaos.servers import Postgres, descendants
from scheduler.workers.supervisor import process_state

SILENCE_SECONDS = 0.5  # how long a frozen server is listened to for an answer that cannot come


@pytest.fixture
def postgres(tmp_path):
    """A private chaos ``Postgres`` on a free port of 127.0.0.1 (the harness's one-host mode), stopped after."""
    workdir = tmp_path / "pg"
    (workdir / "logs").mkdir(parents=True)
    server = Postgres(Hosts.single("t", "test"), workdir)
    server.prepare()
    server.start()
    yield server
    server.stop()


def test_descendants_walks_children_and_grandchildren(tmp_path):
    proc = tmp_path / "proc"
    # pid 10 -> 11 -> 13, 10 -> 12; 20 is someone else's; "self" and a vanished entry are skipped.
    table = [(10, 1, "postgres"), (11, 10, "postgres: a (b)"), (12, 10, "x"), (13, 11, "y"), (20, 1, "z")]
    for pid, ppid, comm in table:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
    (proc / "self").mkdir()
    (proc / "99").mkdir()
    assert descendants(10, proc=proc) == [11, 12, 13]
    assert descendants(20, proc=proc) == []


def test_a_frozen_postgres_answers_no_open_connection_until_resumed(postgres):
    """pause() stops the postmaster and every backend: a query on a connection opened before waits for resume().

    Stopping the postmaster's process group would not do: each backend leads its own session,
    so an open connection would go on answering (the manual trial's finding).
    """
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert backend in descendants(postgres.proc.pid)
        postgres.pause()
        try:
            assert process_state(postgres.proc.pid) in ("T", "t")
            assert {process_state(pid) for pid in descendants(postgres.proc.pid)} <= {"T", "t", None}
            conn.pgconn.send_query(b"SELECT 42")
            readable, _, _ = select.select([conn.pgconn.socket], [], [], SILENCE_SECONDS)
            assert readable == []
        finally:
            postgres.resume()
        assert process_state(backend) not in ("T", "t")
        conn.pgconn.flush()
        result = None
        while (r := conn.pgconn.get_result()) is not None:
            result = r
        assert result.get_value(0, 0) == b"42"
        assert conn.execute("SELECT 1").fetchone() == (1,)
