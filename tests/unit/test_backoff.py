"""The node's retry delays: bounded, growing, jittered, and reset by a success."""

from __future__ import annotations

import random

import pytest

from client.node.work.backoff import Backoff


def delays(backoff: Backoff, count: int) -> list[float]:
    return [backoff.next_delay() for _ in range(count)]


def test_delays_stay_between_half_the_base_and_the_cap():
    for seed in range(50):
        backoff = Backoff(base=0.5, cap=8.0, rng=random.Random(seed))
        for delay in delays(backoff, 200):
            assert 0.25 <= delay <= 8.0


def test_each_delay_is_below_its_doubling_ceiling():
    backoff = Backoff(base=1.0, cap=60.0, rng=random.Random(3))
    for attempt in range(12):
        assert backoff.next_delay() <= min(60.0, 2.0**attempt)
    assert backoff.attempts == 12


def test_delays_grow_with_failures():
    first = [Backoff(rng=random.Random(seed)).next_delay() for seed in range(100)]
    seventh = [delays(Backoff(rng=random.Random(seed)), 7)[-1] for seed in range(100)]
    assert max(first) <= 1.0  # the first retry comes within a second
    assert max(seventh) > 32.0  # after six failures the ceiling is 60 s (64 capped)
    assert sum(seventh) / len(seventh) > 10 * sum(first) / len(first)


def test_two_random_sources_give_different_delays():
    assert delays(Backoff(rng=random.Random(1)), 10) != delays(Backoff(rng=random.Random(2)), 10)


def test_the_same_seed_repeats_its_delays():
    assert delays(Backoff(rng=random.Random(7)), 10) == delays(Backoff(rng=random.Random(7)), 10)


def test_reset_returns_to_the_shortest_delays():
    backoff = Backoff(base=2.0, cap=100.0, rng=random.Random(5))
    delays(backoff, 10)
    assert backoff.ceiling() == 100.0
    backoff.reset()
    assert backoff.attempts == 0
    assert 1.0 <= backoff.next_delay() <= 2.0


def test_thousands_of_failures_stay_at_the_cap():
    backoff = Backoff(base=1e-3, cap=30.0, rng=random.Random(0))
    for delay in delays(backoff, 5000):
        assert delay <= 30.0
    assert backoff.ceiling() == 30.0


@pytest.mark.parametrize(
    ("base", "cap"), [(0.0, 1.0), (-1.0, 1.0), (float("nan"), 1.0), (2.0, 1.0), (1.0, float("inf"))]
)
def test_settings_that_would_loop_or_never_return_are_refused(base, cap):
    with pytest.raises(ValueError, match="backoff"):
        Backoff(base=base, cap=cap)
