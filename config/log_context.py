"""Moved to ``core.log_context``: this alias serves ``scheduler/workers/execute.py`` until the hot-path rewrite.

Remove once nothing imports ``config.log_context`` (issue 15, item 4).
"""

from core.log_context import log_context

__all__ = ["log_context"]
