"""Hostile query strings, selections and object ids in the operator console: a message or the admin's 400, never a 500.

``GuardedModelAdmin`` holds the console's guards; ``config.admin_site.StintAdminSite`` mixes it
into every admin registered on the site (Django's users and groups, simplejwt's tokens, Stint's
own), so a page added by any app gets them too.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import DataError, transaction
from django.db.models import BinaryField, DateTimeField
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict

from core.parsers import is_storable_text


def utc_datetime_filters(model: Any, query: QueryDict) -> QueryDict:
    """Return ``query`` with every value of a filter on a ``DateTimeField`` of ``model`` that has an offset in UTC.

    ``?created_at__gte=2030-01-01T00:00:00+23:00`` is a time Python and Django accept, but
    PostgreSQL refuses offsets beyond +-15:59 ("time zone displacement out of range", a 500 once
    the list counts). A value that is not such a time (``__isnull=True``, a year, nonsense) is
    left for Django's own checks. ``query`` is not changed; the copy is mutable.
    """
    fixed = query.copy()
    for key, values in query.lists():
        try:
            field = model._meta.get_field(key.split("__", 1)[0])
        except FieldDoesNotExist:
            continue
        if not isinstance(field, DateTimeField):
            continue
        utc = []
        for value in values:
            try:
                parsed = field.to_python(value)
                if isinstance(parsed, dt.datetime) and parsed.tzinfo is not None:
                    value = parsed.astimezone(dt.UTC).isoformat()
            except (ValidationError, OverflowError):  # Django reports it, or PostgreSQL takes it as it is
                pass
            utc.append(value)
        fixed.setlist(key, utc)
    return fixed


def _field(model: Any, name: str) -> Any:
    try:
        return model._meta.get_field(name)
    except FieldDoesNotExist:
        return None


class GuardedModelAdmin(admin.ModelAdmin):
    """A ``ModelAdmin`` whose list, actions and object pages answer hostile input without a 500."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Django's list, but an action POSTed with a selected id that is not one (a 500 in Django) is refused.

        So is one PostgreSQL's text cannot hold (a NUL or a lone surrogate in a multipart form,
        which ``core.failsafe`` does not read). The operator sees an error message on the list
        again, and nothing is changed.
        """
        if request.method == "POST" and "action" in request.POST:
            pk = self.model._meta.pk
            try:
                for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                    if not is_storable_text(value):
                        raise ValidationError("not storable")
                    pk.to_python(value)
            except ValidationError:
                self.message_user(request, "The selection holds an id that is not one: nothing done.", messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
        return super().changelist_view(request, extra_context)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """Django's, on the query string with its times in UTC (``utc_datetime_filters``).

        A lookup value that passes Django's checks but fails when the list counts its rows is
        ``IncorrectLookupParameters`` here, the admin's answer to a bad filter (the list again with
        ``?e=1``), never a 500: a year outside 1..9999 (``?created_at__year=-1``, ``__iso_year``,
        ``__date__year``, ``__year__gt``), of which Django builds a ``datetime`` (``ValueError``,
        ``OverflowError``), or a value PostgreSQL refuses (``DataError``: ``?name__regex=(``). The
        count runs in a savepoint, so a refused one leaves an enclosing transaction usable. So is a
        lookup on a ``BinaryField`` other than ``__isnull`` (``?key__exact=abc``): the query string's
        text reached psycopg as a value for a bytea parameter (a TypeError, a 500).
        """
        for key in request.GET:
            name, _, lookup = key.partition("__")
            if isinstance(_field(self.model, name), BinaryField) and lookup != "isnull":
                raise IncorrectLookupParameters(f"{name} holds raw bytes: filter it only with __isnull")
        request.GET = utc_datetime_filters(self.model, request.GET)
        try:
            with transaction.atomic():
                return super().get_changelist_instance(request)
        except (ValueError, OverflowError, DataError) as exc:
            raise IncorrectLookupParameters(exc) from exc

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        """Django's, but an id PostgreSQL's text cannot hold (a NUL, a lone surrogate) is no object.

        Such an id in a URL (``/admin/scheduler/queue/%00/change/``) would reach the database as a
        text primary key and fail there (a 500); it gets the admin's answer to an unknown id instead.
        """
        if isinstance(object_id, str) and not is_storable_text(object_id):
            return None
        return super().get_object(request, object_id, from_field)


def view_on_site(request: HttpRequest, content_type_id: str, object_id: str) -> HttpResponse:
    """Django's ``contenttypes.views.shortcut`` (the console's ``r/<type>/<id>/``), but an id that is not one is a 404.

    Django turns ``ValueError`` into its 404 but not the ``ValidationError`` of a key that is no
    UUID (``/admin/r/<job type>/1/``), and sends a NUL in a text key to PostgreSQL: both were 500s.
    """
    from django.contrib.contenttypes.views import shortcut

    if not is_storable_text(object_id):
        raise Http404("No such object.")
    try:
        return shortcut(request, content_type_id, object_id)
    except ValidationError:
        raise Http404("No such object.") from None
