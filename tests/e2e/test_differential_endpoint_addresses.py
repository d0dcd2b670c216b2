"""Differential: an EDS endpoint with A61 ``additional_addresses`` is one
endpoint to the LB policy, through pyxds and grpcio 1.85's C-core.

gRFC A61 "xDS Changes" / "Changes to round_robin" / "pick_first": the cds
policy hands each LbEndpoint on as one endpoint with all its addresses;
round_robin (under wrr_locality) runs one pick_first per endpoint, so the
endpoint gets one share of the calls, served by its first reachable address;
pick_first flattens the endpoints' addresses in order.  Sources: C-core
``test/cpp/end2end/xds/xds_cluster_end2end_test.cc``
(``EdsTest.MultipleAddressesPerEndpoint``) and ``round_robin_test.cc``
(``MultipleAddressesPerEndpoint``), grpc-go
``cdsbalancer/e2e_test/eds_impl_test.go``
(``TestEDS_EndpointWithMultipleAddresses``).
"""

from __future__ import annotations

import pytest
from channel_fixtures import LISTENER, TARGET, CoreXdsClient, pyxds_calls, running_backends
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2

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


def _snapshot(name: str, endpoints: list, pick_first: bool = False) -> Snapshot:
    policy = [pick_first_pb2.PickFirst()] if pick_first else None
    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route",
                [b.virtual_host("vh", routes=[b.route(prefix="", cluster=name)])],
            )
        ],
        clusters=[b.cluster(name, load_balancing_policy=policy)],
        endpoints=[b.endpoints(name, [b.locality(region="r", zone="z", endpoints=endpoints)])],
    )


def _both(
    server, node: str, snapshot: Snapshot, serving: set[str], n: int = CALLS
) -> dict[str, dict[str, int]]:
    """What each client's ``n`` calls reached, on a fresh channel each, once
    its calls have reached every backend of ``serving`` (every endpoint
    connected: round_robin is READY with its first one)."""
    nodes = {"pyxds": f"{node}-pyxds", "core": f"{node}-core"}
    for node_id in nodes.values():
        server.set_snapshot(snapshot, node_id)
    core = CoreXdsClient(server.bootstrap(node_id=nodes["core"]))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=nodes["pyxds"]))
    calls = {"pyxds": lambda k: pyxds_calls(channel, k, timeout=10), "core": core.call}
    try:
        for who, call in calls.items():
            seen: set[str] = set()
            for _ in range(60):
                seen.update(call(1))
                if seen >= serving:
                    break
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
