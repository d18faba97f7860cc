"""A clock a test moves by hand, for code that takes an injectable ``clock`` (monotonic seconds)."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock the test advances by hand: ``clock()`` reads it, ``clock.advance(s)`` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds
