"""The sans-IO retry decision (gRFC A6 "Retry Policy", A44): attempt
counts, jittered exponential backoff with seeded draws, pushback, commit
points, transparent retry, throttling."""

from __future__ import annotations

import random

import grpc
import pytest

from pyxds.channel.retry import RetryState, not_sent, pushback_of
from pyxds.lb.api import Status
from pyxds.resolver.retry_policy import RetryPolicy, RetryThrottle

UNAVAILABLE = Status(grpc.StatusCode.UNAVAILABLE, "backend says no")
INTERNAL = Status(grpc.StatusCode.INTERNAL, "boom")
OK = Status(grpc.StatusCode.OK, "")
REFUSED = Status(grpc.StatusCode.UNAVAILABLE, "Stream refused by server")


def xds_policy(retry_on=("unavailable",), num_retries=3, base=0.025, cap=0.25) -> RetryPolicy:
    policy = RetryPolicy.from_xds(retry_on, num_retries, base, cap)
    assert policy is not None
    return policy


def failures_until_stop(state: RetryState, status: Status = UNAVAILABLE) -> list[float]:
    delays = []
    for _ in range(50):  # bounded: any policy stops long before
        delay = state.on_attempt_end(status)
        if delay is None:
            return delays
        delays.append(delay)
    raise AssertionError("never stopped retrying")


def test_xds_num_retries_gives_num_retries_plus_one_attempts():
    state = RetryState(xds_policy(num_retries=3), None, random.Random(1))
    assert len(failures_until_stop(state)) == 3
    assert state.attempts == 4


def test_attempts_are_capped_at_five():
    state = RetryState(xds_policy(num_retries=10), None, random.Random(1))
    assert len(failures_until_stop(state)) == 4
    assert state.attempts == 5


def test_xds_retry_on_maps_supported_codes_and_ignores_others():
    policy = RetryPolicy.from_xds(
        ("unavailable", "5xx", "cancelled", "deadline-exceeded", "internal", "resource-exhausted"),
        1,
        0.025,
        0.25,
    )
    assert policy.retryable_codes == {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    assert policy.backoff_multiplier == 2.0


def test_policy_without_supported_codes_is_no_policy():
    assert RetryPolicy.from_xds(("5xx", "gateway-error"), 3, 0.025, 0.25) is None


def test_code_not_in_retry_on_is_not_retried():
    state = RetryState(xds_policy(retry_on=("unavailable",)), None, random.Random(1))
    assert state.on_attempt_end(INTERNAL) is None
    assert state.attempts == 1


def test_ok_is_never_retried():
    assert RetryState(xds_policy(), None).on_attempt_end(OK) is None


def test_backoff_is_the_exponential_backoff_with_plus_or_minus_20_percent_seeded_jitter():
    """A6 "Exponential Backoff": the n-th retry waits
    ``min(initialBackoff * multiplier**(n-1), maxBackoff) * random(0.8, 1.2)``."""
    policy = xds_policy(num_retries=4, base=0.1, cap=0.3)
    seen = failures_until_stop(RetryState(policy, None, random.Random(7)))
    draws = random.Random(7)
    backoffs = [0.1, 0.2, 0.3, 0.3]
    assert seen == [b * draws.uniform(0.8, 1.2) for b in backoffs]


def test_backoff_bounds_over_many_seeds():
    policy = xds_policy(num_retries=4, base=0.025, cap=0.25)
    ratios: list[list[float]] = [[], [], [], []]
    for seed in range(300):
        state = RetryState(policy, None, random.Random(seed))
        for i, delay in enumerate(failures_until_stop(state)):
            ratios[i].append(delay / [0.025, 0.05, 0.1, 0.2][i])
    # backoffs 25, 50, 100, 200 ms, each within +-20 % and both ends nearly reached
    for seen in ratios:
        assert 0.8 <= min(seen) < 0.82 and 1.18 < max(seen) <= 1.2


def test_pushback_sets_the_exact_delay_and_resets_the_backoff():
    policy = xds_policy(num_retries=4, base=0.1, cap=10.0)
    state = RetryState(policy, None, random.Random(3))
    draws = random.Random(3)
    assert state.on_attempt_end(UNAVAILABLE) == 0.1 * draws.uniform(0.8, 1.2)
    assert state.on_attempt_end(UNAVAILABLE) == 0.2 * draws.uniform(0.8, 1.2)
    assert state.on_attempt_end(UNAVAILABLE, [("grpc-retry-pushback-ms", "1500")]) == 1.5
    # after pushback the backoff starts again from the initial backoff
    assert state.on_attempt_end(UNAVAILABLE) == 0.1 * draws.uniform(0.8, 1.2)


@pytest.mark.parametrize("value", ["-1", "abc", "", "1.5", b"\xff", "99999999999"])
def test_pushback_negative_or_unparsable_means_do_not_retry(value):
    state = RetryState(xds_policy(), None, random.Random(1))
    assert state.on_attempt_end(UNAVAILABLE, [("grpc-retry-pushback-ms", value)]) is None


def test_pushback_does_not_extend_max_attempts():
    state = RetryState(xds_policy(num_retries=1), None, random.Random(1))
    assert state.on_attempt_end(UNAVAILABLE, [("grpc-retry-pushback-ms", "0")]) == 0.0
    assert state.on_attempt_end(UNAVAILABLE, [("grpc-retry-pushback-ms", "0")]) is None


def test_pushback_parsing():
    assert pushback_of(None) == -2.0
    assert pushback_of([("other", "1")]) == -2.0
    assert pushback_of([("grpc-retry-pushback-ms", b"250")]) == 0.25


def test_committed_rpc_is_not_retried():
    state = RetryState(xds_policy(), None, random.Random(1))
    assert state.on_attempt_end(UNAVAILABLE, committed=True) is None


def test_transparent_retry_once_without_policy_and_not_counted_as_an_attempt():
    state = RetryState(None, None)
    assert state.on_attempt_end(REFUSED) == 0.0
    assert state.attempts == 1 and state.previous_attempts == 0
    assert state.on_attempt_end(REFUSED) is None


def test_transparent_retry_does_not_count_against_max_attempts():
    state = RetryState(xds_policy(num_retries=1), None, random.Random(1))
    assert state.on_attempt_end(REFUSED) == 0.0
    assert state.on_attempt_end(UNAVAILABLE) is not None
    assert state.previous_attempts == 1
    assert state.on_attempt_end(UNAVAILABLE) is None


def test_not_sent_is_not_transparently_retried_once_committed():
    assert RetryState(None, None).on_attempt_end(REFUSED, committed=True) is None


def test_not_sent_texts():
    assert not_sent(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; x")
    assert not not_sent(grpc.StatusCode.UNAVAILABLE, "backend says no")
    assert not not_sent(grpc.StatusCode.CANCELLED, "Channel closed!")


def test_previous_attempts_counts_policy_retries():
    state = RetryState(xds_policy(num_retries=3), None, random.Random(1))
    assert state.previous_attempts == 0
    state.on_attempt_end(UNAVAILABLE)
    state.on_attempt_end(UNAVAILABLE)
    assert state.previous_attempts == 2


def test_throttle_stops_retries_at_half_the_tokens_and_successes_restore_them():
    throttle = RetryThrottle(max_tokens=4, token_ratio=0.5)
    policy = xds_policy(num_retries=4)
    # 4 -> 3: still above 2, retried
    assert RetryState(policy, throttle, random.Random(1)).on_attempt_end(UNAVAILABLE) is not None
    # 3 -> 2: at the threshold, not retried
    assert RetryState(policy, throttle, random.Random(1)).on_attempt_end(UNAVAILABLE) is None
    assert throttle.tokens == 2
    # non-retryable failures do not count
    RetryState(policy, throttle).on_attempt_end(INTERNAL)
    assert throttle.tokens == 2
    for _ in range(3):
        RetryState(policy, throttle).on_attempt_end(OK)
    assert throttle.tokens == 3.5
    assert RetryState(policy, throttle, random.Random(1)).on_attempt_end(UNAVAILABLE) is not None


def test_throttle_caps_tokens_and_truncates_ratio_to_three_decimals():
    throttle = RetryThrottle(max_tokens=10, token_ratio=0.5466)
    assert throttle.token_ratio == 0.546
    throttle.record_success()
    assert throttle.tokens == 10
    assert RetryThrottle(10, 0.5) == RetryThrottle(10, 0.5)


def test_xds_intervals_under_one_millisecond_are_one_millisecond():
    """A44: "Values of base_interval or max_interval less than 1ms will be
    treated as 1ms"."""
    policy = RetryPolicy.from_xds(("unavailable",), 1, 0.0001, 0.0005)
    assert (policy.initial_backoff, policy.max_backoff) == (0.001, 0.001)


NEVER_LEFT = Status(
    grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: x"
)


def test_an_attempt_that_never_left_the_client_is_retried_each_time_on_a_newer_picker():
    # A6 "Transparent Retries" case 2: until success or the deadline (the
    # adapters bound it), each time asking for a picker newer than the one
    # that chose the lost connection; never counted as an attempt.
    state = RetryState(None, None)
    for _ in range(10):
        assert state.on_attempt_end(NEVER_LEFT) == 0.0
        assert state.wait_for_new_picker
        assert state.attempts == 1
    assert state.on_attempt_end(REFUSED) == 0.0
    assert not state.wait_for_new_picker  # a refused stream re-picks at once


def test_a_failed_pick_is_never_a_transparent_retry():
    assert RetryState(None, None).on_attempt_end(NEVER_LEFT, pick_failed=True) is None
