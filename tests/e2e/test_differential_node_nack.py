"""Differential: after an invalid update of a resource the channel already
uses, RPCs keep going to the same backend, in pyxds and in grpcio's C-core
(``xds:///`` in a subprocess, CoreXdsClient), and both NACK the update.

Source: grpc-node ``packages/grpc-js-xds/test/test-nack.ts`` "Should continue
to use a valid resource after receiving an invalid EDS / CDS / RDS / LDS
update" (gRFC A40 / the xDS protocol: a NACKed resource leaves the previous
one in use).  The invalid resources are ones both clients refuse: an
endpoint without a socket address (EDS), a cluster of STATIC type (CDS), a
route with a regex that does not compile (RDS), a listener without
api_listener or address (LDS).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

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
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server.snapshot import Snapshot

CLUSTER = "node-nack"


@pytest.fixture(scope="module")
def server() -> Iterator[ManagementServer]:
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    started = Backend("kept").start()
    yield started
    started.stop()


def good(backend: Backend, version: str) -> Snapshot:
    return snapshot(
        [route(prefix="", cluster=CLUSTER)], {CLUSTER: [[backend.address]]}, version=version
    )


def with_bad(base: Snapshot, kind: str, spoil: Callable[[Any], Any]) -> Snapshot:
    """``base`` with its one resource of ``kind`` replaced by ``spoil(copy)``."""
    types = list(base._by_type)
    parts: dict[str, list[Any]] = {}
    for key, type_url in zip(("listeners", "routes", "clusters", "endpoints"), types, strict=True):
        resources = []
        for resource in base.resources(type_url).values():
            if key == kind:
                copy = type(resource)()
                copy.CopyFrom(resource)
                resource = spoil(copy) or copy
            resources.append(resource)
        parts[key] = resources
    return Snapshot(**parts, version="bad")


def _no_socket_address(cla: Any) -> None:
    cla.endpoints[0].lb_endpoints[0].endpoint.address.ClearField("socket_address")


def _static_type(cluster: Any) -> None:
    cluster.type = cluster_pb2.Cluster.STATIC


def _bad_regex(route_config: Any) -> None:
    match = route_config.virtual_hosts[0].routes[0].match
    match.safe_regex.regex = "[unclosed"


def _no_api_listener(listener: Any) -> Any:
    return listener_pb2.Listener(name=listener.name)


CASES = [
    ("EDS", "endpoints", _no_socket_address),
    ("CDS", "clusters", _static_type),
    ("RDS", "routes", _bad_regex),
    ("LDS", "listeners", _no_api_listener),
]


@pytest.mark.parametrize(("type_name", "kind", "spoil"), CASES, ids=[c[0] for c in CASES])
def test_invalid_update_is_nacked_and_the_valid_resource_stays_in_use_like_c_core(
    server, backend, type_name, kind, spoil
):
    node = f"node-nack-{type_name}"
    server.set_snapshot(good(backend, f"good-{type_name}"))
    core = CoreXdsClient(server.bootstrap(node_id=node + "-core"))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=node + "-pyxds"))
    want = {backend.name: 3}
    try:
        assert wait_until(lambda: pyxds_calls(channel, 3) == want, 10)
        assert wait_until(lambda: core.call(3) == want, 10)
        server.set_snapshot(with_bad(good(backend, "unused"), kind, spoil))
        for client in ("-core", "-pyxds"):
            assert wait_until(lambda c=client: server.nacks(type_name, node_id=node + c), 10), (
                f"no {type_name} NACK from {node + client}"
            )
        assert pyxds_calls(channel, 3, wait_for_ready=False) == want
        assert core.call(3, wait_for_ready=False) == want
    finally:
        channel.close()
        core.close()
