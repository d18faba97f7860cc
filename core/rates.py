"""Rate-limit strings (``"100/min"``): their grammar, read by the settings at start-up and by the throttle per request.

Pure: no Django machinery beyond ``ImproperlyConfigured``, so ``config.settings`` can check
``STINT_RATE_LIMIT_*`` while it loads, before the apps and the cache exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

PERIOD_SECONDS = {  # window length in seconds, by the period's name in a rate ("100/min")
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Rate:
    """A budget: at most ``limit`` requests in any ``window_seconds``."""

    limit: int
    window_seconds: int


def rate_parse(value: str) -> Rate:
    """Parse ``"<count>/<period>"``, period one of ``PERIOD_SECONDS`` (``s``, ``min``, ``hour``, ``day``...).

    Raises ImproperlyConfigured on anything else or a count below 1.
    """
    try:
        count_text, period = value.split("/")
        limit = int(count_text)
        window = PERIOD_SECONDS[period.strip().lower()]
    except (ValueError, KeyError, AttributeError) as exc:
        raise ImproperlyConfigured(f"Bad rate limit {value!r}: expected '<count>/<s|min|hour|day>'") from exc
    if limit < 1:
        raise ImproperlyConfigured(f"Bad rate limit {value!r}: the count must be at least 1")
    return Rate(limit=limit, window_seconds=window)
