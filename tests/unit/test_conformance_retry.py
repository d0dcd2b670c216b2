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
import pytest

from pyxds.channel.retry import RetryState, pushback_of
from pyxds.resolver.retry_policy import RetryPolicy, RetryThrottle
from pyxds.resolver.service_config import parse_service_config
from pyxds.status import Status

ALL_XDS_CODES = ("cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable")
PUSHBACK = "grpc-retry-pushback-ms"


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


def service_config_policy(
    max_attempts: int, codes: list[str], throttling: dict | None = None
) -> tuple[RetryPolicy, RetryThrottle | None]:
    raw: dict = {
        "methodConfig": [
            {
                "name": [{"service": "grpc.testing.TestService"}],
                "retryPolicy": {
                    "maxAttempts": max_attempts,
                    # grpc-go's tests say ".01s", which C-core and pyxds
                    # reject (no digit before the point)
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.01s",
                    "backoffMultiplier": 1.0,
                    "retryableStatusCodes": codes,
                },
            }
        ]
    }
    if throttling is not None:
        raw["retryThrottling"] = throttling
    sc = parse_service_config(raw)
    policy = sc.methods["grpc.testing.TestService", ""].retry_policy
    assert policy is not None
    return policy, sc.retry_throttle


def replay(
    policy: RetryPolicy, throttle: RetryThrottle | None, server: list[str], rpcs: int
) -> list[tuple[str, int]]:
    """Sequential RPCs against a server answering its i-th call with
    ``server[i]``: each RPC's (final code, index of its last server call)."""
    calls = iter(enumerate(server))
    out = []
    for _ in range(rpcs):
        state = RetryState(policy, throttle, random.Random(0))
        while True:
            i, code = next(calls)
            if state.on_attempt_end(status(code)) is None:
                out.append((code, i))
                break
    return out


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


# ---------------------------------------------------------------- sequences


def test_grpc_go_retry_unary_sequence():
    """grpc-go retry_test.go TestRetryUnary: maxAttempts 4, ALREADY_EXISTS
    retryable: OK answers end an RPC, INTERNAL ends it at once, four
    ALREADY_EXISTS end it with ALREADY_EXISTS."""
    policy, throttle = service_config_policy(4, ["ALREADY_EXISTS"])
    server = ["OK" if i in (0, 2, 5) else "ALREADY_EXISTS" for i in range(16)]
    for i in (6, 8, 11):
        server[i] = "INTERNAL"
    assert replay(policy, throttle, server, 7) == [
        ("OK", 0),
        ("OK", 2),
        ("OK", 5),
        ("INTERNAL", 6),
        ("INTERNAL", 8),
        ("INTERNAL", 11),
        ("ALREADY_EXISTS", 15),
    ]


def test_grpc_go_retry_throttling_sequence():
    """grpc-go retry_test.go TestRetryThrottling: maxTokens 10, tokenRatio
    0.5, maxAttempts 4: a failure takes a token, a success gives half of
    one back, no retry once the bucket is at or below 5 (A6 "Throttling
    Retry Attempts and Hedged RPCs")."""
    policy, throttle = service_config_policy(
        4, ["UNAVAILABLE"], {"maxTokens": 10, "tokenRatio": 0.5}
    )
    ok_at = {0, 3, 6, 10, 11, 12, 13, 14, 16, 18}
    server = ["OK" if i in ok_at else "UNAVAILABLE" for i in range(20)]
    assert replay(policy, throttle, server, 12) == [
        ("OK", 0),
        ("OK", 3),
        ("OK", 6),
        ("UNAVAILABLE", 8),  # the first failure retried, the second throttled
        ("UNAVAILABLE", 9),
        ("OK", 10),
        ("OK", 11),
        ("OK", 12),
        ("OK", 13),
        ("OK", 14),
        ("OK", 16),
        ("UNAVAILABLE", 17),
    ]


def test_c_core_retry_throttle_basic_sequence():
    """C-core retry_throttle_test RetryThrottle.Basic: 4 tokens, ratio 1.6:
    the bucket never goes above its maximum nor below 0, and retries are
    allowed only while it is above 2."""
    throttle = RetryThrottle(4, 1.6)
    assert throttle.record_failure()  # 3
    throttle.record_success()  # 4, not 4.6
    assert throttle.record_failure()  # 3
    assert not throttle.record_failure()  # 2: at the threshold
    assert not throttle.record_failure()  # 1
    assert not throttle.record_failure()  # 0
    assert not throttle.record_failure()  # still 0
    throttle.record_success()  # 1.6
    throttle.record_success()  # 3.2
    assert throttle.record_failure()  # 2.2
    assert not throttle.record_failure()  # 1.2
    throttle.record_success()  # 2.8
    assert not throttle.record_failure()  # 1.8
    throttle.record_success()  # 3.4
    assert throttle.record_failure()  # 2.4
    assert throttle.tokens == pytest.approx(2.4)


def test_c_core_pushback_disabled_after_a_retry():
    """C-core retry_server_pushback_disabled.cc: ABORTED is retried; the
    retry's ABORTED with ``grpc-retry-pushback-ms: -1`` ends the RPC with it
    although attempts remain (maxAttempts 3)."""
    policy, _ = service_config_policy(3, ["ABORTED"])
    state = RetryState(policy, None, random.Random(0))
    assert state.on_attempt_end(status("ABORTED")) is not None
    assert state.on_attempt_end(status("ABORTED"), [(PUSHBACK, "-1")]) is None
    assert state.attempts == 2


# ---------------------------------------------------------------- pushback


@pytest.mark.parametrize(
    ("values", "seconds"),
    [(["-1", "10"], 0.01), (["10", "-1"], -1.0), (["abc", "10"], 0.01), (["10", "20"], 0.02)],
)
def test_pushback_given_twice_takes_the_last_value(values, seconds):
    """A6 "Pushback" says nothing of a repeated header; grpcio 1.85's C-core
    and grpc-java (``Metadata.get``: the last value) read the last one,
    seen live (tests/e2e/test_differential_retry.py).  (grpc-go retry_test.go
    "Multiple server pushback values - no retry" does not retry at all.)"""
    assert pushback_of([(PUSHBACK, v) for v in values]) == seconds


def test_do_not_retry_pushback_takes_a_token_whatever_the_code():
    """A6 "Throttling Retry Attempts and Hedged RPCs": "The only RPCs that
    are counted as failures ... fail with a status code that qualifies as
    retryable ..., or that receive a pushback response indicating not to
    retry" (grpc-go stream.go shouldRetry, grpc-java RetriableStream
    makeRetryDecision).  A non-retryable code without pushback takes none.
    (grpcio 1.85's C-core counts the pushback only with a retryable code:
    docs/differences-from-c-core.md.)"""
    policy, _ = service_config_policy(3, ["UNAVAILABLE"])
    throttle = RetryThrottle(10, 0.1)
    assert RetryState(policy, throttle).on_attempt_end(status("INTERNAL")) is None
    assert throttle.tokens == 10
    state = RetryState(policy, throttle)
    assert state.on_attempt_end(status("INTERNAL"), [(PUSHBACK, "-1")]) is None
    assert throttle.tokens == 9
    # a method without a retry policy on a channel with a throttle: the same
    assert RetryState(None, throttle).on_attempt_end(status("INTERNAL"), [(PUSHBACK, "x")]) is None
    assert throttle.tokens == 8
    # a retryable code with "do not retry" takes one token, not two
    assert (
        RetryState(policy, throttle).on_attempt_end(status("UNAVAILABLE"), [(PUSHBACK, "-5")])
        is None
    )
    assert throttle.tokens == 7


# ---------------------------------------------------------------- A6 validation


@pytest.mark.parametrize("code", ["UNAVAILABLE", "unavailable", "Unavailable", 14])
def test_retryable_status_codes_take_the_integer_and_any_case_forms(code):
    """A6 "Validation of retryPolicy": "Each status code MUST be a valid
    gRPC status code and specified in the integer form or the
    case-insensitive string form (eg. [14], ["UNAVAILABLE"] or
    ["unavailable"])".  (grpcio 1.85's C-core rejects the integer and
    lower-case forms: docs/differences-from-c-core.md.)"""
    policy, _ = service_config_policy(2, [code])
    assert policy.retryable_codes == {grpc.StatusCode.UNAVAILABLE}


@pytest.mark.parametrize(
    ("section", "key", "value", "accepted"),
    [
        ("retryPolicy", "maxAttempts", 2.0, False),
        ("retryPolicy", "maxAttempts", "3", True),
        ("retryPolicy", "initialBackoff", "315576000001s", False),
        ("retryPolicy", "initialBackoff", "315576000000s", True),
        ("retryPolicy", "backoffMultiplier", "1.5", True),
        ("retryPolicy", "backoffMultiplier", "nan", False),
        ("retryPolicy", "backoffMultiplier", "-2", False),
        ("retryThrottling", "maxTokens", 10.0, False),
        ("retryThrottling", "tokenRatio", "0.5", True),
        ("retryThrottling", "tokenRatio", 0.0004, False),
        ("retryThrottling", "tokenRatio", 0.0015, True),
    ],
)
def test_retry_json_forms_c_core_accepts_and_rejects(section, key, value, accepted):
    """Where A6 is silent on the JSON forms, as grpcio 1.85's C-core (seen
    live, tests/e2e/test_differential_retry.py::test_retry_policy_validation_like_c_core):
    numbers may be strings (proto3 JSON mapping) but not NaN, a number with a
    fraction is not an integer, durations stay within proto3's range, and a
    tokenRatio that is 0 once "decimal places beyond 3 are ignored" is not
    "greater than 0"."""
    retry = {
        "maxAttempts": 2,
        "initialBackoff": "1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    throttling = {"maxTokens": 10, "tokenRatio": 0.1}
    {"retryPolicy": retry, "retryThrottling": throttling}[section][key] = value
    raw = {"methodConfig": [{"name": [{}], "retryPolicy": retry}], "retryThrottling": throttling}
    if accepted:
        parse_service_config(raw)
    else:
        with pytest.raises(ValueError, match=f"{section}.{key}"):
            parse_service_config(raw)


@pytest.mark.parametrize(
    ("retry_on", "num_retries", "server", "want"),
    [
        # "virtualHost only, fail": one retry, then the retry's UNAVAILABLE
        ("resource-exhausted,unavailable", 1, ["RESOURCE_EXHAUSTED", "UNAVAILABLE"], "UNAVAILABLE"),
        # "virtualHost only" (grpc-go writes "resource-exhausted, unavailable"
        # and trims; C-core and pyxds would ignore " unavailable")
        ("resource-exhausted,unavailable", 2, ["RESOURCE_EXHAUSTED", "UNAVAILABLE", "OK"], "OK"),
        # "virtualHost+route, fail": the route's codes only
        ("resource-exhausted", 2, ["RESOURCE_EXHAUSTED", "UNAVAILABLE"], "UNAVAILABLE"),
        # "virtualHost+route"
        ("unavailable", 2, ["UNAVAILABLE", "OK"], "OK"),
        # "virtualHost+route, not enough attempts": the route's num_retries
        ("unavailable", 1, ["UNAVAILABLE", "UNAVAILABLE", "OK"], "UNAVAILABLE"),
    ],
)
def test_grpc_go_xds_client_side_retry_cases(retry_on, num_retries, server, want):
    """grpc-go test/xds/xds_client_retry_test.go TestClientSideRetry: the
    policy in force (A44: the route's, else its virtual host's; which one
    is tested in test_conformance_rds_resource.py and the e2e differential)
    retries each attempt's own code, up to num_retries."""
    policy = RetryPolicy.from_xds(retry_on.split(","), num_retries, 0.025, 0.25)
    assert policy is not None
    assert replay(policy, None, server, 1)[0][0] == want
