"""Differential: what an RPC fails with, and aggregate-cluster failover,
through pyxds and through grpcio's C-core ``xds:///`` channel (a subprocess,
CoreXdsClient) against the same pyxds.server.  C-core is the reference: the
same status code, and the same details where C-core's words are the
channel's own (C-core xds_routing_end2end_test NoMatchingRoute, xds_cluster_
end2end_test DropConfig / circuit breaking (xds_cluster_end2end_test
CircuitBreaking...), xds_end2end_test AllBackendsDown-style "connections to
all backends failing", xds_cluster_type_end2end_test AggregateClusterTest
FallBackToBackupCluster / FallBackWithConnectivityChurn)."""

from __future__ import annotations

import threading

import pytest
from channel_fixtures import (
    SERVICE,
    TARGET,
    Backend,
    CoreXdsClient,
    at_once,
    core_note,
    header,
    pyxds_calls,
    route,
    running_backends,
    snapshot,
    wait_until,
)

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

FAST_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 300)]
NODE = "differential-more"
WHO = f"/{SERVICE}/Who"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0")


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=NODE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server):
    ch = pyxds.insecure_channel(
        TARGET, bootstrap=server.bootstrap(node_id=NODE), options=FAST_BACKOFF
    )
    yield ch
    ch.close()


def both(core, channel, method=WHO, wait_for_ready=False, timeout=3.0, n=3):
    ours = pyxds_calls(
        channel, n, method=method, details=True, timeout=timeout, wait_for_ready=wait_for_ready
    )
    theirs = core.call(
        n, method=method, details=True, timeout=timeout, wait_for_ready=wait_for_ready
    )
    return ours, theirs


def settle(core, channel, method, want, timeout=10.0):
    """Both channels have the config: ``want`` is a predicate on the result key."""
    assert wait_until(
        lambda: all(
            want(k)
            for k in pyxds_calls(channel, 2, method=method, details=True, wait_for_ready=False)
        ),
        timeout,
    )
    assert wait_until(
        lambda: all(
            want(k) for k in core.call(2, method=method, details=True, wait_for_ready=False)
        ),
        timeout,
    )


def test_no_matching_route_fails_with_the_same_status_and_words(server, backends, core, channel):
    server.set_snapshot(
        snapshot(
            [route(path=f"/{SERVICE}/Sleep", cluster="ca")], {"ca": [[backends["a0"].address]]}
        )
    )
    settle(core, channel, WHO, lambda k: k.startswith("error:"))
    for wait_for_ready in (False, True):  # a missing route fails even wait_for_ready RPCs
        ours, theirs = both(core, channel, wait_for_ready=wait_for_ready)
        assert (
            ours == theirs == {"error:UNAVAILABLE: No matching route found in xDS route config": 3}
        )


def test_eds_drop_fails_with_the_same_words_even_wait_for_ready(server, backends, core, channel):
    server.set_snapshot(
        snapshot(
            [route(prefix="", cluster="cdrop")],
            {"cdrop": [[backends["a0"].address]]},
            drops={"cdrop": {"throttle": 1_000_000}},
        )
    )
    settle(core, channel, WHO, lambda k: "drop" in k)
    ours, theirs = both(core, channel, wait_for_ready=True)
    assert ours == theirs == {"error:UNAVAILABLE: EDS-configured drop: throttle": 3}


def test_circuit_breaker_drop_has_the_same_words(server, backends, core, channel):
    """max_requests=1 with one RPC in flight: the next RPC is dropped."""
    server.set_snapshot(
        snapshot(
            [route(prefix="", cluster="ccb")],
            {"ccb": [[backends["a0"].address]]},
            max_requests={"ccb": 1},
        )
    )
    sleep = f"/{SERVICE}/Sleep"
    assert wait_until(lambda: pyxds_calls(channel, 1) == {"a0": 1}, 10)
    assert wait_until(lambda: core.call(1) == {"a0": 1}, 10)
    # one long RPC in flight on pyxds, the next fails; C-core the same
    hold = threading.Thread(target=lambda: channel.unary_unary(sleep)(b"1.5", timeout=5))
    hold.start()
    try:
        assert wait_until(lambda: "error" in "".join(pyxds_calls(channel, 1, details=True)), 1.0)
        ours = pyxds_calls(channel, 1, details=True)
    finally:
        hold.join(5)
    theirs = core.call(1, details=True)  # C-core's own channel: nothing in flight
    assert theirs == {"a0": 1}
    assert ours == {"error:UNAVAILABLE: circuit breaker drop": 1}


def test_circuit_breaker_of_zero_drops_every_rpc_alike(server, backends, core, channel):
    server.set_snapshot(
        snapshot(
            [route(prefix="", cluster="ccb0")],
            {"ccb0": [[backends["a0"].address]]},
            max_requests={"ccb0": 0},
        )
    )
    settle(core, channel, WHO, lambda k: "circuit" in k)
    ours, theirs = both(core, channel, wait_for_ready=True)
    assert ours == theirs == {"error:UNAVAILABLE: circuit breaker drop": 3}


def test_all_backends_down_fails_fast_with_c_core_words(server, backends, core, channel, ports):
    down = [ports.dead_address(), ports.dead_address()]
    server.set_snapshot(snapshot([route(prefix="", cluster="cdown")], {"cdown": [down]}))
    prefix = "error:UNAVAILABLE: connections to all backends failing; last error: "
    settle(core, channel, WHO, lambda k: k.startswith(prefix), timeout=10)
    ours, theirs = both(core, channel)
    assert all(k.startswith(prefix) for k in list(ours) + list(theirs)), (ours, theirs)
    # wait_for_ready: both wait out the deadline
    ours, theirs = both(core, channel, wait_for_ready=True, timeout=0.3, n=1)
    assert ours == theirs == {"error:DEADLINE_EXCEEDED: Deadline Exceeded": 1}


def test_aggregate_cluster_falls_back_to_its_second_cluster_alike(server, backends, core, channel):
    primary = Backend("a-primary").hold()  # refuses connections until it starts
    down = primary.address
    base = snapshot(
        [route(prefix="", cluster="agg")],
        {"primary": [[down]], "backup": [[backends["b0"].address]]},
    )
    listener_t, route_t, cluster_t, eds_t = list(base._by_type)
    clusters = [
        *base.resources(cluster_t).values(),
        b.cluster("agg", aggregate_children=["primary", "backup"]),
    ]
    server.set_snapshot(
        Snapshot(
            listeners=list(base.resources(listener_t).values()),
            routes=list(base.resources(route_t).values()),
            clusters=clusters,
            endpoints=list(base.resources(eds_t).values()),
        )
    )
    assert wait_until(lambda: pyxds_calls(channel, 5) == {"b0": 5}, 10)
    assert wait_until(lambda: core.call(5) == {"b0": 5}, 10)
    # the primary comes up on that address: both switch back to it
    primary.start()
    try:
        assert wait_until(lambda: pyxds_calls(channel, 5) == {"a-primary": 5}, 10)
        assert wait_until(lambda: core.call(5) == {"a-primary": 5}, 10)
    finally:
        primary.release()


def test_nacked_listener_with_nothing_cached_fails_naming_the_nack_like_c_core(server, core):
    """C-core (1.85.1): 'empty address list (LDS resource NAME: invalid
    resource: ... (node ID:N))'; pyxds says the same resource and reason."""
    from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    bad = listener_pb2.Listener(
        name="nacked-lds",
        api_listener=api_listener_pb2.ApiListener(
            api_listener=b.pack(hcm_pb2.HttpConnectionManager())
        ),
    )
    server.set_snapshot(Snapshot(listeners=[bad]))
    target = "xds:///nacked-lds"
    ch = pyxds.insecure_channel(target, bootstrap=server.bootstrap(node_id=NODE))
    try:
        ours = pyxds_calls(ch, 1, details=True, wait_for_ready=False, timeout=3)
        theirs = core.call(1, details=True, target=target, wait_for_ready=False, timeout=3)
    finally:
        ch.close()
    (ours_text,), (theirs_text,) = list(ours), list(theirs)
    assert ours_text.startswith("error:UNAVAILABLE: ") and theirs_text.startswith(
        "error:UNAVAILABLE: "
    )
    for words in ("LDS resource nacked-lds: invalid resource", "neither route_config nor rds"):
        assert words in ours_text and words in theirs_text, (ours_text, theirs_text)


def test_listener_that_does_not_exist_waits_out_the_deadline_alike(server, core, channel):
    """The listener is absent from the server's LDS answer: neither client
    fails a (non wait_for_ready) RPC before its deadline."""
    server.set_snapshot(snapshot([route(prefix="", cluster="cx")], {"cx": [["127.0.0.1:1"]]}))
    target = "xds:///no-such-listener"
    ch = pyxds.insecure_channel(target, bootstrap=server.bootstrap(node_id=NODE))
    try:
        ours = pyxds_calls(ch, 1, details=True, wait_for_ready=False, timeout=0.5)
        theirs = core.call(1, details=True, target=target, wait_for_ready=False, timeout=0.5)
    finally:
        ch.close()
    assert ours == theirs == {"error:DEADLINE_EXCEEDED: Deadline Exceeded": 1}


def test_a31_max_stream_duration_and_grpc_timeout_header_max_agree_with_c_core(
    server, backends, core, channel
):
    """A31's effective-timeout table, end to end: an RPC taking 0.6 s with a
    5 s application deadline, on routes chosen by a header."""
    from pyxds.server import builders as b

    routes = [
        route(headers=[header("case", exact="msd")], cluster="ct", max_stream_duration=0.2),
        route(
            headers=[header("case", exact="hdrmax")],
            cluster="ct",
            max_stream_duration=0.2,
            grpc_timeout_header_max=3,
        ),
        route(
            headers=[header("case", exact="hdrmax0")],
            cluster="ct",
            max_stream_duration=0.2,
            grpc_timeout_header_max=0,
        ),
        route(headers=[header("case", exact="msd0")], cluster="ct", max_stream_duration=0),
        route(prefix="", cluster="ct"),  # listener default applies
    ]
    base = snapshot(routes, {"ct": [[backends["a0"].address]]})
    _listener_t, route_t, cluster_t, eds_t = list(base._by_type)
    server.set_snapshot(
        Snapshot(
            listeners=[b.listener("echo-service", max_stream_duration=0.2)],
            routes=list(base.resources(route_t).values()),
            clusters=list(base.resources(cluster_t).values()),
            endpoints=list(base.resources(eds_t).values()),
        )
    )
    sleep = f"/{SERVICE}/Sleep"
    expired = "error:DEADLINE_EXCEEDED"

    def outcome(calls, case):
        got = calls(1, method=sleep, metadata=[("case", case)], request="0.6")
        (key,) = got
        return "ok" if key == "a0" else key.split(":")[0] + ":" + key.split(":")[1]

    def ours(n, **kw):
        return pyxds_calls(channel, n, timeout=5, **kw)

    def theirs(n, **kw):
        return core.call(n, timeout=5, **kw)

    # each client's RPCs wait on real timers (0.6 s backend, 0.2 s caps): both at once
    ours_ready, theirs_ready = at_once(
        lambda: wait_until(lambda: outcome(ours, "default") == expired, 10),
        lambda: wait_until(lambda: outcome(theirs, "default") == expired, 10),
    )
    assert ours_ready
    assert theirs_ready
    expected = {"msd": expired, "hdrmax": "ok", "hdrmax0": "ok", "msd0": "ok", "default": expired}
    got_ours, got_theirs = at_once(
        lambda: {case: outcome(ours, case) for case in expected},
        lambda: {case: outcome(theirs, case) for case in expected},
    )
    assert got_ours == got_theirs == expected


def test_all_endpoints_unhealthy_fails_alike_and_pyxds_says_why(server, backends, core, channel):
    """TRAPS.md (C-core 1.85.1): valid-but-unusable EDS fails every RPC, as the
    spec says; C-core says "no children in weighted_target policy (EDS resource
    cu: contains empty localities: ...)", pyxds says C-core's note, then the
    cluster and exactly why (issue 22)."""
    base = snapshot([route(prefix="", cluster="cu")], {"cu": [[backends["a0"].address]]})
    listener_t, route_t, cluster_t, _eds_t = list(base._by_type)
    unhealthy = b.endpoint(backends["a0"].address, health_status="UNHEALTHY")
    server.set_snapshot(
        Snapshot(
            listeners=list(base.resources(listener_t).values()),
            routes=list(base.resources(route_t).values()),
            clusters=list(base.resources(cluster_t).values()),
            endpoints=[
                b.endpoints("cu", [b.locality(zone="z", priority=0, endpoints=[unhealthy])])
            ],
        )
    )
    settle(core, channel, WHO, lambda k: k.startswith("error:UNAVAILABLE"))
    ours, theirs = both(core, channel, n=1)
    ((theirs_text, _),) = theirs.items()
    note = core_note(theirs_text)
    assert note.startswith("EDS resource cu: contains empty localities: [")
    why = "(cluster cu: no endpoints: all endpoints unhealthy)"
    assert ours == {f"error:UNAVAILABLE: {note} {why}": 1}


def _with_clusters(base: Snapshot, clusters: list) -> Snapshot:
    listener_t, route_t, _cluster_t, eds_t = list(base._by_type)
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=clusters,
        endpoints=list(base.resources(eds_t).values()),
    )


def test_logical_dns_cluster_reaches_its_backend_by_hostname_alike(server, backends, core, channel):
    # A37: a LOGICAL_DNS cluster resolves "localhost:PORT" (loopback only) and
    # pick_first-s over the resolved addresses; both clients reach the backend.
    port = int(backends["a0"].address.rsplit(":", 1)[1])
    base = snapshot([route(prefix="", cluster="dns")], {})
    dns = b.cluster("dns", kind="LOGICAL_DNS", dns_host="localhost", dns_port=port)
    server.set_snapshot(_with_clusters(base, [dns]))
    assert wait_until(lambda: pyxds_calls(channel, 5) == {"a0": 5}, 10)
    assert wait_until(lambda: core.call(5) == {"a0": 5}, 10)


def test_aggregate_of_dead_eds_and_logical_dns_falls_back_to_dns_alike(
    server, backends, core, channel, ports
):
    # A37/A75: aggregate [EDS whose only backend is down, LOGICAL_DNS]: the
    # EDS priority fails, so traffic goes to the DNS cluster's backend.
    down = ports.dead_address()
    port = int(backends["b0"].address.rsplit(":", 1)[1])
    base = snapshot([route(prefix="", cluster="agg-dns")], {"eds-dead": [[down]]})
    _listener_t, _route_t, cluster_t, _eds_t = list(base._by_type)
    clusters = [
        *base.resources(cluster_t).values(),
        b.cluster("dns-backup", kind="LOGICAL_DNS", dns_host="localhost", dns_port=port),
        b.cluster("agg-dns", aggregate_children=["eds-dead", "dns-backup"]),
    ]
    server.set_snapshot(_with_clusters(base, clusters))
    assert wait_until(lambda: pyxds_calls(channel, 5) == {"b0": 5}, 10)
    assert wait_until(lambda: core.call(5) == {"b0": 5}, 10)


def test_logical_dns_name_that_does_not_resolve_fails_unavailable_alike(server, core, channel):
    # A hostname in the reserved .invalid TLD (RFC 2606) never resolves, so
    # no query leaves the machine: both fail the RPC UNAVAILABLE.
    base = snapshot([route(prefix="", cluster="dns-bad")], {})
    bad = b.cluster("dns-bad", kind="LOGICAL_DNS", dns_host="no-such-host.invalid", dns_port=443)
    server.set_snapshot(_with_clusters(base, [bad]))

    def unavailable(result: dict) -> bool:
        return all(key.startswith("error:UNAVAILABLE") for key in result)

    assert wait_until(
        lambda: unavailable(pyxds_calls(channel, 2, details=True, wait_for_ready=False)), 15
    )
    assert wait_until(lambda: unavailable(core.call(2, details=True, wait_for_ready=False)), 15)


def test_listener_deleted_after_a_good_config_fails_fast_but_wait_for_ready_waits_alike(
    server, backends, core, channel
):
    """A74: once a good listener is deleted, both clients fail plain RPCs at
    once naming the LDS resource, while wait_for_ready RPCs wait (C-core's
    channel is left with no addresses) and complete when it returns."""
    good = snapshot([route(prefix="", cluster="cgone")], {"cgone": [[backends["a0"].address]]})
    server.set_snapshot(good)
    assert wait_until(lambda: pyxds_calls(channel, 2) == {"a0": 2}, 10)
    assert wait_until(lambda: core.call(2) == {"a0": 2}, 10)
    server.set_snapshot(Snapshot(listeners=[], routes=[], clusters=[], endpoints=[]))

    def gone(result) -> bool:
        return all("does not exist" in key for key in result)

    assert wait_until(lambda: gone(pyxds_calls(channel, 1, details=True, wait_for_ready=False)), 10)
    assert wait_until(lambda: gone(core.call(1, details=True, wait_for_ready=False)), 10)
    ours, theirs = both(core, channel, n=1)
    for text in (*ours, *theirs):
        assert text.startswith("error:UNAVAILABLE: ") and "LDS resource" in text, text
    ours = pyxds_calls(channel, 1, details=True, wait_for_ready=True, timeout=0.5)
    theirs = core.call(1, details=True, wait_for_ready=True, timeout=0.5)
    assert ours == theirs == {"error:DEADLINE_EXCEEDED: Deadline Exceeded": 1}

    # A wait_for_ready RPC started during the outage completes once it ends.
    # (C-core 1.85.1's queued RPC here waits out its deadline although its
    # fresh RPCs succeed: TRAPS "every queued RPC re-picks on every new
    # config"; pyxds does better, so only C-core's fresh RPC is compared.)
    ours_future = channel.unary_unary(WHO).future(b"", timeout=10, wait_for_ready=True)
    assert not wait_until(ours_future.done, 0.3)  # still waiting
    server.set_snapshot(good)
    assert ours_future.result(timeout=10) == b"a0"
    assert wait_until(lambda: core.call(1, wait_for_ready=True, timeout=5) == {"a0": 1}, 10)
