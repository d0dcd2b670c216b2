"""Conformance: stateful session affinity (gRFC A55, A60, A75) cases of
C-core's ``test/core/xds/xds_http_stateful_session_filter_test.cc``,
``test/core/load_balancing/xds_override_host_test.cc`` and
``test/cpp/end2end/xds/xds_override_host_end2end_test.cc`` that no other
pyxds test replays (tests/unit/test_conformance_override_host.py,
test_xds_override_host.py, test_stateful_session_{config,filter}.py and
tests/e2e/test_{stateful_session,differential_stateful_session}.py have
the rest).  grpc-java and grpc-go do not implement A55: C-core is the only
other implementation.
"""

from __future__ import annotations

import base64
import random

import grpc
from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2 as ss_pb2
from test_cds_support import connect_all, loc
from test_conformance_override_host import E0, E1, E2, fallback_picks, override_picks, plain_picks
from test_stateful_session_filter import md, selector
from test_xds_override_host import A, live, locality, tree

from pyxds.resolver.config_selector import ClusterRef, XdsConfigSelector
from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.xds.resources import LISTENER, ROUTE_CONFIG
from pyxds.xds.resources.stateful_session import STATEFUL_SESSION_TYPE

FILTER = "envoy.filters.http.stateful_session"
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"

# -- the filter's config (xds_http_stateful_session_filter_test.cc) -------------------------


def test_a_per_route_session_without_session_state_turns_the_cookie_off_on_that_route():
    """C-core XdsStatefulSessionFilterConfigTest.SessionStateUnset, the
    per-route variant: a StatefulSessionPerRoute whose ``stateful_session``
    is present but has no ``session_state`` is valid and is a filter that
    does nothing (C-core's config ``{}``): that route reads no cookie and
    sets none, while the other routes keep the listener's cookie."""
    per_route = ss_pb2.StatefulSessionPerRoute(stateful_session=ss_pb2.StatefulSession())
    sel, _ = selector(
        [
            b.route(prefix="/s/off", cluster="c1", typed_per_filter_config={FILTER: per_route}),
            b.route(prefix="", cluster="c1"),
        ]
    )
    off = sel.select("/s/off", md("10.0.0.1:80", "c1"))
    assert off.call_state is None and "xds_override_host" not in off.call_attributes
    off.on_committed()
    on = sel.select("/s/m", md("10.0.0.1:80", "c1"))
    assert on.call_state is not None and on.call_state.cookie_address_list == "10.0.0.1:80"
    on.on_committed()


def _server_listener(http_filter):
    lis = ib.server_listener("S", "127.0.0.1:8080", [ib.filter_chain(http_filters=[http_filter])])
    return LISTENER.decode(lis.SerializeToString())


def test_the_filter_is_refused_on_servers_and_skipped_there_when_optional():
    """C-core XdsStatefulSessionFilterTest.Accessors: supported on clients,
    not on servers (A36/A39: a server Listener naming it is NACKed with
    "filter is not supported on servers"; an optional one is skipped)."""
    got = _server_listener(b.stateful_session_filter(cookie_name="c"))
    assert got.resource is None
    assert got.error == (
        f"filter_chains[0].filters[0].typed_config.value[{HCM}].http_filters[0]"
        f".typed_config.value[{STATEFUL_SESSION_TYPE}]: filter is not supported on servers"
    )
    optional = b.stateful_session_filter(cookie_name="c")
    optional.is_optional = True
    got = _server_listener(optional)
    assert got.error is None and got.resource is not None


# -- the LB policy (xds_override_host_test.cc, xds_override_host_end2end_test.cc) -------------


def test_a_session_holds_when_its_locality_moves_to_a_new_lower_priority():
    """C-core OverrideHostTest.AffinityWorksAcrossPrioritiesHeuristicChangesChildName:
    priority 0 has localities A (E0) and B (E1); the next update keeps A
    in priority 0 with a new locality C (E2) and moves B to priority 1
    (the priority child names are re-assigned by locality).  The session
    on E1 stays there (A75: the override-host policy is above the
    priorities); new sessions go to priority 0 (E0, E2)."""
    b_, c_ = loc("b"), loc("c")
    helper, _policy, update = tree()
    update([locality(A, [E0]), locality(b_, [E1])])
    connect_all(helper)
    assert plain_picks(helper) == {E0, E1}
    override_picks(helper, E1, E1)
    update([locality(A, [E0]), locality(c_, [E2])], [locality(b_, [E1])])
    connect_all(helper)
    assert plain_picks(helper) == {E0, E2}
    override_picks(helper, E1, E1)
    assert len(live(helper, E1)) == 1


def test_a_draining_hosts_sessions_end_when_it_leaves_the_update():
    """C-core XdsOverrideHostTest.DrainingState: a session keeps its
    DRAINING host (DRAINING overridable) while no other RPC goes there;
    once an update removes the host, its session's picks are round robin
    over the others and the subchannel the policy kept for it is shut
    down."""
    helper, _policy, update = tree(statuses={"UNKNOWN", "HEALTHY", "DRAINING"})
    update([locality(A, [E0, E1, E2])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    update([locality(A, [(E0, "UNKNOWN"), (E1, "DRAINING"), (E2, "HEALTHY")])])
    assert plain_picks(helper) == {E0, E2}
    override_picks(helper, E1, E1)
    (kept,) = live(helper, E1)
    update([locality(A, [(E0, "UNKNOWN"), (E2, "HEALTHY")])])
    assert fallback_picks(helper, E1) == {E0, E2}
    assert kept.shut_down and live(helper, E1) == []


# -- several stateful session filters on one route (C-core runs each) ----------------------


def _two_filter_selector(routes, two_path=""):
    """A ConfigSelector over ``routes`` whose listener has two stateful
    session filters: cookie ``one`` then cookie ``two`` (``two_path``: the
    second cookie's path)."""
    listener = b.listener(
        "L",
        http_filters=[
            b.stateful_session_filter(name="ssa-one", cookie_name="one"),
            b.stateful_session_filter(name="ssa-two", cookie_name="two", path=two_path),
        ],
    )
    lis = LISTENER.decode(listener.SerializeToString()).resource
    rc = b.route_config("L-route", [b.virtual_host("vh", routes=routes)])
    vh = ROUTE_CONFIG.decode(rc.SerializeToString()).resource.virtual_hosts[0]
    refs = {name: ClusterRef(name, lambda: None) for name in ("c1", "c2")}
    return XdsConfigSelector(vh, refs, rng=random.Random(3), http_filters=lis.http_filters)


def _cookies(**values: str) -> list[tuple[str, str]]:
    """One ``cookie`` header: name -> "address;cluster"."""
    text = "; ".join(f"{k}={base64.b64encode(v.encode()).decode()}" for k, v in values.items())
    return [("cookie", text)]


def _set_cookies(config, actual: str) -> list[tuple[str, str]]:
    """(name, decoded value) of each set-cookie once the picker wrote ``actual``."""
    config.call_attributes["xds_override_host"].actual_address_list = actual
    out = []
    for key, value in config.call_state.response_metadata():
        assert key == "set-cookie"
        name, _, rest = value.partition("=")
        out.append((name, base64.b64decode(rest.split(";", 1)[0]).decode()))
    config.on_committed()
    return out


def test_with_two_session_filters_the_last_one_pins_and_each_sets_its_cookie():
    """Two StatefulSession filters in the listener (A39: each runs, in
    order).  gRFC A55 is silent on how they combine; C-core (grpcio 1.85,
    checked live by tests/e2e/test_differential_stateful_session.py): each
    filter reads its own cookie and sets the override-host attribute,
    the last one's replacing the first's, so the last filter's cookie
    drives the pick (even when it has none); each filter answers with its
    own set-cookie, the last filter's first.  The first filter's cookie
    value is the address picked (A55: "the base64-encoded string value of
    hostAddress"), where C-core writes an empty address
    (docs/differences-from-c-core.md).  Fails on the old code: pyxds read
    the first filter's cookie only and set one cookie."""
    sel = _two_filter_selector([b.route(prefix="", cluster="c1")])
    only_one = sel.select("/s/m", _cookies(one="10.0.0.1:80;c1"))
    assert only_one.call_attributes["xds_override_host"].cookie_addresses == ()
    assert _set_cookies(only_one, "10.0.0.7:80") == [
        ("two", "10.0.0.7:80;c1"),
        ("one", "10.0.0.7:80;c1"),
    ]
    both = sel.select("/s/m", _cookies(one="10.0.0.1:80;c1", two="10.0.0.2:80;c1"))
    assert both.call_attributes["xds_override_host"].cookie_addresses == ("10.0.0.2:80",)
    # the pick honoured cookie two: only cookie one is re-set, to that address
    assert _set_cookies(both, "10.0.0.2:80") == [("one", "10.0.0.2:80;c1")]


def test_with_two_session_filters_one_outside_its_path_the_other_pins():
    """The second filter's cookie path does not match the RPC: it does
    nothing for it (A55), and the first filter's cookie drives the pick."""
    sel = _two_filter_selector([b.route(prefix="", cluster="c1")], two_path="/other")
    config = sel.select("/s/m", _cookies(one="10.0.0.1:80;c1", two="10.0.0.2:80;c1"))
    assert config.call_attributes["xds_override_host"].cookie_addresses == ("10.0.0.1:80",)
    assert _set_cookies(config, "10.0.0.1:80") == []


def test_with_two_session_filters_the_first_cookie_s_cluster_stands_without_a_second():
    """A60 per filter, in order: the first filter's cookie moves the RPC to
    its cluster c2; the second has no cookie, keeps c2 and writes it."""
    sel = _two_filter_selector([b.route(prefix="", weighted_clusters={"c1": 99, "c2": 1})])
    for _ in range(5):
        config = sel.select("/s/m", _cookies(one="10.0.0.1:80;c2"))
        assert config.call_attributes["cluster"] == "cluster:c2"
        assert _set_cookies(config, "10.0.0.9:80") == [
            ("two", "10.0.0.9:80;c2"),
            ("one", "10.0.0.9:80;c2"),
        ]


def test_with_two_session_filters_each_cookie_names_the_cluster_used():
    """A60 per filter: cookie ``one`` moves the RPC to c1, cookie ``two``
    then to c2, where it goes.  Cookie ``one`` is re-set naming c2, the
    cluster used (A60's clusterUsed; C-core writes the cluster the first
    filter chose, c1, with an empty address)."""
    sel = _two_filter_selector([b.route(prefix="", weighted_clusters={"c1": 1, "c2": 1})])
    for _ in range(5):
        config = sel.select("/s/m", _cookies(one="10.0.0.1:80;c1", two="10.0.0.2:80;c2"))
        assert config.call_attributes["cluster"] == "cluster:c2"
        assert _set_cookies(config, "10.0.0.2:80") == [("one", "10.0.0.2:80;c2")]


# -- the response side: a call the client's deadline ended ---------------------------------


class _Session:
    def response_metadata(self):
        return (("set-cookie", "c=x; HttpOnly"),)


class _Rpc:
    def __init__(self, deadline, cancelled=False):
        self.deadline = deadline
        self.cancelled = cancelled


def test_a_call_its_deadline_ended_gets_no_cookie_and_a_server_sent_one_does():
    """A55's response processing has nothing to add to when there is no
    response: a call that ended DEADLINE_EXCEEDED once its own deadline
    was over gets no set-cookie (C-core: a locally generated status is no
    trailers-only response).  A DEADLINE_EXCEEDED received before the
    deadline (the server's, trailers-only), or on an RPC without deadline,
    gets it in its trailers.  tests/e2e/test_differential_stateful_session.py
    runs it against C-core; there pyxds's old behaviour depended on
    grpcio's status text (with or without the cookie)."""
    import time

    from pyxds.channel.response_metadata import ResponseAdditions

    exceeded = grpc.StatusCode.DEADLINE_EXCEEDED
    over = ResponseAdditions(_Session(), _Rpc(time.monotonic() - 0.001))
    assert over.initial((), exceeded) == ()
    assert over.trailing((), (), exceeded) == ()
    for rpc in (_Rpc(time.monotonic() + 60), _Rpc(None)):
        early = ResponseAdditions(_Session(), rpc)
        assert early.initial((), exceeded) == ()
        assert [tuple(item) for item in early.trailing((), (), exceeded)] == [
            ("set-cookie", "c=x; HttpOnly")
        ]
    # any other status once the deadline is over: the server's trailers-only
    other = ResponseAdditions(_Session(), _Rpc(time.monotonic() - 1))
    assert len(other.trailing((), (), grpc.StatusCode.UNAVAILABLE)) == 1


def test_a_call_the_application_cancelled_gets_no_cookie_and_a_server_sent_cancel_does():
    """As for the deadline: a call the application cancelled had no
    response (C-core: CANCELLED "Locally cancelled by application!" is no
    trailers-only response, its filter adds nothing); a CANCELLED the
    server sent (trailers-only) gets the cookie in its trailers
    (tests/e2e/test_differential_stateful_session.py runs both, the
    server's against C-core too).  Fails on the old code (the cookie came back
    after cancel())."""
    from pyxds.channel.response_metadata import ResponseAdditions

    cancelled = grpc.StatusCode.CANCELLED
    mine = ResponseAdditions(_Session(), _Rpc(None, cancelled=True))
    assert mine.trailing((), (), cancelled) == () and mine.initial((), cancelled) == ()
    theirs = ResponseAdditions(_Session(), _Rpc(None))
    assert len(theirs.trailing((), (), cancelled)) == 1
