"""Which threads opened a database connection, from Django's ``connection_created`` signal.

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

from django.db.backends.signals import connection_created

_state = threading.local()


def _note_connection(sender: Any, connection: Any, **kwargs: Any) -> None:  # noqa: ARG001 - a signal receiver
    _state.opened = True


connection_created.connect(_note_connection, dispatch_uid="stint-thread-opened-a-connection")


def opened_a_connection() -> bool:
    """Whether the calling thread has opened a database connection (of any alias) since Django loaded its apps."""
    return getattr(_state, "opened", False)
