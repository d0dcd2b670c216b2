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

from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2 as ss_pb2
from test_cds_support import connect_all, loc
from test_conformance_override_host import E0, E1, E2, fallback_picks, override_picks, plain_picks
from test_stateful_session_filter import md, selector
from test_xds_override_host import A, live, locality, tree

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.xds.resources import LISTENER
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
