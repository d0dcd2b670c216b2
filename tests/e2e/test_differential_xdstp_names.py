"""Differential: xdstp resource names (gRFC A47) through pyxds and grpcio's
C-core ``xds:///`` channel (a subprocess), against one pyxds.server.

C-core subscribes an ``xdstp:`` name in its canonical form, query
parameters sorted by key (XdsClient::ParseXdsResourceName and
ConstructFullXdsResourceName).  Here the route names its cluster with the
parameters out of order and the server has the Cluster only under the
canonical name: both clients must find it and reach the backend.
"""

from __future__ import annotations

import pytest
from channel_fixtures import TARGET, Backend, CoreXdsClient, call_until, pyxds_calls, route

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot
from pyxds.xds.resources import CLUSTER_TYPE_URL

NODE = "differential-xdstp-names"
CLUSTER_PATH = "xdstp://names.example/envoy.config.cluster.v3.Cluster/svc"
EDS_NAME = "xdstp-names-eds"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def _routing_to(cluster: str, clusters=(), endpoints=()) -> Snapshot:
    """The listener of TARGET routing every RPC to ``cluster``."""
    vhost = b.virtual_host("vh", routes=[route(prefix="", cluster=cluster)])
    return Snapshot(
        listeners=[b.listener("echo-service")],
        routes=[b.route_config("echo-service-route", [vhost])],
        clusters=clusters,
        endpoints=endpoints,
    )


@pytest.mark.parametrize(
    ("case", "in_route", "served"),
    [
        ("params", f"{CLUSTER_PATH}?b=2&a=1", f"{CLUSTER_PATH}?a=1&b=2"),
        ("escapes", f"{CLUSTER_PATH}:a%3Ab?k=%2F", f"{CLUSTER_PATH}:a:b?k=/"),
    ],
)
def test_xdstp_cluster_name_spelled_otherwise_agrees_with_c_core(server, case, in_route, served):
    """The route names the cluster with its parameters out of order, or with
    escapes C-core decodes; the server has it under the canonical name."""
    node = f"{NODE}-{case}"
    backend = Backend(f"xdstp-names-{case}").start()
    bootstrap = server.bootstrap(node_id=node, authorities={"names.example": {}})
    server.set_snapshot(
        _routing_to(
            in_route,
            clusters=[b.cluster(served, eds_service_name=EDS_NAME)],
            endpoints=[b.endpoints(EDS_NAME, [b.locality(zone="z", endpoints=[backend.address])])],
        ),
        node_id=node,
    )
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    core = CoreXdsClient(bootstrap)
    try:
        assert core.until(backend.name, 10)[backend.name] == 1
        assert call_until(channel, backend.name, 10) < 10
        asked = {
            name
            for request in server.requests(CLUSTER_TYPE_URL, node_id=node)
            for name in request.resource_names
        }
        assert asked == {served}, asked
    finally:
        channel.close()
        core.close()
        backend.stop()


@pytest.mark.parametrize(
    ("case", "cluster", "words"),
    [
        (
            "unknown-authority",
            "xdstp://nowhere.example/envoy.config.cluster.v3.Cluster/c",
            'authority "nowhere.example" not present in bootstrap config',
        ),
        ("unparseable", "xdstp://x", "Unable to parse resource name xdstp://x"),
    ],
)
def test_route_to_xdstp_cluster_that_cannot_be_watched_fails_as_in_c_core(
    server, case, cluster, words
):
    """C-core XdsClientTest.FederationWithUnknownAuthority and
    FederationWithUnparseableXdstpResourceName, seen through the RPC: both
    channels fail it UNAVAILABLE naming the cluster and the same reason
    (C-core adds its node ID)."""
    node = f"{NODE}-{case}"
    bootstrap = server.bootstrap(node_id=node)
    server.set_snapshot(_routing_to(cluster), node_id=node)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    core = CoreXdsClient(bootstrap)
    try:
        (ours,) = pyxds_calls(channel, 1, wait_for_ready=False, timeout=5, details=True)
        (theirs,) = core.call(1, wait_for_ready=False, timeout=5, details=True)
    finally:
        channel.close()
        core.close()
    want = f"error:UNAVAILABLE: CDS resource {cluster}: {words}"
    assert ours == want, ours
    assert theirs == f"{want} (node ID:{node})", theirs
