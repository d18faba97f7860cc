"""Refuse query parameters a list endpoint does not know, instead of silently ignoring them.

A misspelt or unsupported filter (``?statuss=DEAD``, ``?owner=`` on a USER's list) would
otherwise answer the whole, unfiltered list: a client could not tell "no such filter" from "everything
matches". Every list of the API pages by key (``core.pagination.KeysetPagination``), which
calls ``check_known`` first, so the rule holds for every list without a line in any view.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework import serializers
from rest_framework.request import Request

UNKNOWN_MESSAGE = "Unknown query parameter."


def known_query_params(view: Any, *, paging: Iterable[str]) -> frozenset[str]:
    """Return the query parameter names ``view`` reads: ``paging`` ones, its filterset's, its ``extra_query_params``.

    ``view`` is a DRF view; its filters come from django-filter's ``filterset_class`` (the same
    declaration that documents them in the OpenAPI schema), so the accepted set cannot drift
    from the documented one.
    """
    names = set(paging)
    filterset = getattr(view, "filterset_class", None)
    if filterset is not None and view.filter_backends:
        names.update(filterset.base_filters)
    names.update(getattr(view, "extra_query_params", ()))
    return frozenset(names)


def check_known(request: Request, view: Any, *, paging: Iterable[str]) -> None:
    """Raise a DRF ``ValidationError`` (400) naming each query parameter ``view`` does not know.

    The error's ``details`` map each unknown name to ``["Unknown query parameter. Known: a, b."]``
    and its message starts with the first unknown name (``core.errors``). Does nothing when
    ``view`` is None (a paginator used outside a view).
    """
    if view is None:
        return
    known = known_query_params(view, paging=paging)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        hint = f"{UNKNOWN_MESSAGE} Known: {', '.join(sorted(known))}."
        raise serializers.ValidationError({name[:100]: [hint] for name in unknown})
