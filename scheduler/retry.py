"""Pure backoff arithmetic for retries."""

from __future__ import annotations

import random


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
