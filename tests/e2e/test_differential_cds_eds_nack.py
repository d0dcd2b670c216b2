"""Differential: a Cluster or ClusterLoadAssignment pyxds NACKs, C-core
(grpcio's ``xds:///`` channel in a subprocess, CoreXdsClient) NACKs too, and
both name the same field with the same words in the RPC's UNAVAILABLE
status (nothing cached for that resource).

The resources are the C-core resource-type test cases whose field paths
pyxds got wrong before (xds_lb_policy_registry_test.cc
WrrLocality.MissingEndpointPickingPolicy, RingHashConfig.InvalidHashFunction;
xds_cluster_resource_type_test.cc UpstreamConfigTest.UnknownUpstreamConfigType,
LbPolicyTest.EnumLbPolicyRingHashSetMinRingSizeLargerThanMaxRingSize;
xds_endpoint_resource_type_test.cc AdditionalAddressesMissingSocketAddress):
here the words are checked against the live grpcio, not the test file.
C-core writes ``field:<path> error:<words>``, pyxds ``<path>: <words>``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from channel_fixtures import Backend, CoreXdsClient, pyxds_calls, route
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from xds.type.v3 import typed_struct_pb2

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NODE = "differential-cds-eds-nack"
LBP = "load_balancing_policy.policies[0].typed_extension_config.typed_config"
_LB = "envoy.extensions.load_balancing_policies."
HPO = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=NODE))
    yield client
    client.close()


def _policy(c: cluster_pb2.Cluster, msg) -> None:
    c.ClearField("lb_policy")
    c.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(msg)


def _wrr_without_child(c: cluster_pb2.Cluster) -> None:
    _policy(c, wrr_locality_pb2.WrrLocality())


def _murmur_ring_hash(c: cluster_pb2.Cluster) -> None:
    _policy(c, ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.MURMUR_HASH_2))


def _unknown_upstream_config(c: cluster_pb2.Cluster) -> None:
    c.upstream_config.typed_config.Pack(cluster_pb2.Cluster())


def _ring_hash_enum_min_above_max(c: cluster_pb2.Cluster) -> None:
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    c.ring_hash_lb_config.minimum_ring_size.value = 1025
    c.ring_hash_lb_config.maximum_ring_size.value = 1024


def _typed_struct_without_type(c: cluster_pb2.Cluster) -> None:
    _policy(c, typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/"))


def _policy_without_typed_config(c: cluster_pb2.Cluster) -> None:
    c.ClearField("lb_policy")
    c.load_balancing_policy.policies.add().typed_extension_config.name = "x"


def _http_options_in_typed_struct(c: cluster_pb2.Cluster) -> None:
    ts = typed_struct_pb2.TypedStruct(type_url=f"type.googleapis.com/{HPO}")
    c.upstream_config.typed_config.Pack(ts)


def _unparsable_http_options(c: cluster_pb2.Cluster) -> None:
    c.upstream_config.typed_config.Pack(http_protocol_options_pb2.HttpProtocolOptions())
    c.upstream_config.typed_config.value = b"\0"


def _negative_idle_timeout(c: cluster_pb2.Cluster) -> None:
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    opts.common_http_protocol_options.idle_timeout.seconds = -1
    c.upstream_config.typed_config.Pack(opts)


def _transport_socket_without_typed_config(c: cluster_pb2.Cluster) -> None:
    c.transport_socket.name = "envoy.transport_sockets.tls"


def _transport_socket_without_type_url(c: cluster_pb2.Cluster) -> None:
    c.transport_socket.typed_config.SetInParent()


CDS_CASES: list[tuple[str, Callable[[cluster_pb2.Cluster], None], str, str]] = [
    (
        "ts-no-typed-config",
        _transport_socket_without_typed_config,
        "transport_socket.typed_config",
        "field not present",
    ),
    (
        "ts-no-type-url",
        _transport_socket_without_type_url,
        "transport_socket.typed_config.type_url",
        "field not present",
    ),
    (
        "wrr-no-child",
        _wrr_without_child,
        f"{LBP}.value[{_LB}wrr_locality.v3.WrrLocality].endpoint_picking_policy",
        "field not present",
    ),
    (
        "murmur",
        _murmur_ring_hash,
        f"{LBP}.value[{_LB}ring_hash.v3.RingHash].hash_function",
        "unsupported value (must be XX_HASH)",
    ),
    (
        "upstream",
        _unknown_upstream_config,
        "upstream_config.typed_config.value[envoy.config.cluster.v3.Cluster].type_url",
        "unsupported upstream config type",
    ),
    (
        "typed-struct-no-type",
        _typed_struct_without_type,
        f"{LBP}.value[xds.type.v3.TypedStruct].type_url",
        'invalid value "type.googleapis.com/"',
    ),
    ("no-typed-config", _policy_without_typed_config, LBP, "field not present"),
    (
        "hpo-typed-struct",
        _http_options_in_typed_struct,
        f"upstream_config.typed_config.value[xds.type.v3.TypedStruct].value[{HPO}]",
        "can't decode HttpProtocolOptions",
    ),
    (
        "hpo-unparsable",
        _unparsable_http_options,
        f"upstream_config.typed_config.value[{HPO}]",
        "can't decode HttpProtocolOptions",
    ),
    (
        "idle-negative",
        _negative_idle_timeout,
        f"upstream_config.typed_config.value[{HPO}].common_http_protocol_options.idle_timeout"
        ".seconds",
        "value must be in the range [0, 315576000000]",
    ),
    (
        "ring-enum",
        _ring_hash_enum_min_above_max,
        "ring_hash_lb_config.minimum_ring_size",
        "cannot be greater than maximum_ring_size",
    ),
]


def _serve(server, name: str, cluster: cluster_pb2.Cluster, cla, extra_clusters=()) -> str:
    """Publish listener ``name`` -> route -> ``cluster``, the EDS resource
    ``cla`` and ``extra_clusters``; returns the target."""
    server.set_snapshot(
        Snapshot(
            listeners=[b.listener(name)],
            routes=[
                b.route_config(
                    f"{name}-route",
                    [b.virtual_host("vh", routes=[route(prefix="", cluster=cluster.name)])],
                )
            ],
            clusters=[cluster, *extra_clusters],
            endpoints=[cla],
        )
    )
    return f"xds:///{name}"


def _one_rpc_each(server, core, target: str, timeout: float = 5) -> tuple[str, str]:
    ch = pyxds.insecure_channel(target, bootstrap=server.bootstrap(node_id=NODE))
    try:
        ours = pyxds_calls(ch, 1, details=True, wait_for_ready=False, timeout=timeout)
        theirs = core.call(1, details=True, target=target, wait_for_ready=False, timeout=timeout)
    finally:
        ch.close()
    (ours_text,), (theirs_text,) = list(ours), list(theirs)
    return ours_text, theirs_text


def _cla(name: str, extra=None) -> endpoint_pb2.ClusterLoadAssignment:
    cla = b.endpoints(name, [b.locality(zone="z", endpoints=["127.0.0.1:1"])])
    if extra is not None:
        extra(cla)
    return cla


@pytest.mark.parametrize(
    ("case", "mutate", "path", "words"), CDS_CASES, ids=[c[0] for c in CDS_CASES]
)
def test_nacked_cluster_names_the_same_field_as_c_core(server, core, case, mutate, path, words):
    name = f"cds-nack-{case}"
    cluster = b.cluster(f"{name}-cluster")
    mutate(cluster)
    target = _serve(server, name, cluster, _cla(f"{name}-cluster"))
    ours, theirs = _one_rpc_each(server, core, target)
    assert theirs.startswith("error:UNAVAILABLE: ") and ours.startswith("error:UNAVAILABLE: ")
    assert f"field:{path} error:{words}" in theirs, theirs
    assert f"{path}: {words}" in ours, ours
    # C-core reports only the conversion's error, never the registry's on top.
    assert theirs.count("error:") == 2, theirs  # the status' own "error:" and the field's
    assert "errors validating LB policy config" not in ours, ours


def test_nacked_eds_additional_address_names_the_same_field_as_c_core(server, core):
    name = "eds-nack-additional"

    def no_socket_address(cla: endpoint_pb2.ClusterLoadAssignment) -> None:
        endpoint = cla.endpoints[0].lb_endpoints[0].endpoint
        endpoint.additional_addresses.add().address.SetInParent()

    target = _serve(
        server, name, b.cluster(f"{name}-cluster"), _cla(f"{name}-cluster", no_socket_address)
    )
    ours, theirs = _one_rpc_each(server, core, target)
    path = "endpoints[0].lb_endpoints[0].endpoint.additional_addresses[0].address.socket_address"
    assert f"field:{path} error:field not present" in theirs, theirs
    assert f"{path}: field not present" in ours, ours


def test_aggregate_child_with_an_empty_name_is_not_nacked_alike(server, core):
    """A37 "Validation" and C-core's AggregateClusterParse: a child named ""
    is a cluster that never arrives, not a NACK (pyxds NACKed it before):
    both channels wait for it and fail the RPC the same way."""
    backend = Backend("agg-empty-leaf").start()
    name = "agg-empty-child"
    try:
        leaf = b.endpoints(f"{name}-leaf", [b.locality(zone="z", endpoints=[backend.address])])
        aggregate = b.cluster(f"{name}-agg", aggregate_children=["", f"{name}-leaf"])
        target = _serve(server, name, aggregate, leaf, [b.cluster(f"{name}-leaf")])
        ours, theirs = _one_rpc_each(server, core, target, timeout=2)
    finally:
        backend.stop()
    assert ours == theirs, (ours, theirs)
    assert "invalid resource" not in ours, ours


def _least_request_enum(c: cluster_pb2.Cluster) -> None:
    c.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST


def _ring_hash_enum_max_only(c: cluster_pb2.Cluster) -> None:
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    c.ring_hash_lb_config.maximum_ring_size.value = 100


@pytest.mark.parametrize(
    ("case", "mutate", "ours_has", "theirs_has"),
    [
        (  # A48: pyxds serves; C-core has no least_request
            "least-request-enum",
            _least_request_enum,
            "agg-leaf",
            "field:lb_policy error:LB policy is not supported",
        ),
        (  # grpc-go alike: NACK; C-core ACKs and fails the ring_hash config
            "ring-max-only",
            _ring_hash_enum_max_only,
            "ring_hash_lb_config.minimum_ring_size: cannot be greater than maximum_ring_size",
            "error:INTERNAL: ",
        ),
    ],
    ids=["least-request-enum", "ring-max-only"],
)
def test_documented_differences_from_c_core_hold(server, core, case, mutate, ours_has, theirs_has):
    """docs/differences-from-c-core.md "CDS and EDS validation": each
    difference is pinned against the live grpcio, so a grpcio that changes
    shows up here."""
    backend = Backend("agg-leaf").start()
    name = f"cds-diff-{case}"
    try:
        cluster = b.cluster(f"{name}-cluster")
        mutate(cluster)
        cla = b.endpoints(f"{name}-cluster", [b.locality(zone="z", endpoints=[backend.address])])
        target = _serve(server, name, cluster, cla)
        ours, theirs = _one_rpc_each(server, core, target)
    finally:
        backend.stop()
    assert ours_has in ours, ours
    assert theirs_has in theirs, theirs


def test_ipv6_endpoint_with_a_zone_is_served_alike(server, core):
    """An EDS endpoint ``::1%lo`` (RFC 6874 zone): grpcio 1.85.3's C-core
    ACKs and reaches it; pyxds NACKed the resource before.  A backend on
    [::1] answers both."""
    import collections
    from concurrent import futures

    import grpc
    from channel_fixtures import EXCLUSIVE, _handlers

    executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="backend-")
    v6 = grpc.server(executor, options=[EXCLUSIVE])
    v6.add_generic_rpc_handlers((_handlers("v6", collections.Counter()),))
    port = v6.add_insecure_port("[::1]:0")
    v6.start()
    name = "eds-zone"
    try:
        cla = b.endpoints(f"{name}-cluster", [b.locality(zone="z", endpoints=[])])
        sa = cla.endpoints[0].lb_endpoints.add().endpoint.address.socket_address
        sa.address = "::1%lo"
        sa.port_value = port
        target = _serve(server, name, b.cluster(f"{name}-cluster"), cla)
        ours, theirs = _one_rpc_each(server, core, target)
    finally:
        v6.stop(None).wait(5)
        executor.shutdown(wait=False)
    assert (ours, theirs) == ("v6", "v6")
