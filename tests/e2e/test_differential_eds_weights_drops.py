"""Differential: EDS locality weights left out or zero, and drop categories
applied in order, through pyxds and grpcio 1.85's C-core.

Sources: gRFC A27 "EDS" (a locality without ``load_balancing_weight`` is
ignored; C-core ``xds_endpoint_parser``: weight 0 likewise) and "Drops"
(categories are checked in order, the first that draws names the drop:
C-core ``XdsClusterImplLb::Picker::Pick``, ``EdsTest.Drops``/``DropAll``).
"""

from __future__ import annotations

import pytest
from channel_fixtures import LISTENER, TARGET, CoreXdsClient, pyxds_calls, running_backends

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0", "c0")


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def _snapshot(name: str, localities: list, drops: dict[str, int] | None = None) -> Snapshot:
    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route",
                [b.virtual_host("vh", routes=[b.route(prefix="", cluster=name)])],
            )
        ],
        clusters=[b.cluster(name)],
        endpoints=[b.endpoints(name, localities, drop_overloads=drops)],
    )


def _both(server, node: str, snapshot: Snapshot, n: int, **kwargs) -> dict[str, dict[str, int]]:
    nodes = {"pyxds": f"{node}-pyxds", "core": f"{node}-core"}
    for node_id in nodes.values():
        server.set_snapshot(snapshot, node_id)
    core = CoreXdsClient(server.bootstrap(node_id=nodes["core"]))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=nodes["pyxds"]))
    try:
        return {
            "pyxds": dict(pyxds_calls(channel, n, timeout=10, **kwargs)),
            "core": dict(core.call(n, timeout=10, **kwargs)),
        }
    finally:
        channel.close()
        core.close()


@pytest.mark.parametrize("weight", [None, 0])
def test_a_locality_without_weight_gets_no_traffic_as_in_c_core(server, backends, weight):
    """A27 "EDS": za (weight unset, or 0) holding a0 is ignored; zb and zc
    (weight 1) share the calls: a0 never serves, in both clients."""
    localities = [
        b.locality(region="r", zone="za", weight=weight, endpoints=[backends["a0"].address]),
        b.locality(region="r", zone="zb", endpoints=[backends["b0"].address]),
        b.locality(region="r", zone="zc", endpoints=[backends["c0"].address]),
    ]
    name = f"weightless-{weight}"
    got = _both(server, name, _snapshot(name, localities), 30)
    for who, counts in got.items():
        assert set(counts) == {"b0", "c0"} and sum(counts.values()) == 30, (who, got)


def test_the_first_drop_category_that_draws_names_the_drop_as_in_c_core(server, backends):
    """C-core EdsTest.DropAll / XdsClusterImplLb's picker: categories are
    drawn in EDS order; with two at 100 % every call is dropped by the
    first, UNAVAILABLE "EDS-configured drop: first", wait_for_ready or not."""
    localities = [b.locality(region="r", zone="z", endpoints=[backends["a0"].address])]
    name = "drop-order"
    snapshot = _snapshot(name, localities, {"first": 1_000_000, "second": 1_000_000})
    got = _both(server, name, snapshot, 5, details=True)
    want = {"error:UNAVAILABLE: EDS-configured drop: first": 5}
    assert got["core"] == want, got
    assert got["pyxds"] == want, got
