"""Exception classes that name, in a ``TaskResult``'s errors, the attempts that ended without a Python exception."""

from __future__ import annotations

from scheduler.exceptions import PermanentError, RetryableError


class TaskTimedOut(Exception):  # noqa: N818 - reads as the event
    """The attempt overran its ``timeout_seconds`` and the worker gave up on it."""


class TaskLost(Exception):  # noqa: N818
    """The attempt's worker died or stopped renewing its lease; the lease rescuer ended it."""


class TaskCancelled(Exception):  # noqa: N818
    """The attempt stopped because the job's cancellation was requested."""


class TaskExited(RetryableError):  # noqa: N818
    """The task raised SystemExit, KeyboardInterrupt or another BaseException; counted as a failed attempt."""


class TaskResultNotJSON(PermanentError):  # noqa: N818
    """The task returned a value that Django's ``normalize_json`` refuses; the job ends FAILED without a retry."""
