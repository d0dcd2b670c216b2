"""Conformance: round_robin against the scenarios of the reference suites
(C-core test/core/load_balancing/round_robin_test.cc, grpc-java
RoundRobinLoadBalancerTest, grpc-go balancer/roundrobin tests) and A61
("create a pick_first child policy for each endpoint").

The TRANSIENT_FAILURE text is the one grpcio 1.85.1 prints for a
round_robin channel whose backends refuse connections
("connections to all backends failing; last error: UNKNOWN:
ipv4:127.0.0.1:2: Failed to connect to remote host: Connection refused"),
i.e. the prefix, then the failing subchannel's ``CODE: details``.
"""

from __future__ import annotations

import collections

import grpc

from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    PickComplete,
    PickFail,
    PickQueue,
    ResolverUpdate,
    Status,
)
from pyxds.lb.pick_first import CONNECTION_ATTEMPT_DELAY
from pyxds.lb.round_robin import RoundRobin, RoundRobinConfig
from pyxds.testing import FakeHelper, FakeSubchannel

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

A, B, C = "127.0.0.1:441", "127.0.0.1:442", "127.0.0.1:443"


def eps(*addresses: str) -> list[Endpoint]:
    return [Endpoint((a,)) for a in addresses]


def update(policy: RoundRobin, endpoints) -> Status | None:
    return policy.update(ResolverUpdate(endpoints, RoundRobinConfig()))


def make(endpoints, seed: int = 0) -> tuple[RoundRobin, FakeHelper]:
    helper = FakeHelper(seed=seed)
    policy = RoundRobin(helper)
    assert update(policy, endpoints) is None
    return policy, helper


def sc(helper: FakeHelper, address: str) -> FakeSubchannel:
    return helper.subchannel(address)


def picks(helper: FakeHelper, n: int) -> list[str]:
    out = []
    for _ in range(n):
        result = helper.pick()
        assert isinstance(result, PickComplete), result
        out.append(result.subchannel.address)
    return out


def fail(helper: FakeHelper, address: str, text: str = "ugh") -> None:
    sc(helper, address).set_state(CONNECTING)
    sc(helper, address).set_state(TF, text)


def test_basic_startup_connects_every_endpoint_and_rotates_evenly():
    """C-core RoundRobinTest.Basic."""
    _policy, helper = make(eps(A, B, C))
    assert all(sc(helper, a).connect_calls == 1 for a in (A, B, C))
    assert helper.state is CONNECTING and isinstance(helper.pick(), PickQueue)
    sc(helper, A).set_state(READY)
    assert set(picks(helper, 4)) == {A}
    sc(helper, B).set_state(READY)
    sc(helper, C).set_state(READY)
    counts = collections.Counter(picks(helper, 300))
    assert counts == {A: 100, B: 100, C: 100}


def test_address_updates_remove_and_readd_endpoints():
    """C-core RoundRobinTest.AddressUpdates."""
    policy, helper = make(eps(A, B, C))
    for a in (A, B, C):
        sc(helper, a).set_state(READY)
    update(policy, eps(A, B))
    assert helper.subchannel(C, live=False).shut_down
    assert set(picks(helper, 6)) == {A, B}
    update(policy, eps(B, C))
    assert helper.subchannel(A, live=False).shut_down
    assert set(picks(helper, 6)) == {B}  # the new C is still connecting
    new_c = sc(helper, C)
    assert new_c.connect_calls == 1
    new_c.set_state(READY)
    assert set(picks(helper, 6)) == {B, C}


def test_multiple_addresses_per_endpoint_use_one_connection_each():
    """C-core RoundRobinTest.MultipleAddressesPerEndpoint (A61: a pick_first
    child per endpoint)."""
    e1 = ("127.0.0.1:443", "127.0.0.1:444")
    e2 = ("127.0.0.1:445", "127.0.0.1:446")
    _policy, helper = make([Endpoint(e1), Endpoint(e2)])
    s10, s11, s20, s21 = (sc(helper, a) for a in (*e1, *e2))
    assert (s10.connect_calls, s11.connect_calls) == (1, 0)
    assert (s20.connect_calls, s21.connect_calls) == (1, 0)
    s10.set_state(CONNECTING)
    assert helper.state is CONNECTING
    s20.set_state(CONNECTING)
    s10.set_state(TF, "ugh")
    assert s11.connect_calls == 1  # pick_first moves to the endpoint's next address
    s11.set_state(CONNECTING)
    s20.set_state(READY)
    assert set(picks(helper, 4)) == {e2[0]}
    s11.set_state(READY)
    assert set(picks(helper, 4)) == {e1[1], e2[0]}
    assert [s.connect_calls for s in (s10, s11, s20, s21)] == [1, 1, 1, 0]
    # endpoint 1 switches to its other address: its connection drops, it
    # leaves the rotation, reconnects at once (IDLE -> exit_idle) and is back
    s10 = helper.subchannel(e1[0], live=False)
    assert s10.shut_down  # pick_first let it go once e1[1] was selected
    s11.set_state(IDLE)
    assert set(picks(helper, 4)) == {e2[0]}
    new_s10 = sc(helper, e1[0])
    assert new_s10.connect_calls == 1
    new_s10.set_state(CONNECTING)
    new_s10.set_state(READY)
    assert set(picks(helper, 4)) == {e1[0], e2[0]}


def test_dual_stack_endpoint_gets_one_share_of_the_load():
    """A61: "the LB policy to use only one of the addresses for each endpoint
    at any given time" -- a v6+v4 endpoint is one backend, not two."""
    dual = Endpoint(("[2001:db8::1]:80", "10.0.0.1:80"))
    _policy, helper = make([dual, Endpoint(("10.0.0.2:80",))])
    sc(helper, "[2001:db8::1]:80").set_state(READY)
    sc(helper, "10.0.0.2:80").set_state(READY)
    assert helper.subchannel("10.0.0.1:80", live=False).connect_calls == 0
    counts = collections.Counter(picks(helper, 200))
    assert counts == {"[2001:db8::1]:80": 100, "10.0.0.2:80": 100}


def test_dual_stack_endpoint_happy_eyeballs_inside_round_robin():
    """A61 Happy Eyeballs applies to each endpoint's addresses: the second
    address starts after the 250 ms Connection Attempt Delay."""
    dual = Endpoint(("[2001:db8::1]:80", "10.0.0.1:80"))
    _policy, helper = make([dual])
    v6, v4 = sc(helper, "[2001:db8::1]:80"), sc(helper, "10.0.0.1:80")
    v6.set_state(CONNECTING)
    assert v4.connect_calls == 0
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    assert v4.connect_calls == 1
    v4.set_state(READY)
    assert set(picks(helper, 3)) == {"10.0.0.1:80"}
    assert helper.subchannel("[2001:db8::1]:80", live=False).shut_down


def test_connection_attempts_start_from_a_random_endpoint():
    """C-core RoundRobinTest.StartsConnectingFromRandomIndex."""
    starts = set()
    for seed in range(20):
        helper = FakeHelper(seed=seed)
        update(RoundRobin(helper), eps(A, B, C))
        order = [s.address for s in helper.subchannels]
        assert order in ([A, B, C], [B, C, A], [C, A, B])  # a rotation
        starts.add(order[0])
    assert starts == {A, B, C}


def test_picker_starts_at_a_random_ready_endpoint():
    """C-core RoundRobin::Picker: random starting index (grpc-go#2580)."""
    firsts = set()
    for seed in range(30):
        _policy, helper = make(eps(A, B, C), seed=seed)
        for a in (A, B, C):
            sc(helper, a).set_state(READY)
        firsts.add(picks(helper, 1)[0])
    assert firsts == {A, B, C}


def test_all_endpoints_failing_reports_tf_in_c_core_words():
    """C-core MaybeUpdateRoundRobinConnectivityStateLocked: "connections to
    all backends failing; last error: " + the failing child's message
    (pick_first under round_robin omits its own prefix)."""
    _policy, helper = make(eps(A, B))
    fail(helper, A, "first")
    assert helper.state is CONNECTING  # B has not failed yet
    fail(helper, B, f"ipv4:{B}: Failed to connect to remote host: Connection refused")
    assert helper.state is TF
    expected = Status(
        UNAVAILABLE,
        "connections to all backends failing; last error: UNAVAILABLE: "
        f"ipv4:{B}: Failed to connect to remote host: Connection refused",
    )
    assert helper.last.status == expected
    result = helper.pick()
    assert isinstance(result, PickFail) and result.status == expected


def test_transient_failure_is_sticky_until_an_endpoint_is_ready():
    """grpc-java RoundRobinLoadBalancerTest.stayTransientFailureUntilReady;
    A62 sticky TF through the children's reconnect attempts."""
    _policy, helper = make(eps(A, B))
    fail(helper, A)
    fail(helper, B)
    assert helper.state is TF
    for a in (A, B):
        sc(helper, a).set_state(IDLE)
        assert sc(helper, a).connect_calls == 2  # reconnects at once
        sc(helper, a).set_state(CONNECTING)
    assert helper.state_sequence()[-1] is TF
    assert CONNECTING not in helper.state_sequence()[helper.state_sequence().index(TF) :]
    sc(helper, B).set_state(READY)
    assert helper.state is READY and set(picks(helper, 3)) == {B}


def test_tf_error_is_refreshed_by_later_failures():
    """C-core: each TRANSIENT_FAILURE report of a child replaces last_failure_."""
    _policy, helper = make(eps(A))
    fail(helper, A, "one")
    sc(helper, A).set_state(IDLE)
    sc(helper, A).set_state(CONNECTING)
    sc(helper, A).set_state(TF, "two")
    assert helper.last.status.details.endswith("UNAVAILABLE: two")


def test_ready_endpoint_dropping_reconnects_at_once_and_requests_reresolution():
    """grpc-java refreshNameResolutionWhenSubchannelConnectionBroken;
    TRAPS grpc-node#2667 (READY -> IDLE must reconnect)."""
    _policy, helper = make(eps(A, B))
    sc(helper, A).set_state(READY)
    sc(helper, B).set_state(READY)
    sc(helper, A).set_state(IDLE)
    assert helper.reresolution_requests == 1
    assert sc(helper, A).connect_calls == 2
    assert set(picks(helper, 4)) == {B}
    assert helper.state is READY


def test_failing_endpoint_requests_reresolution():
    """grpc-go TestRoundRobin_AllServersDown / C-core: a child whose
    addresses all failed requests re-resolution."""
    _policy, helper = make(eps(A, B))
    fail(helper, A)
    assert helper.reresolution_requests == 1
    fail(helper, B)
    assert helper.reresolution_requests == 2


def test_new_endpoint_while_in_tf_reports_connecting():
    """C-core: any child CONNECTING (a new endpoint's first pass) makes the
    policy CONNECTING; the failing ones stay TRANSIENT_FAILURE."""
    policy, helper = make(eps(A))
    fail(helper, A)
    assert helper.state is TF
    update(policy, eps(A, B))
    assert helper.state is CONNECTING
    fail(helper, B)
    assert helper.state is TF


def test_resolver_error_without_endpoints_reports_tf_with_the_error():
    """grpc-java nameResolutionErrorWithNoChannels; C-core UpdateLocked."""
    helper = FakeHelper()
    policy = RoundRobin(helper)
    error = Status(UNAVAILABLE, "no such host")
    assert policy.update(ResolverUpdate(error, RoundRobinConfig())) == error
    assert helper.state is TF and helper.last.status == error


def test_resolver_error_with_endpoints_keeps_serving():
    """grpc-java nameResolutionErrorWithActiveChannels; C-core: "If we already
    have a child list, then keep using the existing list"."""
    policy, helper = make(eps(A))
    sc(helper, A).set_state(READY)
    policy.resolver_error(Status(UNAVAILABLE, "no such host"))
    assert helper.state is READY and set(picks(helper, 2)) == {A}


def test_empty_update_is_rejected_with_tf():
    """C-core: "empty address list" TRANSIENT_FAILURE, status returned."""
    policy, helper = make(eps(A))
    status = update(policy, [])
    assert status is not None and status.details.startswith("empty address list")
    assert helper.state is TF and helper.last.status == status
    assert helper.subchannel(A, live=False).shut_down


def test_same_list_twice_is_a_no_op():
    """TRAPS grpc-java#12213: an unchanged update restarts nothing."""
    policy, helper = make([Endpoint(("[::1]:1", "10.0.0.1:1")), *eps(A)])
    sc(helper, A).set_state(READY)
    before = (len(helper.states), len(helper.subchannels), helper.reresolution_requests)
    update(policy, [Endpoint(("[::1]:1", "10.0.0.1:1")), *eps(A)])
    assert (len(helper.states), len(helper.subchannels), helper.reresolution_requests) == before


def test_reordered_addresses_of_a_connected_endpoint_keep_the_connection():
    """A61/C-core: an endpoint's child keeps its connection when its address
    is still listed (pick_first: connected address in the new list)."""
    policy, helper = make([Endpoint(("[::1]:1", "10.0.0.1:1"))])
    v6 = sc(helper, "[::1]:1")
    v6.set_state(READY)
    update(policy, [Endpoint(("10.0.0.1:1", "[::1]:1"))])
    assert not v6.shut_down and set(picks(helper, 2)) == {"[::1]:1"}


def test_endpoint_gaining_an_address_keeps_its_connection():
    """C-core keeps subchannels of addresses present in both lists (its
    subchannel pool): an endpoint {a} becoming {a, a'} stays connected."""
    policy, helper = make(eps(A, B))
    sc(helper, A).set_state(READY)
    sc(helper, B).set_state(READY)
    update(policy, [Endpoint((A, "127.0.0.1:999")), *eps(B)])
    assert not sc(helper, A).shut_down
    assert set(picks(helper, 4)) == {A, B}


def test_address_listed_in_two_endpoints_is_connected_once():
    """pyxds: an address is connected once; the first endpoint listing it
    owns it."""
    policy, helper = make([Endpoint((A, B)), Endpoint((B,)), Endpoint((C,))])
    assert sorted(s.address for s in helper.subchannels) == sorted([A, B, C])
    assert len(policy.children) == 2


def test_exit_idle_and_reset_backoff_reach_every_endpoint():
    """LB API: exit_idle / reset_backoff are forwarded to the children."""
    policy, helper = make(eps(A, B))
    policy.reset_backoff()
    assert all(s.reset_backoff_calls == 1 for s in helper.live_subchannels())


def test_shutdown_shuts_every_subchannel_down_and_ignores_late_reports():
    """Reports from children after shutdown change nothing."""
    policy, helper = make(eps(A, B))
    subchannels = list(helper.subchannels)
    policy.shutdown()
    assert all(s.shut_down for s in subchannels)
    n = len(helper.states)
    for s in subchannels:
        s.set_state(READY)
    assert len(helper.states) == n


def test_goaway_on_the_only_endpoint_queues_rpcs_instead_of_failing_them():
    """TRAPS grpc#29428: a GOAWAY / max-connection-age (READY -> IDLE) is
    not a failure: round_robin reconnects and reports CONNECTING, so queued
    RPCs wait rather than fail."""
    _policy, helper = make(eps(A))
    sc(helper, A).set_state(READY)
    sc(helper, A).set_state(IDLE)
    assert helper.state is CONNECTING and isinstance(helper.pick(), PickQueue)
    assert TF not in helper.state_sequence()
    assert sc(helper, A).connect_calls == 2
    sc(helper, A).set_state(CONNECTING)
    sc(helper, A).set_state(READY)
    assert set(picks(helper, 2)) == {A}


def test_update_changing_an_endpoint_address_set_keeps_the_shared_connection_serving():
    """A61: an endpoint {a, b} becoming {b, c} keeps the child (and its
    connection to b) when b was the selected address."""
    policy, helper = make([Endpoint((A, B))])
    sc(helper, A).set_state(TF, "a down")
    sc(helper, B).set_state(READY)
    update(policy, [Endpoint((B, C))])
    b = sc(helper, B)
    assert not b.shut_down and set(picks(helper, 3)) == {B}
    assert helper.state is READY


def test_resolver_error_after_an_empty_list_keeps_the_empty_list_error():
    """C-core RoundRobin::UpdateLocked: once any list was applied (the empty
    one included), a resolver error keeps the existing list and its state."""
    policy, helper = make(eps(A))
    status = update(policy, [])
    n = len(helper.states)
    policy.resolver_error(Status(UNAVAILABLE, "resolver down"))
    assert len(helper.states) == n and helper.last.status == status


def test_update_without_a_ready_endpoint_keeps_serving_on_the_old_ones_until_a_new_is_ready():
    """C-core RoundRobin::MaybeUpdateRoundRobinConnectivityStateLocked: the
    pending endpoint list replaces the serving one only once it has a READY
    endpoint (or all its endpoints failed, or the old list has no READY one
    left); until then picks keep going to the old READY endpoints."""
    policy, helper = make(eps(A))
    sc(helper, A).set_state(READY)
    update(policy, eps(B, C))
    assert helper.state is READY and set(picks(helper, 4)) == {A}
    assert not sc(helper, A).shut_down
    assert sc(helper, B).connect_calls == 1 and sc(helper, C).connect_calls == 1
    sc(helper, B).set_state(CONNECTING)
    assert set(picks(helper, 4)) == {A}
    sc(helper, B).set_state(READY)
    assert helper.state is READY and set(picks(helper, 4)) == {B}
    assert helper.subchannel(A, live=False).shut_down
    assert A not in {s.address for s in policy.subchannels}


def test_old_endpoints_are_dropped_when_every_new_endpoint_fails():
    """C-core: a pending list whose endpoints are all in TRANSIENT_FAILURE
    replaces the serving one ("we're doing what the control plane told us
    to do"), so the policy reports TRANSIENT_FAILURE."""
    policy, helper = make(eps(A))
    sc(helper, A).set_state(READY)
    update(policy, eps(B, C))
    sc(helper, B).set_state(TF, "b down")
    assert set(picks(helper, 2)) == {A}
    sc(helper, C).set_state(TF, "c down")
    assert helper.state is TF
    assert helper.last.status.details.startswith("connections to all backends failing")
    assert helper.subchannel(A, live=False).shut_down


def test_old_endpoint_leaving_ready_while_the_new_list_connects_is_dropped():
    """C-core: once the serving list has no READY endpoint the pending list
    takes over at once; the old endpoint is not reconnected."""
    policy, helper = make(eps(A))
    sc(helper, A).set_state(READY)
    update(policy, eps(B))
    a = sc(helper, A)
    a.set_state(IDLE)
    assert a.shut_down and a.connect_calls == 1
    assert helper.state is CONNECTING and isinstance(helper.pick(), PickQueue)
    sc(helper, B).set_state(READY)
    assert set(picks(helper, 2)) == {B}


def test_old_endpoints_are_shut_down_with_the_policy_and_ignore_exit_idle():
    policy, helper = make(eps(A))
    sc(helper, A).set_state(READY)
    update(policy, eps(B))
    policy.exit_idle()
    assert sc(helper, A).connect_calls == 1
    policy.shutdown()
    assert all(s.shut_down for s in helper.subchannels)
