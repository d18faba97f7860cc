"""Refuse query parameters a list endpoint does not know, or cannot read as sent, instead of silently ignoring them.

A misspelt or unsupported filter (``?statuss=DEAD``, ``?owner=`` on a USER's list) would
otherwise answer the whole, unfiltered list: a client could not tell "no such filter" from "everything
matches". Every list of the API pages by key (``core.pagination.KeysetPagination``), which
calls ``check_known`` first, so the rule holds for every list without a line in any view.

A parameter given more than once is refused too, unless its filter takes several values (the
jobs' ``status``): QueryDict would read its last value alone (``enabled=true&enabled=false``
would list the disabled schedules), dropping the others silently.

A value whose bytes are not UTF-8 (a lone surrogate's ``%ED%A0%80``, Latin-1's ``%E9``) is
read by Django as U+FFFD: a filter would then match text the client did not send, so it is
refused too. ``core.failsafe`` refuses NUL before any view.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

from django import forms
from rest_framework import serializers
from rest_framework.request import Request

UNKNOWN_MESSAGE = "Unknown query parameter."
TAKES_NONE = "This endpoint takes none."  # a read that neither pages nor filters (the limits list): not "Known: ."
REPEATED_MESSAGE = "Given {count} times; this parameter takes one value."
NOT_UTF8_MESSAGE = "Not UTF-8 text (a lone surrogate's bytes, or another encoding's), so it cannot match as sent."


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
    (``"... This endpoint takes none."`` when ``view`` knows none)
    and its message starts with the first unknown name (``core.errors``). Does nothing when
    ``view`` is None (a paginator used outside a view).
    """
    if view is None:
        return
    known = known_query_params(view, paging=paging)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        hint = f"{UNKNOWN_MESSAGE} Known: {', '.join(sorted(known))}." if known else f"{UNKNOWN_MESSAGE} {TAKES_NONE}"
        raise serializers.ValidationError({name[:100]: [hint] for name in unknown})
    multiple = multi_valued_query_params(view)
    repeated = {
        name: len(values) for name, values in request.query_params.lists() if len(values) > 1 and name not in multiple
    }
    if repeated:
        raise serializers.ValidationError(
            {name[:100]: [REPEATED_MESSAGE.format(count=count)] for name, count in sorted(repeated.items())}
        )
    unreadable = not_utf8_query_params(request)
    if unreadable:
        raise serializers.ValidationError({name[:100]: [NOT_UTF8_MESSAGE] for name in unreadable})


def multi_valued_query_params(view: Any) -> frozenset[str]:
    """Return the names of ``view``'s filters that take several values (a ``MultipleChoiceField``: ``status``)."""
    filterset = getattr(view, "filterset_class", None)
    if filterset is None or not view.filter_backends:
        return frozenset()
    return frozenset(
        name
        for name, declared in filterset.base_filters.items()
        if issubclass(declared.field_class, forms.MultipleChoiceField)
    )


def not_utf8_query_params(request: Any) -> list[str]:
    """Return the names (as Django reads them) of the query parameters whose name or value is not UTF-8.

    Reads the raw query string (``QUERY_STRING``: the bytes as Latin-1 text, under WSGI and in
    Django's test client), percent-decoded pair by pair, as ``QueryDict`` splits it.
    """
    try:
        raw = request.META.get("QUERY_STRING", "").encode("iso-8859-1")
    except UnicodeEncodeError:  # a server that passed decoded text: nothing was replaced
        return []
    names = []
    for pair in raw.split(b"&"):
        name, _, value = (unquote_to_bytes(part.replace(b"+", b" ")) for part in pair.partition(b"="))
        try:
            name.decode("utf-8")
            value.decode("utf-8")
        except UnicodeDecodeError:
            names.append(name.decode("utf-8", "replace"))
    return names
