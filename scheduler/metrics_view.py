"""``/metrics`` of the web process: django-prometheus's exposition, closed to the public when restricted.

The page holds django-prometheus's ``django_http_*`` families and the Stint metrics the web
process measures (``scheduler.metrics.SERVED_BY["web"]``: jobs created, rate limits); the
workers' and scheduler's families are served by those processes, never here as zeros.

``METRICS_RESTRICTED`` (on by default in production) admits a scrape only from a socket peer
in ``METRICS_ALLOWED_IPS`` (addresses or CIDR networks) or with ``Authorization: Bearer
<METRICS_BEARER_TOKEN>``; anything else gets a 403 in the API's error shape. The peer is
``REMOTE_ADDR``, never ``X-Forwarded-For``: a scraper talks to the process directly.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.errors import error_body
from scheduler.metrics import served_registry

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@functools.lru_cache(maxsize=8)
def allowed_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """Parse addresses and CIDR networks (``10.0.0.5``, ``172.28.0.0/16``, ``::1``). Raises ValueError."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries if entry.strip())


def scrape_allowed(request: HttpRequest) -> bool:
    """Return True if ``request`` may read the metrics under the current settings."""
    if not getattr(settings, "METRICS_RESTRICTED", False):
        return True
    token = getattr(settings, "METRICS_BEARER_TOKEN", "")
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return True
    networks = allowed_networks(tuple(getattr(settings, "METRICS_ALLOWED_IPS", ())))
    if networks:
        try:
            peer = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            return False
        if peer.version == 6 and peer.ipv4_mapped is not None:
            peer = peer.ipv4_mapped
        return any(peer in network for network in networks)
    return False


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the Prometheus text exposition, or 403 when the scrape is not allowed."""
    if not scrape_allowed(request):
        message = "Metrics are restricted: scrape from an allowed address or with the bearer token."
        return JsonResponse(error_body(code="forbidden", message=message), status=403)
    registry = served_registry("web")
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
