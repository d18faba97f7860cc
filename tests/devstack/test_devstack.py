"""Tests for devstack: real embedded servers started as subprocesses in a tmp state dir."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import devstack

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30  # seconds any one devstack invocation may take
SERVER_VARS = ("DATABASE_URL", "REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS")

PING_CHILD = """
import os, sys, redis
url = os.environ["REDIS_URL"]
print("URL", url, "PING", redis.Redis.from_url(url).ping(), flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""

# Touches <name>.ready, waits for <name>.go, pings Redis, exits; lets a test interleave two runs.
STEP_CHILD = """
import os, sys, time, redis
from pathlib import Path
base = Path(sys.argv[1])
# Write then rename: the test must never read a ready file that exists but is still empty.
(base / (sys.argv[2] + ".tmp")).write_text(os.environ["REDIS_URL"])
(base / (sys.argv[2] + ".tmp")).rename(base / (sys.argv[2] + ".ready"))
while not (base / (sys.argv[2] + ".go")).exists():
    time.sleep(0.02)
print("PING", redis.Redis.from_url(os.environ["REDIS_URL"]).ping(), flush=True)
"""

SIGNAL_CHILD = """
import signal, sys, time
def stop(signum, frame):
    print("GOT", signum, flush=True)
    sys.exit(9)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
print("READY", flush=True)
time.sleep(20)
sys.exit(1)
"""


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    """Yield a private devstack state dir; stop whatever was left in it afterwards, then remove it.

    Not under pytest's ``tmp_path``: as root, devstack grants o+x on each ancestor of the data
    directory so that PostgreSQL's own user can reach it, and every pytest session that starts
    (``make test`` runs the Django 6 session beside the main one) takes those bits off its
    ``/tmp/pytest-of-<user>`` again; PostgreSQL starting in between could not stat its data
    directory ("Permission denied", seen in CI). A directory of its own under the system's temp
    directory keeps the grant.
    """
    directory = Path(tempfile.mkdtemp(prefix="stint-devstack-test-")) / "devstack"
    yield directory
    devstack_cmd(directory, "down", check=False)
    shutil.rmtree(directory.parent, ignore_errors=True)


def stack_env(directory: Path, *, only: tuple[str, ...] = ("REDIS_URL",)) -> dict[str, str]:
    """Return an environment in which devstack starts only the servers for ``only``."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARS}
    env[devstack.DIR_ENV] = str(directory)
    for var in SERVER_VARS:
        if var not in only:
            env[var] = "unused://set-by-test"
    return env


def devstack_cmd(
    directory: Path, *args: str, only: tuple[str, ...] = ("REDIS_URL",), check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m devstack ARGS`` to completion and return its result."""
    result = subprocess.run(
        [sys.executable, "-m", "devstack", *args],
        cwd=ROOT,
        env=stack_env(directory, only=only),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if check:
        assert result.returncode in (0, 7), result.stderr
    return result


def record(directory: Path, name: str) -> dict[str, object] | None:
    """Return the JSON record for server ``name``, or None."""
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def wait_for(path: Path, timeout: float = TIMEOUT) -> None:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_run_starts_redis_exports_url_and_stops_it_after(stack_dir: Path) -> None:
    result = devstack_cmd(stack_dir, "run", "--", sys.executable, "-c", PING_CHILD, "7")

    assert result.returncode == 7  # the command's exit code
    url = result.stdout.split()[1]
    assert url.startswith("redis://127.0.0.1:")
    assert "PING True" in result.stdout
    pid = int(result.stderr.split("started redis (pid ")[1].split(")")[0])
    assert not devstack.pid_alive(pid)
    assert record(stack_dir, "redis") is None
    assert not (stack_dir / "pg").exists()  # DATABASE_URL was set: no PostgreSQL


def test_run_starts_all_three_servers_that_answer(stack_dir: Path) -> None:
    child = (
        "import os; import devstack as d\n"
        "for cls in d.SERVERS: assert cls(directory=d.state_dir()).probe(os.environ[cls.env_var]), cls.name\n"
        "print('ALL OK')"
    )
    result = devstack_cmd(stack_dir, "run", "--", sys.executable, "-c", child, only=SERVER_VARS)

    assert result.returncode == 0, result.stderr
    assert "ALL OK" in result.stdout
    assert "stopping pg" in result.stderr
    assert not (stack_dir / "pg" / "postmaster.pid").exists()


def test_up_then_run_reuses_the_same_server_and_leaves_it_running(stack_dir: Path) -> None:
    up = devstack_cmd(stack_dir, "up")
    started = record(stack_dir, "redis")
    assert started is not None
    assert up.stdout == f"export REDIS_URL={started['url']}\n"

    run = devstack_cmd(stack_dir, "run", "--", sys.executable, "-c", PING_CHILD)

    assert f"URL {started['url']} PING True" in run.stdout
    assert "reusing redis" in run.stderr
    assert record(stack_dir, "redis") == {**started, "users": []}
    assert devstack.pid_alive(int(started["pid"]))  # type: ignore[call-overload]
    assert devstack_cmd(stack_dir, "env").stdout == up.stdout

    devstack_cmd(stack_dir, "down")

    assert not devstack.pid_alive(int(started["pid"]))  # type: ignore[call-overload]
    assert record(stack_dir, "redis") is None
    assert devstack_cmd(stack_dir, "env").stdout == ""


def test_env_with_no_running_server_says_so_on_stderr_naming_the_directory(stack_dir: Path) -> None:
    # `eval "$(python -m devstack env)"` in the wrong clone, or without the STINT_DEVSTACK_DIR that
    # `make run` was given, printed nothing: the shell then went on with the settings' default
    # database, silently. The exports stay empty (eval is harmless); stderr says why.
    result = devstack_cmd(stack_dir, "env")

    assert result.stdout == ""
    assert f"no running dev stack in {stack_dir.resolve()}" in result.stderr
    assert "STINT_DEVSTACK_DIR" in result.stderr


def test_stale_record_is_replaced_without_touching_the_recorded_pid(stack_dir: Path) -> None:
    # The recorded pid now belongs to an unrelated process: it must be left alone.
    with subprocess.Popen(["sleep", "30"]) as bystander:
        stack_dir.mkdir()
        stale = {"name": "redis", "pid": bystander.pid, "port": 1, "url": "redis://127.0.0.1:1/0",
                 "env_var": "REDIS_URL", "persistent": True, "users": []}  # fmt: skip
        (stack_dir / "redis.json").write_text(json.dumps(stale))

        result = devstack_cmd(stack_dir, "run", "--", sys.executable, "-c", PING_CHILD)

        assert "clearing stale redis record" in result.stderr
        assert "PING True" in result.stdout
        assert bystander.poll() is None
        bystander.kill()
    assert record(stack_dir, "redis") is None


@contextlib.contextmanager
def _killed_on_failure(*procs: subprocess.Popen[str]) -> Iterator[None]:
    """Kill ``procs`` if the block raises, so Popen's exit (an unbounded wait) cannot hang the suite."""
    try:
        yield
    except BaseException:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the devstack run and the child it waits for
        raise


def test_racing_runs_share_one_server_until_the_last_leaves(stack_dir: Path) -> None:
    def start(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "devstack", "run", "--", sys.executable, "-c", STEP_CHILD,
             str(stack_dir.parent), name],
            cwd=ROOT, env=stack_env(stack_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip

    base = stack_dir.parent
    with start("a") as first, start("b") as second, _killed_on_failure(first, second):
        wait_for(base / "a.ready")
        wait_for(base / "b.ready")
        assert (base / "a.ready").read_text() == (base / "b.ready").read_text()
        shared = record(stack_dir, "redis")
        assert shared is not None
        assert sorted(shared["users"]) == sorted([first.pid, second.pid])  # type: ignore[type-var]

        (base / "a.go").touch()
        out, err = first.communicate(timeout=TIMEOUT)
        assert first.returncode == 0, err
        assert devstack.pid_alive(int(shared["pid"]))  # type: ignore[call-overload]  # b still uses it

        (base / "b.go").touch()
        out, err = second.communicate(timeout=TIMEOUT)
        assert second.returncode == 0, err
        assert "PING True" in out
    assert not devstack.pid_alive(int(shared["pid"]))  # type: ignore[call-overload]
    assert record(stack_dir, "redis") is None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_devstack_reaches_the_command_once_then_servers_stop(stack_dir: Path, signum: int) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "devstack", "run", "--", sys.executable, "-c", SIGNAL_CHILD],
        cwd=ROOT, env=stack_env(stack_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline() == "READY\n"
        server = record(stack_dir, "redis")
        assert server is not None

        proc.send_signal(signum)
        out, err = proc.communicate(timeout=TIMEOUT)

    assert out == f"GOT {signum}\n"
    assert proc.returncode == 9, err
    assert not devstack.pid_alive(int(server["pid"]))  # type: ignore[call-overload]
    assert record(stack_dir, "redis") is None


# -- make run's metrics ports -----------------------------------------------------------------------


def _three_free_consecutive_ports() -> int:
    for _ in range(50):
        first = devstack.pick_port(None)
        if all(devstack.port_free(first + i) for i in range(3)) and first + 2 < 65536:
            return first
    raise RuntimeError("no three consecutive free ports")


def test_metrics_ports_derive_from_the_web_port_while_free() -> None:
    first = _three_free_consecutive_ports()
    web_port = first - devstack.METRICS_PORT_OFFSET

    assert list(devstack.metrics_ports(web_port).values()) == [first, first + 1, first + 2]


def test_a_taken_metrics_port_is_replaced_by_a_free_one() -> None:
    # A second stack on the same host: its scheduler's preferred port is taken by the first stack.
    first = _three_free_consecutive_ports()
    with socket.socket() as taken:
        taken.bind((devstack.HOST, first))
        taken.listen()
        ports = devstack.metrics_ports(first - devstack.METRICS_PORT_OFFSET)

    scheduler, workers, audit = ports.values()
    assert scheduler != first and (workers, audit) == (first + 1, first + 2)
    assert len(set(ports.values())) == 3


def test_the_metrics_ports_command_prints_export_lines_for_make_run() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "devstack", "metrics-ports", "--web-port", "8000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout

    names = [line.split("=")[0] for line in out.splitlines()]
    assert names == [f"export {n}" for n in devstack.METRICS_PORT_NAMES]


def test_a_free_web_port_has_no_problem() -> None:
    assert devstack.web_port_problem(devstack.pick_port(None)) is None


def test_a_taken_web_port_is_refused_naming_it_and_a_free_one_to_use_instead() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # noqa: S104 - as `python -m http.server` binds: every interface
        taken.listen()
        port = taken.getsockname()[1]
        problem = devstack.web_port_problem(port)

    assert problem is not None and f"port {port} is already in use" in problem
    suggested = int(problem.rsplit("PORT=", 1)[1].split()[0])
    assert suggested > port and devstack.port_free(suggested)


def test_make_run_on_a_taken_web_port_stops_before_starting_or_printing_anything(tmp_path: Path) -> None:
    # The web server binds last: make run used to migrate, print the one-time admin password and a
    # link to the program holding the port, and only then fail.
    stack = tmp_path / "devstack"
    unreachable = {  # were anything started, it would fail on these at once instead of starting servers
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    }
    with socket.socket() as taken:
        taken.bind((devstack.HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        made = subprocess.run(
            ["make", "--no-print-directory", "run", f"PORT={port}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env={**os.environ, **unreachable, devstack.DIR_ENV: str(stack)},
            check=False,
        )

    assert made.returncode != 0
    assert f"make run: port {port} is already in use" in made.stderr
    assert "make run" in made.stderr.split("Pick another port:", 1)[1]
    assert made.stdout == "" and not stack.exists()


def test_a_url_set_only_in_dot_env_counts_as_set_and_the_real_environment_wins(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text(
        "# a comment\nDATABASE_URL=postgres://nobody@127.0.0.1:1/mydb\nREDIS_URL=redis://from-dotenv:1/0\n"
    )
    merged = devstack.with_dotenv({"REDIS_URL": "redis://from-environment:2/0"}, dotenv)

    assert merged["DATABASE_URL"] == "postgres://nobody@127.0.0.1:1/mydb"
    assert merged["REDIS_URL"] == "redis://from-environment:2/0"
    needed = devstack.servers_needed(tmp_path / "state", merged)
    assert [server.env_var for server in needed] == ["KAFKA_BOOTSTRAP_SERVERS"]
    assert devstack.with_dotenv({"A": "1"}, tmp_path / "missing.env") == {"A": "1"}
