"""The operator console: Django's admin site, open only to active staff users with the ADMIN role.

``StintAdminConfig`` replaces ``django.contrib.admin`` in ``INSTALLED_APPS`` and makes
``StintAdminSite`` the default site (Django's documented way to override ``admin.site``), so
every app keeps registering with ``@admin.register`` unchanged.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest, HttpResponse

from pages.ratelimit import AUTH_SCOPE, rate_limit_hit, too_many_requests


class StintAdminSite(AdminSite):
    """Admin site that also requires ``role == ADMIN``: ``is_staff`` alone (or a superuser flag) is not enough."""

    site_header = "Stint operator console"
    # The model list stays on the index page: beside every list it took 230 px from the columns,
    # and at 1400 px the job list's last columns (owner, attempts, times) were cut off.
    enable_nav_sidebar = False
    site_title = "Stint admin"
    index_title = "Jobs, schedules and users"

    def has_permission(self, request: HttpRequest) -> bool:
        """Return True for an active staff user whose role is ADMIN."""
        from accounts.models import Role

        user = request.user
        return bool(user.is_active and user.is_staff and getattr(user, "role", None) == Role.ADMIN)

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Django's admin sign-in, whose POSTs spend the client address's ``auth`` budget.

        The budget is the one the API's login and register and the pages' sign-in spend
        (``core.throttling``): guessing the ``admin`` password here costs the same as anywhere.
        Spent: the readable 429 page with ``Retry-After``.
        """
        if request.method == "POST":
            decision = rate_limit_hit(request, scope=AUTH_SCOPE)
            if decision is not None and not decision.allowed:
                return too_many_requests(request, decision)
        return super().login(request, extra_context)

    def register(self, model_or_iterable: Any, admin_class: Any = None, **options: Any) -> None:
        """Django's, with the console's input guards (``core.admin_input.GuardedModelAdmin``) mixed in.

        Every admin of the site gets them, Django's user and group admins and third parties'
        included: without them ``?date_joined__gte=...+23:59``, ``?name__regex=[`` or a selected
        id that is not one were 500s on those pages.
        """
        from django.contrib.admin import ModelAdmin

        from core.admin_input import GuardedModelAdmin

        admin_class = admin_class or ModelAdmin
        if not issubclass(admin_class, GuardedModelAdmin):
            admin_class = type(
                admin_class.__name__, (GuardedModelAdmin, admin_class), {"__module__": admin_class.__module__}
            )
        super().register(model_or_iterable, admin_class, **options)

    def get_urls(self) -> list[Any]:
        """Django's admin URLs (its ``r/`` guarded) plus the live queues-and-workers page and its data."""
        from django.urls import path

        from core.admin_input import view_on_site
        from scheduler import admin_ops

        ours = [
            # Django's own route, served by a view that answers an id that is not one with a 404.
            path("r/<path:content_type_id>/<path:object_id>/", self.admin_view(view_on_site), name="view_on_site"),
            path("stint/queues/", self.admin_view(admin_ops.queues_page(self)), name="stint-queues"),
            path("stint/queues/live/", self.admin_view(admin_ops.queues_live), name="stint-queues-live"),
            path("stint/queues/data.json", self.admin_view(admin_ops.queues_data), name="stint-queues-data"),
        ]
        return ours + super().get_urls()

    def password_change(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Django's change-my-password page (it takes the old password): POSTs spend the ``auth`` budget too."""
        if request.method == "POST":
            decision = rate_limit_hit(request, scope=AUTH_SCOPE)
            if decision is not None and not decision.allowed:
                return too_many_requests(request, decision)
        return super().password_change(request, extra_context)


class StintAdminConfig(AdminConfig):
    """``django.contrib.admin`` with ``StintAdminSite`` as ``admin.site``."""

    default_site = "config.admin_site.StintAdminSite"

    def ready(self) -> None:
        """Django's admin autodiscovery; then register the project's deploy checks (``config.checks``).

        The first app of ``INSTALLED_APPS`` and the project's own (``config``): its checks run
        whatever other apps are installed.
        """
        super().ready()
        import config.checks  # noqa: F401 - registers them
