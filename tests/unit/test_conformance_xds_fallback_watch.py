"""A71 fallback started by a new watch while the server is unreachable.

A71 "Change XdsClient to support fallback within each xDS authority":
fallback starts when there is a connectivity failure *and* a watcher of a
resource that is not cached, "mid-config update, such as when the control
plane sends an updated RDS resource that points to a new cluster, but then
the control plane becomes unavailable before the new CDS resources can be
obtained".  C-core test/core/xds/xds_client_test.cc FallbackAndRecover: with
the primary down and everything cached, a watch of a new name starts the
fallback server at once, subscribes both names there and on the primary,
and the new watcher hears no error; the primary's first response takes
over.  Over the XdsClient with a fake transport and a FakeClock.
"""

from __future__ import annotations

import grpc
from test_xds_client_ads_state import LDS, res, response
from test_xds_client_client import ThreadWatcher
from test_xds_fallback import DOWN, env  # noqa: F401  (a pytest fixture)


def _primary_down_with_a_cached(env):  # noqa: F811
    watcher = ThreadWatcher()
    env.client.watch(LDS, "foo1", watcher)
    primary = env.transports[0]
    primary.connected()
    primary.respond(response(LDS, "20", "O", ("foo1", "6")))
    watcher.wait()
    primary.close_stream(DOWN)  # after a response: routine, a new stream follows
    env.clock.advance(2)
    primary.close_stream(DOWN)  # that one fails before any response
    (_, (kind, status)) = watcher.wait(2)
    assert kind == "ambient" and status.code == grpc.StatusCode.UNAVAILABLE
    assert env.server(2) == []  # everything cached: no fallback yet
    return primary, watcher


def test_new_watch_of_uncached_name_while_primary_is_down_falls_back_at_once(env):  # noqa: F811
    primary, watcher = _primary_down_with_a_cached(env)
    watcher2 = ThreadWatcher()
    env.client.watch(LDS, "foo2", watcher2)
    env.client.dump()  # the watch has run on the serializer
    (secondary,) = env.server(2)
    (request,) = secondary.requests()
    assert list(request.resource_names) == ["foo1", "foo2"]
    assert watcher2.calls == []  # the primary's failure is not this watcher's news
    secondary.connected()
    secondary.respond(response(LDS, "5", "A", ("foo1", "20"), ("foo2", "30")))
    assert watcher.wait(3)[2] == ("changed", res(LDS, "foo1", "20"))
    assert watcher2.wait() == [("changed", res(LDS, "foo2", "30"))]
    # the primary comes back with both names subscribed and takes over
    env.clock.advance(10)
    primary.connected()
    (resubscribe,) = primary.requests(primary.current)
    assert list(resubscribe.resource_names) == ["foo1", "foo2"]
    primary.respond(response(LDS, "15", "B", ("foo1", "35"), ("foo2", "25")))
    assert watcher.wait(4)[3] == ("changed", res(LDS, "foo1", "35"))
    assert watcher2.wait(2)[1] == ("changed", res(LDS, "foo2", "25"))
    assert secondary.closed


def test_new_watch_of_cached_name_while_primary_is_down_does_not_fall_back(env):  # noqa: F811
    """FallbackAndRecover's watcher_cached: the cached resource, then the
    channel's error; no fallback server."""
    _primary_down_with_a_cached(env)
    cached = ThreadWatcher()
    env.client.watch(LDS, "foo1", cached)
    calls = cached.wait(2)
    assert calls[0] == ("changed", res(LDS, "foo1", "6"))
    assert calls[1][0] == "ambient" and calls[1][1].code == grpc.StatusCode.UNAVAILABLE
    assert env.server(2) == []
