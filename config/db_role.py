"""Moved to ``core.db_role``: this alias serves ``scheduler/workers/*`` until the hot-path rewrite imports core.

Remove once nothing imports ``config.db_role`` (issue 15, item 4).
"""

from core.db_role import application_name_for, set_process_role

__all__ = ["application_name_for", "set_process_role"]
