"""Differential: a route flipping cluster A -> B -> A within seconds reuses
A's connection (gRFC A28 "When a child policy is removed, it will be cached
for 15 minutes"; C-core src/core/load_balancing/xds/xds_cluster_manager.cc
ClusterChild::DeactivateLocked / UpdateLocked, kChildRetentionInterval).

The xds_cluster_manager child of A is retained while the route points at B,
and re-adding A updates that same child, so its subchannel (and its TCP
connection) serve A's calls again: A's backend accepts no new connection.
Checked for pyxds and grpcio's C-core (``xds:///`` channel in a
subprocess), each on its own backends, by the client ports A's backend sees.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from channel_fixtures import (
    SERVICE,
    TARGET,
    CoreXdsClient,
    pyxds_calls,
    route,
    snapshot,
    wait_until,
)
from ports import EXCLUSIVE

import pyxds._api as pyxds
from pyxds.server import ManagementServer


class PeerBackend:
    """Answers ``/SERVICE/Who`` with its name and records each caller's
    ``context.peer()`` (one client port per TCP connection)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.peers: set[str] = set()
        self._lock = threading.Lock()
        self._executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="peer-")
        self._server = grpc.server(self._executor, options=[EXCLUSIVE])
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Who": grpc.unary_unary_rpc_method_handler(self._who)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def _who(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.peers.add(context.peer())
        return self.name.encode()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def connections(self) -> set[str]:
        with self._lock:
            return set(self.peers)

    def stop(self) -> None:
        self._server.stop(None).wait(5)
        self._executor.shutdown(wait=False)


@pytest.fixture(scope="module")
def server() -> Iterator[ManagementServer]:
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def backends() -> Iterator[dict[str, PeerBackend]]:
    started = {name: PeerBackend(name) for name in ("ra", "rb")}
    yield started
    for backend in started.values():
        backend.stop()


def routed_to(cluster: str, backends: dict[str, PeerBackend]) -> Any:
    return snapshot(
        [route(prefix="", cluster=cluster)],
        {"ret-a": [[backends["ra"].address]], "ret-b": [[backends["rb"].address]]},
    )


def flip_a_b_a(
    server: ManagementServer, backends: dict[str, PeerBackend], call: Callable[[int], Any]
) -> set[str]:
    """Serve A, then B, then A again; the connections A's backend accepted
    after the first phase."""
    server.set_snapshot(routed_to("ret-a", backends))
    assert wait_until(lambda: call(1) == {"ra": 1}, 15)
    assert call(5) == {"ra": 5}
    before = backends["ra"].connections()
    assert before
    server.set_snapshot(routed_to("ret-b", backends))
    assert wait_until(lambda: call(1) == {"rb": 1}, 15)
    server.set_snapshot(routed_to("ret-a", backends))
    assert wait_until(lambda: call(1) == {"ra": 1}, 15)
    assert call(5) == {"ra": 5}
    return backends["ra"].connections() - before


def test_cluster_flipped_away_and_back_reuses_its_connection_in_pyxds(server, backends):
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id="ret-pyxds"))
    try:
        new = flip_a_b_a(server, backends, lambda n: pyxds_calls(channel, n))
    finally:
        channel.close()
    assert new == set()


def test_cluster_flipped_away_and_back_reuses_its_connection_in_c_core(server, backends):
    core = CoreXdsClient(server.bootstrap(node_id="ret-core"))
    try:
        new = flip_a_b_a(server, backends, core.call)
    finally:
        core.close()
    assert new == set()
