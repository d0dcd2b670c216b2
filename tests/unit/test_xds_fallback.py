"""xDS server fallback within an authority (gRFC A71) over a fake transport."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest
from test_xds_client_ads_state import CDS, LDS, TYPES, res, response
from test_xds_client_client import FakeTransport, ThreadWatcher

from pyxds.lb.api import Status
from pyxds.testing.fake_clock import FakeClock
from pyxds.xds.client import XdsClient

DOWN = Status(grpc.StatusCode.UNAVAILABLE, "connection refused")


def two_servers() -> dict:
    return {
        "xds_servers": [
            {"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]},
            {"server_uri": "127.0.0.1:2", "channel_creds": [{"type": "insecure"}]},
        ],
        "node": {"id": "n"},
    }


@pytest.fixture
def env():
    transports: list[FakeTransport] = []
    clock = FakeClock()
    client = XdsClient(
        two_servers(),
        clock=clock,
        resource_types=TYPES,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
    )

    def server(uri_port: int) -> list[FakeTransport]:
        return [t for t in transports if t.channel.server.server_uri.endswith(f":{uri_port}")]

    yield SimpleNamespace(client=client, clock=clock, transports=transports, server=server)
    client.close()


def test_only_the_first_server_is_used_while_it_serves(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    (primary,) = env.transports
    primary.connected()
    primary.respond(response(LDS, "1", "n1", ("a", "v")))
    assert watcher.wait() == [("changed", res(LDS, "a", "v"))]
    assert env.server(2) == []


def test_primary_down_before_any_response_falls_back_without_telling_watchers(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    (primary,) = env.transports
    primary.close_stream(DOWN)
    (secondary,) = env.server(2)
    (request,) = secondary.requests()
    assert list(request.resource_names) == ["a"]
    secondary.connected()
    secondary.respond(response(LDS, "1", "n1", ("a", "from-2")))
    assert watcher.wait() == [("changed", res(LDS, "a", "from-2"))]


def test_errors_reach_watchers_only_when_every_server_failed(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    env.transports[0].close_stream(DOWN)
    env.server(2)[0].close_stream(DOWN)
    (call,) = watcher.wait()
    assert call[0] == "changed" and call[1].code == grpc.StatusCode.UNAVAILABLE
    assert "127.0.0.1:2" in call[1].details


def test_primary_dying_with_everything_cached_does_not_fall_back(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    primary = env.transports[0]
    primary.connected()
    primary.respond(response(LDS, "1", "n1", ("a", "v")))
    watcher.wait()
    primary.close_stream(DOWN)  # after a response: routine
    env.clock.advance(2)
    primary.close_stream(DOWN)  # the retry fails before any response
    assert env.server(2) == []
    calls = watcher.wait(2)
    assert calls[0] == ("changed", res(LDS, "a", "v"))
    assert calls[1][0] == "ambient"


def test_primary_down_with_an_uncached_resource_falls_back_and_keeps_cached_ones(env):
    lds, cds = ThreadWatcher(), ThreadWatcher()
    env.client.watch(LDS, "a", lds)
    primary = env.transports[0]
    primary.connected()
    primary.respond(response(LDS, "1", "n1", ("a", "v1")))
    lds.wait()
    env.client.watch(CDS, "c", cds)
    primary.close_stream(DOWN)
    env.clock.advance(2)
    primary.close_stream(DOWN)
    (secondary,) = env.server(2)
    assert {tuple(r.resource_names) for r in secondary.requests()} == {("a",), ("c",)}
    secondary.connected()
    secondary.respond(response(CDS, "1", "n1", ("c", "from-2")))
    assert cds.wait() == [("changed", res(CDS, "c", "from-2"))]
    assert lds.calls == [("changed", res(LDS, "a", "v1"))]


def test_primary_back_takes_over_and_the_fallback_server_is_closed(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    primary = env.transports[0]
    primary.close_stream(DOWN)
    (secondary,) = env.server(2)
    secondary.connected()
    secondary.respond(response(LDS, "1", "n1", ("a", "from-2")))
    watcher.wait()
    env.clock.advance(5)  # primary's backoff: a new stream
    assert len(primary.streams) == 2
    primary.connected()
    assert not secondary.closed
    primary.respond(response(LDS, "7", "n7", ("a", "from-1")))
    assert watcher.wait(2)[1] == ("changed", res(LDS, "a", "from-1"))
    assert secondary.closed
    dump = env.client.dump()["generic_xds_configs"]
    assert [(c["name"], c["xds_server"]) for c in dump] == [("a", "127.0.0.1:1")]


def test_dump_names_the_server_each_resource_came_from(env):
    lds, cds = ThreadWatcher(), ThreadWatcher()
    env.client.watch(LDS, "a", lds)
    primary = env.transports[0]
    primary.connected()
    primary.respond(response(LDS, "1", "n1", ("a", "v1")))
    lds.wait()
    env.client.watch(CDS, "c", cds)
    primary.close_stream(DOWN)
    env.clock.advance(2)
    primary.close_stream(DOWN)
    secondary = env.server(2)[0]
    secondary.connected()
    secondary.respond(response(CDS, "1", "n1", ("c", "from-2")))
    cds.wait()
    rows = {
        (c["name"], c["xds_server"], c["client_status"])
        for c in env.client.dump()["generic_xds_configs"]
    }
    assert ("a", "127.0.0.1:1", "ACKED") in rows
    assert ("c", "127.0.0.1:2", "ACKED") in rows


def test_cancelled_watch_unsubscribes_on_every_server_of_the_chain(env):
    watcher = ThreadWatcher()
    cancel = env.client.watch(LDS, "a", watcher)
    env.transports[0].close_stream(DOWN)
    secondary = env.server(2)[0]
    cancel()
    assert list(secondary.requests()[-1].resource_names) == []


def test_fallback_is_per_authority():
    """A47 + A71: an authority's failure moves only that authority's watches."""
    config = two_servers()
    config["authorities"] = {
        "other.example": {
            "xds_servers": [
                {"server_uri": "127.0.0.1:7", "channel_creds": [{"type": "insecure"}]},
                {"server_uri": "127.0.0.1:8", "channel_creds": [{"type": "insecure"}]},
            ]
        }
    }
    transports: list[FakeTransport] = []
    client = XdsClient(
        config,
        clock=FakeClock(),
        resource_types=TYPES,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
    )
    try:
        plain, other = ThreadWatcher(), ThreadWatcher()
        client.watch(LDS, "plain", plain)
        name = "xdstp://other.example/envoy.config.listener.v3.Listener/x"
        client.watch(LDS, name, other)
        by_uri = {t.channel.server.server_uri: t for t in transports}
        assert set(by_uri) == {"127.0.0.1:1", "127.0.0.1:7"}
        by_uri["127.0.0.1:7"].close_stream(DOWN)
        uris = [t.channel.server.server_uri for t in transports]
        assert uris == ["127.0.0.1:1", "127.0.0.1:7", "127.0.0.1:8"]
        (request,) = transports[-1].requests()
        assert list(request.resource_names) == [name]
    finally:
        client.close()


def test_load_reports_go_to_the_server_the_cluster_came_from(env):
    # A27 + A71: a cluster with lrs_server: self reports to the server that
    # delivered its CDS resource - the fallback while it serves, the primary
    # again once the primary is back.
    watcher = ThreadWatcher()
    env.client.watch(CDS, "c", watcher)
    assert env.client.lrs_server_for("c").server_uri == "127.0.0.1:1"  # nothing cached yet
    primary = env.transports[0]
    primary.close_stream(DOWN)
    (secondary,) = env.server(2)
    secondary.connected()
    secondary.respond(response(CDS, "1", "n1", ("c", "from-2")))
    watcher.wait()
    assert env.client.lrs_server_for("c").server_uri == "127.0.0.1:2"
    env.clock.advance(5)
    primary.connected()
    primary.respond(response(CDS, "7", "n7", ("c", "from-1")))
    watcher.wait(2)
    assert env.client.lrs_server_for("c").server_uri == "127.0.0.1:1"
