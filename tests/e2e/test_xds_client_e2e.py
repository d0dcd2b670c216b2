"""The XdsClient against pyxds.server over real sockets on 127.0.0.1 (A27, A57,
A88).  Every wait is bounded."""

from __future__ import annotations

import queue
import time
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from tcp_proxy import FreezingProxy

from pyxds.lb.api import Status
from pyxds.server import ManagementServer, Snapshot
from pyxds.server import builders as b
from pyxds.xds.bootstrap import load_bootstrap
from pyxds.xds.client import XdsClient
from pyxds.xds.resources import (
    CLUSTER_TYPE_URL,
    ENDPOINTS_TYPE_URL,
    LISTENER_TYPE_URL,
    ROUTE_CONFIG_TYPE_URL,
)

WAIT = 10.0
# Fast reconnects of the ADS channel itself, so a restarted server is found
# within the client's own stream backoff.
FAST_RECONNECT = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)


def load(bootstrap: dict) -> Any:
    return load_bootstrap(bootstrap)


class QueueWatcher:
    def __init__(self) -> None:
        self.events: queue.Queue = queue.Queue()

    def on_resource_changed(self, value: Any) -> None:
        self.events.put(("changed", value))

    def on_ambient_error(self, status: Status) -> None:
        self.events.put(("ambient", status))

    def next(self, timeout: float = WAIT) -> tuple[str, Any]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no watcher event within {timeout}s") from None

    def next_resource(self, timeout: float = WAIT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            kind, value = self.next(max(0.01, deadline - time.monotonic()))
            if kind == "changed" and not isinstance(value, Status):
                return value

    def quiet(self, seconds: float) -> list[tuple[str, Any]]:
        time.sleep(seconds)
        out = []
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out


def wait_until(predicate, timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def snapshot(endpoint: str = "127.0.0.1:50051", bad_cluster: bool = False) -> Snapshot:
    cluster = b.cluster("backend")
    if bad_cluster:
        cluster.type = cluster_pb2.Cluster.STATIC
    return Snapshot(
        listeners=[b.listener("greeter", route_config_name="greeter-route")],
        routes=[
            b.route_config(
                "greeter-route",
                [b.virtual_host("all", ["*"], [b.route(prefix="", cluster="backend")])],
            )
        ],
        clusters=[cluster],
        endpoints=[b.endpoints("backend", [b.locality(endpoints=[endpoint])])],
    )


@pytest.fixture
def server():
    srv = ManagementServer().start()
    try:
        yield srv
    finally:
        srv.stop()


def make_client(server: ManagementServer, **kwargs: Any) -> XdsClient:
    bootstrap = load(server.bootstrap(node_id="client-e2e"))
    return XdsClient(bootstrap, channel_options=FAST_RECONNECT, **kwargs)


def endpoint_addresses(cla: Any) -> list[str]:
    return [a for p in cla.priorities for loc in p for ep in loc.endpoints for a in ep.addresses]


def test_initial_fetch_of_all_four_types(server):
    server.set_snapshot(snapshot())
    with make_client(server) as client:
        watchers = {t: QueueWatcher() for t in ("lds", "rds", "cds", "eds")}
        client.watch(LISTENER_TYPE_URL, "greeter", watchers["lds"])
        client.watch(ROUTE_CONFIG_TYPE_URL, "greeter-route", watchers["rds"])
        client.watch(CLUSTER_TYPE_URL, "backend", watchers["cds"])
        client.watch(ENDPOINTS_TYPE_URL, "backend", watchers["eds"])
        assert watchers["lds"].next_resource().route_config_name == "greeter-route"
        assert watchers["rds"].next_resource().name == "greeter-route"
        assert watchers["cds"].next_resource().name == "backend"
        assert endpoint_addresses(watchers["eds"].next_resource()) == ["127.0.0.1:50051"]
        wait_until(lambda: len(server.acks()) >= 4, what="four ACKs")
        first = server.requests()[0]
        assert first.has_node and first.node_id == "client-e2e"
        dump = client.dump()
        assert {c["client_status"] for c in dump["generic_xds_configs"]} == {"ACKED"}


def test_update_push_reaches_watcher(server):
    server.set_snapshot(snapshot("127.0.0.1:1001"))
    with make_client(server) as client:
        watcher = QueueWatcher()
        client.watch(ENDPOINTS_TYPE_URL, "backend", watcher)
        assert endpoint_addresses(watcher.next_resource()) == ["127.0.0.1:1001"]
        server.set_snapshot(snapshot("127.0.0.1:1002"))
        assert endpoint_addresses(watcher.next_resource()) == ["127.0.0.1:1002"]


def test_nack_keeps_last_good_resource_and_server_sees_reason(server):
    server.set_snapshot(snapshot())
    with make_client(server) as client:
        watcher = QueueWatcher()
        client.watch(CLUSTER_TYPE_URL, "backend", watcher)
        good = watcher.next_resource()
        server.set_snapshot(snapshot(bad_cluster=True))
        kind, status = watcher.next()
        assert kind == "ambient" and "unknown discovery type" in status.details
        wait_until(lambda: server.nacks("CDS"), what="a NACK")
        nack = server.nacks("CDS")[0]
        assert "backend" in nack.error_message and "unknown discovery type" in nack.error_message
        (entry,) = client.dump()["generic_xds_configs"]
        assert entry["client_status"] == "NACKED"
        assert entry["xds_config"]["name"] == good.name
        assert "unknown discovery type" in entry["error_state"]["details"]


def test_server_restart_on_same_port_client_reconnects_and_keeps_cache(server):
    server.set_snapshot(snapshot("127.0.0.1:2001"))
    with make_client(server) as client:
        watcher = QueueWatcher()
        client.watch(ENDPOINTS_TYPE_URL, "backend", watcher)
        client.watch(CLUSTER_TYPE_URL, "backend", QueueWatcher())
        assert endpoint_addresses(watcher.next_resource()) == ["127.0.0.1:2001"]
        wait_until(lambda: len(server.acks()) >= 2, what="ACKs")
        streams_before = server.total_streams
        last_stream = max(r.stream_id for r in server.requests())
        server.stop()
        # cached resources stay in use while the server is away (A57)
        events = watcher.quiet(1.0)
        assert all(kind == "ambient" for kind, _ in events), events
        statuses = {c["client_status"] for c in client.dump()["generic_xds_configs"]}
        assert statuses == {"ACKED"}
        server.start()
        wait_until(
            lambda: server.total_streams > streams_before, timeout=15, what="a new ADS stream"
        )
        acked = {a.type_url: a.version_info for a in server.acks()}

        def resubscribed() -> bool:
            return all(
                any(
                    r.stream_id > last_stream
                    and r.type_url == type_url
                    and r.resource_names == ("backend",)
                    and r.version_info == version
                    and r.nonce == ""
                    for r in server.requests()
                )
                for type_url, version in acked.items()
            )

        wait_until(resubscribed, what="re-subscription with the last ACKed versions")
        server.set_snapshot(snapshot("127.0.0.1:2002"))
        assert endpoint_addresses(watcher.next_resource()) == ["127.0.0.1:2002"]


def test_watch_before_server_is_up_reports_unavailable_then_delivers():
    srv = ManagementServer()
    srv.start()
    bootstrap = srv.bootstrap(node_id="late")
    srv.stop()
    client = XdsClient(load(bootstrap), channel_options=FAST_RECONNECT)
    try:
        watcher = QueueWatcher()
        client.watch(CLUSTER_TYPE_URL, "backend", watcher)
        kind, status = watcher.next()
        assert kind == "changed" and status.code == grpc.StatusCode.UNAVAILABLE
        srv.set_snapshot(snapshot())
        srv.start()
        assert watcher.next_resource(timeout=15).name == "backend"
    finally:
        client.close()
        srv.stop()


def test_resource_that_does_not_exist_is_reported(server):
    server.set_snapshot(snapshot())
    with make_client(server, resource_timeout=0.5) as client:
        watcher = QueueWatcher()
        client.watch(CLUSTER_TYPE_URL, "missing", watcher)
        kind, status = watcher.next()
        assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
        assert "missing" in status.details
        (entry,) = client.dump()["generic_xds_configs"]
        assert entry["client_status"] == "DOES_NOT_EXIST"


def test_cancel_unsubscribes_on_the_wire(server):
    server.set_snapshot(snapshot())
    with make_client(server) as client:
        watcher = QueueWatcher()
        client.watch(CLUSTER_TYPE_URL, "other", QueueWatcher())
        cancel = client.watch(CLUSTER_TYPE_URL, "backend", watcher)
        watcher.next_resource()
        cancel()
        wait_until(
            lambda: any(
                r.type_url == CLUSTER_TYPE_URL and r.resource_names == ("other",)
                for r in server.requests()[1:]
            ),
            what="unsubscribe request",
        )
        assert client.dump()["generic_xds_configs"][0]["name"] == "other"


def test_stream_closed_by_server_after_response_is_routine(server):
    server.set_snapshot(snapshot())
    with make_client(server) as client:
        watcher = QueueWatcher()
        client.watch(LISTENER_TYPE_URL, "greeter", watcher)
        watcher.next_resource()
        wait_until(lambda: server.acks(), what="ACK")
        before = server.total_streams
        assert server.close_streams() == 1
        wait_until(lambda: server.total_streams > before, what="a new stream")
        wait_until(lambda: len(server.acks()) >= 2, what="ACK on the new stream")
        # same resource again on the new stream: nobody is told anything
        assert watcher.quiet(0.3) == []


def test_keepalive_notices_silently_dead_control_plane(server):
    """TRAPS (grpc-rust#2744): without keepalive the client would sit on a
    dead connection forever and never see the update below."""
    server.set_snapshot(snapshot("127.0.0.1:3001"))
    proxy = FreezingProxy(server.port)
    bootstrap = server.bootstrap(node_id="keepalive")
    bootstrap["xds_servers"][0]["server_uri"] = f"127.0.0.1:{proxy.port}"
    options = (
        *FAST_RECONNECT,
        ("grpc.keepalive_time_ms", 250),
        ("grpc.keepalive_timeout_ms", 500),
    )
    client = XdsClient(load(bootstrap), channel_options=options)
    try:
        watcher = QueueWatcher()
        client.watch(ENDPOINTS_TYPE_URL, "backend", watcher)
        assert endpoint_addresses(watcher.next_resource()) == ["127.0.0.1:3001"]
        proxy.freeze_all()
        time.sleep(0.3)  # let in-flight recv() calls of the pumps time out
        server.set_snapshot(snapshot("127.0.0.1:3002"))
        assert endpoint_addresses(watcher.next_resource(timeout=15)) == ["127.0.0.1:3002"]
    finally:
        client.close()
        proxy.close()


def test_ads_channel_has_keepalive_by_default():
    from pyxds.xds.transport import KEEPALIVE_TIME, KEEPALIVE_TIMEOUT, channel_options

    options = dict(channel_options())
    assert options["grpc.keepalive_time_ms"] == int(KEEPALIVE_TIME * 1000)
    assert options["grpc.keepalive_timeout_ms"] == int(KEEPALIVE_TIMEOUT * 1000)
    assert options["grpc.http2.ping_timeout_ms"] == int(KEEPALIVE_TIMEOUT * 1000)
    assert KEEPALIVE_TIME <= 300 and KEEPALIVE_TIMEOUT <= 30


def test_resource_timer_does_not_run_while_connection_hangs():
    """A57: a server that accepts TCP but never completes the HTTP/2 handshake
    leaves the stream unconnected; no does-not-exist may be reported."""
    from backends import Blackhole

    hole = Blackhole()
    config = {
        "xds_servers": [{"server_uri": hole.address, "channel_creds": [{"type": "insecure"}]}],
        "node": {"id": "blackhole"},
    }
    client = XdsClient(load(config), resource_timeout=0.2)
    try:
        watcher = QueueWatcher()
        client.watch(CLUSTER_TYPE_URL, "backend", watcher)
        events = watcher.quiet(1.5)
        assert not any(
            isinstance(v, Status) and v.code == grpc.StatusCode.NOT_FOUND for _, v in events
        ), events
        wait_until(lambda: hole.accepted >= 1, what="a connection attempt")
        (entry,) = client.dump()["generic_xds_configs"]
        assert entry["client_status"] == "REQUESTED"
    finally:
        client.close()
        hole.close()
