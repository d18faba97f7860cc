"""Never imported by a worker: a job whose type names this module must not load it.

Importing it writes the file named by ``STINT_TRAP_FILE`` (when set), so a test can see whether a
worker process imported it; ``boom`` is the call a hostile job type would ask for.
"""

from __future__ import annotations

import os
from pathlib import Path

if os.environ.get("STINT_TRAP_FILE"):
    Path(os.environ["STINT_TRAP_FILE"]).write_text("imported")


def boom(*args: object, **kwargs: object) -> str:
    return "called"
