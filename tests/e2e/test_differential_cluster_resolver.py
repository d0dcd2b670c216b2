"""Differential: how a cluster's EDS endpoints reach the LB policies, through
pyxds and grpcio 1.85's C-core (a fresh channel of each per scenario, each
with its own node and snapshot).

1. An EDS endpoint with A61 ``additional_addresses`` is one endpoint to the
LB policy.  gRFC A61 "xDS Changes" / "Changes to round_robin" / "pick_first": the cds
policy hands each LbEndpoint on as one endpoint with all its addresses;
round_robin (under wrr_locality) runs one pick_first per endpoint, so the
endpoint gets one share of the calls, served by its first reachable address;
pick_first flattens the endpoints' addresses in order.  Sources: C-core
``test/cpp/end2end/xds/xds_cluster_end2end_test.cc``
(``EdsTest.MultipleAddressesPerEndpoint``) and ``round_robin_test.cc``
(``MultipleAddressesPerEndpoint``), grpc-go
``cdsbalancer/e2e_test/eds_impl_test.go``
(``TestEDS_EndpointWithMultipleAddresses``).

2. EDS locality weights left out or zero, and drop categories applied in
order: gRFC A27 "EDS" (a locality without ``load_balancing_weight`` is
ignored; C-core's EDS parser: weight 0 likewise) and "Drops" (categories
are checked in order, the first that draws names the drop: C-core
``XdsClusterImplLb::Picker::Pick``, ``EdsTest.Drops``/``DropAll``).
"""

from __future__ import annotations

import pytest
from channel_fixtures import TARGET, CoreXdsClient, pyxds_calls, running_backends, until_answered
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2
from lrs_fixtures import one_cluster_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

CALLS = 12


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0", "c0")


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def _endpoint(*addresses: str):
    lb = b.endpoint(addresses[0])
    for extra in addresses[1:]:
        host, _, port = extra.rpartition(":")
        socket_address = lb.endpoint.additional_addresses.add().address.socket_address
        socket_address.address = host
        socket_address.port_value = int(port)
    return lb


def _snapshot(
    name: str,
    endpoints: list,
    pick_first: bool = False,
    drops: dict[str, int] | None = None,
    localities: list | None = None,
) -> Snapshot:
    """One route to cluster ``name`` whose EDS resource is one locality of
    ``endpoints`` (or ``localities``)."""
    policy = [pick_first_pb2.PickFirst()] if pick_first else None
    if localities is None:
        localities = [b.locality(region="r", zone="z", endpoints=endpoints)]
    return one_cluster_snapshot(
        b.cluster(name, load_balancing_policy=policy), drops=drops, localities=localities
    )


def _both(
    server, node: str, snapshot: Snapshot, serving: set[str], n: int = CALLS, **kwargs
) -> dict[str, dict[str, int]]:
    """What each client's ``n`` calls (``kwargs``: more ``call`` arguments)
    reached, on a fresh channel each, once its calls have reached every
    backend of ``serving`` (every endpoint connected: round_robin is READY
    with its first one)."""
    nodes = {"pyxds": f"{node}-pyxds", "core": f"{node}-core"}
    for node_id in nodes.values():
        server.set_snapshot(snapshot, node_id)
    core = CoreXdsClient(server.bootstrap(node_id=nodes["core"]))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=nodes["pyxds"]))
    calls = {
        "pyxds": lambda k: pyxds_calls(channel, k, timeout=10, **kwargs),
        "core": lambda k: core.call(k, timeout=10, **kwargs),
    }
    try:
        for who, call in calls.items():
            seen = set(until_answered(lambda c=call: c(1), serving))
            assert seen >= serving, (who, seen)
        return {who: dict(call(n)) for who, call in calls.items()}
    finally:
        channel.close()
        core.close()


def test_round_robin_gives_a_two_address_endpoint_one_share_on_its_first_address(server, backends):
    """C-core RoundRobinTest.MultipleAddressesPerEndpoint: [a0, b0] and [c0]
    are two endpoints: half the calls each, b0 (the first endpoint's second
    address) none while a0 serves."""
    a0, b0, c0 = (backends[n].address for n in ("a0", "b0", "c0"))
    snapshot = _snapshot("addr-rr", [_endpoint(a0, b0), _endpoint(c0)])
    got = _both(server, "addr-rr", snapshot, {"a0", "c0"})
    assert got["core"] == {"a0": CALLS // 2, "c0": CALLS // 2}, got
    assert got["pyxds"] == got["core"], got


def test_round_robin_serves_an_endpoint_on_its_second_address_when_the_first_refuses(
    server, backends, ports
):
    """C-core EdsTest.MultipleAddressesPerEndpoint, grpc-go
    TestEDS_EndpointWithMultipleAddresses: the first endpoint's first
    address refuses connections: its pick_first serves it on b0, with the
    endpoint's one share of the calls."""
    b0, c0 = backends["b0"].address, backends["c0"].address
    snapshot = _snapshot("addr-rr-dead", [_endpoint(ports.dead_address(), b0), _endpoint(c0)])
    got = _both(server, "addr-rr-dead", snapshot, {"b0", "c0"})
    assert got["core"] == {"b0": CALLS // 2, "c0": CALLS // 2}, got
    assert got["pyxds"] == got["core"], got


def test_pick_first_tries_an_endpoints_addresses_in_order_before_the_next_endpoint(
    server, backends, ports
):
    """A61 "pick_first": the endpoints' addresses flattened in order: [dead,
    a0], [b0] -> a0."""
    a0, b0 = backends["a0"].address, backends["b0"].address
    snapshot = _snapshot(
        "addr-pf", [_endpoint(ports.dead_address(), a0), _endpoint(b0)], pick_first=True
    )
    got = _both(server, "addr-pf", snapshot, {"a0"})
    assert got["core"] == {"a0": CALLS}, got
    assert got["pyxds"] == got["core"], got


# -- 2. locality weights and drops ------------------------------------------


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
    got = _both(server, name, _snapshot(name, [], localities=localities), {"b0", "c0"}, 30)
    for who, counts in got.items():
        assert set(counts) == {"b0", "c0"} and sum(counts.values()) == 30, (who, got)


def test_the_first_drop_category_that_draws_names_the_drop_as_in_c_core(server, backends):
    """C-core EdsTest.DropAll / XdsClusterImplLb's picker: categories are
    drawn in EDS order; with two at 100 % every call is dropped by the
    first, UNAVAILABLE "EDS-configured drop: first", wait_for_ready or not."""
    name = "drop-order"
    drops = {"first": 1_000_000, "second": 1_000_000}
    snapshot = _snapshot(name, [backends["a0"].address], drops=drops)
    got = _both(server, name, snapshot, set(), 5, details=True)
    want = {"error:UNAVAILABLE: EDS-configured drop: first": 5}
    assert got["core"] == want, got
    assert got["pyxds"] == want, got
