"""The channel's own service config (service_config= / grpc.service_config):
validation naming the JSON path, methodConfig name precedence, A6
retryPolicy and retryThrottling, and the subchannels' message-size config."""

from __future__ import annotations

import json

import grpc
import pytest

from pyxds.resolver.api import CallConfig, DefaultConfigSelector
from pyxds.resolver.service_config import (
    MethodConfigSelector,
    from_channel_args,
    parse_service_config,
)

RETRY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", "resource_exhausted", 13],
}


def config(**extra):
    return {
        "methodConfig": [
            {"name": [{}], "timeout": "9s"},
            {"name": [{"service": "pkg.Svc"}], "timeout": "5s", "waitForReady": True},
            {
                "name": [{"service": "pkg.Svc", "method": "Get"}],
                "timeout": "1.5s",
                "retryPolicy": RETRY,
                "maxRequestMessageBytes": 1024,
            },
        ],
        **extra,
    }


def select(sc, path) -> CallConfig:
    return MethodConfigSelector(sc, DefaultConfigSelector()).select(path, ())


def test_method_name_precedence_exact_then_service_then_default():
    sc = parse_service_config(config())
    assert select(sc, "/pkg.Svc/Get").timeout == 1.5
    assert select(sc, "/pkg.Svc/Other").timeout == 5.0
    assert select(sc, "/pkg.Svc/Other").wait_for_ready is True
    assert select(sc, "/other.Svc/Get").timeout == 9.0


def test_retry_policy_per_a6():
    policy = select(parse_service_config(config()), "/pkg.Svc/Get").retry_policy
    assert policy.max_attempts == 4
    assert (policy.initial_backoff, policy.max_backoff, policy.backoff_multiplier) == (0.1, 1, 2)
    assert policy.retryable_codes == {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
    }


def test_max_attempts_capped_at_five():
    sc = parse_service_config(
        {"methodConfig": [{"name": [{}], "retryPolicy": {**RETRY, "maxAttempts": 9}}]}
    )
    assert select(sc, "/a/b").retry_policy.max_attempts == 5


def test_json_text_and_dict_are_the_same_config():
    assert (
        parse_service_config(json.dumps(config())).methods == parse_service_config(config()).methods
    )


def test_retry_throttling():
    sc = parse_service_config({"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}})
    assert sc.retry_throttle.max_tokens == 10 and sc.retry_throttle.token_ratio == 0.1


@pytest.mark.parametrize(
    ("bad", "path"),
    [
        ("{not json", "not JSON"),
        ([], "$"),
        ({"methodConfig": {}}, "methodConfig"),
        ({"methodConfig": [{"name": [{"method": "x"}]}]}, "methodConfig[0].name[0]"),
        ({"methodConfig": [{"name": [{}], "timeout": "5"}]}, "methodConfig[0].timeout"),
        ({"methodConfig": [{"name": [{}], "waitForReady": "yes"}]}, "methodConfig[0].waitForReady"),
        (
            {"methodConfig": [{"name": [{}]}, {"name": [{}]}]},
            "methodConfig[1].name[0]: duplicate",
        ),
        (
            {"methodConfig": [{"name": [{}], "retryPolicy": {**RETRY, "maxAttempts": 1}}]},
            "methodConfig[0].retryPolicy.maxAttempts",
        ),
        (
            {"methodConfig": [{"name": [{}], "retryPolicy": {**RETRY, "initialBackoff": "0s"}}]},
            "methodConfig[0].retryPolicy.initialBackoff",
        ),
        (
            {"methodConfig": [{"name": [{}], "retryPolicy": {**RETRY, "backoffMultiplier": 0}}]},
            "methodConfig[0].retryPolicy.backoffMultiplier",
        ),
        (
            {
                "methodConfig": [
                    {"name": [{}], "retryPolicy": {**RETRY, "retryableStatusCodes": []}}
                ]
            },
            "methodConfig[0].retryPolicy.retryableStatusCodes",
        ),
        (
            {
                "methodConfig": [
                    {"name": [{}], "retryPolicy": {**RETRY, "retryableStatusCodes": ["NOPE"]}}
                ]
            },
            "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
        ),
        (
            {"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 2}}]},
            "methodConfig[0].retryPolicy.initialBackoff: field not present",
        ),
        ({"retryThrottling": {"maxTokens": 0, "tokenRatio": 1}}, "retryThrottling.maxTokens"),
        ({"retryThrottling": {"maxTokens": 5}}, "retryThrottling.tokenRatio"),
        ({"loadBalancingConfig": [{"no_such_policy": {}}]}, "loadBalancingConfig"),
        ({"loadBalancingPolicy": 3}, "loadBalancingPolicy"),
    ],
)
def test_invalid_config_is_a_value_error_naming_the_json_path(bad, path):
    with pytest.raises(ValueError) as info:
        parse_service_config(bad)
    assert path in str(info.value)


def test_channel_args_service_config_replaces_the_option_and_feeds_subchannel_sizes():
    opts, parsed, extra = from_channel_args([("grpc.service_config", "{}"), ("x", 1)], config())
    assert dict(opts)["grpc.service_config"] == parsed.json
    assert ("x", 1) in opts
    sizes = json.loads(dict(extra)["grpc.service_config"])
    assert sizes == {
        "methodConfig": [
            {"name": [{"service": "pkg.Svc", "method": "Get"}], "maxRequestMessageBytes": 1024}
        ]
    }


def test_invalid_option_keeps_the_resolver_error_path():
    _, parsed, extra = from_channel_args([("grpc.service_config", "{bad")])
    assert parsed is None and extra == ()


def test_insecure_channel_rejects_a_bad_service_config_at_creation():
    import pyxds

    with pytest.raises(ValueError, match=r"methodConfig\[0\]\.timeout"):
        pyxds.insecure_channel(
            "ipv4:127.0.0.1:1", service_config={"methodConfig": [{"name": [{}], "timeout": 1}]}
        )


def test_xds_targets_keep_the_xds_config():
    """For xds: targets the xDS config wins (no methodConfig, no throttle)."""
    import pyxds

    sc = {**config(), "retryThrottling": {"maxTokens": 10, "tokenRatio": 1}}
    xds = pyxds.insecure_channel("xds:///svc", bootstrap={"xds_servers": []}, service_config=sc)
    static = pyxds.insecure_channel("ipv4:127.0.0.1:1", service_config=sc)
    try:
        assert xds._core.service_config is None and xds._core.retry_throttle is None
        assert static._core.service_config is not None
        assert static._core.retry_throttle == sc_throttle(sc)
    finally:
        xds.close()
        static.close()


def sc_throttle(sc):
    return parse_service_config(sc).retry_throttle
