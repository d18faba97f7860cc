"""App config for the audit trail."""

from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """Audit events consumed from Kafka."""

    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Have ``run_scheduler`` prune the quarantine (``audit.quarantine.QuarantinePruner``)."""
        from audit.quarantine import QuarantinePruner
        from scheduler.maintenance import register_service

        register_service(QuarantinePruner)
