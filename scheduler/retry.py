"""Pure retry rules: the attempt budget, the retry-or-dead-letter decision, and backoff arithmetic."""

from __future__ import annotations

import decimal
import math
import numbers
import random

from scheduler.states import JobStatus

# The longest backoff base or cap a job type or the settings may give: a delay PostgreSQL can add
# to now() (1e15 s is "timestamp out of range", which failed every rescue batch holding such a job).
MAX_BACKOFF_SECONDS = 7 * 24 * 3600  # seconds


def is_backoff_seconds(value: object) -> bool:
    """Return whether ``value`` may be a backoff base or cap, in seconds.

    It must be an int or float (not a bool) from 0 to ``MAX_BACKOFF_SECONDS``; NaN and infinities
    are refused (a NaN delay is "interval out of range" in PostgreSQL). Used by ``@handler`` and the
    Django Tasks backend's ``OPTIONS`` check; the settings bound theirs alike (config/settings.py).
    """
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_BACKOFF_SECONDS
    )


# The name a class was created with, read past a metaclass (whose ``__name__`` may be a property that raises).
_class_name = type.__dict__["__name__"].__get__


def asked_delay(value: object) -> tuple[float | None, str]:
    """Read the delay a handler asked for (``RetryAfter.delay_seconds``): ``(seconds, note)`` or ``(None, why)``.

    Taken: an ``int`` or ``float`` (not a ``bool``), read through the base type, so that a subclass
    is the value it holds and none of its methods runs; or another real number (``numbers.Real``,
    ``decimal.Decimal``: NumPy's int64, a ``Fraction``) through ``float()``, which runs its code.
    A finite number below 0 is 0 (at once: a reset time that has passed) and one above
    ``MAX_BACKOFF_SECONDS`` (a week) is that week, ``note`` saying so (it is "" for a delay taken as
    asked). Refused, ``seconds`` None and ``why`` a phrase that follows "its delay": NaN, an infinity,
    any other type, a number whose conversion raises (anything, ``SystemExit`` included). The
    caller applies the job type's backoff then. Call it where the handler ran (its slot thread or
    pool child): a hostile ``float()`` that never returns then holds the handler's slot alone,
    until the job's timeout, as the handler itself could.
    """
    try:
        kind = type(value)
        if issubclass(kind, bool) or not issubclass(kind, numbers.Real | decimal.Decimal):
            return None, f"is of type {_class_name(kind)}, not a number of seconds"
        if issubclass(kind, int):
            # The value it holds (a subclass's own __int__ is not called), brought within a float's
            # range first (10**400 has none) and judged by the bounds below with the floats.
            seconds = float(min(max(int.__int__(value), -1), MAX_BACKOFF_SECONDS + 1))
        else:
            seconds = float.__float__(value) if issubclass(kind, float) else float.__float__(float(value))
    except BaseException as failure:  # noqa: BLE001 - a handler's number may raise anything, even SystemExit
        return None, f"could not be read as a number ({_class_name(type(failure))})"
    if math.isnan(seconds):
        return None, "is NaN"
    if math.isinf(seconds):
        return None, "is infinite"
    if seconds <= 0:  # -0.0 too
        return 0.0, "it asked for a negative delay" if seconds < 0 else ""
    if seconds > MAX_BACKOFF_SECONDS:
        return float(MAX_BACKOFF_SECONDS), f"it asked for more than {MAX_BACKOFF_SECONDS} s"
    return seconds, ""


def backoff(attempt: int, *, base: float, cap: float, jitter: bool = False, rng: random.Random | None = None) -> float:
    """Return the delay in seconds before retry number ``attempt`` (1 for the first retry).

    ``delay = min(base * 2**(attempt-1), cap)``; with ``jitter`` the delay is drawn uniformly
    from [0, delay] ("full jitter", AWS Architecture Blog, "Exponential Backoff And Jitter",
    2015). Raises ValueError when ``attempt`` < 1 or ``base``/``cap`` are negative.
    """
    if attempt < 1:
        raise ValueError("attempt must be >= 1")
    if base < 0 or cap < 0:
        raise ValueError("base and cap must be >= 0")
    # 2**62 already exceeds any sane cap; avoid float overflow for huge attempt numbers.
    delay = min(base * (2 ** min(attempt - 1, 62)), cap)
    if jitter:
        delay = (rng or random).uniform(0, delay)  # noqa: S311 - not cryptographic
    return delay


def attempts_left(*, attempts: int, attempts_base: int, max_retries: int) -> int:
    """Return how many attempts remain after ``attempts`` in the current budget of 1 + ``max_retries``.

    ``attempts`` counts every attempt the job ever made; ``attempts_base`` is where the current
    budget began (a recovery or manual retry gives a fresh one; a hand-back moves it up, so a
    handed-back attempt costs nothing). DESIGN.md: a job makes at most 1 + max_retries attempts
    per budget. Never negative.
    """
    return max(0, 1 + max_retries - (attempts - attempts_base))


def after_failed_attempt(*, attempts_left: int, cancel_requested: bool = False, handed_back: bool = False) -> JobStatus:
    """Decide a job's next status after an attempt that failed, was lost or was handed back.

    CANCELLED when its cancellation was requested; RETRYING for a handed-back attempt (a
    stopping worker gave it up: it costs nothing) or while the budget has ``attempts_left``;
    DEAD (dead-lettered) otherwise. DESIGN.md's RUNNING -> RETRYING / DEAD / CANCELLED moves
    (River's ``makeRetryDecision``). The one rule for the worker's outcomes (``leasing``) and
    the lease rescuer.
    """
    if cancel_requested:
        return JobStatus.CANCELLED
    return JobStatus.RETRYING if handed_back or attempts_left > 0 else JobStatus.DEAD
