"""The audit trail: lifecycle events consumed from Kafka, each stored once."""

from __future__ import annotations

from django.db import models


class AuditEvent(models.Model):
    """One lifecycle event as received from ``job-lifecycle-events`` (unique ``event_id``)."""

    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(unique=True)
    job_id = models.UUIDField()
    event_type = models.CharField(max_length=32)
    owner_id = models.BigIntegerField(null=True, blank=True)
    sequence = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(default=0)
    from_status = models.CharField(max_length=10, blank=True, default="")
    to_status = models.CharField(max_length=10, blank=True, default="")
    schema_version = models.PositiveSmallIntegerField(default=1)
    payload = models.JSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "stint_audit_event"
        indexes = [models.Index(fields=["job_id", "sequence"], name="audit_job_sequence")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.job_id} #{self.sequence}"
