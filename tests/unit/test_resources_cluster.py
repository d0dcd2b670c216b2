"""CDS validation (A27 "Cluster Proto", A37 "Validation", A52, A62 pick_first via xDS, A75)."""

from __future__ import annotations

import json

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
    client_side_weighted_round_robin_pb2 as cswrr_pb2,
)
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2
from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import struct_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.lb import registry
from pyxds.lb.api import PolicyFactory
from pyxds.lb.errors import LBConfigError
from pyxds.xds.resources import CLUSTER, Cluster

WRR_RR = [{"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}]


class _StubFactory(PolicyFactory):
    """A permissive policy so conversions can be tested whether or not the real
    policy exists yet; ``reject`` makes parse_config fail."""

    def __init__(self, name: str, reject: bool = False) -> None:
        self.name = name
        self.reject = reject

    def parse_config(self, json_config):
        if self.reject:
            raise LBConfigError("field", "rejected by stub")
        return json.dumps(json_config, sort_keys=True)

    def build(self, helper):  # pragma: no cover - never built here
        raise NotImplementedError


@pytest.fixture(autouse=True)
def lb_policies():
    """Register stubs for the gRPC policies the converter targets (only those
    not registered yet), so these tests do not depend on the LB tree."""
    added = []
    for name in (
        "round_robin",
        "pick_first",
        "xds_wrr_locality_experimental",
        "ring_hash_experimental",
        "least_request_experimental",
        "weighted_round_robin",
    ):
        if registry.get(name) is None:
            registry.register(_StubFactory(name))
            added.append(name)
    yield
    for name in added:
        registry.unregister(name)


def eds_cluster(name: str = "c1", service_name: str = "", source: str = "ads"):
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
    if source == "ads":
        c.eds_cluster_config.eds_config.ads.SetInParent()
    elif source == "self":
        c.eds_cluster_config.eds_config.self.SetInParent()
    elif source == "path":
        c.eds_cluster_config.eds_config.path_config_source.path = "/x"
    c.eds_cluster_config.service_name = service_name
    return c


def decode_ok(c) -> Cluster:
    result = CLUSTER.decode(c.SerializeToString())
    assert result.error is None, result.error
    assert result.name == c.name
    return result.resource


def decode_err(c) -> str:
    result = CLUSTER.decode(c.SerializeToString())
    assert result.resource is None and result.name == c.name
    return result.error


# ---------------------------------------------------------------- EDS


def test_eds_cluster_defaults():
    got = decode_ok(eds_cluster())
    assert got.kind == "EDS" and got.eds_service_name is None and got.eds_resource_name == "c1"
    assert got.lb_policy_json() == WRR_RR
    assert got.max_requests == 1024 and not got.lrs_server and got.transport_socket is None
    assert got.idle_timeout == 3600.0


def test_eds_service_name_used():
    got = decode_ok(eds_cluster(service_name="svc"))
    assert got.eds_service_name == "svc" and got.eds_resource_name == "svc"


def test_eds_config_self_accepted_other_rejected():
    assert decode_ok(eds_cluster(source="self")).kind == "EDS"
    assert "eds_cluster_config.eds_config: ConfigSource is not ads or self" in decode_err(
        eds_cluster(source="path")
    )
    assert "eds_cluster_config.eds_config: field not present" in decode_err(
        eds_cluster(source="none")
    )


def test_xdstp_eds_cluster_needs_service_name():
    c = eds_cluster(name="xdstp://auth/envoy.config.cluster.v3.Cluster/c1")
    assert "eds_cluster_config.service_name: must be set" in decode_err(c)


@pytest.mark.parametrize("kind", [cluster_pb2.Cluster.STATIC, cluster_pb2.Cluster.STRICT_DNS])
def test_other_discovery_types_are_rejected(kind):
    c = cluster_pb2.Cluster(name="c1", type=kind)
    assert "type: unknown discovery type" in decode_err(c)


# ---------------------------------------------------------------- LOGICAL_DNS (A37)


def dns_cluster(host="dns.example.com", port=8080, localities=1, endpoints=1, resolver=""):
    c = cluster_pb2.Cluster(name="dns", type=cluster_pb2.Cluster.LOGICAL_DNS)
    c.load_assignment.SetInParent()
    for _ in range(localities):
        loc = c.load_assignment.endpoints.add()
        for _ in range(endpoints):
            sa = loc.lb_endpoints.add().endpoint.address.socket_address
            sa.address = host
            if port is not None:
                sa.port_value = port
            sa.resolver_name = resolver
    return c


def test_logical_dns_cluster():
    got = decode_ok(dns_cluster())
    assert (got.kind, got.dns_hostname, got.dns_port) == ("LOGICAL_DNS", "dns.example.com", 8080)
    assert got.dns_target == "dns.example.com:8080"


def test_logical_dns_ipv6_target_bracketed():
    assert decode_ok(dns_cluster(host="::1")).dns_target == "[::1]:8080"


def test_logical_dns_needs_load_assignment():
    c = cluster_pb2.Cluster(name="dns", type=cluster_pb2.Cluster.LOGICAL_DNS)
    assert "load_assignment: field not present" in decode_err(c)


@pytest.mark.parametrize(("localities", "endpoints"), [(0, 1), (2, 1)])
def test_logical_dns_needs_exactly_one_locality(localities, endpoints):
    err = decode_err(dns_cluster(localities=localities, endpoints=endpoints))
    assert "load_assignment.endpoints: must contain exactly one locality" in err


@pytest.mark.parametrize("endpoints", [0, 2])
def test_logical_dns_needs_exactly_one_endpoint(endpoints):
    err = decode_err(dns_cluster(endpoints=endpoints))
    assert "load_assignment.endpoints[0].lb_endpoints: must contain exactly one endpoint" in err


def test_logical_dns_empty_host_and_missing_port_rejected():
    err = decode_err(dns_cluster(host="", port=None))
    assert "socket_address.address: field not present" in err
    assert "socket_address.port_value: field not present" in err


def test_logical_dns_resolver_name_rejected():
    err = decode_err(dns_cluster(resolver="custom"))
    assert "socket_address.resolver_name: LOGICAL_DNS clusters must NOT have a custom" in err


def test_logical_dns_missing_socket_address_rejected():
    c = cluster_pb2.Cluster(name="dns", type=cluster_pb2.Cluster.LOGICAL_DNS)
    c.load_assignment.endpoints.add().lb_endpoints.add().endpoint.address.pipe.path = "/p"
    assert "endpoint.address.socket_address: field not present" in decode_err(c)


# ---------------------------------------------------------------- aggregate (A37)


def aggregate_cluster(children, type_url=None):
    c = cluster_pb2.Cluster(name="agg")
    c.cluster_type.name = "envoy.clusters.aggregate"
    c.cluster_type.typed_config.Pack(aggregate_pb2.ClusterConfig(clusters=children))
    if type_url:
        c.cluster_type.typed_config.type_url = type_url
    return c


def test_aggregate_cluster():
    got = decode_ok(aggregate_cluster(["a", "b"]))
    assert got.kind == "AGGREGATE" and got.aggregate_children == ("a", "b")


def test_aggregate_cluster_empty_list_rejected():
    assert (
        "cluster_type.typed_config.value[envoy.extensions.clusters.aggregate.v3.ClusterConfig]"
        ".clusters: must be non-empty"
    ) in decode_err(aggregate_cluster([]))


def test_aggregate_cluster_wrong_type_rejected():
    err = decode_err(aggregate_cluster(["a"], type_url="type.googleapis.com/foo.Bar"))
    assert "cluster_type.typed_config.type_url: unknown cluster_type extension: foo.Bar" in err


def test_neither_type_nor_cluster_type_rejected():
    assert "type: unknown discovery type" in decode_err(cluster_pb2.Cluster(name="x"))


# ---------------------------------------------------------------- legacy lb_policy


def test_lb_policy_ring_hash_converted():
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    c.ring_hash_lb_config.minimum_ring_size.value = 100
    c.ring_hash_lb_config.maximum_ring_size.value = 1000
    assert decode_ok(c).lb_policy_json() == [
        {"ring_hash_experimental": {"minRingSize": 100, "maxRingSize": 1000}}
    ]


def test_lb_policy_ring_hash_invalid_fields():
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    c.ring_hash_lb_config.hash_function = cluster_pb2.Cluster.RingHashLbConfig.MURMUR_HASH_2
    c.ring_hash_lb_config.minimum_ring_size.value = 2000
    c.ring_hash_lb_config.maximum_ring_size.value = 1000
    err = decode_err(c)
    assert "ring_hash_lb_config.hash_function: invalid hash function" in err
    assert "ring_hash_lb_config.minimum_ring_size: cannot be greater than maximum_ring_size" in err


def test_lb_policy_least_request_converted():
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    c.least_request_lb_config.choice_count.value = 3
    assert decode_ok(c).lb_policy_json() == [
        {
            "xds_wrr_locality_experimental": {
                "childPolicy": [{"least_request_experimental": {"choiceCount": 3}}]
            }
        }
    ]


def test_lb_policy_least_request_choice_count_below_two_rejected():
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    c.least_request_lb_config.choice_count.value = 1
    assert "least_request_lb_config.choice_count: must be greater than or equal to 2" in (
        decode_err(c)
    )


def test_lb_policy_unsupported_rejected():
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.MAGLEV
    assert "lb_policy: LB policy is not supported" in decode_err(c)


# ---------------------------------------------------------------- load_balancing_policy (A52)


def with_policies(*messages, cluster=None):
    c = cluster or eds_cluster()
    for m in messages:
        c.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(m)
    return c


def test_load_balancing_policy_round_robin():
    c = with_policies(round_robin_pb2.RoundRobin())
    c.lb_policy = cluster_pb2.Cluster.MAGLEV  # ignored when load_balancing_policy is set
    assert decode_ok(c).lb_policy_json() == [{"round_robin": {}}]


def test_load_balancing_policy_pick_first_shuffle():
    c = with_policies(pick_first_pb2.PickFirst(shuffle_address_list=True))
    assert decode_ok(c).lb_policy_json() == [{"pick_first": {"shuffleAddressList": True}}]


def test_load_balancing_policy_wrr_locality_recurses():
    inner = wrr_locality_pb2.WrrLocality()
    inner.endpoint_picking_policy.policies.add().typed_extension_config.typed_config.Pack(
        pick_first_pb2.PickFirst()
    )
    assert decode_ok(with_policies(inner)).lb_policy_json() == [
        {
            "xds_wrr_locality_experimental": {
                "childPolicy": [{"pick_first": {"shuffleAddressList": False}}]
            }
        }
    ]


def test_load_balancing_policy_ring_hash_and_least_request():
    rh = ring_hash_pb2.RingHash()
    rh.minimum_ring_size.value = 10
    assert decode_ok(with_policies(rh)).lb_policy_json() == [
        {"ring_hash_experimental": {"minRingSize": 10, "maxRingSize": 8388608}}
    ]
    lr = least_request_pb2.LeastRequest()
    assert decode_ok(with_policies(lr)).lb_policy_json() == [
        {"least_request_experimental": {"choiceCount": 2}}
    ]


def test_load_balancing_policy_ring_hash_bad_hash_function_rejected():
    rh = ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.MURMUR_HASH_2)
    err = decode_err(with_policies(rh))
    assert (
        "load_balancing_policy.policies[0].typed_extension_config.typed_config"
        ".value[envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash]"
        ".hash_function: unsupported value (must be XX_HASH)"
    ) in err


def test_load_balancing_policy_ring_hash_sizes_validated():
    rh = ring_hash_pb2.RingHash()
    rh.minimum_ring_size.value = 20
    rh.maximum_ring_size.value = 10
    err = decode_err(with_policies(rh))
    assert "RingHash].minimum_ring_size: cannot be greater than maximum_ring_size" in err
    rh.maximum_ring_size.value = 9_000_000
    rh.minimum_ring_size.value = 0
    err = decode_err(with_policies(rh))
    assert "RingHash].maximum_ring_size: value must be in the range [1, 8388608]" in err
    assert "RingHash].minimum_ring_size: value must be in the range [1, 8388608]" in err


def test_wrr_locality_without_endpoint_picking_policy_rejected():
    err = decode_err(with_policies(wrr_locality_pb2.WrrLocality()))
    assert "WrrLocality].endpoint_picking_policy: field not present" in err


def test_policy_entry_without_typed_extension_config_rejected():
    c = eds_cluster()
    c.load_balancing_policy.policies.add()
    err = decode_err(c)
    assert "load_balancing_policy.policies[0].typed_extension_config: field not present" in err


def test_load_balancing_policy_client_side_wrr():
    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.enable_oob_load_report.value = True
    m.blackout_period.seconds = 5
    m.weight_update_period.nanos = 500_000_000
    assert decode_ok(with_policies(m)).lb_policy_json() == [
        {
            "weighted_round_robin": {
                "enableOobLoadReport": True,
                "blackoutPeriod": "5s",
                "weightUpdatePeriod": "0.500000000s",
            }
        }
    ]


def typed_struct(name: str, fields: dict) -> typed_struct_pb2.TypedStruct:
    s = struct_pb2.Struct()
    s.update(fields)
    return typed_struct_pb2.TypedStruct(type_url=f"type.googleapis.com/{name}", value=s)


def test_load_balancing_policy_typed_struct_custom_policy():
    registry.register(_StubFactory("myorg.MyLb"))
    try:
        c = with_policies(typed_struct("myorg.MyLb", {"knob": 3, "on": True}))
        assert decode_ok(c).lb_policy_json() == [{"myorg.MyLb": {"knob": 3.0, "on": True}}]
    finally:
        registry.unregister("myorg.MyLb")


def test_load_balancing_policy_first_supported_wins():
    c = with_policies(
        typed_struct("myorg.Unregistered", {}),
        pick_first_pb2.PickFirst(),
        round_robin_pb2.RoundRobin(),
    )
    c.load_balancing_policy.policies.add().typed_extension_config.typed_config.type_url = (
        "type.googleapis.com/unknown.Type"
    )
    assert decode_ok(c).lb_policy_json() == [{"pick_first": {"shuffleAddressList": False}}]


def test_load_balancing_policy_none_supported_rejected():
    c = with_policies(typed_struct("myorg.Unregistered", {}))
    err = decode_err(c)
    assert "load_balancing_policy: no supported load balancing policy config found" in err


def test_load_balancing_policy_unregistered_builtin_is_skipped():
    saved = registry.get("least_request_experimental")
    registry.unregister("least_request_experimental")
    try:
        c = with_policies(least_request_pb2.LeastRequest(), round_robin_pb2.RoundRobin())
        assert decode_ok(c).lb_policy_json() == [{"round_robin": {}}]
    finally:
        if saved is not None:
            registry.register(saved)


def test_load_balancing_policy_recursion_limit():
    inner = wrr_locality_pb2.WrrLocality()
    inner.endpoint_picking_policy.policies.add().typed_extension_config.typed_config.Pack(
        round_robin_pb2.RoundRobin()
    )
    for _ in range(16):
        outer = wrr_locality_pb2.WrrLocality()
        outer.endpoint_picking_policy.policies.add().typed_extension_config.typed_config.Pack(inner)
        inner = outer
    err = decode_err(with_policies(inner))
    assert "exceeded max recursion depth of 16" in err


def test_load_balancing_policy_within_recursion_limit_ok():
    inner = wrr_locality_pb2.WrrLocality()
    inner.endpoint_picking_policy.policies.add().typed_extension_config.typed_config.Pack(
        round_robin_pb2.RoundRobin()
    )
    for _ in range(13):
        outer = wrr_locality_pb2.WrrLocality()
        outer.endpoint_picking_policy.policies.add().typed_extension_config.typed_config.Pack(inner)
        inner = outer
    assert decode_ok(with_policies(inner)).kind == "EDS"


def test_config_the_lb_registry_rejects_is_a_nack():
    registry.register(_StubFactory("myorg.Picky", reject=True))
    try:
        err = decode_err(with_policies(typed_struct("myorg.Picky", {})))
        assert "load_balancing_policy: errors validating LB policy config" in err
        assert "rejected by stub" in err
    finally:
        registry.unregister("myorg.Picky")


# ---------------------------------------------------------------- circuit breakers, LRS, TLS


def test_circuit_breaker_default_priority_max_requests():
    c = eds_cluster()
    high = c.circuit_breakers.thresholds.add(priority=1)
    high.max_requests.value = 5
    default = c.circuit_breakers.thresholds.add(priority=0)
    default.max_requests.value = 77
    assert decode_ok(c).max_requests == 77


def test_circuit_breaker_without_max_requests_defaults_to_1024():
    c = eds_cluster()
    c.circuit_breakers.thresholds.add(priority=0)
    assert decode_ok(c).max_requests == 1024


def test_lrs_server_self():
    c = eds_cluster()
    c.lrs_server.self.SetInParent()
    assert decode_ok(c).lrs_server is True


def test_lrs_server_other_than_self_rejected():
    c = eds_cluster()
    c.lrs_server.ads.SetInParent()
    assert "lrs_server: ConfigSource is not self" in decode_err(c)


def test_transport_socket_kept_opaque():
    c = eds_cluster()
    c.transport_socket.name = "envoy.transport_sockets.tls"
    ctx = tls_pb2.UpstreamTlsContext(sni="backend.example.com")
    ca = ctx.common_tls_context.validation_context.ca_certificate_provider_instance
    ca.instance_name = "default"
    c.transport_socket.typed_config.Pack(ctx)
    got = decode_ok(c)
    assert got.transport_socket_type_url == (
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
    )
    assert tls_pb2.UpstreamTlsContext.FromString(got.transport_socket).sni == (
        "backend.example.com"
    )


def test_transport_socket_of_other_type_rejected():
    c = eds_cluster()
    c.transport_socket.typed_config.Pack(aggregate_pb2.ClusterConfig())
    assert "].type_url: unsupported transport socket type" in (decode_err(c))


# ---------------------------------------------------------------- A75 idle_timeout


def with_upstream(idle_seconds=None, other_type=False, chpo=True):
    c = eds_cluster()
    if other_type:
        c.upstream_config.typed_config.Pack(tls_pb2.UpstreamTlsContext())
        return c
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    if chpo:
        opts.common_http_protocol_options.SetInParent()
        if idle_seconds is not None:
            opts.common_http_protocol_options.idle_timeout.seconds = idle_seconds
    c.upstream_config.typed_config.Pack(opts)
    return c


def test_idle_timeout_from_upstream_config():
    assert decode_ok(with_upstream(60)).idle_timeout == 60.0
    assert decode_ok(with_upstream(None)).idle_timeout == 3600.0
    assert decode_ok(with_upstream(chpo=False)).idle_timeout == 3600.0


def test_idle_timeout_invalid_rejected():
    assert "idle_timeout.seconds: value must be" in decode_err(with_upstream(-5))


def test_upstream_config_of_other_type_rejected():
    assert (
        "upstream_config.typed_config.value[envoy.extensions.transport_sockets.tls.v3"
        ".UpstreamTlsContext].type_url: unsupported upstream config type"
    ) in decode_err(with_upstream(other_type=True))


# ---------------------------------------------------------------- values


def test_same_bytes_decode_to_equal_hashable_values():
    c = with_policies(pick_first_pb2.PickFirst(shuffle_address_list=True))
    c.circuit_breakers.thresholds.add(priority=0).max_requests.value = 9
    data = c.SerializeToString()
    a, b = CLUSTER.decode(data).resource, CLUSTER.decode(data).resource
    assert a == b and hash(a) == hash(b)


def test_lb_policy_json_returns_a_fresh_copy():
    got = decode_ok(eds_cluster())
    got.lb_policy_json()[0]["mutated"] = True
    assert got.lb_policy_json() == WRR_RR


def test_unparseable_bytes():
    result = CLUSTER.decode(b"\x0a\xff")
    assert result.name is None and result.resource is None and "could not parse" in result.error


# -- A55/A75 override_host_status, A64/A85 lrs_report_endpoint_metrics ----------------


def test_override_host_statuses_default_to_unknown_and_healthy():
    """A55: unset (no common_lb_config, or no override_host_status) means
    {UNKNOWN, HEALTHY} (C-core's DefaultsToUnknownAndHealthy tests)."""
    assert decode_ok(eds_cluster()).override_host_statuses == {"UNKNOWN", "HEALTHY"}
    c = eds_cluster()
    c.common_lb_config.SetInParent()
    assert decode_ok(c).override_host_statuses == {"UNKNOWN", "HEALTHY"}


def test_override_host_statuses_keep_only_unknown_healthy_draining():
    """A55: only UNKNOWN, HEALTHY and DRAINING are considered; the others
    are ignored, not NACKed (mixed deployments)."""
    from envoy.config.core.v3 import health_check_pb2 as hc

    c = eds_cluster()
    c.common_lb_config.override_host_status.statuses.extend(
        [hc.UNKNOWN, hc.HEALTHY, hc.DRAINING, hc.UNHEALTHY, hc.DEGRADED, 42]
    )
    assert decode_ok(c).override_host_statuses == {"UNKNOWN", "HEALTHY", "DRAINING"}


def test_override_host_statuses_can_be_set_empty():
    c = eds_cluster()
    c.common_lb_config.override_host_status.SetInParent()
    assert decode_ok(c).override_host_statuses == frozenset()


def test_lrs_report_endpoint_metrics_parsed_as_c_core(monkeypatch):
    """A85: the three top-level fields and named_metrics.<key>; unknown
    strings ignored; C-core's AsString order."""
    monkeypatch.delenv("GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION", raising=False)
    c = eds_cluster()
    c.lrs_report_endpoint_metrics.extend(
        [
            "named_metrics.foo",
            "named_metrics.bar",
            "cpu_utilization",
            "mem_utilization",
            "application_utilization",
            "unknown_field",
        ]
    )
    got = decode_ok(c).lrs_metrics
    assert str(got) == (
        "{cpu_utilization,mem_utilization,application_utilization,"
        "named_metrics.bar,named_metrics.foo}"
    )
    all_named = eds_cluster()
    all_named.lrs_report_endpoint_metrics.extend(["named_metrics.*", "cpu_utilization"])
    assert str(decode_ok(all_named).lrs_metrics) == "{cpu_utilization,named_metrics.*}"
    assert decode_ok(eds_cluster()).lrs_metrics.empty


@pytest.mark.parametrize("value", ["false", "FALSE", "0", "no", "garbage"])
def test_lrs_propagation_switched_off_is_a64_all_named_metrics(monkeypatch, value):
    """GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION=false: the field is not
    read and every named metric is reported under its own name (A64)."""
    monkeypatch.setenv("GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION", value)
    c = eds_cluster()
    c.lrs_report_endpoint_metrics.append("cpu_utilization")
    got = decode_ok(c).lrs_metrics
    assert got.legacy and not got.cpu_utilization


def test_same_override_and_lrs_config_twice_is_equal():
    c = eds_cluster()
    c.common_lb_config.override_host_status.statuses.append(3)
    c.lrs_report_endpoint_metrics.append("named_metrics.*")
    assert decode_ok(c) == decode_ok(c)
