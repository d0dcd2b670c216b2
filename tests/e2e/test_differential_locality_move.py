"""Differential: an endpoint that moves to another locality in an EDS update
(same address) has its load reported under its new locality afterwards.

gRFC A27 "Load Reporting" counts each call under the locality of the endpoint
it went to; the EDS update decides that locality.  C-core
(``xds_cluster_impl.cc``) wraps each subchannel it creates with the stats of
the locality in the endpoint's attributes, and every policy below it creates
a subchannel again for an endpoint whose attributes changed: round_robin
under wrr_locality because the endpoint is now in another locality's child,
ring_hash because it hands the endpoint's pick_first child the new endpoint
(``RingHashEndpoint::UpdateLocked``) and pick_first because each update
builds a new subchannel list (``AttemptToConnectUsingLatestUpdateArgsLocked``).
The underlying connection is shared (subchannel pool), the wrapper is new.

Scenario (per cluster LB policy, through pyxds and grpcio 1.85's C-core in a
subprocess, each with its own node and snapshot): localities ``za`` -> a0,
``zb`` -> b0; calls; then EDS ``zb`` -> [a0, b0] (``za`` gone, a0 moved);
once the client ACKed it, more calls: every one of them is reported under
``zb``, none under ``za``.
"""

from __future__ import annotations

import time

import pytest
from channel_fixtures import TARGET, CoreXdsClient, pyxds_calls, running_backends
from channel_fixtures import wait_until as wait_for
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2
from lrs_fixtures import one_cluster_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

CALLS = 12


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0")


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer(lrs_interval=0.5).start()
    yield srv
    srv.stop()


def _cluster(name: str, policy: str):
    if policy == "pick_first":
        return b.cluster(name, lrs_server=True, load_balancing_policy=[pick_first_pb2.PickFirst()])
    return b.cluster(name, lrs_server=True, lb_policy=policy.upper())


def _snapshot(cluster, localities: dict[str, list[str]], version: str) -> Snapshot:
    return one_cluster_snapshot(
        cluster,
        localities=[
            b.locality(region="r", zone=zone, endpoints=addresses)
            for zone, addresses in localities.items()
        ],
        version=version,
    )


def _succeeded(server: ManagementServer, cluster: str, node_id: str) -> dict[str, int]:
    counts = server.lrs.totals(cluster, node_id).counts()["succeeded"]
    return {key[1]: n for key, n in counts.items()}


@pytest.mark.parametrize("policy", ["round_robin", "ring_hash", "pick_first"])
def test_load_of_a_moved_endpoint_is_reported_under_its_new_locality_as_in_c_core(
    server, backends, policy
):
    name = f"move-{policy}"
    cluster = _cluster(name, policy)
    a0, b0 = backends["a0"].address, backends["b0"].address
    nodes = {"pyxds": f"{name}-pyxds", "core": f"{name}-core"}
    for node in nodes.values():
        server.set_snapshot(_snapshot(cluster, {"za": [a0], "zb": [b0]}, "1"), node)
    core = CoreXdsClient(server.bootstrap(node_id=nodes["core"]))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=nodes["pyxds"]))
    calls = {
        "pyxds": lambda n: pyxds_calls(channel, n),
        "core": lambda n: core.call(n),
    }
    try:
        before = {who: calls[who](CALLS) for who in nodes}
        for who, node in nodes.items():
            assert sum(before[who].values()) == CALLS, (who, before[who])
            assert wait_for(lambda n=node: sum(_succeeded(server, name, n).values()) == CALLS, 20)
        base = {who: _succeeded(server, name, node) for who, node in nodes.items()}
        for who in nodes:
            want = {"za": before[who]["a0"], "zb": before[who]["b0"]}
            assert base[who] == {z: n for z, n in want.items() if n}, (who, base[who])
        # a0 moves to zb; za is gone
        for node in nodes.values():
            server.set_snapshot(_snapshot(cluster, {"zb": [a0, b0]}, "2"), node)
        for node in nodes.values():
            server.wait_for_ack("EDS", "2", timeout=10, node_id=node)
        time.sleep(0.3)  # the LB update follows the ACK asynchronously in C-core
        after = {who: calls[who](CALLS) for who in nodes}
        deltas = {}
        for who, node in nodes.items():
            assert sum(after[who].values()) == CALLS, (who, after[who])
            assert wait_for(
                lambda n=node: sum(_succeeded(server, name, n).values()) == 2 * CALLS, 20
            )
            now = _succeeded(server, name, node)
            deltas[who] = {
                zone: now.get(zone, 0) - base[who].get(zone, 0)
                for zone in set(now) | set(base[who])
                if now.get(zone, 0) != base[who].get(zone, 0)
            }
        assert deltas["core"] == {"zb": CALLS}, (deltas, after)
        assert deltas["pyxds"] == deltas["core"], (deltas, after)
    finally:
        channel.close()
        core.close()
