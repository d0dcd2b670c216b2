"""Service config validation (doc/service_config.md, gRFC A2's JSON form) as
grpcio 1.85's C-core does it, replayed on :func:`parse_service_config` (the
``service_config=`` argument) and on a channel given the
``grpc.service_config`` option.

Sources: C-core ``test/core/service_config/service_config_test.cc``,
``test/core/client_channel/client_channel_service_config_test.cc``, and
the live grpcio 1.85 results of
``tests/e2e/test_differential_service_config_validation.py`` where those
files say nothing (JSON nulls, bounds, millisecond timeouts).
"""

from __future__ import annotations

import json

import grpc
import pytest

import pyxds
from pyxds.lb.registry import select_policy
from pyxds.resolver.api import DefaultConfigSelector
from pyxds.resolver.service_config import MethodConfigSelector, parse_service_config


def mc(**fields):
    return {"methodConfig": [{"name": [{}], **fields}]}


def lookup(sc, path):
    return MethodConfigSelector(parse_service_config(sc), DefaultConfigSelector()).select(path, ())


def test_skip_method_config_with_no_name_or_empty_name():
    """service_config_test.cc SkipMethodConfigWithNoNameOrEmptyName: an
    entry without ``name`` or with ``[]`` applies to nothing (it is not a
    default)."""
    sc = {
        "methodConfig": [
            {"timeout": "1s"},
            {"name": [], "timeout": "2s"},
            {"name": [{"service": "TestServ"}], "timeout": "3s"},
        ]
    }
    assert lookup(sc, "/TestServ/TestMethod").timeout == 3.0
    assert lookup(sc, "/Other/TestMethod").timeout is None


@pytest.mark.parametrize(
    "names",
    [
        [{"service": "TestServ", "method": None}, {"service": "TestServ"}],
        [{"service": "TestServ", "method": ""}, {"service": "TestServ"}],
        [{"service": None}, {}],
        [{"service": ""}, {}],
    ],
    ids=["null method", "empty method", "null service", "empty service"],
)
def test_duplicate_names_null_and_empty_are_the_same(names):
    """service_config_test.cc ErrorDuplicateMethodConfigNamesWith{Null,Empty}Method,
    ErrorDuplicateDefaultMethodConfigsWith{Null,Empty}Service: a null or
    empty service/method is the absent one, so these two entries collide."""
    sc = {"methodConfig": [{"name": [names[0]]}, {"name": [names[1]]}]}
    with pytest.raises(ValueError, match=r"methodConfig\[1\]\.name\[0\]: duplicate"):
        parse_service_config(sc)


def test_json_nulls_are_absent_fields_as_in_c_core():
    """grpcio 1.85 takes ``null`` for name, timeout and waitForReady as
    absent (``{"name": null}`` names nothing), but a null ``methodConfig``
    or ``loadBalancingConfig`` is "not an array"."""
    sc = {"methodConfig": [{"name": [{"service": "S"}], "timeout": None, "waitForReady": None}]}
    got = lookup(sc, "/S/M")
    assert got.timeout is None and got.wait_for_ready is None
    assert lookup({"methodConfig": [{"name": None, "timeout": "1s"}]}, "/S/M").timeout is None
    for key in ("methodConfig", "loadBalancingConfig"):
        with pytest.raises(ValueError, match=key):
            parse_service_config({key: None})
    for key in ("loadBalancingPolicy", "healthCheckConfig"):
        parse_service_config({key: None})


def test_valid_timeout_and_a_timeout_under_a_millisecond_is_none():
    """client_channel_service_config_test.cc ValidTimeout ("5s"); C-core
    keeps durations in whole milliseconds, so "0.0009s" is 0, which like
    "0s" sets no timeout (grpcio 1.85: such an RPC runs to completion)."""
    assert lookup(mc(timeout="5s"), "/S/M").timeout == 5.0
    assert lookup(mc(timeout="0.001s"), "/S/M").timeout == 0.001
    for value in ("0.0009s", "0.000000001s", "0s"):
        assert lookup(mc(timeout=value), "/S/M").timeout is None, value


@pytest.mark.parametrize(
    "value", ["5sec", "5", 5, "-1s", "1.s", ".5s", "1e1s", "1.0000000001s", "315576000001s"]
)
def test_invalid_timeout(value):
    """client_channel_service_config_test.cc InvalidTimeout ("5sec") and
    the other forms grpcio 1.85 rejects."""
    with pytest.raises(ValueError, match=r"methodConfig\[0\]\.timeout"):
        parse_service_config(mc(timeout=value))


#: grpc-go service_config_test.go TestParseDuration's inputs, with grpcio
#: 1.85's verdict (where grpc-go differs, C-core decides: grpc-go takes "1.s",
#: ".002s" and "-1s", refuses " 1s", "1 s" and 2**31 s)
DURATIONS = {
    "1s": 1.0,
    "1.1s": 1.1,
    "1.0s": 1.0,
    "0.003s": 0.003,
    "5000.000000009s": 5000.000000009,
    "4999.999999999s": 4999.999999999,
    "2147483648s": 2147483648.0,
    "00001s": 1.0,
    " 1s": 1.0,
    "1 s": 1.0,
    "\t1s": 1.0,
    "+1s": 1.0,
    "-0.5s": 0.5,
    "1": None,
    "s": None,
    ".s": None,
    "1.s": None,
    ".002s": None,
    "-1s": None,
    "1s ": None,
    "1ms": None,
    "1.1.1s": None,
    "Xs": None,
    "as": None,
    ".0000000001s": None,
    "0x10s": None,
    "1_0s": None,
    "- 1s": None,
    "+-1s": None,
    "\uff11s": None,
}


@pytest.mark.parametrize(("value", "seconds"), DURATIONS.items(), ids=list(map(repr, DURATIONS)))
def test_timeout_forms_as_c_core_reads_them(value, seconds):
    """grpc-go TestParseDuration's table, each checked live on grpcio 1.85:
    C-core's reader takes blanks around the number and a sign ("-0.5s" is
    0.5 s: the sign goes with the 0), and ASCII digits only."""
    if seconds is None:
        with pytest.raises(ValueError, match=r"methodConfig\[0\]\.timeout"):
            parse_service_config(mc(timeout=value))
    else:
        assert lookup(mc(timeout=value), "/S/M").timeout == pytest.approx(seconds, abs=1e-9)


def test_valid_and_invalid_wait_for_ready():
    """client_channel_service_config_test.cc ValidWaitForReady / InvalidWaitForReady."""
    assert lookup(mc(waitForReady=True), "/S/M").wait_for_ready is True
    for value in ("true", 1):
        with pytest.raises(ValueError, match=r"waitForReady: must be a boolean"):
            parse_service_config(mc(waitForReady=value))


def test_message_size_limits_are_uint32_as_in_c_core():
    """grpcio 1.85 takes 0 .. 4294967295 (also as a string) and rejects
    4294967296 "failed to parse non-negative number"."""
    for key in ("maxRequestMessageBytes", "maxResponseMessageBytes"):
        parse_service_config(mc(**{key: 2**32 - 1}))
        parse_service_config(mc(**{key: "10"}))
        for bad in (2**32, str(2**63 - 1), -1, "-1", 10.0):
            with pytest.raises(ValueError, match=key):
                parse_service_config(mc(**{key: bad}))


@pytest.mark.parametrize(
    "lbc",
    [
        [{"pick_first": {}}],
        [{"round_robin": {}}, {}],
        [{"does_not_exist": {}}, {"round_robin": {}}],
        [{"round_robin": {}}, {"pick_first": {"shuffleAddressList": "x"}}],
    ],
    ids=[
        "ValidLoadBalancingConfigPickFirst",
        "ValidLoadBalancingConfigRoundRobin",
        "skip",
        "after",
    ],
)
def test_valid_load_balancing_config(lbc):
    """client_channel_service_config_test.cc ValidLoadBalancingConfig*:
    the first registered policy wins; entries after it are not read."""
    parse_service_config({"loadBalancingConfig": lbc})


@pytest.mark.parametrize(
    "lbc",
    [
        [{"unknown": {}}],
        [],
        [{"pick_first": {"shuffleAddressList": "x"}}, {"round_robin": {}}],
        [{"unknown": {}}, {}, {"round_robin": {}}],
        [{"unknown": 1}, {"round_robin": {}}],
        [{"pick_first": {}, "round_robin": {}}],
    ],
    ids=["UnknownLoadBalancingConfig", "empty", "known bad", "empty entry", "config 1", "oneOf"],
)
def test_invalid_load_balancing_config(lbc):
    """client_channel_service_config_test.cc UnknownLoadBalancingConfig,
    InvalidGrpclbLoadBalancingConfig (a known policy with a bad config fails
    the whole service config, though a later entry would do); grpcio 1.85
    checks the shape of every entry before the chosen one."""
    with pytest.raises(ValueError, match="loadBalancingConfig"):
        parse_service_config({"loadBalancingConfig": lbc})


def test_unknown_policy_with_a_non_object_config_is_rejected_by_the_registry():
    """The LB registry itself (also used for the policies xDS names): an
    entry it skips must still be ``{"name": {...}}``, null included
    (grpcio 1.85: "child entry should be of type object")."""
    for config in (1, None):
        with pytest.raises(ValueError, match=r"\[0\]\.unknown: expected object"):
            select_policy([{"unknown": config}, {"round_robin": {}}], "lbc")


def test_null_policy_config_in_a_service_config_is_refused():
    """grpcio 1.85 refuses a null config in ``loadBalancingConfig`` up to the
    chosen entry, known policy or not ("child entry should be of type
    object"); after it, not read."""
    for lbc in ([{"unknown": None}, {"round_robin": {}}], [{"round_robin": None}]):
        with pytest.raises(ValueError, match=r"loadBalancingConfig\[0\]\.\w+: expected object"):
            parse_service_config({"loadBalancingConfig": lbc})
    parse_service_config({"loadBalancingConfig": [{"round_robin": {}}, {"unknown": None}]})


def test_load_balancing_policy():
    """client_channel_service_config_test.cc ValidLoadBalancingPolicy,
    ValidLoadBalancingPolicyAllCaps, UnknownLoadBalancingPolicy,
    LoadBalancingPolicyXdsNotAllowed; grpcio 1.85 also checks it when
    ``loadBalancingConfig`` is there and wins."""
    for name in ("pick_first", "PICK_FIRST", "round_robin", ""):
        parse_service_config({"loadBalancingPolicy": name})
    for bad in ("unknown", "xds_cluster_impl_experimental", "priority_experimental"):
        with pytest.raises(ValueError, match="loadBalancingPolicy"):
            parse_service_config({"loadBalancingPolicy": bad})
    with pytest.raises(ValueError, match="loadBalancingPolicy"):
        parse_service_config(
            {"loadBalancingConfig": [{"round_robin": {}}], "loadBalancingPolicy": "unknown"}
        )


def test_health_check_config_shape():
    """client_channel_service_config_test.cc ValidHealthCheck; grpcio 1.85
    rejects a non-object and a non-string serviceName."""
    parse_service_config({"healthCheckConfig": {"serviceName": "health_check_service_name"}})
    parse_service_config({"healthCheckConfig": {}})
    with pytest.raises(ValueError, match=r"healthCheckConfig: must be an object"):
        parse_service_config({"healthCheckConfig": 1})
    with pytest.raises(ValueError, match=r"healthCheckConfig\.serviceName"):
        parse_service_config({"healthCheckConfig": {"serviceName": 1}})


@pytest.mark.parametrize(
    "raw", ["", "{} x", '{"healthCheckConfig": {}, "healthCheckConfig": {}}', "[]"]
)
def test_json_errors(raw):
    """service_config_test.cc JsonParseError (empty text),
    client_channel_service_config_test.cc InvalidHealthCheckMultipleEntries
    (a duplicate key), trailing text, a non-object."""
    with pytest.raises(ValueError, match="invalid service config"):
        parse_service_config(raw)


@pytest.mark.parametrize("target", ["ipv4:127.0.0.1:1", "dns:///localhost:1", "xds:///svc"])
def test_invalid_option_makes_a_lame_channel(target):
    """grpcio 1.85 validates ``grpc.service_config`` when it creates the
    channel, whatever the target: when invalid, every RPC fails at once with
    INVALID_ARGUMENT "Failed to create channel to '<target>':..." (wait_for_ready
    ones too) and the channel is in TRANSIENT_FAILURE.  Nothing connects."""
    channel = pyxds.insecure_channel(
        target,
        bootstrap={"xds_servers": [{"server_uri": "127.0.0.1:1"}], "node": {"id": "n"}},
        options=[("grpc.service_config", json.dumps(mc(timeout=1)))],
    )
    try:
        for wfr in (False, True):
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary("/a.B/C")(b"", timeout=5, wait_for_ready=wfr)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = info.value.details()
            assert details.startswith(f"Failed to create channel to '{target}':"), details
            assert "methodConfig[0].timeout" in details
        assert channel.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE
    finally:
        channel.close()


def test_empty_option_text_is_invalid_json():
    """service_config_test.cc JsonParseError: "" is not a service config
    (pyxds took it as no config)."""
    channel = pyxds.insecure_channel("ipv4:127.0.0.1:1", options=[("grpc.service_config", "")])
    try:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/a.B/C")(b"", timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()


def test_invalid_option_makes_a_lame_aio_channel_too():
    """The asyncio channel shares the rule (one ChannelCore)."""
    import asyncio

    import pyxds.aio

    async def run() -> list[tuple[grpc.StatusCode, str]]:
        channel = pyxds.aio.insecure_channel(
            "ipv4:127.0.0.1:1", options=[("grpc.service_config", '{"methodConfig": 1}')]
        )
        got = []
        for wfr in (False, True):
            try:
                await channel.unary_unary("/a.B/C")(b"", timeout=5, wait_for_ready=wfr)
            except grpc.aio.AioRpcError as err:
                got.append((err.code(), err.details()))
        await channel.close()
        return got

    got = asyncio.run(run())
    assert [code for code, _ in got] == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert all(d.startswith("Failed to create channel to 'ipv4:127.0.0.1:1':") for _, d in got)


def test_lb_policy_name_option_falls_back_to_pick_first():
    """C-core: a ``grpc.lb_policy_name`` naming no registered policy (as
    given, no case folding) or one that needs a config means pick_first."""
    from pyxds.resolver.static_resolver import lb_selection_from_options

    for name in ("nope", "ROUND_ROBIN", "priority_experimental"):
        assert lb_selection_from_options({"grpc.lb_policy_name": name}).name == "pick_first"
    assert lb_selection_from_options({"grpc.lb_policy_name": "round_robin"}).name == "round_robin"
