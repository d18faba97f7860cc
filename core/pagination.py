"""Keyset (cursor) pagination for the API's lists, in DRF's page shape ``{"count", "next", "previous", "results"}``.

A page is the ``page_size`` rows that follow (or, for ``previous``, precede) the row its opaque
``cursor`` names, in a unique order (e.g. ``-created_at, -id``), so a client walking the pages
while rows are inserted or deleted never sees a row twice and never misses one that existed
when it started: the position is a key, not an offset. DRF's ``CursorPagination`` has no
``count`` and keys on the first ordering field alone (an offset breaks its ties); this one keys
on every ordering field and adds ``count`` (of the filtered list, not of the page).

The condition for "after (v1, v2)" in an order ``-f1, -f2`` is ``f1 <= v1 AND (f1 < v1 OR
(f1 = v1 AND f2 < v2))``: the redundant first term lets PostgreSQL start an index scan at the
cursor, so a page costs the same at the millionth row as at the first.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q, QuerySet
from rest_framework import serializers
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from core.query_params import check_known

MAX_PAGE_SIZE = 200
MAX_CURSOR_CHARS = 512  # a cursor holds a few keys; anything longer is not one of ours


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position: the ordering-field values of a boundary row, and whether the page lies before it."""

    values: tuple[Any, ...]
    reverse: bool


def _encode_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


class KeysetPagination(BasePagination):
    """Page by key over ``ordering`` (field names, ``-`` for descending; together unique, e.g. ending in the pk).

    Query parameters: ``cursor`` (opaque, from a ``next``/``previous`` link; a bad one is a 400)
    and ``page_size`` (1 to ``max_page_size``; anything else gets the default, as in DRF).
    Subclasses set ``ordering``; the queryset's own order is replaced by it.
    """

    ordering: Sequence[str] = ("-id",)
    page_size_query_param = "page_size"
    cursor_query_param = "cursor"
    max_page_size = MAX_PAGE_SIZE

    def __init__(self) -> None:
        self.page_size = settings.REST_FRAMEWORK["PAGE_SIZE"]
        self.count = 0
        self.next: str | None = None
        self.previous: str | None = None

    # -- paging -------------------------------------------------------------------------------

    def paginate_queryset(self, queryset: QuerySet, request: Request, view: Any = None) -> list[Any]:
        """Return the page of ``queryset`` the request's cursor names (the first page without one).

        A query parameter that neither this paginator nor the view's filters know is a 400
        naming it (``core.query_params``), never silently ignored.
        """
        check_known(request, view, paging=(self.cursor_query_param, self.page_size_query_param))
        self.request = request
        self.page_size = self._page_size(request)
        cursor = self._decode(request, queryset)
        self.count = queryset.order_by().count()
        reverse = cursor is not None and cursor.reverse
        order = [self._flip(f) for f in self.ordering] if reverse else list(self.ordering)
        page_qs = queryset.order_by(*order)
        if cursor is not None:
            page_qs = page_qs.filter(self._beyond(cursor.values, order))
        rows = list(page_qs[: self.page_size + 1])
        more = len(rows) > self.page_size
        rows = rows[: self.page_size]
        if reverse:
            rows.reverse()
        # Coming back (reverse), the page we came from follows; going forward from a cursor, one precedes.
        has_next = (more and not reverse) or reverse
        has_previous = (more and reverse) or (cursor is not None and not reverse)
        self.next = self._link(rows[-1], reverse=False) if rows and has_next else None
        self.previous = self._link(rows[0], reverse=True) if rows and has_previous else None
        if not rows and cursor is not None:  # walked past the end (or the boundary rows were deleted)
            self.previous = self._link_values(cursor.values, reverse=not cursor.reverse)
        return rows

    def get_paginated_response(self, data: Any) -> Response:
        """Return ``{"count", "next", "previous", "results"}``."""
        return Response({"count": self.count, "next": self.next, "previous": self.previous, "results": data})

    def _page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param, "")
        if not raw.isascii() or not raw.isdigit() or not raw.strip("0"):
            return self.page_size  # as DRF does: a malformed page_size gets the default, not an error
        return self.max_page_size if len(raw.lstrip("0")) > 9 else min(int(raw), self.max_page_size)

    @staticmethod
    def _flip(field: str) -> str:
        return field[1:] if field.startswith("-") else f"-{field}"

    @staticmethod
    def _beyond(values: Sequence[Any], order: Sequence[str]) -> Q:
        """Rows strictly after ``values`` in ``order`` (lexicographic), plus the bound on the first field."""
        names = [f.lstrip("-") for f in order]
        ops = ["lt" if f.startswith("-") else "gt" for f in order]
        after = Q()
        for i in reversed(range(len(order))):
            step = Q(**{f"{names[i]}__{ops[i]}": values[i]})
            after = step if i == len(order) - 1 else step | (Q(**{names[i]: values[i]}) & after)
        return Q(**{f"{names[0]}__{ops[0]}e": values[0]}) & after

    # -- cursors ------------------------------------------------------------------------------

    def _link(self, row: Any, *, reverse: bool) -> str:
        return self._link_values([getattr(row, f.lstrip("-")) for f in self.ordering], reverse=reverse)

    def _link_values(self, values: Sequence[Any], *, reverse: bool) -> str:
        raw = json.dumps({"v": [_encode_value(v) for v in values], "r": int(reverse)}, separators=(",", ":"))
        token = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
        return replace_query_param(self.request.build_absolute_uri(), self.cursor_query_param, token)

    def _decode(self, request: Request, queryset: QuerySet) -> Cursor | None:
        token = request.query_params.get(self.cursor_query_param)
        if token is None:
            return None
        invalid = serializers.ValidationError({self.cursor_query_param: ["Invalid cursor."]})
        if len(token) > MAX_CURSOR_CHARS:
            raise invalid
        try:
            raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            values, reverse = raw["v"], raw["r"]
            if not isinstance(values, list) or len(values) != len(self.ordering) or reverse not in (0, 1):
                raise invalid
            fields = [queryset.model._meta.get_field(f.lstrip("-")) for f in self.ordering]
            parsed = tuple(field.to_python(value) for field, value in zip(fields, values, strict=True))
        except (ValueError, TypeError, KeyError, binascii.Error, DjangoValidationError, OverflowError) as exc:
            raise invalid from exc
        if any(v is None or isinstance(v, dt.datetime) and v.tzinfo is None for v in parsed):
            raise invalid
        try:
            # In UTC: PostgreSQL refuses an offset beyond +-15:59 ("time zone displacement out of range").
            parsed = tuple(v.astimezone(dt.UTC) if isinstance(v, dt.datetime) else v for v in parsed)
        except OverflowError as exc:  # 0001-01-01 with a positive offset is before year 1 in UTC
            raise invalid from exc
        return Cursor(values=parsed, reverse=bool(reverse))

    # -- OpenAPI (drf-spectacular) --------------------------------------------------------------

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """Document ``cursor`` and ``page_size``."""
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "The page after (or before) another: take it from a `next` or `previous` link.",
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param,
                "required": False,
                "in": "query",
                "description": f"Results per page, 1 to {self.max_page_size} (default {self.page_size}).",
                "schema": {"type": "integer"},
            },
        ]

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """Describe ``{"count", "next", "previous", "results"}``."""
        return {
            "type": "object",
            "required": ["count", "next", "previous", "results"],
            "properties": {
                "count": {"type": "integer", "description": "Rows in the whole (filtered) list."},
                "next": {"type": "string", "nullable": True, "format": "uri"},
                "previous": {"type": "string", "nullable": True, "format": "uri"},
                "results": schema,
            },
        }
