"""Handler-facing errors (DESIGN.md names ``scheduler.errors.PermanentError``)."""

from __future__ import annotations

from scheduler.exceptions import JobCancelled, PermanentError, RetryableError, RetryAfter

__all__ = ["JobCancelled", "PermanentError", "RetryAfter", "RetryableError"]
