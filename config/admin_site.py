"""The operator console: Django's admin site, open only to active staff users with the ADMIN role.

``StintAdminConfig`` replaces ``django.contrib.admin`` in ``INSTALLED_APPS`` and makes
``StintAdminSite`` the default site (Django's documented way to override ``admin.site``), so
every app keeps registering with ``@admin.register`` unchanged.
"""

from __future__ import annotations

from django.contrib.admin import AdminSite
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest


class StintAdminSite(AdminSite):
    """Admin site that also requires ``role == ADMIN``: ``is_staff`` alone (or a superuser flag) is not enough."""

    site_header = "Stint operator console"
    site_title = "Stint admin"
    index_title = "Jobs, schedules and users"

    def has_permission(self, request: HttpRequest) -> bool:
        """Return True for an active staff user whose role is ADMIN."""
        from accounts.models import Role

        user = request.user
        return bool(user.is_active and user.is_staff and getattr(user, "role", None) == Role.ADMIN)


class StintAdminConfig(AdminConfig):
    """``django.contrib.admin`` with ``StintAdminSite`` as ``admin.site``."""

    default_site = "config.admin_site.StintAdminSite"
