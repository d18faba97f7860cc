"""Moved to ``core.parsers``: this alias serves ``scheduler/services.py`` until the hot-path rewrite imports core.

Remove once nothing imports ``config.parsers`` (issue 15, item 4).
"""

from core.parsers import SURROGATE_MESSAGE, has_lone_surrogate, json_depth

__all__ = ["SURROGATE_MESSAGE", "has_lone_surrogate", "json_depth"]
