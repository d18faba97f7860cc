"""The API's schema and docs pages (drf-spectacular's views), whose errors are JSON like the rest of /api/."""

from __future__ import annotations

from typing import Any

from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response


class JsonErrorsMixin:
    """Render an error response (status 400 or more) with ``JSONRenderer``, whatever renderer was negotiated.

    The docs page renders HTML through a template that has no error page, so its 405 or 429 was the
    plain text "405 Method Not Allowed", and the schema's errors were YAML (its default renderer);
    DESIGN.md: errors under /api/ are ``{"error": {...}}`` JSON.
    """

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        """Switch an error ``Response`` to JSON before DRF renders it."""
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


class SchemaView(JsonErrorsMixin, SpectacularAPIView):
    """GET /api/schema/: the OpenAPI document (YAML, or JSON by ``Accept`` or ``?format=json``)."""


class DocsView(JsonErrorsMixin, SpectacularSwaggerView):
    """GET /api/docs/: Swagger UI on the schema."""
