"""Tables of flow control: limits set through the API or console, and the rate limits' admission log and pacing state.

Imported by ``scheduler.models`` so Django sees them as models of the ``scheduler`` app.
"""

from __future__ import annotations

from django.db import models


class LimitScope(models.TextChoices):
    """What a limit counts: the jobs of one queue, or of one job type."""

    QUEUE = "queue"
    TYPE = "type"


class FlowLimit(models.Model):
    """A concurrency and/or rate limit on a queue or a job type, set by an ADMIN (API or console).

    A row here wins over the same (scope, name) in ``SCHEDULER["FLOW_LIMITS"]`` and over a
    handler's own ``@handler(concurrency=..., rate_limit=...)``.
    """

    scope = models.CharField(max_length=10, choices=LimitScope.choices)
    name = models.CharField(max_length=100)
    # At most this many RUNNING at once across every worker (None: no global cap).
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    # A payload field; at most ``partition_concurrency`` RUNNING per distinct value of it.
    partition_key = models.CharField(max_length=100, null=True, blank=True)
    partition_concurrency = models.PositiveIntegerField(null=True, blank=True)
    # At most ``rate_limit`` claims in any window of ``rate_period_seconds`` (sliding window).
    rate_limit = models.PositiveIntegerField(null=True, blank=True)
    rate_period_seconds = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "stint_flow_limit"
        constraints = [models.UniqueConstraint(fields=["scope", "name"], name="flow_limit_unique_scope_name")]

    def __str__(self) -> str:
        return f"{self.scope} {self.name}"


class FlowAdmission(models.Model):
    """One claim a rate limit admitted (the sliding window's log); pruned past the window by each claim.

    ``key`` is ``"<scope>:<name>"``; rows older than the limit's period are deleted by the next
    claim under that limit and, for limits since removed, by ``run_scheduler``'s pruner.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=120)
    admitted_at = models.DateTimeField()

    class Meta:
        db_table = "stint_flow_admission"
        indexes = [models.Index(fields=["key", "admitted_at"], name="flow_admission_window")]

    def __str__(self) -> str:
        return f"{self.key}@{self.admitted_at}"


class FlowPace(models.Model):
    """A rate limit's pacing state (GCRA's theoretical arrival time): when its next claim is due.

    Claims under a rate limit are spaced ``rate_period_seconds / rate_limit`` apart, with a
    catch-up of a few (``flow.claim.burst``) after a late poll; the admission log still caps every
    window at ``rate_limit``. One row per rate-limited key, written under the limit's lock.
    """

    key = models.CharField(max_length=120, primary_key=True)
    tat = models.DateTimeField()

    class Meta:
        db_table = "stint_flow_pace"

    def __str__(self) -> str:
        return f"{self.key} next at {self.tat}"
