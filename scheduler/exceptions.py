"""Domain errors of the job system; the API maps each to its status code and error code."""

from __future__ import annotations

from typing import Any


class StintError(Exception):
    """A request could not be carried out."""

    http_status = 400
    code = "error"

    def __init__(self, message: str | None = None, *, details: Any = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip().splitlines()[0])
        self.details = details


class IllegalTransition(StintError):  # noqa: N818 - the domain's name for it
    """The job's current state does not allow this action."""

    http_status = 409
    code = "invalid_state"


class JobNotFound(StintError):  # noqa: N818
    """No such job."""

    http_status = 404
    code = "not_found"


class NoResult(StintError):  # noqa: N818
    """The job has no result yet."""

    http_status = 404
    code = "no_result"


class IdempotencyConflict(StintError):  # noqa: N818
    """This Idempotency-Key was already used with a different request body."""

    http_status = 409
    code = "idempotency_conflict"


class PayloadTooLarge(StintError):  # noqa: N818
    """The job payload is larger than the limit."""

    http_status = 413
    code = "payload_too_large"


class UnknownJobType(StintError):  # noqa: N818
    """No handler is registered for this job type."""

    http_status = 400
    code = "validation_error"


class InvalidJob(StintError):  # noqa: N818
    """The job's fields are not valid."""

    http_status = 400
    code = "validation_error"


class RetryableError(Exception):
    """A handler failed in a way that may succeed later; the job is retried with backoff."""


class RetryAfter(RetryableError):  # noqa: N818 - named for HTTP's Retry-After, the delay it usually passes on
    """A handler asked to be retried after a delay of its choosing, in seconds, instead of the job type's backoff.

    ``raise RetryAfter(30, "the API answered 429")``: the attempt ends like any retryable error (it
    spends an attempt; with none left the job is DEAD) but the job is due ``delay_seconds`` after
    the outcome is written. The worker reads the delay where the handler ran, with
    ``retry.asked_delay``: a finite number is clamped to 0 .. ``retry.MAX_BACKOFF_SECONDS`` (a
    week); anything else (a string, NaN, an attribute that raises) leaves the job type's backoff in
    force, and the attempt's error says why. The idea is Celery's ``self.retry(countdown=...)``,
    Huey's ``RetryTask(delay=...)`` and Sidekiq's ``sidekiq_retry_in``; the name is HTTP's
    ``Retry-After`` header (RFC 9110, section 10.2.3), in its delay-seconds form.
    """

    def __init__(self, delay_seconds: float, message: str = "") -> None:
        super().__init__(*([message] if message else []))
        self.delay_seconds = delay_seconds


class PermanentError(Exception):
    """A handler failed in a way that will not succeed on retry; the job ends FAILED."""


class JobCancelled(Exception):  # noqa: N818
    """A handler stopped because its job's cancellation was requested."""


class InvalidSchedule(StintError):  # noqa: N818
    """The schedule's fields are not valid."""

    http_status = 400
    code = "validation_error"


class ScheduleNotFound(StintError):  # noqa: N818
    """No such schedule."""

    http_status = 404
    code = "not_found"


class InvalidQueue(StintError):  # noqa: N818
    """The queue name is not valid."""

    http_status = 400
    code = "validation_error"


class InvalidLimit(StintError):  # noqa: N818
    """The flow limit is not valid."""

    http_status = 400
    code = "validation_error"


class InvalidUnique(StintError):  # noqa: N818
    """The unique-job options are not valid."""

    http_status = 400
    code = "validation_error"


class UniqueConflict(StintError):  # noqa: N818
    """A live job with the same unique content exists; this one cannot run again until that one ends."""

    http_status = 409
    code = "unique_conflict"
