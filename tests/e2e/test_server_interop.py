"""Interop: grpcio's C-core as the xDS client of pyxds.server routes RPCs per the served config.

C-core reads its bootstrap (GRPC_XDS_BOOTSTRAP_CONFIG) once per process, so each
test runs a C-core client in its own subprocess (backends.CoreClient) against a
fresh management server and real Echo backends, all on 127.0.0.1.
"""

from __future__ import annotations

import time
from concurrent import futures

import pytest
from backends import CoreClient, backend_names

from pyxds.server import (
    CLUSTER,
    CLUSTER_LOAD_ASSIGNMENT,
    LISTENER,
    ROUTE_CONFIGURATION,
    Snapshot,
)
from pyxds.server import builders as b

TARGET = "echo-service"


def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def echo_snapshot(route, clusters: dict[str, list[str]]) -> Snapshot:
    """Listener TARGET -> route config "echo-route" with ``route``; one EDS cluster per entry."""
    return Snapshot(
        listeners=[b.listener(TARGET, route_config_name="echo-route")],
        routes=[b.route_config("echo-route", [b.virtual_host("echo", [TARGET], [route])])],
        clusters=[b.cluster(name, eds_service_name=f"{name}-eds") for name in clusters],
        endpoints=[
            b.endpoints(f"{name}-eds", [b.locality(region="r", zone="z", endpoints=addresses)])
            for name, addresses in clusters.items()
        ],
    )


@pytest.fixture
def backends(echo_backends):
    a, b_ = echo_backends(["A", "B"])
    return a, b_


def test_core_client_reaches_the_backend_of_a_single_cluster(xds_server, backends):
    a, b_ = backends
    xds_server.set_snapshot(
        echo_snapshot(b.route(prefix="", cluster="cluster-a"), {"cluster-a": [a.address]})
    )
    with CoreClient(xds_server.bootstrap(), f"xds:///{TARGET}") as client:
        counts = client.call(20)
    assert counts == {"A": 20}
    assert b_.calls == 0


def test_core_client_splits_traffic_75_25_over_weighted_clusters(xds_server, backends):
    a, b_ = backends
    xds_server.set_snapshot(
        echo_snapshot(
            b.route(prefix="/", weighted_clusters={"cluster-a": 75, "cluster-b": 25}),
            {"cluster-a": [a.address], "cluster-b": [b_.address]},
        )
    )
    with CoreClient(xds_server.bootstrap(), f"xds:///{TARGET}") as client:
        counts = client.call(400)
    assert counts["A"] + counts["B"] == 400, counts
    # Binomial(400, 0.75): mean 300, sd ~8.7; 5 sd either side.
    assert 257 <= counts["A"] <= 343, counts


def test_core_client_follows_a_route_update_pushed_mid_run(xds_server, backends):
    a, b_ = backends
    clusters = {"cluster-a": [a.address], "cluster-b": [b_.address]}
    xds_server.set_snapshot(echo_snapshot(b.route(prefix="", cluster="cluster-a"), clusters))
    with CoreClient(xds_server.bootstrap(), f"xds:///{TARGET}") as client:
        assert client.call(10) == {"A": 10}
        with futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(client.call_until, "B", 10)
            wait_for(lambda: a.calls >= 20, "RPCs to keep reaching A")  # traffic is flowing
            xds_server.set_snapshot(
                echo_snapshot(b.route(prefix="", cluster="cluster-b"), clusters)
            )
            moved = running.result(timeout=20)
        assert moved["B"] == 1 and moved["A"] >= 10, moved
        assert client.call(10) == {"B": 10}
    assert xds_server.acks(ROUTE_CONFIGURATION)[-1].version_info == "2"


def test_server_records_core_client_acks_for_all_four_types(xds_server, backends):
    a, _ = backends
    xds_server.set_snapshot(
        echo_snapshot(b.route(prefix="", cluster="cluster-a"), {"cluster-a": [a.address]})
    )
    with CoreClient(xds_server.bootstrap(node_id="core-node"), f"xds:///{TARGET}") as client:
        assert client.call(1) == {"A": 1}
        for type_url, names in (
            (LISTENER, (TARGET,)),
            (ROUTE_CONFIGURATION, ("echo-route",)),
            (CLUSTER, ("cluster-a",)),
            (CLUSTER_LOAD_ASSIGNMENT, ("cluster-a-eds",)),
        ):
            ack = xds_server.wait_for_ack(type_url, "1", timeout=5, node_id="core-node")
            assert ack.resource_names == names
        assert xds_server.connected_nodes() == ["core-node"]
    assert xds_server.nacks() == []


def test_server_records_the_core_client_nack_of_a_listener_without_router(xds_server, backends):
    a, _ = backends
    good = echo_snapshot(b.route(prefix="", cluster="cluster-a"), {"cluster-a": [a.address]})
    xds_server.set_snapshot(good)
    hcm = b.http_connection_manager("echo-route")
    del hcm.http_filters[:]
    from envoy.config.listener.v3 import api_listener_pb2, listener_pb2

    bad_listener = listener_pb2.Listener(
        name=TARGET, api_listener=api_listener_pb2.ApiListener(api_listener=b.pack(hcm))
    )
    with CoreClient(xds_server.bootstrap(), f"xds:///{TARGET}") as client:
        assert client.call(1) == {"A": 1}
        xds_server.update(listeners=[bad_listener])
        nack = xds_server.wait_for_nack(LISTENER, timeout=5)
        assert nack.version_info == "1"
        assert nack.rejected_version == "2"
        assert TARGET in nack.error_message
        assert "http_filters" in nack.error_message, nack.error_message
        assert client.call(5) == {"A": 5}  # the last good listener stays in use


def test_core_client_reconnects_after_the_server_restarts_on_the_same_port(xds_server, backends):
    a, b_ = backends
    clusters = {"cluster-a": [a.address], "cluster-b": [b_.address]}
    xds_server.set_snapshot(echo_snapshot(b.route(prefix="", cluster="cluster-a"), clusters))
    with CoreClient(xds_server.bootstrap(), f"xds:///{TARGET}") as client:
        assert client.call(5) == {"A": 5}
        xds_server.stop()
        assert client.call(5) == {"A": 5}  # cached config stays in use
        xds_server.set_snapshot(echo_snapshot(b.route(prefix="", cluster="cluster-b"), clusters))
        xds_server.start()
        assert client.call_until("B", timeout=15)["B"] == 1


def test_core_client_uses_an_aggregate_cluster_and_drops_per_eds(xds_server, backends):
    a, b_ = backends
    snapshot = Snapshot(
        listeners=[b.listener(TARGET, route_config_name="echo-route")],
        routes=[
            b.route_config(
                "echo-route", [b.virtual_host("echo", ["*"], [b.route(cluster="aggregate")])]
            )
        ],
        clusters=[
            b.cluster("aggregate", aggregate_children=["primary", "secondary"]),
            b.cluster("primary"),
            b.cluster("secondary"),
        ],
        endpoints=[
            b.endpoints("primary", [b.locality(endpoints=[])]),
            b.endpoints("secondary", [b.locality(endpoints=[b_.address])]),
        ],
    )
    xds_server.set_snapshot(snapshot)
    with CoreClient(xds_server.bootstrap(), f"xds:///{TARGET}", details=True) as client:
        assert client.call(5) == {"B": 5}
        xds_server.update(
            endpoints=[
                b.endpoints("primary", [b.locality(endpoints=[a.address])]),
                b.endpoints("secondary", [b.locality(endpoints=[b_.address])]),
            ]
        )
        assert client.call_until("A", timeout=10)["A"] == 1
        xds_server.update(
            endpoints=[
                b.endpoints(
                    "primary", [b.locality(endpoints=[a.address])], drop_overloads={"lb": 1_000_000}
                ),
                b.endpoints("secondary", [b.locality(endpoints=[b_.address])]),
            ]
        )
        # Drops fail RPCs even with wait_for_ready: first drop, then every RPC.
        drop = "error:UNAVAILABLE:EDS-configured drop: lb"
        assert client.call_until(drop, timeout=10)[drop] == 1
        dropped = client.call(20)
        assert backend_names(dropped) == set(), dropped
        assert dropped == {drop: 20}, dropped
