"""rls_experimental's config (grpc/lookup/v1 rls_config.proto, C-core's
RlsLbConfig rules) and its gRPC key builders."""

from __future__ import annotations

import copy
import json

import pytest

from pyxds.lb import LBConfigError, registry
from pyxds.lb.rls_config import (
    DEFAULT_LOOKUP_SERVICE_TIMEOUT,
    MAX_CACHE_SIZE_BYTES,
    MAX_MAX_AGE,
    is_valid_target,
    key_map,
    make_key,
    parse_rls_config,
)

BUILDER = {
    "names": [{"service": "pkg.Svc", "method": "Get"}],
    "headers": [{"key": "user", "names": ["x-user", "x-alt-user"]}],
}


def rls_json(**route_lookup: object) -> dict:
    rlc: dict = {
        "grpcKeybuilders": [copy.deepcopy(BUILDER)],
        "lookupService": "localhost:1234",
        "cacheSizeBytes": "1000",
    }
    rlc.update(route_lookup)
    for name in [k for k, v in rlc.items() if v is None]:
        del rlc[name]
    return {
        "routeLookupConfig": rlc,
        "childPolicy": [{"cds_experimental": {"isDynamic": True}}],
        "childPolicyConfigTargetFieldName": "cluster",
    }


def error_of(config: dict) -> str:
    with pytest.raises(LBConfigError) as info:
        parse_rls_config(config)
    return str(info.value)


# -- defaults and clamping ----------------------------------------------------------


def test_a_minimal_config_takes_the_defaults():
    config = parse_rls_config(rls_json())
    rlc = config.route_lookup
    assert rlc.lookup_service == "localhost:1234"
    assert rlc.lookup_service_timeout == DEFAULT_LOOKUP_SERVICE_TIMEOUT == 10.0
    assert rlc.max_age == MAX_MAX_AGE == 300.0
    assert rlc.stale_age == 300.0
    assert rlc.cache_size_bytes == 1000
    assert rlc.default_target == ""
    assert config.target_field == "cluster"
    assert config.default_child is None


def test_max_age_is_capped_at_five_minutes():
    assert parse_rls_config(rls_json(maxAge="3600s")).route_lookup.max_age == 300.0
    assert parse_rls_config(rls_json(maxAge="20.5s")).route_lookup.max_age == 20.5


def test_stale_age_at_or_above_max_age_is_clamped_to_max_age():
    rlc = parse_rls_config(rls_json(maxAge="20s", staleAge="30s")).route_lookup
    assert (rlc.max_age, rlc.stale_age) == (20.0, 20.0)
    rlc = parse_rls_config(rls_json(maxAge="20s", staleAge="5s")).route_lookup
    assert (rlc.max_age, rlc.stale_age) == (20.0, 5.0)


def test_stale_age_without_max_age_is_rejected():
    assert "routeLookupConfig.maxAge: must be set if staleAge is set" in error_of(
        rls_json(staleAge="5s")
    )


def test_zero_max_age_and_timeout_mean_unset_as_the_proto_says():
    rlc = parse_rls_config(rls_json(maxAge="0s", lookupServiceTimeout="0s")).route_lookup
    assert rlc.max_age == 300.0
    assert rlc.lookup_service_timeout == 10.0


def test_cache_size_is_capped_at_5_mib_and_takes_a_number_or_a_string():
    assert parse_rls_config(rls_json(cacheSizeBytes=10**9)).route_lookup.cache_size_bytes == (
        MAX_CACHE_SIZE_BYTES
    )
    assert parse_rls_config(rls_json(cacheSizeBytes=77)).route_lookup.cache_size_bytes == 77
    for text in ("77", " 77 ", "+77"):  # read as grpcio 1.85 reads an int64
        assert parse_rls_config(rls_json(cacheSizeBytes=text)).route_lookup.cache_size_bytes == 77


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "field not present"),
        (0, "must be greater than 0"),
        ("-5", "must be greater than 0"),
        ("1.5", "failed to parse number"),
        (77.0, "failed to parse number"),  # grpcio 1.85 refuses it too
        (1e3, "failed to parse number"),
        ("- 5", "failed to parse number"),
        (True, "is not a number"),
    ],
)
def test_cache_size_must_be_a_positive_integer(value, problem):
    error = error_of(rls_json(cacheSizeBytes=value))
    assert f"routeLookupConfig.cacheSizeBytes: {problem}" in error


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("5", "Not a duration (no s suffix)"),
        ("-1s", "seconds must be in the range [0, 315576000000]"),
        ("315576000001s", "seconds must be in the range [0, 315576000000]"),
        ("1.0123456789s", "Not a duration (too many digits after decimal)"),
        ("1.xs", "Not a duration (not a number of nanoseconds)"),
        ("abcs", "Not a duration (not a number of seconds)"),
        (5, "is not a string"),
    ],
)
def test_bad_durations_are_rejected_in_c_cores_words(value, problem):
    for field in ("lookupServiceTimeout", "maxAge"):
        assert f"routeLookupConfig.{field}: {problem}" in error_of(rls_json(**{field: value}))


# -- lookup service and default target ------------------------------------------------


#: lookup_service values and what grpcio 1.85's C-core said of them (NACK
#: or not), measured through pyxds.server; tests/e2e/test_differential_rls.py
#: keeps a part of the table compared with C-core.
VALID_TARGETS = [
    "dns:///x?=y",
    "ipv6:[::1]:80%",
    "ipv4:1.2.3.4:80abc",
    "a b?c",
    "unix:",
    "[::1]:80",
    "dns:foo",
    "foo bar",
    "localhost",
    "weird:///x",
    "ipv4:",
    "ipv4:1.2.3.4:80",
    "unix:/tmp/x",
    "xds:foo",
    "dns:///a b",
    "http://x",
    "ipv6:",
    "ipv6:[::1]:80",
    "ipv4:,",
    "xds://auth/x",
    "vsock:",
    "vsock:bad",
    "unix-abstract:",
    "google-c2p:///x",
    "google-c2p:x",
    "google-c2p:",
    "a\tb",
    "dns:///x\ny",
    ":",
    "1.2.3.4",
    "dns:///%zz",
    "dns:///x?y",
    "dns:///x#f",
    "dns://8.8.8.8/foo",
    "vsock:1:2",
    "ipv4:1.2.3.4:80?x",
    "unix:relative",
    "unix:/tmp/a,/tmp/b",
    "ipv6:[::1]:80,,[::2]:81",
    "ipv4:%31.2.3.4:80",
    "unix:/tmp/a%20b",
    "dns:///x%",
    "UNIX:/tmp/x",
    "unix:" + "a" * 107,
    "localhost:1234",
    "dns:///rls.example.com:443",
    "127.0.0.1:1",
    "ipv4:127.0.0.1:5",
    "xds:///x",
    "a b:1",
    "ipv6:[::1%1]:80",
]
INVALID_TARGETS = [
    "dns:///x?",
    "dns:///x?a b",
    "dns:///x#a#b",
    "ipv6:[::1%no-such-if0]:80",
    "dns:///",
    "dns://8.8.8.8/",
    "xds:",
    "xds://auth/",
    "xds:///",
    "xds:///svc/",
    "dns:",
    "dns://",
    "",
    "ipv4://auth/1.2.3.4:80",
    "ipv4:bogus",
    "ipv4:1.2.3.4",
    "unix://host/p",
    "ipv4:1.2.3.4:80,bad",
    "ipv6:[::1]",
    "ipv6:::1",
    "ipv4:1.2.3.4:99999",
    "ipv4:1.2.3.4:",
    "unix:" + "a" * 108,
    "unix:" + "a" * 200,
    "unix-abstract:" + "a" * 200,
    "google-c2p://a/x",
    "ipv4:1.2.3:80",
    "ipv6:1.2.3.4:80",
    "ipv4:[1.2.3.4]:80",
    "ipv4:1.2.3.4:http",
    "IPV4:bogus",
]


@pytest.mark.parametrize("target", VALID_TARGETS)
def test_valid_lookup_service_targets(target):
    assert is_valid_target(target)
    assert parse_rls_config(rls_json(lookupService=target)).route_lookup.lookup_service == target


@pytest.mark.parametrize("target", INVALID_TARGETS)
def test_invalid_lookup_service_targets_are_rejected(target):
    assert not is_valid_target(target)
    assert "routeLookupConfig.lookupService: must be valid gRPC target URI" in error_of(
        rls_json(lookupService=target)
    )


def test_lookup_service_is_required():
    assert "routeLookupConfig.lookupService: field not present" in error_of(
        rls_json(lookupService=None)
    )


def test_default_target_must_be_non_empty_if_set():
    assert "routeLookupConfig.defaultTarget: must be non-empty if set" in error_of(
        rls_json(defaultTarget="")
    )
    config = parse_rls_config(rls_json(defaultTarget="cluster-d"))
    assert config.route_lookup.default_target == "cluster-d"
    assert config.default_child is not None
    assert config.default_child.name == "cds_experimental"
    assert config.default_child.config.cluster == "cluster-d"


# -- key builders ---------------------------------------------------------------------


def with_builders(*builders: dict) -> dict:
    return rls_json(grpcKeybuilders=list(builders))


def test_key_builders_are_required_but_may_be_empty():
    assert "routeLookupConfig.grpcKeybuilders: field not present" in error_of(
        rls_json(grpcKeybuilders=None)
    )
    config = parse_rls_config(with_builders())
    assert config.route_lookup.key_builders.build("/a/b", [("x", "y")], "host") == make_key(())


@pytest.mark.parametrize(
    ("builder", "where", "problem"),
    [
        ({}, ".names", "field not present"),
        ({"names": []}, ".names", "must be non-empty"),
        ({"names": [{"method": "m"}]}, ".names[0].service", "field not present"),
        (
            {"names": [{"service": "s"}], "headers": [{"key": "", "names": ["h"]}]},
            ".headers[0].key",
            "must be non-empty",
        ),
        (
            {"names": [{"service": "s"}], "headers": [{"key": "k", "names": []}]},
            ".headers[0].names",
            "must be non-empty",
        ),
        (
            {"names": [{"service": "s"}], "headers": [{"key": "k", "names": ["a", ""]}]},
            ".headers[0].names[1]",
            "must be non-empty",
        ),
        (
            {
                "names": [{"service": "s"}],
                "headers": [{"key": "k", "names": ["a"], "requiredMatch": True}],
            },
            ".headers[0].requiredMatch",
            "must not be present",
        ),
        (
            {"names": [{"service": "s"}], "extraKeys": {"host": ""}},
            ".extraKeys.host",
            "must be non-empty if set",
        ),
        (
            {"names": [{"service": "s"}], "constantKeys": {"": "v"}},
            '.constantKeys[""]',
            "key must be non-empty",
        ),
        (
            {
                "names": [{"service": "s"}],
                "headers": [{"key": "k", "names": ["a"]}],
                "constantKeys": {"k": "v"},
            },
            '.constantKeys["k"]',
            'duplicate key "k"',
        ),
        (
            {"names": [{"service": "s"}], "constantKeys": {"k": "v"}, "extraKeys": {"method": "k"}},
            ".extraKeys.method",
            'duplicate key "k"',
        ),
        (
            {
                "names": [{"service": "s"}],
                "headers": [{"key": "k", "names": ["a"]}, {"key": "k", "names": ["b"]}],
            },
            ".headers[1].key",
            'duplicate key "k"',
        ),
    ],
)
def test_bad_key_builders_are_rejected_naming_the_field(builder, where, problem):
    assert f"routeLookupConfig.grpcKeybuilders[0]{where}: {problem}" in error_of(
        with_builders(builder)
    )


def test_a_path_may_have_one_key_builder_only():
    one = {"names": [{"service": "s", "method": "m"}]}
    two = {"names": [{"service": "t"}, {"service": "s", "method": "m"}]}
    assert 'routeLookupConfig.grpcKeybuilders[1]: duplicate entry for "/s/m"' in error_of(
        with_builders(one, two)
    )


def build_key(builders: list[dict], path: str, metadata=(), host: str = "svc.example") -> dict:
    config = parse_rls_config(with_builders(*builders))
    return key_map(config.route_lookup.key_builders.build(path, list(metadata), host))


FULL = {
    "names": [{"service": "pkg.Svc", "method": "Get"}],
    "headers": [{"key": "user", "names": ["x-user", "x-alt-user"]}],
    "extraKeys": {"host": "h", "service": "s", "method": "m"},
    "constantKeys": {"kind": "get"},
}
WILDCARD = {
    "names": [{"service": "pkg.Svc"}],
    "headers": [{"key": "team", "names": ["x-team"]}],
    "constantKeys": {"kind": "any"},
}


@pytest.mark.parametrize(
    ("path", "metadata", "expected"),
    [
        # the exact method's builder: headers, constant and extra keys
        (
            "/pkg.Svc/Get",
            [("x-user", "alice")],
            {"user": "alice", "h": "svc.example", "s": "pkg.Svc", "m": "Get", "kind": "get"},
        ),
        # the first listed header present wins
        (
            "/pkg.Svc/Get",
            [("x-alt-user", "bob"), ("x-user", "carol")],
            {"user": "carol", "h": "svc.example", "s": "pkg.Svc", "m": "Get", "kind": "get"},
        ),
        (
            "/pkg.Svc/Get",
            [("x-alt-user", "bob")],
            {"user": "bob", "h": "svc.example", "s": "pkg.Svc", "m": "Get", "kind": "get"},
        ),
        # several values of one header are joined with ","
        (
            "/pkg.Svc/Get",
            [("x-user", "a"), ("other", "z"), ("x-user", "b")],
            {"user": "a,b", "h": "svc.example", "s": "pkg.Svc", "m": "Get", "kind": "get"},
        ),
        # no header: no key for it
        ("/pkg.Svc/Get", [], {"h": "svc.example", "s": "pkg.Svc", "m": "Get", "kind": "get"}),
        # another method of the service: the service's builder
        ("/pkg.Svc/List", [("x-team", "t1"), ("x-user", "u")], {"team": "t1", "kind": "any"}),
        # another service: no builder, empty key
        ("/other.Svc/Get", [("x-user", "alice")], {}),
    ],
)
def test_key_builder_table(path, metadata, expected):
    assert build_key([FULL, WILDCARD], path, metadata) == expected


def test_binary_headers_never_make_keys():
    builder = {"names": [{"service": "s"}], "headers": [{"key": "k", "names": ["x-id-bin", "x"]}]}
    assert build_key([builder], "/s/m", [("x-id-bin", b"\x00"), ("x", "v")]) == {"k": "v"}


def test_path_pseudo_header_is_the_rpc_path_as_in_c_core():
    """C-core's pick sees ``:path`` among the request headers, so a header
    key naming it gets the RPC's path (with or without other metadata);
    ``:authority`` and headers gRPC adds after the pick give no key
    (tests/e2e/test_differential_rls.py compares the key maps)."""
    builder = {
        "names": [{"service": "s"}],
        "headers": [
            {"key": "p", "names": [":path"]},
            {"key": "a", "names": [":authority"]},
            {"key": "ua", "names": ["user-agent", "content-type", "te"]},
            {"key": "u", "names": ["X-User", "x-user"]},
        ],
    }
    assert build_key([builder], "/s/m", []) == {"p": "/s/m"}
    assert build_key([builder], "/s/m", [("x-user", "a")]) == {"p": "/s/m", "u": "a"}
    # an application header of that name cannot replace the path
    assert build_key([builder], "/s/m", [(":path", "/x/y")]) == {"p": "/s/m"}


def test_keys_round_trip_and_differ_when_key_maps_differ():
    pairs = [("b", "2"), ("a", "1,x"), ("c", '"=,{}')]
    key = make_key(pairs)
    assert key_map(key) == dict(pairs)
    assert make_key(reversed(pairs)) == key
    assert make_key([("a", "1"), ("b", "2")]) != make_key([("a", "12")])
    assert make_key([("a,b", "")]) != make_key([("a", ""), ("b", "")])


def test_a_key_is_the_same_whatever_the_metadata_order():
    config = parse_rls_config(with_builders(FULL))
    build = config.route_lookup.key_builders.build
    a = build("/pkg.Svc/Get", [("x-user", "u"), ("z", "1")], "h")
    b = build("/pkg.Svc/Get", [("z", "1"), ("x-user", "u")], "h")
    assert a == b and hash(a) == hash(b)


# -- child policy and the rest --------------------------------------------------------


def test_target_field_is_required_and_non_empty():
    config = rls_json()
    del config["childPolicyConfigTargetFieldName"]
    assert "childPolicyConfigTargetFieldName: field not present" in error_of(config)
    config["childPolicyConfigTargetFieldName"] = ""
    assert "childPolicyConfigTargetFieldName: must be non-empty" in error_of(config)


@pytest.mark.parametrize(
    ("child_policy", "problem"),
    [
        ({"cds_experimental": {}}, "childPolicy: expected array"),
        ([1], "childPolicy[0]: is not an object"),
        ([{"a": {}, "b": {}}], "childPolicy[0]: child policy object contains more than one field"),
        ([{"cds_experimental": 3}], 'childPolicy[0]["cds_experimental"]: child policy config'),
        ([{"no_such_policy": {}}], "no supported load balancing policy"),
    ],
)
def test_bad_child_policies_are_rejected(child_policy, problem):
    config = rls_json()
    config["childPolicy"] = child_policy
    assert problem in error_of(config)


def test_only_the_chosen_child_policy_is_kept_with_the_target_field_set():
    config = rls_json()
    config["childPolicy"] = [{"no_such_policy": {}}, {"cds_experimental": {"isDynamic": True}}]
    parsed = parse_rls_config(config)
    assert json.loads(parsed.child_policy) == [
        {"cds_experimental": {"isDynamic": True, "cluster": "fake_target_field_value"}}
    ]
    child = parsed.child_config("cluster-x")
    assert child.name == "cds_experimental"
    assert (child.config.cluster, child.config.is_dynamic) == ("cluster-x", True)


def test_a_bad_channel_service_config_is_rejected():
    config = rls_json()
    config["routeLookupChannelServiceConfig"] = {"methodConfig": 5}
    assert "routeLookupChannelServiceConfig" in error_of(config)
    config["routeLookupChannelServiceConfig"] = {"loadBalancingConfig": [{"round_robin": {}}]}
    assert parse_rls_config(config).channel_service_config is not None


def test_http_keybuilders_and_valid_targets_are_ignored():
    config = rls_json(httpKeybuilders=[{"hostPatterns": ["x"]}], validTargets=["a"])
    assert parse_rls_config(config) == parse_rls_config(rls_json())


def test_the_policy_is_registered_and_configs_compare_by_value():
    selection = registry.select_policy([{"rls_experimental": rls_json()}])
    assert selection.name == "rls_experimental"
    assert selection.config == parse_rls_config(rls_json())
    assert parse_rls_config(rls_json(maxAge="10s")) != parse_rls_config(rls_json())
