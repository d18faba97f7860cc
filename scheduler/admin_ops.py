"""The operator console's live queues-and-workers page: per-queue and per-worker figures and the hour's charts.

Thin views over ``scheduler.ops_figures`` (every figure from PostgreSQL, no Prometheus): the
page, the fragment it re-fetches every few seconds, and the same figures as JSON
(``data.json``) for scripts. Mounted by ``config.admin_site`` under ``/admin/stint/queues/``,
behind the admin site's ADMIN check; nothing here writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.views.decorators.http import require_GET

from scheduler.admin_dashboard import chart_build
from scheduler.ops_figures import OpsFigures, lag_chart_build, ops_figures

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 5  # how often the page re-reads its figures
QUEUE_PARAM_MAX = 100  # characters of ``?queue=`` (a queue name is at most 100)


def _chart_queue(request: HttpRequest) -> str | None:
    """The queue the charts cover (``?queue=``): None for all; an over-long or odd value is ignored."""
    value = request.GET.get("queue", "").strip()
    if not value or len(value) > QUEUE_PARAM_MAX or "\x00" in value:
        return None
    return value


def _figures(request: HttpRequest) -> OpsFigures | None:
    try:
        return ops_figures(queue=_chart_queue(request))
    except DatabaseError:  # a slow or unreachable database: say so on the page, never a 500
        logger.warning("queue figures: database query failed", exc_info=True)
        return None


def _context(figures: OpsFigures | None) -> dict[str, Any]:
    if figures is None:
        return {"figures": None, "refresh_seconds": REFRESH_SECONDS}
    counts = {m.minute: (m.completed, m.failed) for m in figures.minutes}
    return {
        "figures": figures,
        "throughput": chart_build(now=figures.now, counts=counts),
        "lag": lag_chart_build(figures.minutes),
        "refresh_seconds": REFRESH_SECONDS,
    }


def queues_page(site: Any) -> Callable[[HttpRequest], HttpResponse]:
    """Return the page view (it needs ``site`` for the admin's header, breadcrumbs and sidebar)."""

    @require_GET
    def view(request: HttpRequest) -> HttpResponse:
        """The page: figures rendered now, then refreshed every ``REFRESH_SECONDS`` by the fragment."""
        figures = _figures(request)
        context = {
            **site.each_context(request),
            "title": "Queues and workers",
            **_context(figures),
            "chart_queue": _chart_queue(request) or "",
        }
        return TemplateResponse(request, "admin/stint/queues.html", context, status=200 if figures else 503)

    return view


@require_GET
def queues_live(request: HttpRequest) -> HttpResponse:
    """The live part of the page as an HTML fragment (503 with a short note when the database fails)."""
    figures = _figures(request)
    return TemplateResponse(request, "admin/stint/_queues_live.html", _context(figures), status=200 if figures else 503)


@require_GET
def queues_data(request: HttpRequest) -> JsonResponse:
    """The figures as JSON: ``now``, ``chart_queue``, ``queues``, ``workers``, ``minutes`` (503 on a database error)."""
    figures = _figures(request)
    if figures is None:
        return JsonResponse(
            {"error": {"code": "unavailable", "message": "Database query failed.", "details": None}}, status=503
        )
    return JsonResponse(figures.as_json())
