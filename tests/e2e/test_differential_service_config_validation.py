"""Differential: the ``grpc.service_config`` channel option, given as is to a
plain grpcio channel and to a pyxds channel on the same ``ipv4:`` backend.

grpcio 1.85's C-core validates that option when it creates the channel
(``ServiceConfigImpl::Create``) and, when it fails, makes a lame channel:
every RPC, wait_for_ready or not, fails at once with INVALID_ARGUMENT
"Failed to create channel to '<target>':<why>", and names the JSON field.
A valid one is applied.  Each case below is one of C-core's
``test/core/service_config/service_config_test.cc`` /
``test/core/client_channel/client_channel_service_config_test.cc`` cases, or
a JSON form the doc/service_config.md fields take, run live through both.
Before this file pyxds ran RPCs on a channel whose methodConfig was invalid
(the config silently dropped) and failed LB config errors UNAVAILABLE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest
from channel_fixtures import SERVICE, running_backends, until_answered

import pyxds._api as pyxds

RETRY = {
    "maxAttempts": 2,
    "initialBackoff": "1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 1,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def mc(**fields):
    return {"methodConfig": [{"name": [{}], **fields}]}


#: (case, service config, JSON field C-core names) - C-core rejects them all
REJECTED = [
    ("JsonParseError (empty text)", "", None),
    ("trailing text", "{} x", None),
    ("InvalidHealthCheckMultipleEntries (duplicate key)", '{"a":{},"a":{}}', None),
    ("not an object", "[]", None),
    ("InvalidTimeout 5sec", mc(timeout="5sec"), "methodConfig[0].timeout"),
    ("timeout a number", mc(timeout=1), "methodConfig[0].timeout"),
    ("timeout negative", mc(timeout="-1s"), "methodConfig[0].timeout"),
    ("timeout 10 fraction digits", mc(timeout="1.0000000001s"), "methodConfig[0].timeout"),
    ("timeout 1.s", mc(timeout="1.s"), "methodConfig[0].timeout"),
    ("timeout .5s", mc(timeout=".5s"), "methodConfig[0].timeout"),
    ("timeout exponent", mc(timeout="1e1s"), "methodConfig[0].timeout"),
    ("timeout past the Duration range", mc(timeout="315576000001s"), "methodConfig[0].timeout"),
    ("InvalidWaitForReady string", mc(waitForReady="true"), "methodConfig[0].waitForReady"),
    ("waitForReady a number", mc(waitForReady=1), "methodConfig[0].waitForReady"),
    (
        "ErrorDuplicateDefaultMethodConfigs",
        {"methodConfig": [{"name": [{}]}, {"name": [{}]}]},
        "methodConfig[1].name[0]",
    ),
    (
        "ErrorDuplicateDefaultMethodConfigsWithEmptyService",
        {"methodConfig": [{"name": [{"service": ""}]}, {"name": [{}]}]},
        "methodConfig[1].name[0]",
    ),
    (
        "ErrorDuplicateDefaultMethodConfigsWithNullService",
        {"methodConfig": [{"name": [{"service": None}]}, {"name": [{}]}]},
        "methodConfig[1].name[0]",
    ),
    (
        "ErrorDuplicateMethodConfigNames",
        {"methodConfig": [{"name": [{"service": "S"}]}, {"name": [{"service": "S"}]}]},
        "methodConfig[1].name[0]",
    ),
    (
        "ErrorDuplicateMethodConfigNamesWithNullMethod",
        {
            "methodConfig": [
                {"name": [{"service": "S", "method": None}]},
                {"name": [{"service": "S"}]},
            ]
        },
        "methodConfig[1].name[0]",
    ),
    (
        "duplicate inside one entry",
        {"methodConfig": [{"name": [{"service": "S"}, {"service": "S"}]}]},
        "methodConfig[0].name[1]",
    ),
    (
        "method without service",
        {"methodConfig": [{"name": [{"method": "M"}]}]},
        "methodConfig[0].name[0]",
    ),
    ("name not a list", {"methodConfig": [{"name": {}}]}, "methodConfig[0].name"),
    ("name entry not an object", {"methodConfig": [{"name": [1]}]}, "methodConfig[0].name[0]"),
    ("service not a string", {"methodConfig": [{"name": [{"service": 1}]}]}, "methodConfig[0]"),
    ("methodConfig not a list", {"methodConfig": {}}, "methodConfig"),
    ("methodConfig null", {"methodConfig": None}, "methodConfig"),
    ("methodConfig entry not an object", {"methodConfig": [1]}, "methodConfig[0]"),
    ("maxRequestMessageBytes negative", mc(maxRequestMessageBytes=-1), "maxRequestMessageBytes"),
    ("maxRequestMessageBytes 10.0", mc(maxRequestMessageBytes=10.0), "maxRequestMessageBytes"),
    ("maxRequestMessageBytes 2**32", mc(maxRequestMessageBytes=2**32), "maxRequestMessageBytes"),
    ("maxRequestMessageBytes '-1'", mc(maxRequestMessageBytes="-1"), "maxRequestMessageBytes"),
    (
        "UnknownLoadBalancingConfig",
        {"loadBalancingConfig": [{"unknown": {}}]},
        "loadBalancingConfig",
    ),
    ("loadBalancingConfig empty", {"loadBalancingConfig": []}, "loadBalancingConfig"),
    ("loadBalancingConfig null", {"loadBalancingConfig": None}, "loadBalancingConfig"),
    (
        "loadBalancingConfig an object",
        {"loadBalancingConfig": {"round_robin": {}}},
        "loadBalancingConfig",
    ),
    (
        "a known policy with a bad config fails it all",
        {"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": "x"}}, {"round_robin": {}}]},
        "loadBalancingConfig",
    ),
    (
        "two policies in one entry",
        {"loadBalancingConfig": [{"pick_first": {}, "round_robin": {}}]},
        "loadBalancingConfig",
    ),
    (
        "an empty entry before the chosen one",
        {"loadBalancingConfig": [{"unknown": {}}, {}, {"round_robin": {}}]},
        "loadBalancingConfig",
    ),
    (
        "an unknown policy's config not an object",
        {"loadBalancingConfig": [{"unknown": 1}, {"round_robin": {}}]},
        "loadBalancingConfig",
    ),
    (
        "a known policy's config null",
        {"loadBalancingConfig": [{"round_robin": None}]},
        "loadBalancingConfig",
    ),
    (
        "an unknown policy's config null",
        {"loadBalancingConfig": [{"unknown": None}, {"round_robin": {}}]},
        "loadBalancingConfig",
    ),
    ("an entry null", {"loadBalancingConfig": [None, {"round_robin": {}}]}, "loadBalancingConfig"),
    ("UnknownLoadBalancingPolicy", {"loadBalancingPolicy": "unknown"}, "loadBalancingPolicy"),
    ("loadBalancingPolicy a number", {"loadBalancingPolicy": 3}, "loadBalancingPolicy"),
    (
        "LoadBalancingPolicyXdsNotAllowed (needs a config)",
        {"loadBalancingPolicy": "xds_cluster_impl_experimental"},
        "loadBalancingPolicy",
    ),
    (
        "loadBalancingPolicy checked though loadBalancingConfig wins",
        {"loadBalancingConfig": [{"round_robin": {}}], "loadBalancingPolicy": "unknown"},
        "loadBalancingPolicy",
    ),
    ("healthCheckConfig not an object", {"healthCheckConfig": 1}, "healthCheckConfig"),
    (
        "healthCheckConfig.serviceName not a string",
        {"healthCheckConfig": {"serviceName": 1}},
        "healthCheckConfig.serviceName",
    ),
    ("retryThrottling not an object", {"retryThrottling": 1}, "retryThrottling"),
    (
        "retryThrottling without tokenRatio",
        {"retryThrottling": {"maxTokens": 10}},
        "retryThrottling.tokenRatio",
    ),
]

#: (case, service config, method, request, outcome both give)
ACCEPTED = [
    ("EmptyConfig", {}, "Who", b"", "a0"),
    (
        "SkipMethodConfigWithNoNameOrEmptyName",
        {"methodConfig": [{"timeout": "0.05s"}, {"name": [], "timeout": "0.05s"}]},
        "Sleep",
        b"0.2",
        "a0",
    ),
    ("unknown fields", {"foo": 1, "methodConfig": [{"name": [{}], "bar": 2}]}, "Who", b"", "a0"),
    (
        "null name, service, waitForReady are absent",
        {"methodConfig": [{"name": [{"service": None}], "waitForReady": None, "timeout": None}]},
        "Who",
        b"",
        "a0",
    ),
    ("a timeout under 1 ms is none (C-core's ms)", mc(timeout="0.0009s"), "Sleep", b"0.2", "a0"),
    ("timeout 0s is none", mc(timeout="0s"), "Sleep", b"0.2", "a0"),
    ("timeout at the Duration maximum", mc(timeout="315576000000s"), "Who", b"", "a0"),
    ("maxRequestMessageBytes 2**32-1", mc(maxRequestMessageBytes=2**32 - 1), "Who", b"", "a0"),
    ("maxRequestMessageBytes 0, empty request", mc(maxRequestMessageBytes=0), "Who", b"", "a0"),
    (
        "maxRequestMessageBytes as a string",
        mc(maxRequestMessageBytes="10"),
        "Who",
        b"x" * 27,
        "RESOURCE_EXHAUSTED",
    ),
    ("ValidLoadBalancingPolicyAllCaps", {"loadBalancingPolicy": "PICK_FIRST"}, "Who", b"", "a0"),
    ("loadBalancingPolicy empty", {"loadBalancingPolicy": ""}, "Who", b"", "a0"),
    ("loadBalancingPolicy null", {"loadBalancingPolicy": None}, "Who", b"", "a0"),
    (
        "ValidLoadBalancingConfigRoundRobin (entries after the chosen one unread)",
        {"loadBalancingConfig": [{"round_robin": {}}, {}]},
        "Who",
        b"",
        "a0",
    ),
    (
        "a bad config after the chosen policy is not read",
        {"loadBalancingConfig": [{"round_robin": {}}, {"pick_first": {"shuffleAddressList": 1}}]},
        "Who",
        b"",
        "a0",
    ),
    (
        "a null config after the chosen policy is not read",
        {"loadBalancingConfig": [{"round_robin": {}}, {"unknown": None}]},
        "Who",
        b"",
        "a0",
    ),
    ("ValidHealthCheck", {"healthCheckConfig": {"serviceName": "x"}}, "Who", b"", "a0"),
    ("healthCheckConfig empty", {"healthCheckConfig": {}}, "Who", b"", "a0"),
    ("healthCheckConfig null", {"healthCheckConfig": None}, "Who", b"", "a0"),
    (
        "retryThrottling",
        {"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}},
        "Who",
        b"",
        "a0",
    ),
    ("a retryPolicy", mc(retryPolicy=RETRY), "Who", b"", "a0"),
    (
        "an exact entry without a timeout beats the service's",
        {
            "methodConfig": [
                {"name": [{"service": SERVICE}], "timeout": "0.3s"},
                {"name": [{"service": SERVICE, "method": "Sleep"}]},
            ]
        },
        "Sleep",
        b"0.5",
        "a0",
    ),
    (
        "a service entry without a timeout beats the default's",
        {"methodConfig": [{"name": [{}], "timeout": "0.3s"}, {"name": [{"service": SERVICE}]}]},
        "Sleep",
        b"0.5",
        "a0",
    ),
    (
        "method names are case-sensitive",
        {"methodConfig": [{"name": [{"service": SERVICE, "method": "sleep"}], "timeout": "0.3s"}]},
        "Sleep",
        b"0.5",
        "a0",
    ),
    (
        "service names are case-sensitive",
        {"methodConfig": [{"name": [{"service": SERVICE.lower()}], "timeout": "0.3s"}]},
        "Sleep",
        b"0.5",
        "a0",
    ),
    (
        "the same names do apply (control)",
        {"methodConfig": [{"name": [{"service": SERVICE, "method": "Sleep"}], "timeout": "0.3s"}]},
        "Sleep",
        b"0.5",
        "DEADLINE_EXCEEDED",
    ),
]


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "a1")


def outcome(channel: grpc.Channel, method: str, request: bytes, **kwargs) -> tuple[str, str]:
    """(code or response, details)."""
    try:
        return channel.unary_unary(f"/{SERVICE}/{method}")(request, **kwargs).decode(), ""
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""


def both(target: str, sc) -> tuple[grpc.Channel, grpc.Channel]:
    raw = sc if isinstance(sc, str) else json.dumps(sc)
    option = [("grpc.service_config", raw)]
    return pyxds.insecure_channel(target, options=option), grpc.insecure_channel(
        target, options=option
    )


@pytest.mark.parametrize(("case", "sc", "field"), REJECTED, ids=[c[0] for c in REJECTED])
def test_invalid_option_makes_a_lame_channel_like_c_core(backends, case, sc, field):
    """C-core ``ServiceConfigImpl::Create`` fails; the channel is lame."""
    target = f"ipv4:{backends['a0'].address}"
    ours, theirs = both(target, sc)
    try:
        prefix = f"Failed to create channel to '{target}':"
        for channel in (ours, theirs):
            for wfr in (False, True):
                code, details = outcome(channel, "Who", b"", timeout=5, wait_for_ready=wfr)
                assert code == "INVALID_ARGUMENT", (channel, details)
                assert details.startswith(prefix), details
                if field is not None:
                    assert field in details, details
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize(
    ("case", "sc", "method", "request_", "expected"), ACCEPTED, ids=[c[0] for c in ACCEPTED]
)
def test_valid_option_is_applied_like_c_core(backends, case, sc, method, request_, expected):
    ours, theirs = both(f"ipv4:{backends['a0'].address}", sc)
    try:
        got = [outcome(ch, method, request_, timeout=5)[0] for ch in (ours, theirs)]
        assert got == [expected, expected]
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize(
    "sc",
    [
        {"loadBalancingConfig": [{"unknown": {}}, {"round_robin": {}}]},
        {"loadBalancingPolicy": "ROUND_ROBIN"},
        {"loadBalancingConfig": [{"round_robin": {}}], "loadBalancingPolicy": "pick_first"},
    ],
    ids=["unknown skipped", "legacy name any case", "loadBalancingConfig wins"],
)
def test_policy_choice_like_c_core(backends, sc):
    """The first registered policy of ``loadBalancingConfig`` wins (unknown
    names skipped), over ``loadBalancingPolicy``; the legacy name is
    case-insensitive (C-core ``ValidLoadBalancingPolicyAllCaps``).  Both
    channels spread RPCs over two backends: round_robin, not pick_first."""
    target = f"ipv4:{backends['a0'].address},{backends['a1'].address}"
    ours, theirs = both(target, sc)
    try:
        for channel in (ours, theirs):
            # round_robin reaches a1 once it is READY (under load, after the
            # first RPCs); pick_first never would
            seen = until_answered(
                lambda ch=channel: [outcome(ch, "Who", b"", timeout=5, wait_for_ready=True)[0]],
                {"a0", "a1"},
            )
            assert set(seen) == {"a0", "a1"}, (channel, seen)
    finally:
        ours.close()
        theirs.close()


def test_lame_channel_state_like_c_core(backends):
    target = f"ipv4:{backends['a0'].address}"
    ours, theirs = both(target, {"methodConfig": 1})
    try:
        outcome(ours, "Who", b"", timeout=5)
        outcome(theirs, "Who", b"", timeout=5)
        assert ours.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE
        assert theirs._channel.check_connectivity_state(True) == 3  # TRANSIENT_FAILURE
    finally:
        ours.close()
        theirs.close()


_CORE_XDS = """
import json, grpc
channel = grpc.insecure_channel(
    "xds:///svc", options=[("grpc.service_config", json.dumps({"methodConfig": 1}))]
)
try:
    channel.unary_unary("/a.B/C")(b"", timeout=5)
    print("OK")
except grpc.RpcError as err:
    print(err.code().name + " " + err.details())
"""


def test_invalid_option_on_an_xds_target_like_c_core(tmp_path):
    """C-core validates the option whatever the target: an ``xds:`` channel
    is lame too, before it reads its bootstrap or talks to anything."""
    bootstrap = tmp_path / "bootstrap.json"
    bootstrap.write_text(
        json.dumps(
            {
                "xds_servers": [
                    {"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]}
                ],
                "node": {"id": "n"},
            }
        )
    )
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(bootstrap)}
    core = subprocess.run(
        [sys.executable, "-c", _CORE_XDS], env=env, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    ours = pyxds.insecure_channel(
        "xds:///svc",
        bootstrap=str(bootstrap),
        options=[("grpc.service_config", json.dumps({"methodConfig": 1}))],
    )
    try:
        code, details = outcome(ours, "Who", b"", timeout=5)
    finally:
        ours.close()
    prefix = "Failed to create channel to 'xds:///svc':"
    assert core.startswith("INVALID_ARGUMENT " + prefix), core
    assert code == "INVALID_ARGUMENT" and details.startswith(prefix), details
    assert "methodConfig" in core and "methodConfig" in details


@pytest.mark.parametrize(
    ("option", "field", "request_"),
    [
        ("grpc.max_receive_message_length", "maxResponseMessageBytes", b""),
        ("grpc.max_send_message_length", "maxRequestMessageBytes", b"x" * 20),
    ],
    ids=["receive", "send"],
)
def test_message_limit_is_the_smaller_of_option_and_method_config_like_c_core(
    backends, option, field, request_
):
    """C-core's message-size filter takes the smaller of the channel
    option and the methodConfig limit, either way round (a reply "a0" is 2
    bytes, the request 20): the limit 1 or 5 fails the RPC whichever of
    the two sets it."""
    target = f"ipv4:{backends['a0'].address}"
    small = 1 if field == "maxResponseMessageBytes" else 5
    for channel_limit, config_limit in ((small, 100), (100, small), (-1, small)):
        options = [
            (option, channel_limit),
            ("grpc.service_config", json.dumps(mc(**{field: config_limit}))),
        ]
        ours = pyxds.insecure_channel(target, options=options)
        theirs = grpc.insecure_channel(target, options=options)
        try:
            got = [outcome(ch, "Who", request_, timeout=5) for ch in (ours, theirs)]
            assert got[0] == got[1], (channel_limit, config_limit)
            assert got[0][0] == "RESOURCE_EXHAUSTED"
            assert f"vs. {small})" in got[0][1]
        finally:
            ours.close()
            theirs.close()


def test_method_config_on_a_dns_target_like_c_core(backends):
    """The option's methodConfig applies on a ``dns:`` target as on
    ``ipv4:`` (only an xds: target's own config replaces it): the named
    service's timeout ends a 3 s RPC, another method of no named service
    runs."""
    port = backends["a0"].port
    sc = {"methodConfig": [{"name": [{"service": SERVICE, "method": "Sleep"}], "timeout": "1s"}]}
    ours, theirs = both(f"dns:///127.0.0.1:{port}", sc)
    try:
        for channel in (ours, theirs):
            assert outcome(channel, "Who", b"", timeout=5, wait_for_ready=True)[0] == "a0"
            assert outcome(channel, "Sleep", b"3", timeout=10)[0] == "DEADLINE_EXCEEDED"
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize(
    ("options", "spread"),
    [
        ([("grpc.lb_policy_name", "round_robin")], True),
        (
            [
                ("grpc.lb_policy_name", "round_robin"),
                ("grpc.service_config", json.dumps({"loadBalancingPolicy": "pick_first"})),
            ],
            False,
        ),
        (
            [
                ("grpc.lb_policy_name", "pick_first"),
                ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})),
            ],
            True,
        ),
        (
            [
                ("grpc.lb_policy_name", "round_robin"),
                ("grpc.service_config", json.dumps({"methodConfig": []})),
            ],
            True,
        ),
        ([("grpc.lb_policy_name", "nope")], False),
        ([("grpc.lb_policy_name", "ROUND_ROBIN")], False),
        ([("grpc.lb_policy_name", "priority_experimental")], False),
    ],
    ids=[
        "option",
        "service config wins",
        "loadBalancingConfig wins",
        "config without LB keeps the option",
        "unknown name: pick_first",
        "names are case-sensitive here: pick_first",
        "a policy needing a config: pick_first",
    ],
)
def test_lb_policy_name_option_like_c_core(backends, options, spread):
    """C-core's channel arg ``grpc.lb_policy_name``: used when the service
    config names no policy; a name it does not know as given, or a policy
    that needs a config, is replaced by pick_first (the channel works).
    pyxds failed such a channel (UNAVAILABLE, wait_for_ready RPCs hung)."""
    target = f"ipv4:{backends['a0'].address},{backends['a1'].address}"
    ours = pyxds.insecure_channel(target, options=options)
    theirs = grpc.insecure_channel(target, options=options)
    try:
        for channel in (ours, theirs):
            first = outcome(channel, "Who", b"", timeout=5, wait_for_ready=True)[0]
            assert first in ("a0", "a1")
            seen = {outcome(channel, "Who", b"", timeout=5)[0] for _ in range(10)}
            assert seen == ({"a0", "a1"} if spread else {"a0"}), channel
    finally:
        ours.close()
        theirs.close()
