"""Differential: stateful session affinity (gRFC A55, A60) scenarios of
C-core's ``test/cpp/end2end/xds/xds_override_host_end2end_test.cc``
(``OverrideHostTest.*``) and ``xds_cluster_override_host_end2end_test.cc``
that tests/e2e/test_stateful_session.py does not already replay, and the
stateful session filter's NACKs of C-core's
``test/core/xds/xds_http_stateful_session_filter_test.cc`` that
tests/unit/test_stateful_session_config.py had checked against pyxds only;
then what the gRFCs leave to C-core when sessions meet other features
(A39 per-cluster overrides, A42, A44 retries, A33 faults, A50 ejection,
A37 aggregate and LOGICAL_DNS clusters, two session filters, IPv6
addresses, responses the client ended itself).
Each case runs through pyxds and grpcio's C-core ``xds:///`` channel (a
subprocess) on the same pyxds.server config and the same backends, and
asserts the same observable outcome in both: which backend served, which
``set-cookie`` came back, which NACK text.
"""

from __future__ import annotations

import base64
import itertools

import pytest
import test_stateful_session as ssa
from channel_fixtures import SERVICE, Backend, CoreXdsClient, header, pyxds_calls, wait_until
from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2 as ss_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.stateful_session.cookie.v3 import cookie_pb2
from google.protobuf import any_pb2
from test_stateful_session import FAIL, WHO, cookie_for, decoded, pyxds_call, set_cookie, snapshot
from xds.type.v3 import typed_struct_pb2

import pyxds._api as pyxds
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

SLEEP = f"/{SERVICE}/Sleep"
FILTER = "envoy.filters.http.stateful_session"
SS = "envoy.extensions.filters.http.stateful_session.v3.StatefulSession"
SS_PER_ROUTE = "envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute"
COOKIE_STATE = "envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState"
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_NAMES = itertools.count()

# test_stateful_session's fixtures: its backends (their own set for this
# module), a management server and the (pyxds, C-core) client pairs
backends, server, clients = ssa.backends, ssa.server, ssa.clients


def calls(client: str, channel, core, n: int, metadata=None, method: str = WHO) -> list[tuple]:
    """``n`` calls through one client: (reply, initial, trailing) each."""
    if client == "pyxds":
        return [pyxds_call(channel, metadata, method) for _ in range(n)]
    return [core.call_md(method, metadata) for _ in range(n)]


def one_header(*cookies: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Several cookies in one ``cookie`` header, as a browser sends them
    (two ``cookie`` entries would be joined with "," by C-core and spoil
    the first value's base64)."""
    return [("cookie", "; ".join(md[0][1] for md in cookies))]


def cookie_named(name: str, address: str, cluster: str = "c1") -> list[tuple[str, str]]:
    value = base64.b64encode(f"{address};{cluster}".encode()).decode()
    return [("cookie", f"{name}={value}")]


def fields(set_cookie_value: str) -> tuple[str, str, list[str]]:
    """(cookie name, decoded value, attributes) of a ``set-cookie``."""
    head, *attributes = set_cookie_value.split("; ")
    name, _, value = head.partition("=")
    return name, base64.b64decode(value).decode(), attributes


def unpinned(replies: list[str], everyone: set[str]) -> bool:
    """The replies of an RPC series that no cookie pinned: round robin
    reached every endpoint."""
    return set(replies) == everyone


# -- A39 overrides: where each cookie applies (C-core EnabledInRouteConfig, TTLSetsMaxAge,
# DifferentPerRoute, HappyPath's "another method, same cookie") --------------------------


def test_a_route_override_turns_on_the_cookie_a_listener_leaves_off_in_both(
    server, backends, clients
):
    """C-core OverrideHostTest.EnabledInRouteConfig and TTLSetsMaxAge: the
    listener's StatefulSession has no ``session_state`` (a filter that does
    nothing, accepted); a route's StatefulSessionPerRoute names a cookie
    with a 42 s TTL and no path.  The response sets ``<name>=...;
    HttpOnly; Max-Age=42`` (no Path), and the cookie pins RPCs of every
    method (HappyPath: an unset path matches every path)."""
    per_route = b.stateful_session_per_route(cookie_name="route-cookie", ttl=42)
    routes = [b.route(prefix="", cluster="c1", typed_per_filter_config={FILTER: per_route})]
    base = snapshot(backends, "v-route-on", routes=routes)
    off = b.stateful_session_filter(config=ss_pb2.StatefulSession())
    server.set_snapshot(base.replace(listeners=[b.listener("echo-service", http_filters=[off])]))
    channel, core = clients("ssa-route-on")
    for client in ("pyxds", "core"):
        ((reply, initial, _),) = calls(client, channel, core, 1)
        name, value, attributes = fields(set_cookie(initial))
        assert (name, attributes) == ("route-cookie", ["HttpOnly", "Max-Age=42"]), client
        assert value == f"{backends[reply].address};c1", client
        pinned = [("cookie", set_cookie(initial).split(";", 1)[0])]
        for method in (WHO, SLEEP):
            got = calls(client, channel, core, 4, pinned, method)
            assert [r for r, _, _ in got] == [reply] * 4, (client, method, got)
            assert [set_cookie(i) for _, i, _ in got] == [None] * 4, (client, method)


def test_each_route_honours_only_its_own_cookie_in_both(server, backends, clients):
    """C-core OverrideHostTest.DifferentPerRoute: one route disables the
    filter (no cookie honoured, none set), one renames the cookie (honours
    the renamed cookie only), the rest keep the listener's cookie (and
    ignore the renamed one).  Cookies naming b1, sent together in one
    header."""
    renamed = "overridden-cookie-name"
    routes = [
        b.route(
            path=SLEEP,
            cluster="c1",
            typed_per_filter_config={FILTER: b.stateful_session_per_route(disabled=True)},
        ),
        b.route(
            prefix="",
            headers=[header("x-route", exact="renamed")],
            cluster="c1",
            typed_per_filter_config={FILTER: b.stateful_session_per_route(cookie_name=renamed)},
        ),
        b.route(prefix="", cluster="c1"),
    ]
    server.set_snapshot(snapshot(backends, "v-per-route", routes=routes))
    everyone = {"b0", "b1", "b2"}
    channel, core = clients("ssa-per-route", ready=everyone)
    b1 = backends["b1"].address
    top, other = cookie_for(b1), cookie_named(renamed, b1)
    to_renamed = [("x-route", "renamed")]
    for client in ("pyxds", "core"):
        # disabled: both cookies ignored, nothing set
        got = calls(client, channel, core, 6, one_header(top, other), SLEEP)
        assert unpinned([r for r, _, _ in got], everyone), (client, got)
        assert {set_cookie(i) for _, i, _ in got} == {None}, client
        # renamed: its cookie pins, the listener's is not read (a new renamed cookie)
        got = calls(client, channel, core, 6, other + to_renamed)
        assert [r for r, _, _ in got] == ["b1"] * 6, (client, got)
        got = calls(client, channel, core, 6, top + to_renamed)
        assert unpinned([r for r, _, _ in got], everyone), (client, got)
        for reply, initial, _ in got:
            name, value, attributes = fields(set_cookie(initial))
            assert (name, attributes) == (renamed, ["HttpOnly"]), client
            assert value == f"{backends[reply].address};c1", client
        # the listener's cookie: pins on the default route, the renamed one does not
        got = calls(client, channel, core, 6, top)
        assert [r for r, _, _ in got] == ["b1"] * 6, (client, got)
        got = calls(client, channel, core, 6, other)
        assert unpinned([r for r, _, _ in got], everyone), (client, got)
        assert all(decoded(set_cookie(i)).endswith(";c1") for _, i, _ in got), client


# -- A60: the cookie's cluster (C-core ClusterOverrideHonoredButHostGone,
# XdsRoutingWeightedClusterNoIntegerOverflow) ----------------------------------------------


def test_the_cookie_s_cluster_is_kept_when_its_host_is_not_in_it_in_both(server, backends, clients):
    """C-core OverrideHostTest.ClusterOverrideHonoredButHostGone (A60): the
    cookie names a cluster of the route (here the one the weights almost
    never draw, 1 in 100) and a host that cluster does not have (an
    endpoint of the other cluster): every RPC goes to the cookie's
    cluster, round robin there, and the response re-sets the cookie with
    the endpoint picked in it."""
    routes = [b.route(prefix="", weighted_clusters={"c1": 1, "c2": 99})]
    server.set_snapshot(snapshot(backends, "v-host-gone", routes=routes))
    channel, core = clients("ssa-host-gone", ready={"b0", "b1", "b2"})
    md = cookie_for(backends["d0"].address, cluster="c1")
    for client in ("pyxds", "core"):
        got = calls(client, channel, core, 9, md)
        assert unpinned([r for r, _, _ in got], {"b0", "b1", "b2"}), (client, got)
        for reply, initial, _ in got:
            assert decoded(set_cookie(initial)) == f"{backends[reply].address};c1", client


def test_weights_summing_to_uint32_max_keep_sessions_in_both(server, backends, clients):
    """C-core ClusterOverrideHostTest.XdsRoutingWeightedClusterNoIntegerOverflow:
    weights of 2**32 - 1 in all (A28's upper bound) are accepted; a first
    RPC's cookie names the cluster it was drawn to; a cookie pins its
    endpoint in its cluster."""
    top = 2**32 - 1
    routes = [b.route(prefix="", weighted_clusters={"c1": top // 4, "c2": top - top // 4})]
    server.set_snapshot(snapshot(backends, "v-uint32", routes=routes))
    channel, core = clients("ssa-uint32")
    pinned = cookie_for(backends["d1"].address, cluster="c2")
    for client in ("pyxds", "core"):
        for reply, initial, _ in calls(client, channel, core, 8):
            cluster = "c2" if reply.startswith("d") else "c1"
            assert decoded(set_cookie(initial)) == f"{backends[reply].address};{cluster}", client
        got = calls(client, channel, core, 8, pinned)
        assert [r for r, _, _ in got] == ["d1"] * 8, (client, got)
        assert {set_cookie(i) for _, i, _ in got} == {None}, client


# -- A55/A27: endpoints EDS drops (C-core OverrideHostTest.UnhealthyEndpoint) ----------------


@pytest.mark.parametrize("health", ["UNHEALTHY", "DEGRADED"])
def test_an_endpoint_eds_drops_loses_its_sessions_whatever_the_status_set_in_both(
    server, backends, clients, health
):
    """C-core OverrideHostTest.UnhealthyEndpoint: with DEGRADED (and
    UNHEALTHY) in ``override_host_status`` too, an endpoint that turns
    UNHEALTHY (or DEGRADED) is out of the EDS update (A27; A55 keeps only
    UNKNOWN, HEALTHY and DRAINING of the set): its session's RPCs are
    round-robined over the others, with a new cookie."""
    statuses = ["HEALTHY", "DRAINING", "DEGRADED", "UNKNOWN", "UNHEALTHY"]
    server.set_snapshot(snapshot(backends, "v1", statuses=statuses))
    channel, core = clients(f"ssa-eds-drops-{health.lower()}", ready={"b0", "b1", "b2"})
    pinned = cookie_for(backends["b1"].address)
    for client in ("pyxds", "core"):
        assert [r for r, _, _ in calls(client, channel, core, 3, pinned)] == ["b1"] * 3
    server.set_snapshot(snapshot(backends, "v2", statuses=statuses, health={"b1": health}))

    def moved() -> bool:
        return "b1" not in {r for c in ("pyxds", "core") for r, _, _ in calls(c, channel, core, 3)}

    assert wait_until(moved, timeout=10)
    for client in ("pyxds", "core"):
        got = calls(client, channel, core, 6, pinned)
        assert unpinned([r for r, _, _ in got], {"b0", "b2"}), (client, got)
        for reply, initial, _ in got:
            assert decoded(set_cookie(initial)) == f"{backends[reply].address};c1", client


# -- A55 "Notes": sessions and retries (A44) -------------------------------------------------


def test_every_retry_attempt_of_a_session_goes_to_its_endpoint_in_both(server, backends, clients):
    """A55 "Notes": with stateful session affinity and an A44 retry policy,
    all attempts of an RPC with a cookie go to the cookie's endpoint.
    Without a cookie, the attempts are picked as usual (round robin over
    b0 and b1: three attempts land 2 + 1), and the trailers-only failure
    carries the cookie of the attempt that answered last (the first
    endpoint again)."""
    policy = b.retry_policy("unavailable", num_retries=2, base_interval=0.01, max_interval=0.01)
    routes = [b.route(prefix="", cluster="c1", retry_policy=policy)]
    server.set_snapshot(snapshot(backends, "v-retry", routes=routes, c1=("b0", "b1")))
    # both endpoints READY in each client (round robin serves only READY
    # ones: a first call can come while one is still connecting)
    channel, core = clients("ssa-retry", ready={"b0", "b1"})
    pinned = cookie_for(backends["b1"].address)

    def failing(client: str, metadata) -> tuple[str, list, list, dict[str, int]]:
        """One RPC that every attempt fails UNAVAILABLE: its outcome and
        how many attempts each backend served."""
        before = {n: backends[n].served[n] for n in ("b0", "b1")}
        if client == "pyxds":
            got = pyxds_call(channel, metadata, FAIL, request="UNAVAILABLE")
        else:
            got = core.call_md(FAIL, metadata, request="UNAVAILABLE")
        return (*got, {n: backends[n].served[n] - before[n] for n in ("b0", "b1")})

    for client in ("pyxds", "core"):
        reply, initial, trailing, served = failing(client, pinned)
        assert reply == "error:UNAVAILABLE", client
        assert served == {"b0": 0, "b1": 3}, (client, served)
        assert set_cookie(initial) is None and set_cookie(trailing) is None, client
        # no cookie: the attempts go round, the cookie names the last one
        reply, initial, trailing, served = failing(client, None)
        assert reply == "error:UNAVAILABLE", client
        assert sorted(served.values()) == [1, 2], (client, served)
        (last,) = [n for n, count in served.items() if count == 2]
        assert decoded(set_cookie(trailing)) == f"{backends[last].address};c1", client


# -- what C-core's filter leaves as it is (A39 per-cluster overrides, A42, the backend's own
# headers, a failing endpoint) ------------------------------------------------------------------


def test_the_drawn_weighted_cluster_s_override_decides_whether_the_cookie_is_read_in_both(
    server, backends, clients
):
    """A39 overrides per weighted cluster with A60: c1's ClusterWeight
    disables the filter, c2's does not.  An RPC carrying a cookie for d1
    in c2 is drawn by the weights first: drawn to c2, the cookie is read
    and pins d1; drawn to c1, the filter does nothing (no cookie read, none
    set) and c1 serves it.  C-core takes the filter config of the drawn
    cluster (its method config) before the cookie can change the cluster;
    pyxds too: d0 never serves, both d1 and c1's endpoints do."""
    split = b.route(prefix="", weighted_clusters={"c1": 1, "c2": 1})
    off = b.pack(b.stateful_session_per_route(disabled=True))
    split.route.weighted_clusters.clusters[0].typed_per_filter_config[FILTER].CopyFrom(off)
    server.set_snapshot(snapshot(backends, "v-per-cluster", routes=[split]))
    channel, core = clients("ssa-per-cluster")
    pinned = cookie_for(backends["d1"].address, cluster="c2")
    for client in ("pyxds", "core"):
        got = calls(client, channel, core, 24, pinned)
        replies = {r for r, _, _ in got}
        assert "d1" in replies and replies & {"b0", "b1", "b2"}, (client, got)
        assert "d0" not in replies, (client, got)
        assert {set_cookie(i) for _, i, _ in got} == {None}, (client, got)


def test_a_cookie_wins_over_the_ring_hash_in_both(server, backends, clients):
    """A55 under A42: the cookie's endpoint is picked whatever the request
    hash would pick; without a cookie the same hash key keeps going to the
    same endpoint."""
    routes = [b.route(prefix="", cluster="c1", hash_policies=[b.hash_policy(header="x-key")])]
    base = snapshot(backends, "v-ring-hash", routes=routes)
    rings = [b.cluster("c1", lb_policy="RING_HASH"), b.cluster("c2")]
    server.set_snapshot(base.replace(clusters=rings))
    channel, core = clients("ssa-ring-hash")
    key = [("x-key", "session-7")]
    for client in ("pyxds", "core"):
        hashed = {r for r, _, _ in calls(client, channel, core, 4, key)}
        assert len(hashed) == 1, (client, hashed)
        (other,) = sorted({"b0", "b1", "b2"} - hashed)[:1]
        got = calls(client, channel, core, 6, key + cookie_for(backends[other].address))
        assert [r for r, _, _ in got] == [other] * 6, (client, got)
        assert {set_cookie(i) for _, i, _ in got} == {None}, client


def test_an_aggregate_cluster_s_sessions_stay_within_the_leaf_cluster_in_use_in_both(
    server, backends, clients
):
    """A75 with A55/A60: a route to aggregate cluster ``agg`` = [c1, c2]
    (a priority over the leaf clusters, each with its own override-host
    policy).  The cookie's cluster is ``agg``; a cookie naming an endpoint
    of c1 (in use) pins it; one naming an endpoint of c2 (the lower
    priority, unused while c1 serves) is a normal pick in c1 with a new
    cookie: sessions hold across a leaf cluster's priorities, not across
    an aggregate's clusters."""
    base = snapshot(backends, "v-aggregate", routes=[b.route(prefix="", cluster="agg")])
    clusters = [*base.clusters, b.cluster("agg", aggregate_children=["c1", "c2"])]
    server.set_snapshot(base.replace(clusters=clusters))
    channel, core = clients("ssa-aggregate", ready={"b0", "b1", "b2"})
    for client in ("pyxds", "core"):
        for reply, initial, _ in calls(client, channel, core, 3):
            assert reply in ("b0", "b1", "b2"), client
            assert decoded(set_cookie(initial)) == f"{backends[reply].address};agg", client
        got = calls(client, channel, core, 4, cookie_for(backends["b1"].address, "agg"))
        assert [r for r, _, _ in got] == ["b1"] * 4, (client, got)
        assert {set_cookie(i) for _, i, _ in got} == {None}, client
        got = calls(client, channel, core, 6, cookie_for(backends["d0"].address, "agg"))
        assert unpinned([r for r, _, _ in got], {"b0", "b1", "b2"}), (client, got)
        for reply, initial, _ in got:
            assert decoded(set_cookie(initial)) == f"{backends[reply].address};agg", client


def test_two_session_filters_pin_by_the_last_and_each_set_a_cookie_in_both(
    server, backends, clients
):
    """Two StatefulSession filters (cookies ``one`` then ``two``): A55 is
    silent, grpcio 1.85's C-core decides: the last filter's cookie drives
    the pick (an RPC with cookie ``one`` only is round robin), and each
    filter sets its cookie, ``two`` first.  The one difference, documented
    in docs/differences-from-c-core.md: the first filter's cookie names
    the endpoint picked in pyxds (A55: the host address; so it is not set
    again when it named that endpoint already), an empty address in
    C-core (always set)."""
    base = snapshot(backends, "v-two-filters")
    listener = b.listener(
        "echo-service",
        http_filters=[
            b.stateful_session_filter(name="ssa-one", cookie_name="one"),
            b.stateful_session_filter(name="ssa-two", cookie_name="two"),
        ],
    )
    server.set_snapshot(base.replace(listeners=[listener]))
    channel, core = clients("ssa-two-filters", ready={"b0", "b1", "b2"})
    b1, b2 = backends["b1"].address, backends["b2"].address
    only_one = cookie_named("one", b1)
    both_ = one_header(cookie_named("one", b1), cookie_named("two", b2))
    for client in ("pyxds", "core"):
        got = calls(client, channel, core, 6, only_one)
        assert unpinned([r for r, _, _ in got], {"b0", "b1", "b2"}), (client, got)
        for reply, initial, _ in got:
            cookies = [(n, v) for n, v, _ in (fields(v) for k, v in initial if k == "set-cookie")]
            peer = f"{backends[reply].address};c1"
            if client == "core":
                assert cookies == [("two", peer), ("one", ";c1")], (client, cookies)
            elif reply == "b1":  # cookie one named the endpoint picked: kept
                assert cookies == [("two", peer)], (client, cookies)
            else:
                assert cookies == [("two", peer), ("one", peer)], (client, cookies)
        got = calls(client, channel, core, 4, both_)
        assert [r for r, _, _ in got] == ["b2"] * 4, (client, got)
        for _, initial, _ in got:
            cookies = [fields(v) for k, v in initial if k == "set-cookie"]
            first = f"{b2};c1" if client == "pyxds" else ";c1"
            assert [(n, v) for n, v, _ in cookies] == [("one", first)], (client, cookies)


def test_two_session_filters_move_the_rpc_to_each_cookie_s_cluster_in_turn_in_both(
    server, backends, clients
):
    """A60 per filter, in filter order: cookie ``one`` names c1 and cookie
    ``two`` names d1 in c2; the RPC goes to c2 (the last filter's) and d1.
    Cookie ``one`` is re-set: naming d1 and c2, the endpoint and cluster
    used, in pyxds (A55/A60); an empty address and c1, the cluster the
    first filter chose, in C-core (docs/differences-from-c-core.md)."""
    routes = [b.route(prefix="", weighted_clusters={"c1": 1, "c2": 1})]
    listener = b.listener(
        "echo-service",
        http_filters=[
            b.stateful_session_filter(name="ssa-one", cookie_name="one"),
            b.stateful_session_filter(name="ssa-two", cookie_name="two"),
        ],
    )
    server.set_snapshot(
        snapshot(backends, "v-two-clusters", routes=routes).replace(listeners=[listener])
    )
    channel, core = clients("ssa-two-clusters")
    d1 = backends["d1"].address
    md = one_header(
        cookie_named("one", backends["b1"].address, "c1"), cookie_named("two", d1, "c2")
    )
    for client in ("pyxds", "core"):
        got = calls(client, channel, core, 4, md)
        assert [r for r, _, _ in got] == ["d1"] * 4, (client, got)
        first = f"{d1};c2" if client == "pyxds" else ";c1"
        for _, initial, _ in got:
            cookies = [fields(v)[:2] for k, v in initial if k == "set-cookie"]
            assert cookies == [("one", first)], (client, cookies)


@pytest.mark.parametrize("where", ["draining", "lower-priority"])
def test_a_cookie_naming_an_endpoint_no_child_uses_gets_it_connected_in_both(
    server, backends, clients, where
):
    """C-core XdsOverrideHostTest.ChildPolicyNeverCreatedSubchannel end to
    end, and A75's subchannel creation: b2 is DRAINING from the start
    (DRAINING overridable), or in priority 1 while priority 0 serves; no
    child policy ever made a subchannel for it.  A cookie naming it gets
    it connected and pinned; RPCs without a cookie never go there."""
    statuses = ["UNKNOWN", "HEALTHY", "DRAINING"]
    base = snapshot(backends, f"v-{where}", statuses=statuses, health={"b2": "DRAINING"})
    if where == "lower-priority":
        p0 = [backends[n].address for n in ("b0", "b1")]
        c1 = b.endpoints(
            "c1",
            [
                b.locality(zone="z1", priority=0, endpoints=p0),
                b.locality(zone="z2", priority=1, endpoints=[backends["b2"].address]),
            ],
        )
        base = base.replace(endpoints=[c1, base.endpoints[1]])
    server.set_snapshot(base)
    channel, core = clients(f"ssa-unused-{where}", ready={"b0", "b1"})
    pinned = cookie_for(backends["b2"].address)
    for client in ("pyxds", "core"):
        assert {r for r, _, _ in calls(client, channel, core, 6)} == {"b0", "b1"}, client
        got = calls(client, channel, core, 4, pinned)
        assert [r for r, _, _ in got] == ["b2"] * 4, (client, got)
        assert {set_cookie(i) for _, i, _ in got} == {None}, client
        assert {r for r, _, _ in calls(client, channel, core, 6)} == {"b0", "b1"}, client


@pytest.mark.parametrize("draining_keeps_sessions", [True, False])
def test_a_priority_of_draining_endpoints_is_failed_over_in_both(
    server, backends, clients, draining_keeps_sessions
):
    """A55: the override-host policy hands its child no DRAINING endpoint,
    so a priority whose endpoints are all DRAINING has none and the
    priority policy fails over to the next (b2).  A cookie naming a
    DRAINING endpoint pins it when DRAINING is in override_host_status,
    else it is a normal pick (b2)."""
    statuses = ["UNKNOWN", "HEALTHY", "DRAINING"] if draining_keeps_sessions else None
    base = snapshot(backends, "v-p0-draining", statuses=statuses)
    draining = [b.endpoint(backends[n].address, health_status="DRAINING") for n in ("b0", "b1")]
    c1 = b.endpoints(
        "c1",
        [
            b.locality(zone="z1", priority=0, endpoints=draining),
            b.locality(zone="z2", priority=1, endpoints=[backends["b2"].address]),
        ],
    )
    server.set_snapshot(base.replace(endpoints=[c1, base.endpoints[1]]))
    channel, core = clients(f"ssa-p0-draining-{draining_keeps_sessions}")
    pinned = cookie_for(backends["b0"].address)
    for client in ("pyxds", "core"):
        assert [r for r, _, _ in calls(client, channel, core, 4)] == ["b2"] * 4, client
        got = [r for r, _, _ in calls(client, channel, core, 3, pinned)]
        assert got == (["b0"] if draining_keeps_sessions else ["b2"]) * 3, (client, got)


def test_strict_and_cookie_attributes_are_not_read_in_both(server, backends, clients):
    """Fields of the filter's config that neither client reads (A55 names
    only the cookie's name, path and ttl): ``StatefulSession.strict``
    (Envoy answers 503 when the cookie's host is not available) and
    ``Cookie.attributes`` (Envoy adds them to its set-cookie).  With both
    set, a cookie naming no endpoint is a normal pick with a new cookie,
    and the set-cookie carries no extra attribute, in pyxds as in grpcio
    1.85's C-core."""
    config = b.stateful_session_config(ssa.COOKIE, "", 60)
    config.strict = True
    state = cookie_pb2.CookieBasedSessionState()
    config.session_state.typed_config.Unpack(state)
    state.cookie.attributes.add(name="SameSite", value="Strict")
    state.cookie.attributes.add(name="Secure")
    config.session_state.typed_config.Pack(state)
    listener = b.listener("echo-service", http_filters=[b.stateful_session_filter(config=config)])
    server.set_snapshot(snapshot(backends, "v-strict").replace(listeners=[listener]))
    channel, core = clients("ssa-strict")
    nowhere = cookie_for("10.9.9.9:1")
    for client in ("pyxds", "core"):
        for reply, initial, _ in calls(client, channel, core, 3, nowhere):
            assert reply in ("b0", "b1", "b2"), (client, reply)
            name, value, attributes = fields(set_cookie(initial))
            assert (name, attributes) == (ssa.COOKIE, ["HttpOnly", "Max-Age=60"]), client
            assert value == f"{backends[reply].address};c1", client


def test_an_ejected_endpoint_keeps_its_sessions_in_both(server, backends, clients):
    """A50 with A55 (docs/differences-from-c-core.md, "xds_override_host"):
    outlier detection (failure percentage) ejects the endpoint that fails
    every RPC, and RPCs without a cookie stop going there; a cookie naming
    it still pins it in both clients (the ejection reaches the priorities'
    policies, not the session picker) and so its RPCs still fail."""
    from test_differential_outlier_detection import _Backend as Broken

    bad = Broken("bad", failing=True)
    try:
        members = {**backends, "bad": bad}
        base = snapshot(members, "v-ejected", c1=("b0", "b2", "bad"))
        clusters = list(base.clusters)
        od = clusters[0].outlier_detection
        od.interval.FromSeconds(1)  # (success rate needs 5 hosts: it never runs here)
        od.max_ejection_percent.value = 50
        od.enforcing_failure_percentage.value = 100
        od.failure_percentage_minimum_hosts.value = 2
        od.failure_percentage_request_volume.value = 5
        server.set_snapshot(base.replace(clusters=clusters))
        channel, core = clients("ssa-ejected")
        for client in ("pyxds", "core"):

            def ejected(client: str = client) -> bool:
                # (and both others READY: round robin reaches them only then)
                replies = [r for r, _, _ in calls(client, channel, core, 30)]
                return set(replies[-12:]) == {"b0", "b2"}

            assert wait_until(ejected, timeout=20), client
            got = calls(client, channel, core, 4, cookie_for(bad.address))
            assert [r for r, _, _ in got] == ["error:INTERNAL"] * 4, (client, got)
            assert {r for r, _, _ in calls(client, channel, core, 8)} == {"b0", "b2"}, client
    finally:
        bad.server.stop(None).wait(5)


@pytest.mark.parametrize("session_first", [True, False])
def test_an_rpc_the_fault_filter_aborts_gets_no_cookie_in_both(
    server, backends, clients, session_first
):
    """A33 with A55: a fault filter aborting every RPC (UNAVAILABLE), before
    or after the session filter in the chain.  The RPC never reaches an
    endpoint: it fails with no ``set-cookie`` anywhere (no response to add
    it to), with or without a cookie, in both clients."""
    session = b.stateful_session_filter(cookie_name=ssa.COOKIE)
    fault = b.fault_filter(abort_grpc_status=14, abort_percent=100)
    filters = [session, fault] if session_first else [fault, session]
    listener = b.listener("echo-service", http_filters=filters)
    server.set_snapshot(snapshot(backends, "v-fault").replace(listeners=[listener]))
    channel, core = clients(f"ssa-fault-{session_first}")
    for client in ("pyxds", "core"):
        for md in (None, cookie_for(backends["b1"].address)):
            ((reply, initial, trailing),) = calls(client, channel, core, 1, md)
            assert reply == "error:UNAVAILABLE", (client, reply)
            assert set_cookie(initial) is None and set_cookie(trailing) is None, client


def test_a_logical_dns_cluster_s_session_cookie_names_its_endpoint_in_both(
    server, backends, clients
):
    """A55 on a LOGICAL_DNS cluster (A37, A61: one endpoint, the name's
    addresses): the cookie names the endpoint's address list (here the one
    address of 127.0.0.1) and pins it."""
    base = snapshot(backends, "v-logical-dns")
    dns = b.cluster("c1", kind="LOGICAL_DNS", dns_host="127.0.0.1", dns_port=backends["b1"].port)
    server.set_snapshot(
        base.replace(clusters=[dns, base.clusters[1]], endpoints=[base.endpoints[1]])
    )
    channel, core = clients("ssa-logical-dns")
    address = backends["b1"].address
    for client in ("pyxds", "core"):
        ((reply, initial, _),) = calls(client, channel, core, 1)
        assert reply == "b1" and decoded(set_cookie(initial)) == f"{address};c1", client
        got = calls(client, channel, core, 3, cookie_for(address))
        assert [(r, set_cookie(i)) for r, i, _ in got] == [("b1", None)] * 3, (client, got)


def _server_status_has_the_cookie_in_its_trailers(channel, core, md, code: str, backends) -> None:
    """b1 (``md`` pins it, with a cluster to re-set) fails the RPC with
    ``code`` before sending anything: a trailers-only response, whose
    trailers carry the new cookie in both clients."""
    sent = f"{backends['b1'].address};c1"
    for reply, initial, trailing in (
        pyxds_call(channel, md, FAIL, code),
        core.call_md(FAIL, md, request=code),
    ):
        assert reply == f"error:{code}"
        assert set_cookie(initial) is None and decoded(set_cookie(trailing)) == sent


def test_an_rpc_ended_by_its_deadline_gets_no_cookie_in_both(server, backends, clients):
    """An RPC that reached b1 and ran past its deadline (the backend sent
    nothing): the client ended it, there is no response to carry a cookie,
    and neither client adds one (C-core: a locally generated status is no
    trailers-only response; it does add one in the rare run where the
    backend's own DEADLINE_EXCEEDED, a trailers-only response, arrives
    before its timer fires).  A DEADLINE_EXCEEDED the backend sends
    itself, before the deadline, is a trailers-only response: the cookie
    is in its trailers in both.  Fails on the old code: pyxds put the
    cookie in the trailers of a call its deadline ended, unless grpcio's
    status text was one it rewords."""
    import grpc

    server.set_snapshot(snapshot(backends, "v-deadline"))
    channel, core = clients("ssa-deadline")
    md = cookie_for(backends["b1"].address, cluster="")  # cluster changed: a new cookie
    assert pyxds_call(channel, md)[0] == core.call_md(WHO, md)[0] == "b1"
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as ours:
            channel.unary_unary(SLEEP).with_call(b"1.5", timeout=0.3, metadata=md)
        assert ours.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert set_cookie(ours.value.initial_metadata()) is None
        assert set_cookie(ours.value.trailing_metadata()) is None
    # C-core: none, unless the backend's own DEADLINE_EXCEEDED (it has the
    # same deadline) wins the race against the client's timer, which on a
    # loaded machine it may do several times in a row: call until C-core's
    # own timer has ended one (bounded), each a DEADLINE_EXCEEDED without a
    # cookie in its headers
    theirs = []
    for _ in range(12):
        theirs.append(core.call_md(SLEEP, md, timeout=0.3, request="1.5"))
        if set_cookie(theirs[-1][2]) is None:
            break
    assert {reply for reply, _, _ in theirs} == {"error:DEADLINE_EXCEEDED"}
    assert {set_cookie(initial) for _, initial, _ in theirs} == {None}
    assert None in {set_cookie(trailing) for _, _, trailing in theirs}, theirs
    _server_status_has_the_cookie_in_its_trailers(channel, core, md, "DEADLINE_EXCEEDED", backends)


def test_a_call_the_application_cancels_gets_no_cookie_and_a_server_cancel_does(
    server, backends, clients
):
    """The server's CANCELLED (trailers-only) carries the cookie in its
    trailers in both clients; a call the application cancelled while the
    backend was still at work had no response and gets none (pyxds; C-core's
    filter adds a cookie only to a trailers-only response, and its local
    cancel is none: the C-core client here cannot cancel).  Fails on the old
    code: the cancelled call got the cookie in its trailers."""
    server.set_snapshot(snapshot(backends, "v-cancel"))
    channel, core = clients("ssa-cancel")
    b1 = backends["b1"]
    md = cookie_for(b1.address, cluster="")  # cluster changed: a new cookie
    _server_status_has_the_cookie_in_its_trailers(channel, core, md, "CANCELLED", backends)
    before = b1.served[b1.name]
    future = channel.unary_unary(SLEEP).future(b"1.0", timeout=5, metadata=md)
    assert wait_until(lambda: b1.served[b1.name] > before, 5)  # the backend is sleeping on it
    assert future.cancel()
    assert set_cookie(future.trailing_metadata() or ()) is None
    assert set_cookie(future.initial_metadata() or ()) is None


def test_of_two_cookies_with_the_session_s_name_the_first_is_read_in_both(
    server, backends, clients
):
    """A55: "If you find more than one cookie with that name, then just
    pick the first cookie": the first names b2 (pinned); when the first is
    not base64, the RPC has no session address even though the second
    names b1 (C-core decodes only the first)."""
    server.set_snapshot(snapshot(backends, "v-two-cookies"))
    channel, core = clients("ssa-two-cookies", ready={"b0", "b1", "b2"})
    b1, b2 = cookie_for(backends["b1"].address), cookie_for(backends["b2"].address)
    garbage = [("cookie", f"{ssa.COOKIE}=!!!")]
    for client in ("pyxds", "core"):
        got = calls(client, channel, core, 4, one_header(b2, b1))
        assert [r for r, _, _ in got] == ["b2"] * 4, (client, got)
        got = calls(client, channel, core, 6, one_header(garbage, b1))
        assert unpinned([r for r, _, _ in got], {"b0", "b1", "b2"}), (client, got)


def test_an_rpc_its_backend_cancels_at_shutdown_carries_the_cookie_in_both(
    server, backends, clients
):
    """A backend stopping (no grace) ends the RPCs it runs with UNAVAILABLE
    "Cancelling all calls", a trailers-only response: the session's new
    cookie is in its trailers in both clients."""
    import threading

    s1 = Backend("s1").start()
    try:
        server.set_snapshot(snapshot({**backends, "s1": s1}, "v-shutdown", c1=("s1",)))
        channel, core = clients("ssa-shutdown")
        md = cookie_for(s1.address, cluster="")  # cluster changed: a new cookie

        running: list[bool] = []

        def stop_and_restart(before: int) -> None:
            # once the RPC is running (the backend sleeps on it)
            running.append(wait_until(lambda: s1.served[s1.name] > before, 5))
            s1.stop()
            s1.start()

        for client in ("pyxds", "core"):
            assert calls(client, channel, core, 1, md)[0][0] == "s1"
            stopper = threading.Thread(target=stop_and_restart, args=(s1.served[s1.name],))
            stopper.start()
            if client == "pyxds":
                reply, initial, trailing = pyxds_call(channel, md, SLEEP, "2")
            else:
                reply, initial, trailing = core.call_md(SLEEP, md, request="2")
            stopper.join()
            assert running.pop(), client
            assert reply == "error:UNAVAILABLE", (client, reply)
            assert set_cookie(initial) is None, client
            assert decoded(set_cookie(trailing)) == f"{s1.address};c1", client
    finally:
        s1.stop()


class _CookieBackend:
    """A grpcio backend whose Who sends its own ``set-cookie`` in its
    initial metadata."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc

        def who(request: bytes, context) -> bytes:
            context.send_initial_metadata((("set-cookie", "app=1; Path=/"),))
            return b"s0"

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Who": grpc.unary_unary_rpc_method_handler(who)}
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def stop(self) -> None:
        self._server.stop(None).wait(5)


def test_the_backend_s_own_set_cookie_is_kept_before_the_session_s_in_both(
    server, backends, clients
):
    """The session's ``set-cookie`` is added to the response's initial
    metadata after the backend's own (C-core appends it): the application
    sees both, in that order."""
    backend = _CookieBackend()
    try:
        server.set_snapshot(snapshot({**backends, "s0": backend}, "v-own-cookie", c1=("s0",)))
        channel, core = clients("ssa-own-cookie")
        for client in ("pyxds", "core"):
            ((reply, initial, _),) = calls(client, channel, core, 1)
            cookies = [v for k, v in initial if k == "set-cookie"]
            assert reply == "s0" and len(cookies) == 2, (client, initial)
            assert cookies[0] == "app=1; Path=/", (client, cookies)
            assert decoded(cookies[1]) == f"{backend.address};c1", (client, cookies)
    finally:
        backend.stop()


class _V6Backend:
    """A grpcio backend on [::1] whose Who returns its name."""

    def __init__(self, name: str) -> None:
        from concurrent import futures

        import grpc

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {"Who": grpc.unary_unary_rpc_method_handler(lambda request, context: name.encode())},
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("[::1]:0")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(None).wait(5)


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
def test_an_ipv6_endpoint_s_cookie_is_its_canonical_address_in_both(server, backends, clients):
    """The cookie carries the endpoint's address as C-core prints it
    (``[::1]:PORT``) whatever way EDS wrote the IPv6 address
    (``0:0:0:0:0:0:0:1`` here); a cookie naming that form pins; a
    non-canonical spelling of the same address names no endpoint (a normal
    pick, a new cookie), in both clients."""
    v1, v2 = _V6Backend("v1"), _V6Backend("v2")
    try:
        base = snapshot(backends, "v-ipv6")
        endpoints = []
        for backend in (v1, v2):
            endpoint = b.endpoint(f"127.0.0.1:{backend.port}")
            endpoint.endpoint.address.socket_address.address = "0:0:0:0:0:0:0:1"
            endpoints.append(endpoint)
        c1 = b.endpoints("c1", [b.locality(zone="z1", endpoints=endpoints)])
        server.set_snapshot(base.replace(endpoints=[c1, base.endpoints[1]]))
        # both endpoints READY in each client first (round robin serves only
        # READY ones: the spelled cookie's normal picks below spread over both
        # only then; a loaded full run saw pyxds's go to v2 alone)
        channel, core = clients("ssa-ipv6", ready={"v1", "v2"})
        canonical = {"v1": f"[::1]:{v1.port}", "v2": f"[::1]:{v2.port}"}

        def cookie(text: str) -> list[tuple[str, str]]:
            return [("cookie", f"{ssa.COOKIE}=" + base64.b64encode(text.encode()).decode())]

        for client in ("pyxds", "core"):
            for reply, initial, _ in calls(client, channel, core, 4):
                assert decoded(set_cookie(initial)) == f"{canonical[reply]};c1", client
            got = calls(client, channel, core, 4, cookie(f"{canonical['v2']};c1"))
            assert [r for r, _, _ in got] == ["v2"] * 4, (client, got)
            assert {set_cookie(i) for _, i, _ in got} == {None}, client
            spelled = cookie(f"[0:0:0:0:0:0:0:1]:{v2.port};c1")
            got = calls(client, channel, core, 4, spelled)
            assert {r for r, _, _ in got} == {"v1", "v2"}, (client, got)
            for reply, initial, _ in got:
                assert decoded(set_cookie(initial)) == f"{canonical[reply]};c1", client
    finally:
        v1.stop()
        v2.stop()


def test_a_cookie_naming_a_failing_endpoint_moves_and_comes_back_in_both(server, backends, clients):
    """C-core XdsOverrideHostTest.OverrideIsQueuedInIdleOrConnectingAndFailedInTransientFailure,
    end to end: the cookie's endpoint (still in EDS) stops serving; once
    its connection fails, the session's RPCs are round robin over the
    others with a new cookie; when it serves again the cookie pins it
    again."""
    t1 = Backend("t1").start()
    try:
        members = {**backends, "t1": t1}
        server.set_snapshot(snapshot(members, "v-failing", c1=("b0", "b1", "t1")))
        channel, core = clients("ssa-failing")
        pinned = cookie_for(t1.address)
        for client in ("pyxds", "core"):
            assert [r for r, _, _ in calls(client, channel, core, 3, pinned)] == ["t1"] * 3
        t1.stop()

        def moved(client: str) -> bool:
            got = calls(client, channel, core, 4, pinned)
            return {r for r, _, _ in got} == {"b0", "b1"} and all(
                decoded(set_cookie(i)) == f"{backends[r].address};c1" for r, i, _ in got
            )

        for client in ("pyxds", "core"):
            assert wait_until(lambda client=client: moved(client), timeout=15), client
        t1.start()
        for client in ("pyxds", "core"):

            def back(client: str = client) -> bool:
                return [r for r, _, _ in calls(client, channel, core, 3, pinned)] == ["t1"] * 3

            assert wait_until(back, timeout=20), client
    finally:
        t1.stop()


# -- the filter's NACKs (C-core xds_http_stateful_session_filter_test.cc) -----------------------


def _cookie_state_any(edit=None) -> any_pb2.Any:
    state = cookie_pb2.CookieBasedSessionState()
    state.cookie.name = "c"
    if edit is not None:
        edit(state)
    out = any_pb2.Any()
    out.Pack(state)
    return out


def _in_typed_struct(type_name: str) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(typed_struct_pb2.TypedStruct(type_url=f"type.googleapis.com/{type_name}"))
    return out


def _raw(type_name: str, value: bytes) -> any_pb2.Any:
    return any_pb2.Any(type_url=f"type.googleapis.com/{type_name}", value=value)


def _session(state: any_pb2.Any) -> ss_pb2.StatefulSession:
    out = ss_pb2.StatefulSession()
    out.session_state.name = "envoy.http.stateful_session.cookie"
    out.session_state.typed_config.CopyFrom(state)
    return out


def _negative_ttl(state: cookie_pb2.CookieBasedSessionState) -> None:
    state.cookie.ttl.seconds = -1


def _negative_ttl_nanos(state: cookie_pb2.CookieBasedSessionState) -> None:
    state.cookie.ttl.nanos = -1


def _no_cookie(state: cookie_pb2.CookieBasedSessionState) -> None:
    state.ClearField("cookie")


def _listener(name: str, filter_config: any_pb2.Any | None, override: any_pb2.Any | None):
    """A listener with an inline route config (one route to cluster "c"),
    the stateful session filter (``filter_config``, default a valid one)
    and, when given, the route's override for it."""
    rc = b.route_config("inline", [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c")])])
    if override is not None:
        rc.virtual_hosts[0].routes[0].typed_per_filter_config[FILTER].CopyFrom(override)
    config = filter_config or b.pack(b.stateful_session_config("c"))
    return b.listener(
        name, route_config=rc, http_filters=[hcm_pb2.HttpFilter(name=FILTER, typed_config=config)]
    )


_FILTER = f"api_listener.api_listener.value[{HCM}].http_filters[0].typed_config.value[{SS}]"
_ROUTE = (
    f"api_listener.api_listener.value[{HCM}].route_config.virtual_hosts[0].routes[0]"
    f".typed_per_filter_config[{FILTER}]"
)
_PER_ROUTE = f"{_ROUTE}.value[{SS_PER_ROUTE}].stateful_session"
_STATE = f".session_state.typed_config.value[{COOKIE_STATE}]"
_TS_STATE = f".session_state.typed_config.value[xds.type.v3.TypedStruct].value[{COOKIE_STATE}]"


def _per_route(state: any_pb2.Any) -> any_pb2.Any:
    return b.pack(ss_pb2.StatefulSessionPerRoute(stateful_session=_session(state)))


NACKS = [
    pytest.param(
        b.pack(_session(_in_typed_struct(COOKIE_STATE))),
        None,
        f"{_FILTER}{_TS_STATE}",
        "could not parse session state config",
        id="session-state-in-a-typed-struct",
    ),
    pytest.param(
        b.pack(_session(_raw(COOKIE_STATE, b"\0"))),
        None,
        f"{_FILTER}{_STATE}",
        "could not parse session state config",
        id="session-state-does-not-parse",
    ),
    pytest.param(
        None,
        _in_typed_struct(SS_PER_ROUTE),
        f"{_ROUTE}.value[xds.type.v3.TypedStruct].value[{SS_PER_ROUTE}]",
        "could not parse stateful session filter override config",
        id="override-in-a-typed-struct",
    ),
    pytest.param(
        None,
        _raw(SS_PER_ROUTE, b"\0"),
        f"{_ROUTE}.value[{SS_PER_ROUTE}]",
        "could not parse stateful session filter override config",
        id="override-does-not-parse",
    ),
    pytest.param(
        None,
        _per_route(_cookie_state_any(_no_cookie)),
        f"{_PER_ROUTE}{_STATE}.cookie",
        "field not present",
        id="override-without-cookie",
    ),
    pytest.param(
        None,
        _per_route(_cookie_state_any(_negative_ttl)),
        f"{_PER_ROUTE}{_STATE}.cookie.ttl.seconds",
        "value must be in the range [0, 315576000000]",
        id="override-negative-ttl",
    ),
    pytest.param(
        b.pack(_session(_cookie_state_any(_negative_ttl_nanos))),
        None,
        f"{_FILTER}{_STATE}.cookie.ttl.nanos",
        "value must be in the range [0, 999999999]",
        id="negative-ttl-nanos",
    ),
    pytest.param(
        None,
        _per_route(_in_typed_struct(COOKIE_STATE)),
        f"{_PER_ROUTE}{_TS_STATE}",
        "could not parse session state config",
        id="override-session-state-in-a-typed-struct",
    ),
]


@pytest.fixture(scope="module")
def nack_core(server_for_nacks):
    client = CoreXdsClient(server_for_nacks.bootstrap(node_id="ssa-nacks"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def server_for_nacks():
    from pyxds.server import ManagementServer

    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("filter_config, override, field, words", NACKS)
def test_a_bad_session_config_is_nacked_with_c_core_s_field_and_words(
    server_for_nacks, nack_core, filter_config, override, field, words
):
    """The listener (with its inline route config) is NACKed; an RPC, with
    nothing cached, fails UNAVAILABLE naming the same field and the same
    words in both clients."""
    name = f"ssa-nack-{next(_NAMES)}"
    server_for_nacks.set_snapshot(Snapshot(listeners=[_listener(name, filter_config, override)]))
    target = f"xds:///{name}"
    channel = pyxds.insecure_channel(
        target, bootstrap=server_for_nacks.bootstrap(node_id="ssa-nacks")
    )
    try:
        (ours,) = pyxds_calls(channel, 1, details=True, wait_for_ready=False, timeout=3)
    finally:
        channel.close()
    (theirs,) = nack_core.call(1, details=True, target=target, wait_for_ready=False, timeout=3)
    for text in (ours, theirs):
        assert text.startswith("error:UNAVAILABLE: "), text
        assert f"LDS resource {name}" in text, text
    assert f"field:{field} error:{words}" in theirs, theirs
    assert f"{field}: {words}" in ours, ours
