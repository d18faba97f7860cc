"""Loopback ports for the servers and processes tests start, and stand-ins for a frozen server."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


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


class FreezableProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream`` that can freeze (pass no byte either way), as a SIGSTOPped server.

    While frozen, the proxy reads nothing (the kernel still acknowledges what fits in its buffers,
    so neither TCP keepalives nor ``tcp_user_timeout`` see a dead peer) and sends nothing.
    ``freeze()``, ``thaw()``; use as a context manager, ``port``.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._running = threading.Event()
        self._running.set()
        self._closing = False
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def freeze(self) -> None:
        self._running.clear()

    def thaw(self) -> None:
        self._running.set()

    def __enter__(self) -> FreezableProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing = True
        self._running.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closing:
                self._running.wait()
                if not select.select([src], [], [], 0.1)[0]:
                    continue
                if not self._running.is_set():
                    continue  # frozen between the wait and the read: read nothing
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):  # the other direction's pump sees the end and closes its own source
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            src.close()
