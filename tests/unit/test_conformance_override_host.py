"""Conformance: xds_override_host_experimental (gRFC A55 stateful session
affinity, A60 for weighted clusters, A75 changes) against the scenarios of
C-core ``test/core/load_balancing/xds_override_host_test.cc``
(``XdsOverrideHostTest.*``) that tests/unit/test_xds_override_host.py does
not already show (the report /work/reports/conformwrr.md maps each source
test to its pyxds test).

Driven through the real cds -> xds_cluster_impl -> xds_override_host ->
priority -> round_robin tree on a FakeHelper (the harness of
test_xds_override_host.py), with the session attribute the stateful session
filter sets on each RPC.
"""

from __future__ import annotations

from test_cds_support import (
    CONNECTING,
    IDLE,
    READY,
    TF,
    build,
    cds_update,
    connect,
    connect_all,
    eds_cluster,
    eds_entry,
    xds_config,
)
from test_xds_override_host import A, live, locality, pick, picked, tree

from pyxds.lb import PickComplete, PickQueue

E0, E1, E2 = "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"
ALL_STATUSES = {"UNKNOWN", "HEALTHY", "DRAINING"}


def plain_picks(helper, n: int = 6) -> set[str]:
    """Where RPCs without a usable cookie go (their session learns it); RPCs
    without the session attribute (the picker's shortcut through the child's
    rotation) must go to the same endpoints."""
    seen = set()
    for _ in range(n):
        address, session = picked(helper, cookie="")
        assert session.actual_address_list == address
        seen.add(address)
    without = set()
    for _ in range(n):
        result, _ = pick(helper)
        assert isinstance(result, PickComplete), result
        without.add(result.subchannel.address)
    assert without == seen
    return seen


def override_picks(helper, cookie: str, expected: str, address_list: str | None = None) -> None:
    for _ in range(3):
        address, session = picked(helper, cookie=cookie)
        assert address == expected
        assert session.actual_address_list == (address_list or expected)


def fallback_picks(helper, cookie: str) -> set[str]:
    """Picks of a session whose cookie is not honoured: the child's, and the
    attribute names where each went."""
    seen = set()
    for _ in range(6):
        address, session = picked(helper, cookie=cookie)
        assert session.actual_address_list == address
        seen.add(address)
    return seen


def test_a_session_falls_back_while_its_host_is_gone_and_returns_when_it_is_back():
    """C-core XdsOverrideHostTest.SubchannelsComeAndGo."""
    helper, _policy, update = tree()
    update([locality(A, [E0, E1, E2])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    update([locality(A, [E0, E2])])
    assert fallback_picks(helper, E1) == {E0, E2}
    update([locality(A, [E1, E2])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    assert plain_picks(helper) == {E1, E2}


def test_a_session_queues_while_its_host_reconnects_and_falls_back_when_it_fails():
    """C-core XdsOverrideHostTest.OverrideIsQueuedInIdleOrConnectingAndFailedInTransientFailure."""
    helper, _policy, update = tree()
    update([locality(A, [E0, E1, E2])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    sc = helper.subchannel(E1)
    # (C-core's test also expects a re-resolution request: its child is
    # round_robin itself; here priority drops it for an EDS cluster, A37)
    sc.set_state(IDLE)
    assert sc.connect_calls >= 2  # round_robin reconnects it
    assert plain_picks(helper) == {E0, E2}
    assert isinstance(pick(helper, cookie=E1)[0], PickQueue)
    sc.set_state(CONNECTING)
    assert plain_picks(helper) == {E0, E2}
    assert isinstance(pick(helper, cookie=E1)[0], PickQueue)
    sc.set_state(TF)
    assert plain_picks(helper) == {E0, E2}
    assert fallback_picks(helper, E1) == {E0, E2}


def test_a_draining_hosts_sessions_follow_its_reconnection():
    """C-core XdsOverrideHostTest.DrainingSubchannelIsConnecting: the DRAINING
    host (kept for its session) goes IDLE: session picks queue and ask it to
    connect; CONNECTING queues; READY completes; other picks never use it."""
    helper, _policy, update = tree(statuses=ALL_STATUSES)
    update([locality(A, [E0, E1, E2])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    update([locality(A, [E0, (E1, "DRAINING"), (E2, "HEALTHY")])])
    override_picks(helper, E1, E1)
    assert plain_picks(helper) == {E0, E2}
    sc = helper.subchannel(E1)
    connects = sc.connect_calls
    sc.set_state(IDLE)
    assert plain_picks(helper) == {E0, E2}
    assert isinstance(pick(helper, cookie=E1)[0], PickQueue)
    helper.clock.advance(0)  # the picker's hop onto the serializer
    assert sc.connect_calls == connects + 1
    sc.set_state(CONNECTING)
    assert isinstance(pick(helper, cookie=E1)[0], PickQueue)
    assert plain_picks(helper) == {E0, E2}
    sc.set_state(READY)
    override_picks(helper, E1, E1)
    assert plain_picks(helper) == {E0, E2}


def test_a_host_back_from_draining_to_healthy_takes_new_sessions_again():
    """C-core XdsOverrideHostTest.DrainingToHealthy."""
    helper, _policy, update = tree(statuses=ALL_STATUSES)
    update([locality(A, [E0, E1, E2])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    update([locality(A, [E0, (E1, "DRAINING"), (E2, "HEALTHY")])])
    assert plain_picks(helper) == {E0, E2}
    override_picks(helper, E1, E1)
    update([locality(A, [(E0, "HEALTHY"), (E1, "HEALTHY"), (E2, "HEALTHY")])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    assert plain_picks(helper, 9) == {E0, E1, E2}


def tree_with_statuses(name: str = "c1"):
    """As test_xds_override_host.tree, with override_host_status given per update."""
    helper, policy, config = build([{"cds_experimental": {"cluster": name}}])

    def update(statuses, *priorities):
        cluster = eds_cluster(
            name,
            lb_policy_config='[{"round_robin": {}}]',
            override_host_statuses=frozenset(statuses),
        )
        entry = eds_entry(cluster, *priorities)
        assert policy.update(cds_update(config, xds_config({name: entry}))) is None

    return helper, policy, update


def test_each_health_status_is_honoured_only_while_in_override_host_status():
    """C-core XdsOverrideHostTest.OverrideHostStatus: UNKNOWN, HEALTHY and
    DRAINING endpoints, each status taken out of the set in turn (the
    DRAINING host kept for the session that used it)."""
    helper, _policy, update = tree_with_statuses()
    update(ALL_STATUSES, [locality(A, [E0, E1, E2])])
    connect_all(helper)
    override_picks(helper, E2, E2)  # used: kept when it turns DRAINING
    health = [(E0, "UNKNOWN"), (E1, "HEALTHY"), (E2, "DRAINING")]
    update(ALL_STATUSES, [locality(A, health)])
    assert plain_picks(helper) == {E0, E1}
    for address in (E0, E1, E2):
        override_picks(helper, address, address)
    for statuses, excluded in (
        ({"HEALTHY", "DRAINING"}, E0),
        ({"UNKNOWN", "DRAINING"}, E1),
        ({"UNKNOWN", "HEALTHY"}, E2),
    ):
        update(statuses, [locality(A, health)])
        assert plain_picks(helper) == {E0, E1}
        for address in (E0, E1, E2):
            if address == excluded:
                assert fallback_picks(helper, address) == {E0, E1}
            else:
                override_picks(helper, address, address)


def test_a_multi_address_cookie_follows_the_endpoint_to_its_other_address():
    """C-core XdsOverrideHostTest.MultipleAddressesPerEndpoint: once the
    endpoint is connected on its second address, the cookie of its address
    list picks that address and the list is rewritten to start with it."""
    a0, a1 = "10.0.1.1:443", "10.0.1.1:444"
    b0, b1 = "10.0.2.1:445", "10.0.2.1:446"
    helper, _policy, update = tree()
    update([locality(A, [((a0, a1), "UNKNOWN"), ((b0, b1), "UNKNOWN")])])
    connect(helper, a0)
    connect(helper, b0)
    override_picks(helper, f"{a0},{a1}", a0, f"{a0},{a1}")
    override_picks(helper, f"{b0},{b1}", b0, f"{b0},{b1}")
    first = helper.subchannel(a0)
    first.set_state(IDLE)  # the connection is lost; pick_first starts over
    first.set_state(CONNECTING)
    first.set_state(TF)  # ... and fails on the first address
    connect(helper, a1)
    assert {pick(helper)[0].subchannel.address for _ in range(4)} == {a1, b0}
    override_picks(helper, f"{a0},{a1}", a1, f"{a1},{a0}")


def test_a_draining_host_the_child_never_used_is_connected_for_its_session():
    """C-core XdsOverrideHostTest.ChildPolicyNeverCreatedSubchannel: a DRAINING
    endpoint is not given to the child; a session naming it queues, gets a
    subchannel and a connection, and completes once READY."""
    helper, _policy, update = tree(statuses=ALL_STATUSES)
    update([locality(A, [(E0, "UNKNOWN"), (E1, "DRAINING"), (E2, "HEALTHY")])])
    connect_all(helper)
    assert live(helper, E1) == []
    assert plain_picks(helper) == {E0, E2}
    assert isinstance(pick(helper, cookie=E1)[0], PickQueue)
    helper.clock.advance(0)  # the picker's hop: create (and connect)
    (sc,) = live(helper, E1)
    assert plain_picks(helper) == {E0, E2}
    assert isinstance(pick(helper, cookie=E1)[0], PickQueue)
    helper.clock.advance(0)
    assert sc.connect_calls >= 1
    sc.set_state(CONNECTING)
    assert plain_picks(helper) == {E0, E2}
    assert isinstance(pick(helper, cookie=E1)[0], PickQueue)
    sc.set_state(READY)
    assert plain_picks(helper) == {E0, E2}
    override_picks(helper, E1, E1)


def test_a_draining_host_no_session_used_is_let_go():
    """C-core XdsOverrideHostTest.ChildPolicyUnrefsSubchannelNotUsedWithinIdleThreshold."""
    helper, _policy, update = tree(statuses=ALL_STATUSES, idle_timeout=60.0)
    update([locality(A, [E0, E1, E2])])
    connect_all(helper)
    helper.clock.advance(61.0)  # no session used E1 within the idle timeout
    update([locality(A, [(E0, "UNKNOWN"), (E1, "DRAINING"), (E2, "HEALTHY")])])
    assert plain_picks(helper) == {E0, E2}
    assert live(helper, E0) and live(helper, E2)
    assert live(helper, E1) == []


def test_owned_hosts_are_closed_one_idle_timeout_after_their_last_session_pick():
    """C-core XdsOverrideHostTest.IdleTimer (idle timeout 1 min): two DRAINING
    hosts kept for their sessions; the one picked again stays, the other is
    closed once idle for the timeout, then the first one too."""
    helper, _policy, update = tree(statuses=ALL_STATUSES, idle_timeout=60.0)
    update([locality(A, [E0, E1, E2])])
    connect_all(helper)
    override_picks(helper, E1, E1)
    override_picks(helper, E2, E2)
    helper.clock.advance(5.0)
    update([locality(A, [(E0, "UNKNOWN"), (E1, "DRAINING"), (E2, "DRAINING")])])
    assert plain_picks(helper) == {E0}
    override_picks(helper, E1, E1)  # at t=5
    helper.clock.advance(54.0)  # t=59: E2 idle for 59 s
    assert len(live(helper, E1)) == 1 and len(live(helper, E2)) == 1
    helper.clock.advance(1.0)  # t=60: E2 idle for the timeout
    assert live(helper, E2) == []
    assert len(live(helper, E1)) == 1
    helper.clock.advance(4.9)  # t=64.9: E1 idle for 59.9 s
    assert len(live(helper, E1)) == 1
    helper.clock.advance(5.2)  # t=70.1 (sweeps at least 5 s apart)
    assert live(helper, E1) == []
