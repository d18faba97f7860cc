"""Template tags of the audit app's parts of the operator console."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("admin/stint/_trail.html")
def audit_trail_card(*, outbox_backlog: int) -> dict[str, Any]:
    """Render the event trail's card of the admin dashboard: quarantine and reconciler figures."""
    from audit.selectors import trail_health
    from core.db_clock import db_now

    return {"trail": trail_health(now=db_now()), "outbox_backlog": outbox_backlog}
