"""Differential: a RING_HASH cluster (gRFC A42) with a header hash policy,
through pyxds and through grpcio's C-core ``xds:///`` channel against the
same pyxds.server and backends.  Both build the ring from XXH64 of
"address_N" and hash the header's value with XXH64, so C-core is the
reference for *which* backend each key lands on, not only for stickiness
(C-core xds_ring_hash_end2end_test: HeaderHashing, ReattemptWhenAllEndpoints
Unreachable-style walk to the next endpoint when one is down)."""

from __future__ import annotations

import pytest
from channel_fixtures import (
    TARGET,
    Backend,
    CoreXdsClient,
    pyxds_calls,
    route,
    snapshot,
    wait_until,
)

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

FAST_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 300)]
NODE = "differential-ring-hash"
USERS = [f"user-{i}" for i in range(24)]


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    started = [Backend(f"r{i}").start() for i in range(4)]
    yield started
    for backend in started:
        backend.stop()


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=NODE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server):
    ch = pyxds.insecure_channel(
        TARGET, bootstrap=server.bootstrap(node_id=NODE), options=FAST_BACKOFF
    )
    yield ch
    ch.close()


def ring_hash_snapshot(addresses: list[str], hash_policies: list) -> Snapshot:
    base = snapshot([route(prefix="", cluster="rh", hash_policies=hash_policies)], {"rh": []})
    listener_t, route_t, _cluster_t, _eds_t = list(base._by_type)
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=[b.cluster("rh", lb_policy="RING_HASH")],
        endpoints=[b.endpoints("rh", [b.locality(zone="rh-z", endpoints=addresses)])],
    )


def landing(client, user: str, n: int = 3) -> dict:
    """Where ``n`` RPCs carrying ``user`` land (queued until connected)."""
    metadata = [("user", user)]
    if isinstance(client, CoreXdsClient):
        return dict(client.call(n, metadata=metadata, timeout=10.0, wait_for_ready=True))
    return dict(pyxds_calls(client, n, metadata=metadata, timeout=10.0, wait_for_ready=True))


def test_header_hash_sends_each_key_to_the_same_backend_as_c_core(server, backends, core, channel):
    server.set_snapshot(
        ring_hash_snapshot([x.address for x in backends], [b.hash_policy(header="user")])
    )
    assert wait_until(lambda: len(landing(channel, USERS[0])) == 1, 10)
    assert wait_until(lambda: len(landing(core, USERS[0])) == 1, 10)
    ours = {}
    for user in USERS:
        mine, theirs = landing(channel, user), landing(core, user)
        assert len(mine) == 1, (user, mine)  # sticky: every RPC of a key on one backend
        assert mine == theirs, (user, mine, theirs)
        ours[user] = next(iter(mine))
    # The keys spread: the ring is not degenerate.
    assert len(set(ours.values())) >= 3, ours


def test_a_key_whose_backend_is_down_moves_to_the_same_next_backend_as_c_core(
    server, backends, core, channel
):
    server.set_snapshot(
        ring_hash_snapshot([x.address for x in backends], [b.hash_policy(header="user")])
    )
    user = USERS[5]
    assert wait_until(lambda: landing(channel, user) == landing(core, user), 10)
    home = next(iter(landing(channel, user)))
    victim = next(x for x in backends if x.name == home)
    victim.stop()
    try:
        assert wait_until(lambda: home not in landing(channel, user, 2), 15)
        assert wait_until(lambda: home not in landing(core, user, 2), 15)
        mine, theirs = landing(channel, user), landing(core, user)
        assert len(mine) == 1 and mine == theirs, (mine, theirs)
    finally:
        victim.start()


def test_without_a_hash_policy_both_spread_rpcs_over_the_ring(server, backends, core, channel):
    # No hash policy: each RPC gets a random hash (C-core's resolver draws one).
    server.set_snapshot(ring_hash_snapshot([x.address for x in backends], []))

    def spread(client) -> int:
        if isinstance(client, CoreXdsClient):
            seen = client.call(40, timeout=10.0, wait_for_ready=True)
        else:
            seen = pyxds_calls(client, 40, timeout=10.0, wait_for_ready=True)
        return len([k for k in seen if not k.startswith("error")])

    assert wait_until(lambda: spread(channel) >= 3, 15)
    assert wait_until(lambda: spread(core) >= 3, 15)
