"""App config for the audit trail."""

from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """Audit events consumed from Kafka."""

    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"
