"""A TCP proxy that delays every byte by a fixed time in each direction: link latency where ``tc netem`` is missing.

``python -m chaos.linkproxy --delay-ms 100 LISTEN_HOST:PORT=TARGET_HOST:PORT ...`` forwards each
listened address to its target. Data read from one side is written to the other ``delay-ms``
after it was read, in order, so a request/response pair takes twice the delay more than
without the proxy: what ``tc qdisc add ... netem delay 100ms`` on both hosts' links gives.
The chaos runner uses it for the latency scenario when the kernel has no ``sch_netem``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time

CHUNK = 65536  # bytes read at once


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(CHUNK)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def _serve(listen: str, target: str, delay: float) -> asyncio.Server:
    host, port = listen.rsplit(":", 1)
    t_host, t_port = target.rsplit(":", 1)

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(t_host, int(t_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _pump(client_reader, up_writer, delay), _pump(up_reader, client_writer, delay), return_exceptions=True
        )

    return await asyncio.start_server(handle, host, int(port), reuse_address=True)


async def _main(routes: list[str], delay: float) -> None:
    servers = [await _serve(*route.split("=", 1), delay) for route in routes]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> None:
    """Parse ``--delay-ms`` and the routes; serve until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay in milliseconds")
    parser.add_argument("routes", nargs="+", help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    args = parser.parse_args()
    asyncio.run(_main(args.routes, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
