"""The one capped backoff (gh_common/backoff.py) every retry and poll loop takes its waits from."""

from __future__ import annotations

from gh_common.backoff import Backoff


def test_without_jitter_each_wait_is_its_ceiling_growing_by_the_factor_up_to_the_cap() -> None:
    b = Backoff(base=0.001, cap=0.05, factor=2.0)
    assert [round(b.next_delay(), 3) for _ in range(8)] == [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05]
    assert b.failures == 8
    b.reset()
    assert b.next_delay() == 0.001


def test_with_jitter_a_wait_is_never_below_half_its_ceiling() -> None:
    low, high = Backoff(base=4.0, cap=60.0, jitter=True, rng=lambda: 0.0), Backoff(base=4.0, cap=60.0, jitter=True,
                                                                                   rng=lambda: 1.0)
    assert [low.next_delay() for _ in range(3)] == [2.0, 4.0, 8.0]
    assert [high.next_delay() for _ in range(3)] == [4.0, 8.0, 16.0]


def test_a_huge_failure_count_stays_at_the_cap() -> None:
    assert Backoff(base=1.0, cap=30.0, failures=10_000).next_delay() == 30.0
