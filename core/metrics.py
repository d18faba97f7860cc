"""Prometheus metrics of core's plumbing: the API rate limit (``core.throttling``, ``pages.ratelimit``).

Declared here so that core imports nothing of the apps; ``scheduler.metrics`` lists them among the
families the web process serves (``SERVED_BY``).
"""

from __future__ import annotations

from prometheus_client import Counter

rate_limit_rejections_total = Counter("rate_limit_rejections_total", "Requests rejected with 429.", ["scope"])
rate_limit_backend_errors_total = Counter(
    "rate_limit_backend_errors_total", "Rate-limit checks that failed open because Redis was unreachable."
)
