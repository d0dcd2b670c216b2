"""Bad input is data: no byte string makes a decoder raise, and whatever decodes
decodes to the same value twice (ARCHITECTURE.md "Bad input is data")."""

from __future__ import annotations

import os

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyxds.xds.resources import CLUSTER, ENDPOINTS, LISTENER, RESOURCE_TYPES, ROUTE_CONFIG


def valid_seeds() -> dict:
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.http_filters.add(name="router").typed_config.Pack(router_pb2.Router())
    vh = hcm.route_config.virtual_hosts.add(name="vh", domains=["*"])
    r = vh.routes.add()
    r.match.prefix = "/svc/"
    r.match.headers.add(name="x", safe_regex_match={"regex": "a.*"})
    r.route.cluster = "c"
    lis = listener_pb2.Listener(name="l")
    lis.api_listener.api_listener.Pack(hcm)

    rc = route_pb2.RouteConfiguration(name="r")
    rc.virtual_hosts.append(hcm.route_config.virtual_hosts[0])

    c = cluster_pb2.Cluster(name="c", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.ads.SetInParent()

    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="e")
    loc = cla.endpoints.add()
    loc.load_balancing_weight.value = 1
    loc.locality.zone = "z"
    sa = loc.lb_endpoints.add().endpoint.address.socket_address
    sa.address, sa.port_value = "10.0.0.1", 80
    return {
        LISTENER: lis.SerializeToString(),
        ROUTE_CONFIG: rc.SerializeToString(),
        CLUSTER: c.SerializeToString(),
        ENDPOINTS: cla.SerializeToString(),
    }


SEEDS = valid_seeds()
# FUZZ_N=5000 for a longer local run; the default keeps the suite fast.
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_N", "200"))
TYPES = list(RESOURCE_TYPES.values())


def check(rtype, data: bytes) -> None:
    a = rtype.decode(data, use_memo=False)
    assert not (a.error or "").startswith("internal error"), a.error
    assert (a.resource is None) != (a.error is None)
    if a.name is None:
        assert a.error is not None
    b = rtype.decode(data, use_memo=False)
    assert a == b


@pytest.mark.parametrize("rtype", TYPES, ids=lambda t: t.short_name)
def test_valid_seeds_decode(rtype):
    result = rtype.decode(SEEDS[rtype])
    assert result.error is None, result.error


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rtype=st.sampled_from(TYPES), data=st.binary(max_size=200))
def test_random_bytes_never_raise(rtype, data):
    check(rtype, data)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rtype=st.sampled_from(TYPES),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
)
def test_mutated_valid_resources_never_raise(rtype, flips, cut):
    data = bytearray(SEEDS[rtype])
    for pos, value in flips:
        data[pos % len(data)] = value
    check(rtype, bytes(data[: max(1, cut % (len(data) + 1))]))
