"""Template tags shared by the operator console and the user pages: status badges, durations, the dashboard.

Badge colours are dark enough for white text to pass WCAG AA (contrast ratio >= 4.5:1, checked by
the browser tests from computed styles); they are inline styles so that they render the same in
the admin (whose stylesheet we do not own) and on the user pages.
"""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core.stored_json import UnreadableJSON
from scheduler.ids import short_job_id
from scheduler.states import JobStatus, priority_label

register = template.Library()

# Background of each status badge; the text is white. Contrast with white: 6.4-15.8 : 1.
BADGE_COLOURS: dict[str, str] = {
    JobStatus.CREATED: "#57606a",
    JobStatus.SCHEDULED: "#4b5563",
    JobStatus.QUEUED: "#6639ba",
    JobStatus.RUNNING: "#0550ae",
    JobStatus.SUCCESS: "#116329",
    JobStatus.FAILED: "#a40e26",
    JobStatus.RETRYING: "#8a4600",
    JobStatus.DEAD: "#1f2328",
    JobStatus.CANCELLED: "#5a6370",
}
BADGE_FALLBACK = "#1f2328"
BADGE_STYLE = (
    "display:inline-block;padding:0.1em 0.55em;border-radius:0.8em;font-size:0.85em;font-weight:600;"
    "line-height:1.5;letter-spacing:0.02em;color:#ffffff;background-color:{}"
)


@register.filter
def short_id(job_id: Any) -> str:
    """A job id's short form for lists and titles (``scheduler.ids.short_job_id``)."""
    return short_job_id(job_id)


@register.filter
def status_badge(status: str) -> SafeString:
    """Render ``status`` as a coloured badge: ``<span class="badge" data-status=...>``."""
    colour = BADGE_COLOURS.get(str(status), BADGE_FALLBACK)
    return format_html(
        '<span class="badge badge-{}" data-status="{}" style="{}">{}</span>',
        str(status).lower(),
        status,
        BADGE_STYLE.format(colour),
        status,
    )


@register.filter
def in_zone(when: dt.datetime | None, zone: str) -> str:
    """Show an aware ``when`` in the IANA time zone ``zone`` and in UTC, to the second.

    "2026-12-05 09:00:00 Europe/Paris (08:00:00 UTC)"; the UTC part gives its date too when the
    zone's date differs ("2026-12-06 00:30:00 Asia/Kathmandu (2026-12-05 18:45:00 UTC)"). The zone
    "UTC", or a name that is no zone, shows UTC alone; None shows "". A schedule fires by its zone's
    wall clock (``scheduler.cron``), so its times are read there; UTC is what the API and every
    other time on the pages use.
    """
    if when is None:
        return ""
    utc = when.astimezone(dt.UTC)
    try:
        local = when.astimezone(zoneinfo.ZoneInfo(zone)) if zone != "UTC" else None
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        local = None
    if local is None:
        return f"{utc:%Y-%m-%d %H:%M:%S} UTC"
    utc_part = f"{utc:%H:%M:%S}" if utc.date() == local.date() else f"{utc:%Y-%m-%d %H:%M:%S}"
    return f"{local:%Y-%m-%d %H:%M:%S} {zone} ({utc_part} UTC)"


@register.filter
def pretty_json(value: Any) -> str:
    """Render a JSON value as indented JSON text (escaped by the template like any string).

    A stored value Python cannot read (``core.stored_json.UnreadableJSON``) renders as
    "(cannot be read: why)".
    """
    if isinstance(value, UnreadableJSON):
        return str(value)
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def priority_name(value: Any) -> str:
    """Render a stored priority as HIGH, MEDIUM or LOW at a named point, else as its integer."""
    try:
        return priority_label(int(value))
    except (TypeError, ValueError):
        return str(value)


@register.filter
def duration(seconds: float | dt.timedelta | None) -> str:
    """Render seconds as a short human duration: "42 s", "3 min 5 s", "2 h 10 min", "3 d 4 h"; None as "-"."""
    if seconds is None:
        return "-"
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


@register.filter
def precise_duration(seconds: float | None) -> str:
    """Render seconds for latencies and run times: "4 ms", "1.25 s", "42.0 s", then as ``duration``; None as "-"."""
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return duration(seconds)


@register.inclusion_tag("admin/stint/dashboard.html", takes_context=True)
def stint_dashboard(context: dict[str, Any]) -> dict[str, Any]:
    """Render the operator dashboard (``scheduler.admin_dashboard``) on the admin index."""
    from scheduler.admin_dashboard import dashboard_data

    return {"dashboard": dashboard_data(), "request": context.get("request")}
