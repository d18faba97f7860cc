"""scheduler.retry: the backoff formula of DESIGN.md (cap, full jitter), the attempt budget, the retry decision."""

from __future__ import annotations

import datetime as dt
import math
import random
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.retry import MAX_BACKOFF_SECONDS, after_failed_attempt, asked_delay, attempts_left, backoff
from scheduler.states import JobStatus


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (6, 30.0), (7, 30.0), (50, 30.0)],
)
def test_backoff_doubles_from_base_up_to_the_cap(attempt: int, expected: float) -> None:
    assert backoff(attempt, base=1.0, cap=30.0) == expected


def test_backoff_scales_with_base() -> None:
    assert [backoff(n, base=0.5, cap=100.0) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]


def test_backoff_with_zero_base_or_cap_is_immediate() -> None:
    assert backoff(3, base=0.0, cap=30.0) == 0.0
    assert backoff(3, base=1.0, cap=0.0) == 0.0


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert backoff(10_000, base=1.0, cap=30.0) == 30.0
    assert backoff(10_000, base=1.0, cap=30.0, jitter=True, rng=random.Random(1)) <= 30.0


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempt_numbers_start_at_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt"):
        backoff(attempt, base=1.0, cap=30.0)


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 30.0), (1.0, -1.0)])
def test_negative_base_or_cap_is_rejected(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="base and cap"):
        backoff(1, base=base, cap=cap)


@given(
    attempt=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0, max_value=60, allow_nan=False),
    cap=st.floats(min_value=0, max_value=3600, allow_nan=False),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_full_jitter_stays_within_zero_and_the_plain_delay(attempt: int, base: float, cap: float, seed: int) -> None:
    plain = backoff(attempt, base=base, cap=cap)
    jittered = backoff(attempt, base=base, cap=cap, jitter=True, rng=random.Random(seed))
    assert 0.0 <= jittered <= plain <= cap


def test_full_jitter_spreads_over_the_whole_interval() -> None:
    rng = random.Random(42)
    draws = [backoff(4, base=1.0, cap=30.0, jitter=True, rng=rng) for _ in range(2000)]
    assert all(0.0 <= d <= 8.0 for d in draws)
    # Full jitter, not "equal jitter": draws reach both the bottom and the top quarter of [0, 8].
    assert min(draws) < 2.0
    assert max(draws) > 6.0
    assert len(set(draws)) > 1900


def test_jitter_without_an_rng_uses_the_module_random() -> None:
    draws = {backoff(3, base=1.0, cap=30.0, jitter=True) for _ in range(50)}
    assert all(0.0 <= d <= 4.0 for d in draws)
    assert len(draws) > 1


@pytest.mark.parametrize(
    "attempts,base,max_retries,left",
    [(0, 0, 3, 4), (1, 0, 3, 3), (4, 0, 3, 0), (9, 0, 3, 0), (5, 4, 3, 3), (1, 0, 0, 0)],
)
def test_the_attempt_budget_is_one_plus_max_retries_from_its_base(attempts, base, max_retries, left):
    assert attempts_left(attempts=attempts, attempts_base=base, max_retries=max_retries) == left


@pytest.mark.parametrize(
    "left,cancel,expected",
    [
        (1, False, JobStatus.RETRYING),
        (0, False, JobStatus.DEAD),
        (1, True, JobStatus.CANCELLED),
        (0, True, JobStatus.CANCELLED),
    ],
)
def test_a_failed_or_lost_attempt_is_retried_dead_lettered_or_cancelled(left, cancel, expected):
    assert after_failed_attempt(attempts_left=left, cancel_requested=cancel) == expected


@pytest.mark.parametrize(
    "left,cancel,expected",
    [
        (1, False, JobStatus.RETRYING),
        (0, False, JobStatus.RETRYING),  # a handed-back attempt costs nothing, even the last one
        (0, True, JobStatus.CANCELLED),
    ],
)
def test_a_handed_back_attempt_is_retried_unless_cancelled(left, cancel, expected):
    assert after_failed_attempt(attempts_left=left, cancel_requested=cancel, handed_back=True) == expected


# -- the delay a handler asks for (RetryAfter) -------------------------------------------------


class _FloatWhoseMethodsRaise(float):
    """A float subclass none of whose methods may run: each raises ``SystemExit``."""

    def __float__(self) -> float:
        raise SystemExit("__float__")

    def __lt__(self, other: object) -> bool:
        raise SystemExit("__lt__")

    def __gt__(self, other: object) -> bool:
        raise SystemExit("__gt__")

    def __format__(self, spec: str) -> str:
        raise SystemExit("__format__")


class _IntWhoseMethodsRaise(int):
    def __int__(self) -> int:
        raise SystemExit("__int__")

    def __index__(self) -> int:
        raise SystemExit("__index__")

    def __lt__(self, other: object) -> bool:
        raise SystemExit("__lt__")


class _FractionWhoseFloatRaises(Fraction):
    def __float__(self) -> float:
        raise SystemExit("__float__")


class _ClassOfItsOwn:
    @property  # read by isinstance() when the type alone does not answer
    def __class__(self) -> type:
        raise SystemExit("__class__")


@pytest.mark.parametrize(
    ("asked", "seconds"),
    [
        (2, 2.0),
        (0.25, 0.25),
        (0, 0.0),
        (-0.0, 0.0),
        (MAX_BACKOFF_SECONDS, float(MAX_BACKOFF_SECONDS)),
        (_FloatWhoseMethodsRaise(2.5), 2.5),  # read as the value it holds; none of its methods runs
        (_IntWhoseMethodsRaise(7), 7.0),
        (Fraction(3, 2), 1.5),  # another real number, through float()
        (Decimal("1.5"), 1.5),
    ],
)
def test_a_number_of_seconds_from_zero_to_a_week_is_taken_as_asked(asked: object, seconds: float) -> None:
    taken, note = asked_delay(asked)

    assert (taken, type(taken), note) == (seconds, float, "")


@pytest.mark.parametrize(
    ("asked", "seconds", "note"),
    [
        (-5, 0.0, "it asked for a negative delay"),
        (-1e-9, 0.0, "it asked for a negative delay"),
        (_FloatWhoseMethodsRaise(-3.0), 0.0, "it asked for a negative delay"),
        (MAX_BACKOFF_SECONDS + 1, float(MAX_BACKOFF_SECONDS), f"it asked for more than {MAX_BACKOFF_SECONDS} s"),
        (1e300, float(MAX_BACKOFF_SECONDS), f"it asked for more than {MAX_BACKOFF_SECONDS} s"),
        pytest.param(
            10**5000, float(MAX_BACKOFF_SECONDS), f"it asked for more than {MAX_BACKOFF_SECONDS} s", id="10**5000"
        ),
    ],
)
def test_a_finite_delay_out_of_range_is_clamped_and_says_so(asked: object, seconds: float, note: str) -> None:
    assert asked_delay(asked) == (seconds, note)


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        ("5", "is of type str, not a number of seconds"),
        (None, "is of type NoneType, not a number of seconds"),
        (True, "is of type bool, not a number of seconds"),
        (dt.timedelta(seconds=5), "is of type timedelta, not a number of seconds"),
        (object(), "is of type object, not a number of seconds"),
        (math.nan, "is NaN"),
        (math.inf, "is infinite"),
        (-math.inf, "is infinite"),
        (_FloatWhoseMethodsRaise(math.nan), "is NaN"),
        (_FractionWhoseFloatRaises(1, 2), "could not be read as a number (SystemExit)"),
        pytest.param(Fraction(10**400, 3), "could not be read as a number (OverflowError)", id="10**400/3"),
        pytest.param(_ClassOfItsOwn(), "is of type _ClassOfItsOwn, not a number of seconds", id="__class__ raises"),
    ],
)
def test_a_delay_that_is_not_a_finite_number_is_refused_with_the_reason(asked: object, why: str) -> None:
    assert asked_delay(asked) == (None, why)
