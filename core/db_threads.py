"""Per-thread database connection facts: which threads opened one, and their bounded lock waits.

A worker runs each handler in a pool thread and checks afterwards the connections that thread
opened (``scheduler.workers.execute``): a thread that never opened one has nothing to check, and
asking Django (``connections.all``) costs about 6 us a job, a fifth of a no-op job's run. The
receiver is connected when this module is imported, which ``scheduler.apps`` does while Django
loads its apps, before any connection can exist; a connection is opened in the thread that
uses it, so the flag is that thread's own.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connection
from django.db.backends.signals import connection_created

_state = threading.local()


def _note_connection(sender: Any, connection: Any, **kwargs: Any) -> None:  # noqa: ARG001 - a signal receiver
    _state.opened = True


connection_created.connect(_note_connection, dispatch_uid="stint-thread-opened-a-connection")


def opened_a_connection() -> bool:
    """Whether the calling thread has opened a database connection (of any alias) since Django loaded its apps."""
    return getattr(_state, "opened", False)


def bound_lock_waits(milliseconds: int) -> None:
    """Make ``milliseconds`` the ``lock_timeout`` of the calling thread's connection, once per connection.

    Session-wide (``set_config(..., false)``), so it outlives the statement; a new connection
    (after an error closed the last one) gets it again, and one already set costs no round trip.
    For loops that retry a statement later when it fails, so that none waits on a lock another
    session holds (a handler's ``LOCK TABLE stint_job``) for as long as that session chooses.
    Raises what the database raises (opening the connection included).
    """
    connection.ensure_connection()
    bounded = (connection.connection, milliseconds)
    if getattr(_state, "lock_bounded", None) == bounded:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{milliseconds}ms"])
    _state.lock_bounded = bounded
