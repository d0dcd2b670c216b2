"""Channel conformance over xDS, e2e (pyxds.server control plane, grpcio
backends): TRAPS.md "Seen in grpcio 1.85.1's C-core": a cluster in use that
changes type between EDS and aggregate (either way) crashed C-core's
process; in pyxds the cds policy rebuilds its tree and RPCs under load keep
landing (C-core xds_cluster_type_end2end_test AggregateClusterTest, type
change scenarios)."""

from __future__ import annotations

import collections
import threading

import grpc
import pytest
from channel_fixtures import SERVICE, TARGET, Backend, route, snapshot, wait_until

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def _with_aggregate(base: Snapshot, name: str, children: list[str]) -> Snapshot:
    listener_t, route_t, cluster_t, eds_t = list(base._by_type)
    clusters = {k: v for k, v in base.resources(cluster_t).items() if k != name}
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=[*clusters.values(), b.cluster(name, aggregate_children=children)],
        endpoints=list(base.resources(eds_t).values()),
    )


@pytest.mark.parametrize("wait_for_ready", [True, False])
def test_cluster_in_use_changing_type_eds_aggregate_eds_under_load_fails_no_rpc(
    server, wait_for_ready
):
    a0, b0 = Backend("a0").start(), Backend("b0").start()
    eds = snapshot([route(prefix="", cluster="cx")], {"cx": [[a0.address]], "cy": [[b0.address]]})
    server.set_snapshot(eds)
    channel = pyxds.insecure_channel(
        TARGET, bootstrap=server.bootstrap(node_id=f"type-change-{wait_for_ready}")
    )
    counts: collections.Counter = collections.Counter()
    stop = threading.Event()

    def load():
        who = channel.unary_unary(f"/{SERVICE}/Who")
        while not stop.is_set():
            try:
                counts[who(b"", timeout=5, wait_for_ready=wait_for_ready).decode()] += 1
            except grpc.RpcError as err:
                counts[f"error:{err.code().name}: {err.details()}"] += 1

    thread = threading.Thread(target=load)
    try:
        assert channel.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5, wait_for_ready=True)
        thread.start()
        server.set_snapshot(_with_aggregate(eds, "cx", ["cy"]))  # EDS -> aggregate
        assert wait_until(lambda: counts["b0"] > 20, 10)
        before = counts["a0"]
        server.set_snapshot(eds)  # aggregate -> EDS
        assert wait_until(lambda: counts["a0"] > before + 20, 10)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(10)
        channel.close()
        a0.stop()
        b0.stop()
    assert not [k for k in counts if k.startswith("error")], counts
