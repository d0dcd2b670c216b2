"""Differential: an aggregate cluster over an EDS cluster and a LOGICAL_DNS
cluster, in both orders, through pyxds and grpcio's C-core (``xds:///`` in a
subprocess, CoreXdsClient) against the same pyxds.server.

Source: grpc-node ``packages/grpc-js-xds/test/test-cluster-type.ts``
"Aggregate DNS Clusters": "Should handle EDS then DNS cluster order" and
"Should handle DNS then EDS cluster order" (gRFC A37: the aggregate's
children are priorities in order; traffic goes to the first, fails over to
the second when the first's backend goes down, and comes back when it
returns).  "Logical DNS Clusters: Should successfully make RPCs" is
test_differential_lrs_dns.py; "Should result in prioritized clusters" and
"Should handle a diamond dependency" (EDS only) are
test_conformance_cds.py's test_diamond_aggregate_fails_over_across_deduplicated_leaves
and the C-core aggregate replays there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from channel_fixtures import (
    LISTENER,
    TARGET,
    Backend,
    CoreXdsClient,
    pyxds_calls,
    route,
    wait_until,
)

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

EDS, DNS, AGG = "node-eds", "node-dns", "node-agg"


@pytest.fixture(scope="module")
def server() -> Iterator[ManagementServer]:
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def aggregate_snapshot(eds_backend: Backend, dns_backend: Backend, order: list[str]) -> Snapshot:
    host, port = dns_backend.address.rsplit(":", 1)
    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route", [b.virtual_host("vh", routes=[route(prefix="", cluster=AGG)])]
            )
        ],
        clusters=[
            b.cluster(EDS),
            b.cluster(DNS, kind="LOGICAL_DNS", dns_host=host, dns_port=int(port)),
            b.cluster(AGG, aggregate_children=order),
        ],
        endpoints=[
            b.endpoints(EDS, [b.locality(zone="z", endpoints=[eds_backend.address])]),
        ],
    )


@pytest.mark.parametrize("order", [[EDS, DNS], [DNS, EDS]], ids=["eds-then-dns", "dns-then-eds"])
def test_aggregate_of_eds_and_logical_dns_fails_over_and_back_like_c_core(server, order):
    backends = {EDS: Backend("eds").start(), DNS: Backend("dns").start()}
    first, second = (backends[name] for name in order)
    node = "node-cluster-type-" + "-".join(order)
    server.set_snapshot(aggregate_snapshot(backends[EDS], backends[DNS], order))
    core = CoreXdsClient(server.bootstrap(node_id=node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=node))
    seen: dict[str, object] = {}

    def both_served_by(backend: Backend) -> bool:
        want = {backend.name: 4}
        seen["pyxds"] = ours = pyxds_calls(channel, 4, wait_for_ready=False, timeout=2)
        seen["grpcio"] = theirs = core.call(4, wait_for_ready=False, timeout=2)
        return ours == theirs == want

    try:
        assert wait_until(lambda: both_served_by(first), 15), seen
        first.stop()
        assert wait_until(lambda: both_served_by(second), 20), seen
        first.start()
        assert wait_until(lambda: both_served_by(first), 30), seen
    finally:
        channel.close()
        core.close()
        for backend in backends.values():
            backend.stop()
            backend.release()
