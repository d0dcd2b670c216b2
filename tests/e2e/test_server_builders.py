"""pyxds.server.builders: the shapes gRPC clients require, and errors that name the argument.

Plain data tests (no sockets); the interop tests prove C-core accepts these shapes.
"""

from __future__ import annotations

import datetime

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2

from pyxds.server import builders as b


def unpack_hcm(listener) -> hcm_pb2.HttpConnectionManager:
    hcm = hcm_pb2.HttpConnectionManager()
    assert listener.api_listener.api_listener.Unpack(hcm)
    return hcm


def test_listener_uses_rds_over_ads_and_ends_with_the_router_filter():
    hcm = unpack_hcm(b.listener("svc", route_config_name="rc", max_stream_duration=1.5))
    assert hcm.rds.route_config_name == "rc"
    assert hcm.rds.config_source.HasField("ads")
    assert hcm.http_filters[-1].typed_config.Is(router_pb2.Router.DESCRIPTOR)
    assert hcm.common_http_protocol_options.max_stream_duration.ToNanoseconds() == 1_500_000_000


def test_listener_with_inline_route_config_has_no_rds():
    rc = b.route_config("inline", [b.virtual_host("v", ["*"], [b.route(cluster="c")])])
    hcm = unpack_hcm(b.listener("svc", route_config=rc))
    assert not hcm.HasField("rds")
    assert hcm.route_config == rc


def test_listener_default_route_config_name_derives_from_the_listener():
    assert unpack_hcm(b.listener("svc")).rds.route_config_name == "svc-route"


def test_route_matchers_and_actions():
    r = b.route(
        regex="/a.*",
        case_sensitive=False,
        headers=[b.header_matcher("h", present=True, invert_match=True)],
        weighted_clusters={"a": 3, "b": 1},
        runtime_fraction=0.25,
        timeout=datetime.timedelta(seconds=2),
        max_stream_duration=3,
        grpc_timeout_header_max=4,
    )
    assert r.match.safe_regex.regex == "/a.*"
    assert r.match.case_sensitive.value is False
    assert r.match.headers[0].present_match and r.match.headers[0].invert_match
    assert [(c.name, c.weight.value) for c in r.route.weighted_clusters.clusters] == [
        ("a", 3),
        ("b", 1),
    ]
    assert r.match.runtime_fraction.default_value.numerator == 250_000
    assert r.route.timeout.seconds == 2
    assert r.route.max_stream_duration.max_stream_duration.seconds == 3
    assert r.route.max_stream_duration.grpc_timeout_header_max.seconds == 4


def test_route_without_cluster_is_non_forwarding():
    assert b.route(prefix="/x").HasField("non_forwarding_action")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"prefix": "/a", "path": "/b"}, "at most one of prefix, path, regex"),
        ({"cluster": "a", "weighted_clusters": {"b": 1}}, "at most one of cluster"),
        ({"cluster": "a", "timeout": -1}, "route timeout: expected a non-negative"),
        ({"cluster": "a", "runtime_fraction": 2}, "runtime_fraction: expected a fraction"),
    ],
)
def test_route_rejects_contradictory_arguments(kwargs, error):
    with pytest.raises(ValueError, match=error):
        b.route(**kwargs)


def test_header_matcher_forms():
    assert b.header_matcher("h", exact="v").string_match.exact == "v"
    assert b.header_matcher("h", exact="v", legacy=True).exact_match == "v"
    assert b.header_matcher("h", prefix="p", ignore_case=True).string_match.ignore_case
    assert b.header_matcher("h", safe_regex="r+").string_match.safe_regex.regex == "r+"
    m = b.header_matcher("h", range=(1, 10))
    assert (m.range_match.start, m.range_match.end) == (1, 10)
    with pytest.raises(ValueError, match=r"header_matcher\('h'\): give exactly one matcher"):
        b.header_matcher("h", exact="a", prefix="b")


def test_eds_cluster_takes_endpoints_from_ads():
    c = b.cluster("c", eds_service_name="svc", max_requests=7)
    assert c.type == cluster_pb2.Cluster.EDS
    assert c.eds_cluster_config.eds_config.HasField("ads")
    assert c.eds_cluster_config.service_name == "svc"
    assert c.circuit_breakers.thresholds[0].max_requests.value == 7


def test_aggregate_cluster_lists_children_in_order():
    c = b.cluster("agg", aggregate_children=["x", "y"])
    assert c.cluster_type.name == "envoy.clusters.aggregate"
    config = aggregate_pb2.ClusterConfig()
    assert c.cluster_type.typed_config.Unpack(config)
    assert list(config.clusters) == ["x", "y"]


def test_logical_dns_cluster_has_one_endpoint():
    c = b.cluster("dns", kind="LOGICAL_DNS", dns_host="example.com", dns_port=443)
    assert c.type == cluster_pb2.Cluster.LOGICAL_DNS
    sa = c.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (sa.address, sa.port_value) == ("example.com", 443)
    with pytest.raises(ValueError, match="LOGICAL_DNS needs dns_host and dns_port"):
        b.cluster("dns", kind="LOGICAL_DNS")


def test_cluster_load_balancing_policy_from_messages():
    c = b.cluster("c", load_balancing_policy=[pick_first_pb2.PickFirst(shuffle_address_list=True)])
    ext = c.load_balancing_policy.policies[0].typed_extension_config
    pf = pick_first_pb2.PickFirst()
    assert ext.typed_config.Unpack(pf) and pf.shuffle_address_list


def test_cluster_rejects_unknown_lb_policy_and_kind():
    with pytest.raises(ValueError, match="unknown lb_policy 'FASTEST'"):
        b.cluster("c", lb_policy="FASTEST")
    with pytest.raises(ValueError, match="kind must be EDS, LOGICAL_DNS or AGGREGATE"):
        b.cluster("c", kind="STATIC")


def test_endpoints_localities_weights_health_and_drops():
    cla = b.endpoints(
        "c",
        [
            b.locality(
                region="r",
                zone="z",
                sub_zone="s",
                weight=3,
                priority=1,
                endpoints=[
                    "127.0.0.1:1",
                    b.endpoint("[::1]:2", weight=5, health_status="DRAINING"),
                ],
            ),
            b.locality(weight=None),
        ],
        drop_overloads={"throttle": 250},
    )
    loc = cla.endpoints[0]
    assert (loc.locality.region, loc.locality.zone, loc.locality.sub_zone) == ("r", "z", "s")
    assert (loc.load_balancing_weight.value, loc.priority) == (3, 1)
    second = loc.lb_endpoints[1]
    assert second.endpoint.address.socket_address.address == "::1"
    assert second.load_balancing_weight.value == 5
    assert second.health_status == 3  # DRAINING
    assert not cla.endpoints[1].HasField("load_balancing_weight")
    drop = cla.policy.drop_overloads[0]
    assert (drop.category, drop.drop_percentage.numerator) == ("throttle", 250)


def test_endpoint_rejects_an_address_without_port():
    with pytest.raises(ValueError, match=r"address '127\.0\.0\.1': expected host:port"):
        b.endpoint("127.0.0.1")


def test_route_carries_header_and_channel_id_hash_policies_in_order():
    r = b.route(
        prefix="",
        cluster="c",
        hash_policies=[
            b.hash_policy(header="user", regex="^u-", substitution=""),
            b.hash_policy(channel_id=True, terminal=True),
        ],
    )
    first, second = r.route.hash_policy
    assert first.header.header_name == "user"
    assert first.header.regex_rewrite.pattern.regex == "^u-"
    assert not first.terminal
    assert second.filter_state.key == "io.grpc.channel_id"
    assert second.terminal


def test_hash_policy_needs_exactly_one_of_header_and_channel_id():
    with pytest.raises(ValueError, match="exactly one of header and channel_id"):
        b.hash_policy()
    with pytest.raises(ValueError, match="exactly one of header and channel_id"):
        b.hash_policy(header="user", channel_id=True)
