"""Differential: locality weights (gRFC A28 weighted_target under A56's
priority, the ``load_balancing_weight`` of each ``LocalityLbEndpoints``)
split traffic the same through pyxds and through grpcio's C-core ``xds:///``
channel, against the same pyxds.server and backends; and they still do
after endpoints are added to and removed from a locality while its weight
stays (pyxds then reuses its weighted picker's bucket table, issue 18).

Bounds are 5 standard deviations of a share over the RPC count (one run in
millions fails them by chance); the difference between the two clients'
shares gets sqrt(2) times that."""

from __future__ import annotations

import collections
import contextlib

import pytest
from channel_fixtures import LISTENER, TARGET, Backend, CoreXdsClient, pyxds_calls, wait_until

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NODE = "differential-locality-weights"
N = 4000
WEIGHTS = {"z1": 1, "z3": 3, "z6": 6}


class World:
    """The control plane, four backends, C-core's client and a pyxds channel
    on the same bootstrap, for the whole module."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.server = ManagementServer().start()
        stack.callback(self.server.stop)
        self.backends = {name: Backend(name).start() for name in ("w1", "w3", "w6a", "w6b")}
        for backend in self.backends.values():
            stack.callback(backend.stop)
        bootstrap = self.server.bootstrap(node_id=NODE)
        self.core = CoreXdsClient(bootstrap)
        stack.callback(self.core.close)
        self.channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
        stack.callback(self.channel.close)


@pytest.fixture(scope="module")
def world():
    with contextlib.ExitStack() as stack:
        yield World(stack)


def weighted_snapshot(backends, members: dict[str, list[str]], version: str) -> Snapshot:
    """One EDS cluster, one priority, a locality per zone of ``WEIGHTS``
    holding the named backends."""
    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route",
                [b.virtual_host("vh", routes=[b.route(prefix="", cluster="cw")])],
            )
        ],
        clusters=[b.cluster("cw")],
        endpoints=[
            b.endpoints(
                "cw",
                [
                    b.locality(
                        zone=zone,
                        weight=weight,
                        endpoints=[backends[name].address for name in members[zone]],
                    )
                    for zone, weight in WEIGHTS.items()
                ],
            )
        ],
        version=version,
    )


def shares(counts: collections.Counter, members: dict[str, list[str]]) -> dict[str, float]:
    total = sum(counts.values())
    return {zone: sum(counts[name] for name in names) / total for zone, names in members.items()}


def assert_split_like_c_core(core, channel, members: dict[str, list[str]]) -> None:
    everyone = {name for names in members.values() for name in names}
    assert wait_until(lambda: set(pyxds_calls(channel, 60)) == everyone, 10)
    assert wait_until(lambda: set(core.call(60)) == everyone, 10)
    ours, theirs = pyxds_calls(channel, N), core.call(N)
    assert set(ours) == set(theirs) == everyone
    total_weight = sum(WEIGHTS.values())
    for zone, weight in WEIGHTS.items():
        expected = weight / total_weight
        sd = (expected * (1 - expected) / N) ** 0.5
        ours_share, theirs_share = shares(ours, members)[zone], shares(theirs, members)[zone]
        assert abs(ours_share - expected) < 5 * sd, (zone, ours, theirs)
        assert abs(theirs_share - expected) < 5 * sd, (zone, ours, theirs)
        assert abs(ours_share - theirs_share) < 5 * sd * 2**0.5, (zone, ours, theirs)


def test_locality_weights_split_traffic_like_c_core(world):
    members = {"z1": ["w1"], "z3": ["w3"], "z6": ["w6a", "w6b"]}
    world.server.set_snapshot(weighted_snapshot(world.backends, members, "1"))
    assert_split_like_c_core(world.core, world.channel, members)


def test_endpoints_joining_and_leaving_a_locality_keep_the_weights_like_c_core(world):
    # The heaviest locality loses an endpoint, then the lightest gains one:
    # every READY locality publishes new pickers, no locality weight changes.
    core, channel = world.core, world.channel
    members = {"z1": ["w1"], "z3": ["w3"], "z6": ["w6a"]}
    world.server.set_snapshot(weighted_snapshot(world.backends, members, "2"))
    assert wait_until(lambda: "w6b" not in pyxds_calls(channel, 60), 10)
    assert wait_until(lambda: "w6b" not in core.call(60), 10)
    assert_split_like_c_core(core, channel, members)
    members = {"z1": ["w1", "w6b"], "z3": ["w3"], "z6": ["w6a"]}
    world.server.set_snapshot(weighted_snapshot(world.backends, members, "3"))
    assert_split_like_c_core(core, channel, members)
