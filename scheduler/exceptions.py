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
