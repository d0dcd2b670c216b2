"""Differential load reporting with pick_first over two localities (grpc-go
``clusterimpl/tests/balancer_test.go`` TestLoadReportingPickFirstMultiLocality;
gRFC A27 "Load Reporting", A52 custom policies): a cluster whose
``load_balancing_policy`` is pick_first, localities ``za`` (backend a0) and
``zb`` (b0), ``lrs_server: self``.  Through pyxds and through grpcio's
C-core (``xds:///`` channel in a subprocess): calls go to a0 and are
reported under za; zb, whose subchannel pick_first made and then shut down,
is listed once with zeros and then no longer; once a0 stops, calls go to b0
and are reported under zb, za is flushed once more and then dropped.  The
two clients send the same succession of locality sets and the same totals.
"""

from __future__ import annotations

import pytest
from channel_fixtures import LISTENER, TARGET, CoreXdsClient, pyxds_calls, running_backends
from channel_fixtures import wait_until as wait_for
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

CLUSTER = "lrs-pick-first"


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0")


@pytest.fixture(scope="module")
def server(backends):
    srv = ManagementServer(lrs_interval=1.0).start()
    pick_first = [pick_first_pb2.PickFirst()]
    srv.set_snapshot(
        Snapshot(
            listeners=[b.listener(LISTENER)],
            routes=[
                b.route_config(
                    f"{LISTENER}-route",
                    [b.virtual_host("vh", routes=[b.route(prefix="", cluster=CLUSTER)])],
                )
            ],
            clusters=[b.cluster(CLUSTER, lrs_server=True, load_balancing_policy=pick_first)],
            endpoints=[
                b.endpoints(
                    CLUSTER,
                    [
                        b.locality(region="r", zone=zone, endpoints=[backends[name].address])
                        for zone, name in (("za", "a0"), ("zb", "b0"))
                    ],
                )
            ],
        )
    )
    yield srv
    srv.stop()


def zone_sets(server: ManagementServer, node_id: str) -> list[set[str]]:
    """The zones listed by each report, consecutive repeats collapsed."""
    out: list[set[str]] = []
    for record in server.lrs.reports(CLUSTER, node_id):
        zones = {s.locality.zone for s in record.stats.upstream_locality_stats}
        if not out or out[-1] != zones:
            out.append(zones)
    return out


def last_zones(server: ManagementServer, node_id: str) -> set[str] | None:
    """The zones listed by the node's latest report (None before any)."""
    sets = zone_sets(server, node_id)
    return sets[-1] if sets else None


def succeeded(server: ManagementServer, node_id: str) -> dict[str, int]:
    return {z[1]: n for z, n in server.lrs.totals(CLUSTER, node_id).counts()["succeeded"].items()}


def test_pick_first_load_follows_the_endpoint_in_use_as_in_c_core(server, backends):
    py_node, core_node = "lrs-pf-pyxds", "lrs-pf-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        assert pyxds_calls(channel, 8) == core.call(8) == {"a0": 8}
        for node_id in (py_node, core_node):
            assert wait_for(lambda n=node_id: succeeded(server, n) == {"za": 8}, 20), node_id
            # the zero report that follows (the one after the last call's
            # lists za alone: zb's stats went with its subchannel)
            assert wait_for(lambda n=node_id: last_zones(server, n) == {"za"}, 20), node_id
        backends["a0"].stop()
        try:
            assert pyxds_calls(channel, 4) == core.call(4) == {"b0": 4}
            want = {"za": 8, "zb": 4}
            for node_id in (py_node, core_node):
                assert wait_for(lambda n=node_id: succeeded(server, n) == want, 20), node_id
                # za flushed once more, then the zero report of zb alone
                assert wait_for(lambda n=node_id: last_zones(server, n) == {"zb"}, 20), node_id
        finally:
            backends["a0"].start()
        seen = {n: zone_sets(server, n) for n in (py_node, core_node)}
        assert (
            seen[py_node]
            == seen[core_node]
            == [
                {"za", "zb"},
                {"za"},
                {"za", "zb"},
                {"zb"},
            ]
        ), seen
    finally:
        channel.close()
        core.close()
