"""App config for user accounts."""

from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Users with a USER/ADMIN role and the JWT auth endpoints."""

    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
