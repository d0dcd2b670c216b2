"""Differential: the endpoint weights the cds policy hands down (gRFC A113
"CDS LB Policy changes: Computing Endpoint Weights"), seen through ring_hash
placement in pyxds and grpcio 1.85's C-core.

grpcio 1.85 guards A113 with GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING, off by
default (C-core's ``IsExperimentEnvVarEnabled``): off, an endpoint's weight
is locality weight x endpoint weight; on, the product of the locality's
normalized weight in its priority and the endpoint's in its locality, in
UQ1.31 (C-core ``PriorityEndpointIteratorTest.NormalizedWeights``).  The
ring is built from those weights, so which backend each request hash lands
on shows them exactly.

Scenario: localities ``za`` (weight 1: a0) and ``zb`` (weight 1: b0, b1,
b2), a header hash policy, 48 keys; each client's landing of every key must
be the ring built from the expected weights (raw: 1, 1, 1, 1; normalized:
2**30, then 357913941 three times), the same in both.
"""

from __future__ import annotations

import pytest
import xxhash
from channel_fixtures import TARGET, CoreXdsClient, pyxds_calls, running_backends
from channel_fixtures import wait_until as wait_for
from lrs_fixtures import one_cluster_snapshot

import pyxds._api as pyxds
from pyxds.lb.pick_first import WEIGHTED_SHUFFLING_ENV
from pyxds.lb.ring_hash import DEFAULT_MIN_RING_SIZE, RING_SIZE_CAP, build_ring
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NAMES = ("a0", "b0", "b1", "b2")
KEYS = [f"user-{i}" for i in range(48)]
WEIGHTS = {
    "off": [1, 1, 1, 1],
    "on": [1 << 30, *[((1 << 30) * ((1 << 31) // 3)) >> 31] * 3],
}


@pytest.fixture(scope="module")
def backends():
    yield from running_backends(*NAMES)


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def _snapshot(backends) -> Snapshot:
    return one_cluster_snapshot(
        b.cluster("a113", lb_policy="RING_HASH"),
        localities=[
            b.locality(region="r", zone="za", endpoints=[backends["a0"].address]),
            b.locality(
                region="r", zone="zb", endpoints=[backends[n].address for n in ("b0", "b1", "b2")]
            ),
        ],
        hash_policies=[b.hash_policy(header="user")],
    )


def _expected(backends, weights: list[int]) -> dict[str, str]:
    addresses = [backends[n].address for n in NAMES]
    ring = build_ring(addresses, weights, DEFAULT_MIN_RING_SIZE, RING_SIZE_CAP)
    return {
        key: NAMES[ring.endpoints[ring.start(xxhash.xxh64_intdigest(key.encode()))]] for key in KEYS
    }


@pytest.mark.parametrize("switch", ["off", "on"])
def test_ring_hash_places_endpoints_by_the_weights_cds_gives_as_c_core(
    server, backends, switch, monkeypatch
):
    env = {WEIGHTED_SHUFFLING_ENV: "true"} if switch == "on" else {}
    monkeypatch.delenv(WEIGHTED_SHUFFLING_ENV, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    nodes = {"pyxds": f"a113-{switch}-pyxds", "core": f"a113-{switch}-core"}
    for node in nodes.values():
        server.set_snapshot(_snapshot(backends), node)
    core = CoreXdsClient(server.bootstrap(node_id=nodes["core"]), env=env)
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=nodes["pyxds"]))
    calls = {
        "pyxds": lambda md: pyxds_calls(channel, 1, metadata=md, timeout=10),
        "core": lambda md: core.call(1, metadata=md, timeout=10),
    }
    want = _expected(backends, WEIGHTS[switch])
    assert want != _expected(backends, WEIGHTS["off" if switch == "on" else "on"])
    landed: dict[str, dict[str, str]] = {}
    try:
        for who, call in calls.items():

            def lands(call=call, who=who) -> bool:
                got = {}
                for key in KEYS:
                    [(backend, _)] = call([("user", key)]).items()
                    got[key] = backend
                landed[who] = got
                return got == want

            # a key on an endpoint not yet connected may land further on
            # the ring until it is READY: bounded wait for the settled ring
            assert wait_for(lands, 20, interval=0.1), (who, switch, landed.get(who), want)
    finally:
        channel.close()
        core.close()
    assert landed["pyxds"] == landed["core"] == want
