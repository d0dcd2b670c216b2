"""Conformance: Cluster (CDS) validation, case by case against other
implementations' resource-type tests.

Sources (each test names its case):

* C-core ``test/core/xds/xds_cluster_resource_type_test.cc`` (grpc/grpc):
  accept/NACK, and the field path and words of each NACK.
* C-core ``test/core/xds/xds_lb_policy_registry_test.cc``: the
  ``load_balancing_policy`` conversion (A52) with its field paths.
* gRFCs A27/A37 (cluster types), A42/A76 (ring size limits), A50 (outlier
  detection fields), A52 (custom LB policies, depth limit), A64/A85 (LRS
  metric propagation), A75 (upstream_config idle timeout).

Cases already pinned elsewhere (tests/unit/test_conformance_resources.py,
test_resources_cluster.py, test_conformance_security.py) are not repeated:
docs in /work/reports/conformcds.md list which test covers which case.
C-core's errors read ``field:<path> error:<words>``; pyxds's read
``<path>: <words>``, so each check looks for that pair.
"""

from __future__ import annotations

import json

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
    client_side_weighted_round_robin_pb2 as cswrr_pb2,
)
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2
from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
from envoy.extensions.transport_sockets.http_11_proxy.v3 import upstream_http_11_connect_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.xds.resources import CLUSTER
from pyxds.xds.resources.types import Cluster

CORE = "grpc/grpc test/core/xds/xds_cluster_resource_type_test.cc"
REGISTRY = "grpc/grpc test/core/xds/xds_lb_policy_registry_test.cc"
LBP = "load_balancing_policy.policies[0].typed_extension_config.typed_config"
_LB = "envoy.extensions.load_balancing_policies."
WRR_LOCALITY_T = _LB + "wrr_locality.v3.WrrLocality"
RING_HASH_T = _LB + "ring_hash.v3.RingHash"
LEAST_REQUEST_T = _LB + "least_request.v3.LeastRequest"
CSWRR_T = _LB + "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin"
HPO_T = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
AGG_T = "envoy.extensions.clusters.aggregate.v3.ClusterConfig"


# ---------------------------------------------------------------- helpers


def eds(name: str = "foo") -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.self.SetInParent()
    return c


def ok(c: cluster_pb2.Cluster) -> Cluster:
    result = CLUSTER.decode(c.SerializeToString())
    assert result.error is None, result.error
    assert result.name == c.name
    resource: Cluster = result.resource
    return resource


def nack(c: cluster_pb2.Cluster) -> list[str]:
    """The NACK's errors, one ``path: words`` string each."""
    result = CLUSTER.decode(c.SerializeToString())
    assert result.resource is None and result.error, "expected a NACK"
    assert result.name == c.name
    errors: list[str] = result.error.split("; ")
    return errors


def with_policy(*anys) -> cluster_pb2.Cluster:
    """An EDS cluster whose load_balancing_policy lists ``anys`` in order
    (each a message to pack, or an Any-filling callable)."""
    c = eds()
    for msg in anys:
        typed = c.load_balancing_policy.policies.add().typed_extension_config.typed_config
        if callable(msg):
            msg(typed)
        else:
            typed.Pack(msg)
    return c


def wrr_over(*anys) -> wrr_locality_pb2.WrrLocality:
    w = wrr_locality_pb2.WrrLocality()
    for msg in anys:
        w.endpoint_picking_policy.policies.add().typed_extension_config.typed_config.Pack(msg)
    return w


def lb(c: cluster_pb2.Cluster) -> list[dict[str, object]]:
    return ok(c).lb_policy_json()


# ---------------------------------------------------------------- basics and cluster types


def test_unparsable_cluster_bytes_are_nacked():
    """C-core XdsClusterTest.UnparsableProto."""
    result = CLUSTER.decode(b"\0")
    assert result.resource is None and result.error


def test_minimum_valid_cluster_has_c_core_defaults():
    """C-core XdsClusterTest.MinimumValidConfig: EDS, no service name,
    wrr_locality over round_robin, no LRS, 1024 requests, no outlier detection."""
    r = ok(eds())
    assert r.kind == "EDS" and r.eds_service_name is None
    assert r.eds_resource_name == "foo"
    assert r.lb_policy_json() == [
        {"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}
    ]
    assert r.lrs_server is False
    assert r.max_requests == 1024
    assert r.outlier_detection is None


def test_eds_config_source_ads_is_accepted():
    """C-core ClusterTypeTest.EdsConfigSourceAds."""
    c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.ads.SetInParent()
    assert ok(c).eds_service_name is None


def test_eds_service_name_names_the_eds_resource():
    """C-core ClusterTypeTest.EdsServiceName."""
    c = eds()
    c.eds_cluster_config.service_name = "bar"
    assert ok(c).eds_resource_name == "bar"


def test_eds_cluster_config_without_eds_config_names_the_field():
    """C-core ClusterTypeTest.EdsConfigSourceMissing."""
    c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.SetInParent()
    assert nack(c) == ["eds_cluster_config.eds_config: field not present"]


def test_eds_config_source_path_is_not_ads_or_self():
    """C-core ClusterTypeTest.EdsConfigSourceWrongType."""
    c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.path = "/whee"
    assert nack(c) == ["eds_cluster_config.eds_config: ConfigSource is not ads or self"]


def test_xdstp_cluster_without_service_name_in_c_core_words():
    """C-core ClusterTypeTest.EdsServiceNameAbsentWithXdstpName."""
    assert nack(eds("xdstp:foo")) == [
        "eds_cluster_config.service_name: must be set if Cluster resource has an xdstp name"
    ]


def _dns() -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.LOGICAL_DNS)


def test_logical_dns_cluster_keeps_host_and_port():
    """C-core ClusterTypeTest.LogicalDnsValid (hostname server.example.com:443)."""
    c = _dns()
    sa = c.load_assignment.endpoints.add().lb_endpoints.add().endpoint.address.socket_address
    sa.address = "server.example.com"
    sa.port_value = 443
    r = ok(c)
    assert (r.kind, r.dns_hostname, r.dns_port) == ("LOGICAL_DNS", "server.example.com", 443)


def test_logical_dns_without_load_assignment_in_c_core_words():
    """C-core ClusterTypeTest.LogicalDnsMissingLoadAssignment."""
    assert nack(_dns()) == ["load_assignment: field not present for LOGICAL_DNS cluster"]


def test_logical_dns_with_two_endpoints_in_c_core_words():
    """C-core ClusterTypeTest.LogicalDnsLocalityTooManyEndpoints."""
    c = _dns()
    loc = c.load_assignment.endpoints.add()
    loc.lb_endpoints.add()
    loc.lb_endpoints.add()
    assert nack(c) == [
        "load_assignment.endpoints[0].lb_endpoints: must contain exactly one endpoint for "
        "LOGICAL_DNS cluster, found 2"
    ]


@pytest.mark.parametrize(
    ("depth", "field"),
    [
        (0, "endpoint"),  # LogicalDnsEndpointMissing
        (1, "endpoint.address"),  # LogicalDnsAddressMissing
        (2, "endpoint.address.socket_address"),  # LogicalDnsSocketAddressMissing
    ],
)
def test_logical_dns_missing_endpoint_parts_are_named(depth, field):
    """C-core ClusterTypeTest.LogicalDnsEndpointMissing / LogicalDnsAddressMissing /
    LogicalDnsSocketAddressMissing."""
    c = _dns()
    lbe = c.load_assignment.endpoints.add().lb_endpoints.add()
    if depth >= 1:
        lbe.endpoint.SetInParent()
    if depth >= 2:
        lbe.endpoint.address.SetInParent()
    assert nack(c) == [f"load_assignment.endpoints[0].lb_endpoints[0].{field}: field not present"]


def _aggregate(cfg_any) -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(name="foo")
    c.cluster_type.name = "envoy.clusters.aggregate"
    cfg_any(c.cluster_type.typed_config)
    return c


def test_aggregate_cluster_keeps_children_in_priority_order():
    """C-core ClusterTypeTest.AggregateClusterValid."""
    cfg = aggregate_pb2.ClusterConfig(clusters=["bar", "baz", "quux"])
    r = ok(_aggregate(lambda a: a.Pack(cfg)))
    assert (r.kind, r.aggregate_children) == ("AGGREGATE", ("bar", "baz", "quux"))


def test_aggregate_cluster_child_with_an_empty_name_is_accepted():
    """A37 "Validation" asks only for at least one entry; C-core's
    AggregateClusterParse keeps every name (xds_cluster_parser.cc), so a
    child named "" is a cluster that does not exist, not a NACK."""
    cfg = aggregate_pb2.ClusterConfig(clusters=["bar", ""])
    assert ok(_aggregate(lambda a: a.Pack(cfg))).aggregate_children == ("bar", "")


def test_aggregate_cluster_errors_name_the_config_type():
    """C-core ClusterTypeTest.AggregateClusterEmptyClusterList and
    AggregateClusterUnparsableProto: the path names the Any's type."""
    empty = _aggregate(lambda a: a.Pack(aggregate_pb2.ClusterConfig()))
    assert nack(empty) == [f"cluster_type.typed_config.value[{AGG_T}].clusters: must be non-empty"]

    def garbage(a):
        a.type_url = f"type.googleapis.com/{AGG_T}"
        a.value = b"\0"

    assert nack(_aggregate(garbage)) == [
        f"cluster_type.typed_config.value[{AGG_T}]: can't parse aggregate cluster config"
    ]


# ---------------------------------------------------------------- lb_policy enum


def _ring_hash_enum(lo=None, hi=None, fn=None) -> cluster_pb2.Cluster:
    c = eds()
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    c.ring_hash_lb_config.SetInParent()
    if lo is not None:
        c.ring_hash_lb_config.minimum_ring_size.value = lo
    if hi is not None:
        c.ring_hash_lb_config.maximum_ring_size.value = hi
    if fn is not None:
        c.ring_hash_lb_config.hash_function = fn
    return c


def test_ring_hash_enum_sizes_are_kept():
    """C-core LbPolicyTest.EnumLbPolicyRingHashSetMinAndMaxRingSize."""
    assert lb(_ring_hash_enum(2048, 4096)) == [
        {"ring_hash_experimental": {"maxRingSize": 4096, "minRingSize": 2048}}
    ]


@pytest.mark.parametrize("size", [0, 8388609])
def test_ring_hash_enum_sizes_out_of_range_name_both_fields(size):
    """C-core LbPolicyTest.EnumLbPolicyRingHashSetMinAndMaxRingSizeToZero /
    ...TooLarge (A42: [1, 8388608])."""
    errors = nack(_ring_hash_enum(size, size))
    assert sorted(errors) == [
        "ring_hash_lb_config.maximum_ring_size: must be in the range of 1 to 8388608",
        "ring_hash_lb_config.minimum_ring_size: must be in the range of 1 to 8388608",
    ]


def test_ring_hash_enum_min_above_max_in_c_core_words():
    """C-core LbPolicyTest.EnumLbPolicyRingHashSetMinRingSizeLargerThanMaxRingSize."""
    assert nack(_ring_hash_enum(1025, 1024)) == [
        "ring_hash_lb_config.minimum_ring_size: cannot be greater than maximum_ring_size"
    ]


def test_ring_hash_enum_murmur_hash_in_c_core_words():
    """C-core LbPolicyTest.EnumLbPolicyRingHashUnsupportedHashFunction."""
    c = _ring_hash_enum(fn=cluster_pb2.Cluster.RingHashLbConfig.MURMUR_HASH_2)
    assert nack(c) == ["ring_hash_lb_config.hash_function: invalid hash function"]


def test_load_balancing_policy_wins_over_the_lb_policy_enum():
    """C-core LbPolicyTest.LoadBalancingPolicyField (MAGLEV is ignored)."""
    c = with_policy(wrr_over(round_robin_pb2.RoundRobin()))
    c.lb_policy = cluster_pb2.Cluster.MAGLEV
    assert lb(c) == [{"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}]


# ---------------------------------------------------------------- load_balancing_policy (A52)


def test_wrr_locality_without_child_names_the_wrr_locality_value():
    """C-core LbPolicyTest.XdsLbPolicyRegistryConversionFails and
    XdsLbPolicyRegistryTest WrrLocality.MissingEndpointPickingPolicy."""
    c = with_policy(wrr_locality_pb2.WrrLocality())
    assert nack(c) == [f"{LBP}.value[{WRR_LOCALITY_T}].endpoint_picking_policy: field not present"]


def test_custom_policy_the_registry_rejects_is_named_at_load_balancing_policy():
    """C-core LbPolicyTest.ConvertedCustomPolicyFailsValidation: a TypedStruct
    naming xds_wrr_locality_experimental without childPolicy."""
    ts = typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/xds_wrr_locality_experimental")
    errors = nack(with_policy(ts))
    assert len(errors) == 1
    assert errors[0].startswith("load_balancing_policy: errors validating")
    assert "childPolicy" in errors[0]


def test_round_robin_policy():
    """C-core XdsLbPolicyRegistryTest RoundRobin.Basic."""
    assert lb(with_policy(round_robin_pb2.RoundRobin())) == [{"round_robin": {}}]


def test_client_side_wrr_default_config_is_empty():
    """C-core ClientSideWeightedRoundRobinTest.DefaultConfig."""
    assert lb(with_policy(cswrr_pb2.ClientSideWeightedRoundRobin())) == [
        {"weighted_round_robin": {}}
    ]


def test_client_side_wrr_fields_are_converted():
    """C-core ClientSideWeightedRoundRobinTest.FieldsExplicitlySet (durations as
    JSON duration strings; "1s" and C-core's "1.000000000s" mean the same)."""
    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.enable_oob_load_report.value = True
    m.oob_reporting_period.seconds = 1
    m.blackout_period.seconds = 2
    m.weight_expiration_period.seconds = 3
    m.weight_update_period.seconds = 4
    m.error_utilization_penalty.value = 5.0
    [entry] = lb(with_policy(m))
    cfg = entry["weighted_round_robin"]
    assert isinstance(cfg, dict)
    assert cfg["enableOobLoadReport"] is True
    assert cfg["errorUtilizationPenalty"] == 5.0
    for key, seconds in (
        ("oobReportingPeriod", 1),
        ("blackoutPeriod", 2),
        ("weightExpirationPeriod", 3),
        ("weightUpdatePeriod", 4),
    ):
        assert float(cfg[key].rstrip("s")) == seconds


def test_client_side_wrr_invalid_values_name_each_field_under_the_value():
    """C-core ClientSideWeightedRoundRobinTest.InvalidValues."""
    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.oob_reporting_period.seconds = -1
    m.blackout_period.seconds = -2
    m.weight_expiration_period.seconds = -3
    m.weight_update_period.seconds = -4
    m.error_utilization_penalty.value = -1
    p = f"{LBP}.value[{CSWRR_T}]"
    rng = "value must be in the range [0, 315576000000]"
    assert sorted(nack(with_policy(m))) == [
        f"{p}.blackout_period.seconds: {rng}",
        f"{p}.error_utilization_penalty: value must be non-negative",
        f"{p}.oob_reporting_period.seconds: {rng}",
        f"{p}.weight_expiration_period.seconds: {rng}",
        f"{p}.weight_update_period.seconds: {rng}",
    ]


def test_ring_hash_policy_defaults_and_explicit_sizes():
    """C-core RingHashConfig.DefaultConfig / FieldsExplicitlySet."""
    assert lb(with_policy(ring_hash_pb2.RingHash())) == [
        {"ring_hash_experimental": {"maxRingSize": 8388608, "minRingSize": 1024}}
    ]
    m = ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.XX_HASH)
    m.minimum_ring_size.value = 1234
    m.maximum_ring_size.value = 4567
    assert lb(with_policy(m)) == [
        {"ring_hash_experimental": {"maxRingSize": 4567, "minRingSize": 1234}}
    ]


def test_ring_hash_policy_murmur_hash_names_the_ring_hash_value():
    """C-core RingHashConfig.InvalidHashFunction."""
    m = ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.MURMUR_HASH_2)
    assert nack(with_policy(m)) == [
        f"{LBP}.value[{RING_HASH_T}].hash_function: unsupported value (must be XX_HASH)"
    ]


@pytest.mark.parametrize("size", [0, 8388609])
def test_ring_hash_policy_sizes_out_of_range_name_both_fields(size):
    """C-core RingHashConfig.RingSizesTooHigh / RingSizesTooLow."""
    m = ring_hash_pb2.RingHash()
    m.minimum_ring_size.value = size
    m.maximum_ring_size.value = size
    p = f"{LBP}.value[{RING_HASH_T}]"
    assert sorted(nack(with_policy(m))) == [
        f"{p}.maximum_ring_size: value must be in the range [1, 8388608]",
        f"{p}.minimum_ring_size: value must be in the range [1, 8388608]",
    ]


def test_ring_hash_policy_min_above_max():
    """C-core RingHashConfig.MinRingSizeGreaterThanMaxRingSize."""
    m = ring_hash_pb2.RingHash()
    m.minimum_ring_size.value = 1000
    m.maximum_ring_size.value = 999
    assert nack(with_policy(m)) == [
        f"{LBP}.value[{RING_HASH_T}].minimum_ring_size: cannot be greater than maximum_ring_size"
    ]


def test_least_request_policy_choice_count_below_two_names_the_value():
    """A48 (choice_count >= 2); C-core's path shape for a policy's field
    (XdsLbPolicyRegistryTest RingHashConfig.InvalidHashFunction)."""
    m = least_request_pb2.LeastRequest()
    m.choice_count.value = 1
    assert nack(with_policy(m)) == [
        f"{LBP}.value[{LEAST_REQUEST_T}].choice_count: must be greater than or equal to 2"
    ]
    assert lb(with_policy(least_request_pb2.LeastRequest())) == [
        {"least_request_experimental": {"choiceCount": 2}}
    ]


def test_wrr_locality_child_error_names_the_whole_path():
    """C-core WrrLocality.ChildPolicyInvalid."""
    inner = ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.MURMUR_HASH_2)
    assert nack(with_policy(wrr_over(inner))) == [
        f"{LBP}.value[{WRR_LOCALITY_T}].endpoint_picking_policy.policies[0]"
        f".typed_extension_config.typed_config.value[{RING_HASH_T}].hash_function: "
        "unsupported value (must be XX_HASH)"
    ]


def test_wrr_locality_without_a_supported_child():
    """C-core WrrLocality.NoSupportedChildPolicy."""
    unknown = cluster_pb2.LoadBalancingPolicy()
    assert nack(with_policy(wrr_over(unknown))) == [
        f"{LBP}.value[{WRR_LOCALITY_T}].endpoint_picking_policy: "
        "no supported load balancing policy config found"
    ]


def test_wrr_locality_skips_an_unsupported_child():
    """C-core WrrLocality.UnsupportedChildPolicyTypeSkipped."""
    c = with_policy(wrr_over(cluster_pb2.LoadBalancingPolicy(), round_robin_pb2.RoundRobin()))
    assert lb(c) == [{"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}]


@pytest.mark.parametrize("shuffle", [None, False, True])
def test_pick_first_shuffle_address_list(shuffle):
    """C-core PickFirst.NoShuffle / Shuffle / ShuffleOmitted (A62)."""
    m = pick_first_pb2.PickFirst()
    if shuffle is not None:
        m.shuffle_address_list = shuffle
    assert lb(with_policy(m)) == [{"pick_first": {"shuffleAddressList": bool(shuffle)}}]


def test_empty_load_balancing_policy_is_nacked():
    """C-core XdsLbPolicyRegistryTest.EmptyLoadBalancingPolicy."""
    c = eds()
    c.load_balancing_policy.SetInParent()
    assert nack(c) == ["load_balancing_policy: no supported load balancing policy config found"]


def test_policy_entry_without_typed_extension_config_is_named():
    """C-core XdsLbPolicyRegistryTest.MissingTypedExtensionConfig."""
    c = eds()
    c.load_balancing_policy.policies.add()
    assert nack(c) == [
        "load_balancing_policy.policies[0].typed_extension_config: field not present"
    ]


def test_policy_entry_without_typed_config_is_named():
    """C-core XdsLbPolicyRegistryTest.MissingTypedConfig."""
    c = eds()
    c.load_balancing_policy.policies.add().typed_extension_config.name = "x"
    assert nack(c) == [f"{LBP}: field not present"]


def test_typed_struct_without_a_type_name_is_an_error_not_skipped():
    """C-core XdsLbPolicyRegistryTest.ErrorExtractingExtension."""
    ts = typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/")
    assert nack(with_policy(ts, round_robin_pb2.RoundRobin())) == [
        f'{LBP}.value[xds.type.v3.TypedStruct].type_url: invalid value "type.googleapis.com/"'
    ]


def test_unsupported_policies_are_skipped_until_a_supported_one():
    """C-core XdsLbPolicyRegistryTest.UnsupportedTypesSkipped / NoSupportedType."""
    unknown_struct = typed_struct_pb2.TypedStruct(type_url="myorg/foo/bar/test.UnknownLb")
    c = with_policy(cluster_pb2.LoadBalancingPolicy(), unknown_struct, round_robin_pb2.RoundRobin())
    assert lb(c) == [{"round_robin": {}}]
    c = with_policy(cluster_pb2.LoadBalancingPolicy(), unknown_struct)
    assert nack(c) == ["load_balancing_policy: no supported load balancing policy config found"]


def _recursive(depth: int) -> cluster_pb2.LoadBalancingPolicy:
    policy = cluster_pb2.LoadBalancingPolicy()
    typed = policy.policies.add().typed_extension_config.typed_config
    if depth >= 16:
        typed.Pack(round_robin_pb2.RoundRobin())
    else:
        w = wrr_locality_pb2.WrrLocality()
        w.endpoint_picking_policy.CopyFrom(_recursive(depth + 1))
        typed.Pack(w)
    return policy


def test_policy_nesting_past_sixteen_levels_is_nacked():
    """C-core XdsLbPolicyRegistryTest.MaxRecursion."""
    c = eds()
    c.load_balancing_policy.CopyFrom(_recursive(0))
    [error] = nack(c)
    assert error.endswith(": exceeded max recursion depth of 16")


# ---------------------------------------------------------------- transport socket


def test_http_connect_transport_socket_is_unsupported_as_c_core_without_a86():
    """C-core HttpConnectTest.FeatureNotEnabled (A86 HTTP CONNECT is behind
    GRPC_EXPERIMENTAL_XDS_HTTP_CONNECT, off in grpcio 1.85)."""
    c = eds()
    c.transport_socket.name = "envoy.transport_sockets.http_11_proxy"
    c.transport_socket.typed_config.Pack(
        upstream_http_11_connect_pb2.Http11ProxyUpstreamTransport()
    )
    t = "envoy.extensions.transport_sockets.http_11_proxy.v3.Http11ProxyUpstreamTransport"
    assert nack(c) == [
        f"transport_socket.typed_config.value[{t}].type_url: unsupported transport socket type"
    ]


# ---------------------------------------------------------------- LRS (A64, A85)


def test_lrs_server_self_enables_load_reporting():
    """C-core LrsTest.Valid."""
    c = eds()
    c.lrs_server.self.SetInParent()
    assert ok(c).lrs_server is True


# ---------------------------------------------------------------- upstream_config (A75)


def _upstream(fill) -> cluster_pb2.Cluster:
    c = eds()
    fill(c.upstream_config.typed_config)
    return c


@pytest.mark.parametrize("shape", ["none", "no_common", "no_idle"])
def test_idle_timeout_defaults_to_one_hour(shape):
    """C-core UpstreamConfigTest.DefaultWithNoUpstreamConfig /
    DefaultWithNoCommonHttpProtocolOptions / DefaultWithFieldUnset."""
    if shape == "none":
        c = eds()
    else:
        opts = http_protocol_options_pb2.HttpProtocolOptions()
        if shape == "no_idle":
            opts.common_http_protocol_options.SetInParent()
        c = _upstream(lambda a: a.Pack(opts))
    assert ok(c).idle_timeout == 3600.0


def test_idle_timeout_explicitly_set():
    """C-core UpstreamConfigTest.ExplicitlySet."""
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    opts.common_http_protocol_options.idle_timeout.seconds = 1
    assert ok(_upstream(lambda a: a.Pack(opts))).idle_timeout == 1.0


def test_unknown_upstream_config_type_in_c_core_words():
    """C-core UpstreamConfigTest.UnknownUpstreamConfigType."""
    c = _upstream(lambda a: a.Pack(cluster_pb2.Cluster()))
    assert nack(c) == [
        "upstream_config.typed_config.value[envoy.config.cluster.v3.Cluster].type_url: "
        "unsupported upstream config type"
    ]


def test_unparsable_http_protocol_options_in_c_core_words():
    """C-core UpstreamConfigTest.UnparsableHttpProtocolOptions."""

    def garbage(a):
        a.Pack(http_protocol_options_pb2.HttpProtocolOptions())
        a.value = b"\0"

    assert nack(_upstream(garbage)) == [
        f"upstream_config.typed_config.value[{HPO_T}]: can't decode HttpProtocolOptions"
    ]


def test_http_protocol_options_in_typed_struct_in_c_core_words():
    """C-core UpstreamConfigTest.HttpProtocolOptionsInTypedStruct."""
    ts = typed_struct_pb2.TypedStruct(type_url=f"types.googleapis.com/{HPO_T}")
    assert nack(_upstream(lambda a: a.Pack(ts))) == [
        f"upstream_config.typed_config.value[xds.type.v3.TypedStruct].value[{HPO_T}]: "
        "can't decode HttpProtocolOptions"
    ]


def test_idle_timeout_duration_error_names_the_value_type():
    """C-core UpstreamConfigTest.ErrorsParsingDurations."""
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    opts.common_http_protocol_options.idle_timeout.seconds = -1
    assert nack(_upstream(lambda a: a.Pack(opts))) == [
        f"upstream_config.typed_config.value[{HPO_T}].common_http_protocol_options"
        ".idle_timeout.seconds: value must be in the range [0, 315576000000]"
    ]


# ---------------------------------------------------------------- circuit breakers


@pytest.mark.parametrize("how", ["no_default", "default_without_max"])
def test_circuit_breaker_falls_back_to_1024(how):
    """C-core CircuitBreakingTest.NoDefaultThreshold /
    DefaultThresholdWithMaxRequestsUnset."""
    c = eds()
    t = c.circuit_breakers.thresholds.add()
    if how == "no_default":
        t.priority = base_pb2.HIGH
        t.max_requests.value = 251
    assert ok(c).max_requests == 1024


# ---------------------------------------------------------------- outlier detection (A50)


def test_outlier_detection_all_fields_are_mapped():
    """C-core OutlierDetectionTest.AllFieldsSet (A50 "xDS Integration")."""
    c = eds()
    od = c.outlier_detection
    od.interval.seconds = 1
    od.base_ejection_time.seconds = 2
    od.max_ejection_time.seconds = 3
    od.max_ejection_percent.value = 20
    od.enforcing_success_rate.value = 7
    od.success_rate_minimum_hosts.value = 12
    od.success_rate_request_volume.value = 31
    od.success_rate_stdev_factor.value = 251
    od.enforcing_failure_percentage.value = 9
    od.failure_percentage_minimum_hosts.value = 3
    od.failure_percentage_request_volume.value = 75
    od.failure_percentage_threshold.value = 90
    config = ok(c).outlier_detection
    assert config is not None
    assert json.loads(config) == {
        "interval": "1s",
        "baseEjectionTime": "2s",
        "maxEjectionTime": "3s",
        "maxEjectionPercent": 20,
        "successRateEjection": {
            "stdevFactor": 251,
            "enforcementPercentage": 7,
            "minimumHosts": 12,
            "requestVolume": 31,
        },
        "failurePercentageEjection": {
            "threshold": 90,
            "enforcementPercentage": 9,
            "minimumHosts": 3,
            "requestVolume": 75,
        },
    }


def test_outlier_detection_invalid_values_name_every_field():
    """C-core OutlierDetectionTest.InvalidValues (all seven errors)."""
    c = eds()
    od = c.outlier_detection
    od.interval.seconds = -1
    od.base_ejection_time.seconds = -2
    od.max_ejection_time.seconds = -3
    od.max_ejection_percent.value = 101
    od.enforcing_success_rate.value = 101
    od.enforcing_failure_percentage.value = 101
    od.failure_percentage_threshold.value = 101
    rng = "value must be in the range [0, 315576000000]"
    assert sorted(nack(c)) == [
        f"outlier_detection.base_ejection_time.seconds: {rng}",
        "outlier_detection.enforcing_failure_percentage: value must be <= 100",
        "outlier_detection.enforcing_success_rate: value must be <= 100",
        "outlier_detection.failure_percentage_threshold: value must be <= 100",
        f"outlier_detection.interval.seconds: {rng}",
        "outlier_detection.max_ejection_percent: value must be <= 100",
        f"outlier_detection.max_ejection_time.seconds: {rng}",
    ]


def test_outlier_detection_message_with_no_fields_is_accepted():
    """C-core OutlierDetectionTest.DefaultValues: present and empty is valid
    (the outlier_detection policy's defaults apply)."""
    c = eds()
    c.outlier_detection.SetInParent()
    assert ok(c).outlier_detection is not None


# ---------------------------------------------------------------- override host status (A55)


def test_override_host_status_without_common_lb_config_is_unknown_and_healthy():
    """C-core HostOverrideStatusTest.DefaultsToUnknownAndHealthyWithoutCommonLbConfig /
    DefaultsToUnknownAndHealthyWithoutOverrideHostStatus."""
    assert ok(eds()).override_host_statuses == frozenset({"UNKNOWN", "HEALTHY"})
    c = eds()
    c.common_lb_config.SetInParent()
    assert ok(c).override_host_statuses == frozenset({"UNKNOWN", "HEALTHY"})


# ---------------------------------------------------------------- grpc-go


def _go_case(name: str) -> cluster_pb2.Cluster:
    """grpc-go unmarshal_cds_test.go TestValidateCluster_Failure's clusters
    (each must be NACKed there)."""
    if name in ("static", "original_dst"):
        c = cluster_pb2.Cluster(name="foo", type=getattr(cluster_pb2.Cluster, name.upper()))
        c.eds_cluster_config.eds_config.ads.SetInParent()
        return c
    if name == "no_eds_config":
        return cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.EDS)
    if name == "no_ads_config_source":
        c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.EDS)
        c.eds_cluster_config.SetInParent()
        return c
    if name == "maglev":
        c = eds()
        c.lb_policy = cluster_pb2.Cluster.MAGLEV
        return c
    if name == "logical_dns_two_localities":
        c = _dns()
        c.load_assignment.endpoints.add()
        c.load_assignment.endpoints.add()
        return c
    if name == "ring_hash_policy_max_too_big":
        m = ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.XX_HASH)
        m.minimum_ring_size.value = 10
        m.maximum_ring_size.value = 8388609
        return with_policy(m)
    assert name == "aggregate_empty"
    return _aggregate(lambda a: a.Pack(aggregate_pb2.ClusterConfig()))


@pytest.mark.parametrize(
    "name",
    [
        "static",
        "original_dst",
        "no_eds_config",
        "no_ads_config_source",
        "maglev",
        "logical_dns_two_localities",
        "ring_hash_policy_max_too_big",
        "aggregate_empty",
    ],
)
def test_grpc_go_invalid_clusters_are_nacked(name):
    """grpc-go xdsresource unmarshal_cds_test.go TestValidateCluster_Failure
    (non-supported-cluster-type-static / -original-dst, no-eds-config,
    no-ads-config-source, unsupported-lb-policy, logical-dns-multiple-localities,
    ring-hash-max-bound-greater-than-upper-bound-load-balancing-policy,
    aggregate-empty-clusters)."""
    assert nack(_go_case(name))


# ---------------------------------------------------------------- extensions without a type


@pytest.mark.parametrize("field", ["transport_socket", "upstream_config"])
def test_extension_without_typed_config_is_named_as_c_core(field):
    """grpcio 1.85.3's C-core, checked live in
    tests/e2e/test_differential_cds_eds_nack.py: a transport_socket or
    upstream_config without typed_config is "typed_config: field not
    present"; one whose typed_config has no type URL is
    "typed_config.type_url: field not present" (C-core ExtractXdsExtension)."""
    c = eds()
    getattr(c, field).SetInParent()
    if field == "transport_socket":
        c.transport_socket.name = "envoy.transport_sockets.tls"
    assert nack(c) == [f"{field}.typed_config: field not present"]
    getattr(c, field).typed_config.SetInParent()
    assert nack(c) == [f"{field}.typed_config.type_url: field not present"]


def test_ring_hash_enum_max_below_the_default_min_is_nacked_unlike_c_core():
    """RING_HASH with only maximum_ring_size 100: the default minimum (1024)
    is above it.  grpc-go (unmarshal_cds.go, defaults applied before its
    min > max check) and pyxds NACK; grpcio 1.85.3's C-core checks only an
    explicit minimum, ACKs, and then fails every RPC INTERNAL when the
    ring_hash config does not parse (checked live; documented in
    docs/differences-from-c-core.md)."""
    c = eds()
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    c.ring_hash_lb_config.maximum_ring_size.value = 100
    assert nack(c) == [
        "ring_hash_lb_config.minimum_ring_size: cannot be greater than maximum_ring_size"
    ]


# ---------------------------------------------------------------- grpc-java


def test_wrr_locality_over_client_side_wrr_keeps_its_fields():
    """grpc-java XdsClientImplDataTest parseCluster_WrrLbPolicy_defaultLbConfig:
    wrr_locality over ClientSideWeightedRoundRobin (blackout 17s, OOB on,
    penalty 1.75) converts to xds_wrr_locality over weighted_round_robin with
    those fields (the policy's own defaults fill the rest)."""
    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.blackout_period.seconds = 17
    m.enable_oob_load_report.value = True
    m.error_utilization_penalty.value = 1.75
    [entry] = lb(with_policy(wrr_over(m)))
    [child] = entry["xds_wrr_locality_experimental"]["childPolicy"]
    assert child == {
        "weighted_round_robin": {
            "blackoutPeriod": "17s",
            "enableOobLoadReport": True,
            "errorUtilizationPenalty": 1.75,
        }
    }


def test_transport_socket_matches_are_ignored_as_c_core_not_nacked_as_java():
    """grpc-java parseCluster_transportSocketMatches_exception NACKs a cluster
    with transport_socket_matches; A29 only says gRPC does not support the
    field, and grpcio 1.85.3's C-core ignores it (both a bare match and one
    carrying an UpstreamTlsContext are served, checked live), as pyxds does."""
    c = eds()
    c.transport_socket_matches.add(name="match1")
    r = ok(c)
    assert r.transport_socket is None and r.security is None
