"""Bounds on how long a vanished or stuck client can hold a PostgreSQL session and its locks.

Every Stint connection (``config.settings`` puts these into the database ``OPTIONS``, which
Django passes to libpq as connection parameters) carries:

- ``connect_timeout`` (libpq, ``STINT_DB_CONNECT_TIMEOUT_SECONDS``, default 5 s): a new
  connection to a server that accepts and never answers (a frozen, SIGSTOPped PostgreSQL: the
  kernel completes the handshake) gives up after this, instead of psycopg's default 130 s. A
  server that is alive but slower than this to authenticate a session is refused too: raise it
  for such a server (a pooler far away, a loaded host); libpq's minimum is 2 s;
- client-side TCP keepalives and ``tcp_user_timeout`` (libpq): a process cut off from the
  database host notices within about ``KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT``
  seconds (25 s) when idle, ``TCP_USER_TIMEOUT_MS`` (30 s) when data it sent stays
  unacknowledged, instead of waiting on a dead socket for the OS's 2 hours;
- the same on the server side (``tcp_keepalives_*``, ``tcp_user_timeout`` as startup
  ``options``): PostgreSQL ends the session of a client that vanished mid-transaction (a
  partition, a power loss) within those bounds, which rolls its transaction back and releases
  its row locks. Without them (finding F6 of docs/chaos-findings.md) a cut-off scheduler's
  promoter kept due jobs locked ``FOR UPDATE`` until the partition healed;
- ``idle_in_transaction_session_timeout`` (``STINT_DB_IDLE_IN_TRANSACTION_SECONDS``, default
  60 s, 0: none): the server ends a session that sits idle inside a transaction that long (a
  process SIGSTOPped or hung between two statements of a transaction). No Stint transaction
  waits on anything but the database itself, except the outbox relay's (Kafka's confirmation,
  bounded at 6 s); a handler that keeps a transaction open while it waits for something else
  longer than this loses its session (its transaction is rolled back and the next query
  reconnects).

These are PostgreSQL's own settings (tcp_keepalives_idle, tcp_user_timeout,
idle_in_transaction_session_timeout: docs "Client Connection Defaults" and "Connections and
Authentication"); each is settable by any user. Behind a pooler that refuses startup
``options`` (PgBouncer without ``ignore_startup_parameters = options``), set
``STINT_DB_SERVER_OPTIONS=false`` and configure them on the server.
"""

from __future__ import annotations

from typing import Any

KEEPALIVE_IDLE_SECONDS = 10  # seconds of silence before the first probe
KEEPALIVE_INTERVAL_SECONDS = 5  # seconds between probes
KEEPALIVE_COUNT = 3  # unanswered probes before the connection is dead
TCP_USER_TIMEOUT_MS = 30_000  # ms data may stay unacknowledged before the connection is dead
DEFAULT_IDLE_IN_TRANSACTION_SECONDS = 60.0
DEFAULT_CONNECT_TIMEOUT_SECONDS = 5  # libpq connect_timeout: whole seconds, at least 2


def session_options(
    *,
    idle_in_transaction_seconds: float,
    connect_timeout_seconds: int = DEFAULT_CONNECT_TIMEOUT_SECONDS,
    server_options: bool = True,
    existing_options: str = "",
) -> dict[str, Any]:
    """Return libpq connection parameters that bound a session's life after its client vanished or stalled.

    ``idle_in_transaction_seconds`` (seconds, > 0; 0 or less: no bound) becomes the server's
    ``idle_in_transaction_session_timeout``; ``connect_timeout_seconds`` (whole seconds; 0: psycopg's
    default, 130 s) becomes libpq's ``connect_timeout``; ``server_options`` False leaves out the startup
    ``options`` (server-side keepalives and that timeout) for poolers that refuse them;
    ``existing_options`` (a libpq ``options`` string already configured, e.g. from
    ``DATABASE_URL``) is kept in front of ours. Returns a dict for ``psycopg.connect(**...)`` or a
    Django database's ``OPTIONS``: ``connect_timeout``, ``keepalives``, ``keepalives_idle``, ``keepalives_interval``,
    ``keepalives_count``, ``tcp_user_timeout`` and (with ``server_options``) ``options``.
    """
    params: dict[str, Any] = {
        "connect_timeout": connect_timeout_seconds,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
        "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
    }
    if not server_options:
        return params
    settings = [
        f"tcp_keepalives_idle={KEEPALIVE_IDLE_SECONDS}",
        f"tcp_keepalives_interval={KEEPALIVE_INTERVAL_SECONDS}",
        f"tcp_keepalives_count={KEEPALIVE_COUNT}",
        f"tcp_user_timeout={TCP_USER_TIMEOUT_MS}",
    ]
    if idle_in_transaction_seconds > 0:
        settings.append(f"idle_in_transaction_session_timeout={max(1, round(idle_in_transaction_seconds * 1000))}")
    params["options"] = " ".join(filter(None, [existing_options.strip(), *(f"-c {s}" for s in settings)]))
    return params
