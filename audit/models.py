"""The audit trail: lifecycle events consumed from Kafka, each stored once."""

from __future__ import annotations

from django.db import models

from core.stored_json import StoredJSONField


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
    payload = StoredJSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "stint_audit_event"
        indexes = [models.Index(fields=["job_id", "sequence"], name="audit_job_sequence")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.job_id} #{self.sequence}"


class QuarantineReason(models.TextChoices):
    """Why the audit consumer set a message aside."""

    MALFORMED = "MALFORMED", "not a lifecycle event"  # not JSON, a field missing, of the wrong type or not Stint's
    REFUSED = "REFUSED", "refused by the database"  # parsed, but PostgreSQL would not store it


class QuarantinedMessage(models.Model):
    """A message of the lifecycle topic that the audit consumer could not parse or store.

    Written instead of an audit row so that one bad message never stops the trail; its offset is
    committed like any other. Unique by (topic, partition, offset): a message delivered again
    after a crash is quarantined once. ``value`` and ``key`` are the raw bytes, cut to
    ``audit.quarantine.MAX_VALUE_BYTES`` and ``MAX_KEY_BYTES``; ``value_size`` is the full length.
    Pruned after ``AUDIT_QUARANTINE_RETENTION_DAYS`` (``audit.quarantine.QuarantinePruner``).
    """

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=255)
    partition = models.IntegerField()
    offset = models.BigIntegerField()
    key = models.BinaryField(null=True, blank=True)
    value = models.BinaryField(null=True, blank=True)
    value_size = models.IntegerField(default=0)  # bytes of the whole value; 0 for a null value
    reason = models.CharField(max_length=16, choices=QuarantineReason.choices)
    error = models.TextField()
    event_id = models.UUIDField(null=True, blank=True)  # when the value parsed
    job_id = models.UUIDField(null=True, blank=True)  # when the value parsed
    received_at = models.DateTimeField()  # the database clock

    class Meta:
        db_table = "stint_audit_quarantine"
        constraints = [
            models.UniqueConstraint(fields=["topic", "partition", "offset"], name="audit_quarantine_message"),
        ]
        indexes = [models.Index(fields=["received_at"], name="audit_quarantine_received")]

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"
