"""ADS stream backoff (pyxds.xds.backoff): A57 and gRPC connection backoff,
plus the never-a-tight-loop trap (grpc-java#9029, grpc-go#5280)."""

from __future__ import annotations

import random

import pytest

from pyxds.xds.backoff import (
    INITIAL_BACKOFF,
    JITTER,
    MAX_BACKOFF,
    MULTIPLIER,
    ExponentialBackoff,
    StreamBackoff,
)


class FixedRandom(random.Random):
    """uniform() returns a chosen point of its range (0 = low, 1 = high)."""

    def __init__(self, where: float) -> None:
        super().__init__(0)
        self.where = where

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.where


def test_backoff_constants_are_grpc_connection_backoff():
    assert (INITIAL_BACKOFF, MULTIPLIER, JITTER, MAX_BACKOFF) == (1.0, 1.6, 0.2, 120.0)


def test_backoff_sequence_without_jitter_grows_by_1_6_up_to_120s():
    backoff = ExponentialBackoff(FixedRandom(0.5))
    delays = [backoff.next_delay() for _ in range(14)]
    expected = [min(1.6**i, 120.0) for i in range(14)]
    assert delays == pytest.approx(expected)
    assert delays[-1] == pytest.approx(120.0)


@pytest.mark.parametrize("where, factor", [(0.0, 0.8), (1.0, 1.2)])
def test_backoff_jitter_is_plus_minus_20_percent(where, factor):
    backoff = ExponentialBackoff(FixedRandom(where))
    assert backoff.next_delay() == pytest.approx(1.0 * factor)
    assert backoff.next_delay() == pytest.approx(1.6 * factor)
    for _ in range(20):
        last = backoff.next_delay()
    assert last == pytest.approx(120.0 * factor)


def test_backoff_jitter_stays_within_bounds_with_real_random():
    backoff = ExponentialBackoff(random.Random(7))
    base = 1.0
    for _ in range(30):
        delay = backoff.next_delay()
        assert base * 0.8 <= delay <= base * 1.2
        base = min(base * 1.6, 120.0)


def test_stream_failing_without_response_backs_off_exponentially():
    policy = StreamBackoff(ExponentialBackoff(FixedRandom(0.5)))
    delays = []
    now = 0.0
    for _ in range(4):
        policy.on_stream_started(now)
        delay = policy.on_stream_closed(now + 0.01)
        delays.append(delay)
        now += delay
    assert delays == pytest.approx([1.0, 1.6, 2.56, 4.096])


def test_backoff_resets_after_a_stream_received_a_response():
    policy = StreamBackoff(ExponentialBackoff(FixedRandom(0.5)))
    for _ in range(5):
        policy.on_stream_started(0.0)
        policy.on_stream_closed(0.0)
    policy.on_stream_started(100.0)
    policy.on_response()
    policy.on_stream_closed(100.0)
    policy.on_stream_started(101.0)
    assert policy.on_stream_closed(101.0) == pytest.approx(1.6)  # sequence restarted


def test_stream_that_worked_and_closed_at_once_still_backs_off():
    """Never a tight loop, even when every stream gets one response."""
    policy = StreamBackoff(ExponentialBackoff(FixedRandom(0.5)))
    policy.on_stream_started(10.0)
    policy.on_response()
    assert policy.on_stream_closed(10.2) == pytest.approx(0.8)


def test_long_lived_stream_that_worked_is_replaced_at_once():
    policy = StreamBackoff(ExponentialBackoff(FixedRandom(0.5)))
    policy.on_stream_started(0.0)
    policy.on_response()
    assert policy.on_stream_closed(3600.0) == 0.0


def test_invalid_backoff_parameters_are_rejected():
    with pytest.raises(ValueError):
        ExponentialBackoff(initial=0)
