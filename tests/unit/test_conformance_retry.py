"""Conformance: client retries (gRFC A6, A44) replayed on the sans-IO retry
decision (:class:`pyxds.channel.retry.RetryState`) and the channel's token
bucket (:class:`pyxds.resolver.retry_policy.RetryThrottle`), case by case
from C-core's retry tests, grpc-go's ``test/retry_test.go`` and grpc-java's
``RetriableStream``.

Already covered elsewhere (not repeated here): attempt counts and the cap
of 5 (``test_retry_state.py``, ``test_service_config.py``), pushback
parsing and exact delays, commit, transparent retries, LB drop vs fail
(``test_channel_retry.py``), cancel during a backoff
(``test_channel_calls.py``), A44 parsing and NACKs
(``test_conformance_rds_resource.py``), and the live comparisons in
``tests/e2e/test_differential_retry.py``.
"""

from __future__ import annotations

import itertools
import random

import grpc

from pyxds.channel.retry import RetryState
from pyxds.resolver.retry_policy import RetryPolicy
from pyxds.status import Status

ALL_XDS_CODES = ("cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable")


def status(name: str) -> Status:
    return Status(grpc.StatusCode[name], name.lower())


def starts_of(state: RetryState, failure: Status, limit: int = 10) -> list[float]:
    """When each attempt starts (seconds after the first) while every
    attempt fails at once with ``failure``."""
    starts = [0.0]
    for _ in range(limit):
        delay = state.on_attempt_end(failure)
        if delay is None:
            return starts
        starts.append(starts[-1] + delay)
    raise AssertionError("never stopped retrying")


# ---------------------------------------------------------------- backoff


def test_backoff_jitter_is_plus_or_minus_twenty_percent():
    """A6 "Exponential Backoff" (updated 2024-08): "Jitter of plus or minus
    0.2 is applied to the backoff delay", the n-th retry after
    ``min(initialBackoff*backoffMultiplier**(n-1), maxBackoff) *
    random(0.8, 1.2)``, so slightly under initialBackoff or over maxBackoff
    at times.  C-core's retry filter (BackOff with jitter 0.2) and grpc-go
    ``stream.go`` shouldRetry ("a random factor between 0.8 and 1.2")."""
    policy = RetryPolicy.from_xds(("unavailable",), 4, 0.1, 0.3)
    assert policy is not None
    lowest, highest = [9.0] * 4, [0.0] * 4
    for seed in range(400):
        starts = starts_of(RetryState(policy, None, random.Random(seed)), status("UNAVAILABLE"))
        waits = [b - a for a, b in itertools.pairwise(starts)]
        for n, (wait, backoff) in enumerate(zip(waits, (0.1, 0.2, 0.3, 0.3), strict=True)):
            lowest[n] = min(lowest[n], wait / backoff)
            highest[n] = max(highest[n], wait / backoff)
    assert all(0.8 <= low < 0.81 for low in lowest), lowest
    assert all(1.19 < high <= 1.2 for high in highest), highest


def test_xds_long_back_off_gives_one_retry_before_two_seconds():
    """C-core xds_routing_end2end_test LdsRdsTest.XdsRetryPolicyLongBackOff:
    retry_back_off base_interval 1 s (max_interval 10x): the first retry
    0.8-1.2 s after the first attempt, the second not before 2.4 s, so a
    2 s deadline (C-core's test: 2.5 s) leaves exactly one retry."""
    policy = RetryPolicy.from_xds(ALL_XDS_CODES, 3, 1.0, 10.0)
    assert policy is not None
    for seed in range(300):
        starts = starts_of(RetryState(policy, None, random.Random(seed)), status("CANCELLED"))
        assert 0.8 <= starts[1] <= 1.2
        assert starts[2] >= 2.4
        assert len([t for t in starts if t < 2.0]) == 2


def test_xds_max_back_off_caps_each_wait():
    """C-core LdsRdsTest.XdsRetryPolicyMaxBackOff: base_interval =
    max_interval = 1 s: every wait 0.8-1.2 s (never the doubled 2 s), so
    two retries start within 2.4 s, in time for a 2.5 s deadline."""
    policy = RetryPolicy.from_xds(ALL_XDS_CODES, 3, 1.0, 1.0)
    assert policy is not None
    for seed in range(300):
        starts = starts_of(RetryState(policy, None, random.Random(seed)), status("CANCELLED"))
        waits = [b - a for a, b in itertools.pairwise(starts)]
        assert len(waits) == 3 and all(0.8 <= w <= 1.2 for w in waits)
        assert starts[2] <= 2.4
