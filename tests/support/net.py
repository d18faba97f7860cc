"""Loopback ports for the servers and processes tests start, and stand-ins for a frozen server."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listened on a moment ago (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SilentServer:
    """A listening socket whose connections the kernel accepts and nobody answers: a frozen server, at the TCP level.

    A SIGSTOPped PostgreSQL looks like this to a client: the handshake completes (the kernel
    accepts into the backlog) and nothing ever comes back. Use as a context manager; ``port``.
    """

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
