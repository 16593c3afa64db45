"""backoff_delay: exponential steps, jitter bounds, the retry-after floor and the caps."""

from __future__ import annotations

import random

import pytest

from app.engine.llm.retry import MAX_RETRY_AFTER_SECONDS, backoff_delay


class Fixed(random.Random):
    """A Random whose draw is fixed, to pin the ends of the jitter range."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(("attempt", "step"), [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (10, 30.0)])
def test_equal_jitter_stays_within_half_to_full_step(attempt: int, step: float) -> None:
    low = backoff_delay(attempt, base=0.5, cap=30.0, retry_after=None, rng=Fixed(0.0))
    high = backoff_delay(attempt, base=0.5, cap=30.0, retry_after=None, rng=Fixed(0.999999))
    assert low == pytest.approx(step / 2)
    assert high == pytest.approx(step, rel=1e-5)


def test_full_jitter_spans_zero_to_step() -> None:
    rng = random.Random(7)
    draws = [
        backoff_delay(2, base=1.0, cap=30.0, retry_after=None, rng=rng, jitter="full")
        for _ in range(500)
    ]
    assert all(0.0 <= d <= 4.0 for d in draws)
    assert min(draws) < 0.5  # really spread, not a constant
    assert max(draws) > 3.5


def test_jitter_varies_and_is_reproducible_with_a_seed() -> None:
    first = [
        backoff_delay(3, base=1.0, cap=30.0, retry_after=None, rng=random.Random(1))
        for _ in range(3)
    ]
    again = [
        backoff_delay(3, base=1.0, cap=30.0, retry_after=None, rng=random.Random(1))
        for _ in range(3)
    ]
    assert first == again
    rng = random.Random(2)
    spread = {backoff_delay(3, base=1.0, cap=30.0, retry_after=None, rng=rng) for _ in range(50)}
    assert len(spread) > 40
    assert all(4.0 <= d <= 8.0 for d in spread)


def test_cap_bounds_huge_attempts_without_overflow() -> None:
    for attempt in (20, 1_000, 10**9):
        assert backoff_delay(attempt, base=0.5, cap=8.0, retry_after=None) <= 8.0
    assert backoff_delay(-3, base=0.5, cap=8.0, retry_after=None, rng=Fixed(0.0)) == 0.25


def test_retry_after_is_a_floor_with_a_little_spread() -> None:
    for seed in range(50):
        delay = backoff_delay(0, base=0.5, cap=30.0, retry_after=7.0, rng=random.Random(seed))
        assert 7.0 <= delay <= 7.7


def test_retry_after_longer_than_cap_still_wins_up_to_the_sane_maximum() -> None:
    assert backoff_delay(0, base=0.5, cap=2.0, retry_after=20.0, rng=Fixed(0.0)) == 20.0
    assert backoff_delay(0, base=0.5, cap=2.0, retry_after=3600.0) == MAX_RETRY_AFTER_SECONDS


def test_exponential_above_retry_after_is_kept() -> None:
    delay = backoff_delay(4, base=1.0, cap=30.0, retry_after=1.0, rng=Fixed(0.0))
    assert delay == 8.0  # half of the 16 s step, well above the 1 s floor


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf")])
def test_meaningless_retry_after_is_ignored(bad: float) -> None:
    assert backoff_delay(0, base=0.5, cap=30.0, retry_after=bad, rng=Fixed(0.0)) == 0.25


def test_zero_base_gives_zero_delay() -> None:
    assert backoff_delay(4, base=0.0, cap=30.0, retry_after=None) == 0.0
