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


#: Seconds a client may take to apply an ACKed EDS update to its LB policy
APPLIED_WITHIN = 20.0


def _moved_batches(server: ManagementServer, cluster: str, clients: dict) -> dict:
    """Per client (name: (node, call)), the zones (with their counts) under
    which a batch of ``CALLS`` calls made after the update was reported:
    batch after batch until one has no call under ``za``, or
    ``APPLIED_WITHIN`` seconds.  The ACK does not mean the LB policy has the
    update: C-core hands it to the channel's work serializer after sending
    the ACK, so a batch made in between counts its calls to a0 under ``za``
    (a fixed 0.3 s stood for that before); a client that never moves a0
    fails with its last batch.  The clients' batches of a round are made
    before their reports are waited for (one report interval for all)."""
    deadline = time.monotonic() + APPLIED_WITHIN
    pending, deltas = dict(clients), {}
    while pending:
        prior = {who: _succeeded(server, cluster, node) for who, (node, _) in pending.items()}
        for who, (_, call) in pending.items():
            made = call(CALLS)
            assert sum(made.values()) == CALLS, (who, made)
        for who, (node, _) in list(pending.items()):
            want = sum(prior[who].values()) + CALLS
            assert wait_for(
                lambda n=node, w=want: sum(_succeeded(server, cluster, n).values()) == w, 20
            )
            now, was = _succeeded(server, cluster, node), prior[who]
            deltas[who] = {
                zone: now.get(zone, 0) - was.get(zone, 0)
                for zone in set(now) | set(was)
                if now.get(zone, 0) != was.get(zone, 0)
            }
            if "za" not in deltas[who] or time.monotonic() >= deadline:
                del pending[who]
    return deltas


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
        deltas = _moved_batches(server, name, {w: (nodes[w], calls[w]) for w in nodes})
        assert deltas["core"] == {"zb": CALLS}, deltas
        assert deltas["pyxds"] == deltas["core"], deltas
    finally:
        channel.close()
        core.close()
