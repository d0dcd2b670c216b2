"""Conformance: pick_first against the scenarios of the reference suites
(C-core test/core/load_balancing/pick_first_test.cc, grpc-go
pickfirstleaf tests, grpc-java PickFirstLeafLoadBalancerTest) and the
sentences of A62 / A61.

C-core shares subchannels between channels (A61 "Implications of Subchannel
Sharing in C-core"), so its tests hand pick_first subchannels that already
are in TRANSIENT_FAILURE or CONNECTING.  :class:`PooledHelper` does the same
with fake subchannels.
"""

from __future__ import annotations

import random

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
from pyxds.lb.pick_first import (
    CONNECTION_ATTEMPT_DELAY,
    PickFirst,
    PickFirstConfig,
    order_addresses,
)
from pyxds.testing import FakeHelper, FakeSubchannel

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

A, B, C, D = "127.0.0.1:443", "127.0.0.1:444", "127.0.0.1:445", "127.0.0.1:446"
ALL_FAILED = "failed to connect to all addresses; last error: UNAVAILABLE: failed to connect"


class PooledHelper(FakeHelper):
    """A FakeHelper whose subchannels may exist before the policy asks for
    them, in any state (C-core's subchannel pool)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._pool: dict[str, FakeSubchannel] = {}

    def preset(self, address: str, state: ConnectivityState, text: str = "") -> FakeSubchannel:
        sc = FakeSubchannel(address)
        sc.set_state(state, text or None)
        self._pool[address] = sc
        return sc

    def create_subchannel(self, address, attributes):
        sc = self._pool.pop(address, None)
        if sc is None:
            return super().create_subchannel(address, attributes)
        self.subchannels.append(sc)
        return sc


def eps(*addresses: str) -> list[Endpoint]:
    return [Endpoint((a,)) for a in addresses]


def update(policy: PickFirst, endpoints, shuffle: bool = False) -> Status | None:
    return policy.update(ResolverUpdate(endpoints, PickFirstConfig(shuffle)))


def make(*addresses: str, helper: FakeHelper | None = None) -> tuple[PickFirst, FakeHelper]:
    helper = helper or FakeHelper()
    policy = PickFirst(helper)
    assert update(policy, eps(*addresses)) is None
    return policy, helper


def sc(helper: FakeHelper, address: str) -> FakeSubchannel:
    return helper.subchannel(address)


def fail(helper: FakeHelper, address: str, text: str = "failed to connect") -> None:
    sc(helper, address).set_state(TF, text)


def picked(helper: FakeHelper) -> str:
    result = helper.pick()
    assert isinstance(result, PickComplete), result
    return result.subchannel.address


# -- the first pass (C-core FirstAddressWorks / FirstAddressFails) -------------


def test_only_the_first_address_is_asked_to_connect_and_wins():
    """C-core PickFirstTest.FirstAddressWorks."""
    _policy, helper = make(A, B)
    assert sc(helper, A).connect_calls == 1 and sc(helper, B).connect_calls == 0
    sc(helper, A).set_state(CONNECTING)
    assert helper.state is CONNECTING and isinstance(helper.pick(), PickQueue)
    assert sc(helper, B).connect_calls == 0
    sc(helper, A).set_state(READY)
    assert helper.state is READY
    assert [picked(helper) for _ in range(3)] == [A, A, A]
    assert helper.subchannel(B, live=False).shut_down


def test_failure_of_the_first_address_starts_the_second_at_once():
    """C-core PickFirstTest.FirstAddressFails."""
    _policy, helper = make(A, B)
    sc(helper, A).set_state(CONNECTING)
    fail(helper, A)
    assert sc(helper, B).connect_calls == 1
    assert helper.clock.now() == 0.0
    sc(helper, B).set_state(CONNECTING)
    sc(helper, B).set_state(READY)
    assert [picked(helper) for _ in range(3)] == [B, B, B]
    assert TF not in helper.state_sequence()


def test_endpoints_are_flattened_in_order():
    """C-core PickFirstTest.FlattensEndpointAddressesList."""
    helper = FakeHelper()
    policy = PickFirst(helper)
    update(policy, [Endpoint((A, B)), Endpoint((C,))])
    assert [s.address for s in helper.subchannels] == [A, B, C]
    fail(helper, A)
    assert sc(helper, B).connect_calls == 1 and sc(helper, C).connect_calls == 0
    fail(helper, B)
    assert sc(helper, C).connect_calls == 1
    sc(helper, C).set_state(READY)
    assert picked(helper) == C


def test_addresses_already_failing_are_skipped_and_the_next_idle_one_connects():
    """C-core PickFirstTest.FirstTwoAddressesInTransientFailureAtStart."""
    helper = PooledHelper()
    a = helper.preset(A, TF, "failed to connect")
    b = helper.preset(B, TF, "failed to connect")
    _policy, _ = make(A, B, C, helper=helper)
    assert a.connect_calls == 0 and b.connect_calls == 0
    assert sc(helper, C).connect_calls == 1
    assert helper.state is CONNECTING
    sc(helper, C).set_state(READY)
    assert picked(helper) == C


def test_all_addresses_failing_at_start_reports_tf_at_once_then_reconnects_on_idle():
    """C-core PickFirstTest.AllAddressesInTransientFailureAtStart."""
    helper = PooledHelper()
    a = helper.preset(A, TF, "failed to connect")
    b = helper.preset(B, TF, "failed to connect")
    _policy, _ = make(A, B, helper=helper)
    assert helper.reresolution_requests == 1
    assert helper.state_sequence() == [TF]
    assert helper.last.status == Status(UNAVAILABLE, ALL_FAILED)
    assert isinstance(helper.pick(), PickFail)
    assert a.connect_calls == 0 and b.connect_calls == 0
    a.set_state(IDLE)
    assert a.connect_calls == 1
    a.set_state(CONNECTING)
    assert helper.state_sequence() == [TF]  # sticky: no CONNECTING
    a.set_state(READY)
    assert helper.state is READY and picked(helper) == A


def test_tf_stays_sticky_across_an_address_list_update_and_new_address_connects():
    """C-core PickFirstTest.StaysInTransientFailureAfterAddressListUpdate."""
    helper = PooledHelper()
    helper.preset(A, TF, "failed to connect")
    helper.preset(B, TF, "failed to connect")
    policy, _ = make(A, B, helper=helper)
    assert helper.state is TF
    assert update(policy, eps(A, C)) is None
    c = sc(helper, C)
    assert c.connect_calls == 1
    c.set_state(CONNECTING)
    assert helper.state_sequence() == [TF]
    c.set_state(READY)
    assert helper.state_sequence() == [TF, READY] and picked(helper) == C


def test_update_after_exit_idle_connects_only_the_new_first_address():
    """C-core PickFirstTest.ResolverUpdateBeforeLeavingIdle."""
    policy, helper = make(A, B)
    sc(helper, A).set_state(READY)
    sc(helper, A).set_state(IDLE)
    assert helper.state is IDLE and helper.reresolution_requests == 1
    policy.exit_idle()
    assert update(policy, eps(C, D)) is None
    assert sc(helper, C).connect_calls == 1 and sc(helper, D).connect_calls == 0
    assert helper.subchannel(B, live=False).shut_down
    sc(helper, C).set_state(CONNECTING)
    sc(helper, C).set_state(READY)
    assert picked(helper) == C


# -- happy eyeballs (A61) ------------------------------------------------------


def test_happy_eyeballs_timer_starts_next_attempt_and_failure_skips_the_wait():
    """C-core PickFirstTest.HappyEyeballs; A61 "If the timer fires before the
    connection attempt completes, we will start a connection attempt on the
    next address in the list"."""
    policy, helper = make(A, B, C)
    sc(helper, A).set_state(CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY - 0.001)
    assert sc(helper, B).connect_calls == 0
    helper.clock.advance(0.001)
    assert sc(helper, B).connect_calls == 1
    sc(helper, B).set_state(CONNECTING)
    fail(helper, B)
    assert sc(helper, C).connect_calls == 1  # at once, no 250 ms wait
    sc(helper, C).set_state(CONNECTING)
    assert not policy.timer_pending  # no timer for the last address
    helper.clock.advance(10)
    assert sc(helper, A).connect_calls == 1  # the first attempt was not interrupted
    sc(helper, A).set_state(READY)
    assert picked(helper) == A
    assert helper.subchannel(C, live=False).shut_down


def test_ready_cancels_the_happy_eyeballs_timer():
    """A61 "If there is a timer running, we cancel the timer"."""
    policy, helper = make(A, B)
    sc(helper, A).set_state(CONNECTING)
    assert policy.timer_pending
    sc(helper, A).set_state(READY)
    assert not policy.timer_pending
    helper.clock.advance(1)
    assert helper.subchannel(B, live=False).connect_calls == 0


def test_happy_eyeballs_pass_completes_only_when_every_address_failed_then_counts_failures():
    """C-core PickFirstTest.HappyEyeballsCompletesWithoutSuccess."""
    _policy, helper = make(A, B, C)
    a, b, c = sc(helper, A), sc(helper, B), sc(helper, C)
    a.set_state(CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    b.set_state(CONNECTING)
    fail(helper, B)
    assert c.connect_calls == 1
    c.set_state(CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    b.set_state(IDLE)  # b's backoff ends before the pass is over
    assert b.connect_calls == 1  # not yet: still in the first pass
    fail(helper, C)
    assert helper.state_sequence() == [CONNECTING]  # a is still trying
    assert helper.reresolution_requests == 0
    fail(helper, A)
    assert helper.reresolution_requests == 1
    assert helper.state_sequence() == [CONNECTING, TF]
    assert helper.last.status == Status(UNAVAILABLE, ALL_FAILED)
    # now every subchannel connects as soon as it is IDLE: b already is
    assert (a.connect_calls, b.connect_calls, c.connect_calls) == (1, 2, 1)
    b.set_state(CONNECTING)
    a.set_state(IDLE)
    assert a.connect_calls == 2
    a.set_state(CONNECTING)
    fail(helper, A)  # failure 1 after the pass
    c.set_state(IDLE)
    assert c.connect_calls == 2
    c.set_state(CONNECTING)
    fail(helper, B)  # failure 2
    assert helper.reresolution_requests == 1 and len(helper.states) == 2
    fail(helper, C, "c refused")  # failure 3 == number of subchannels
    assert helper.reresolution_requests == 2
    assert helper.state_sequence() == [CONNECTING, TF, TF]
    assert helper.last.status.details.endswith("UNAVAILABLE: c refused")
    b.set_state(IDLE)
    assert b.connect_calls == 3
    b.set_state(CONNECTING)
    b.set_state(READY)
    assert helper.state_sequence() == [CONNECTING, TF, TF, READY] and picked(helper) == B


def test_address_failing_at_start_but_idle_when_reached_is_tried():
    """grpc#38714: a subchannel reported TRANSIENT_FAILURE first and was IDLE
    by the time the pass reached it; the pass must connect it (with the
    timer), not count the old failure."""
    helper = PooledHelper()
    b = helper.preset(B, TF, "failed to connect")
    policy, _ = make(A, B, C, helper=helper)
    a = sc(helper, A)
    b.set_state(IDLE)  # backoff over before the pass gets there
    assert b.connect_calls == 0
    fail(helper, A)
    assert b.connect_calls == 1  # tried when reached
    assert policy.timer_pending  # and it is not the last address
    assert sc(helper, C).connect_calls == 0
    b.set_state(CONNECTING)
    fail(helper, B)
    assert sc(helper, C).connect_calls == 1
    fail(helper, C)
    assert helper.state_sequence() == [CONNECTING, TF]
    assert a.connect_calls == 1


def test_address_that_fails_ahead_of_the_pass_is_still_tried_when_reached():
    """grpc#40162: a subchannel was CONNECTING (another channel's attempt),
    failed and went back to IDLE before the pass reached it.  Its failure
    must not count for the pass, so the policy keeps connecting and reports
    TRANSIENT_FAILURE only after the pass tried it."""
    helper = PooledHelper()
    b = helper.preset(B, CONNECTING)
    _policy, _ = make(A, B, helper=helper)
    b.set_state(TF, "failed to connect")
    b.set_state(IDLE)
    fail(helper, A)
    assert helper.state_sequence() == [CONNECTING]  # the pass has not tried b
    assert b.connect_calls == 1
    b.set_state(CONNECTING)
    fail(helper, B)
    assert helper.state_sequence() == [CONNECTING, TF]
    assert helper.reresolution_requests == 1
    # and connecting goes on after the pass: no stall
    b.set_state(IDLE)
    assert b.connect_calls == 2


def test_address_connecting_when_reached_counts_as_an_attempt_with_a_timer():
    """A61: "If the subchannel is in state CONNECTING, we do not need to
    actually request a connection, but we will treat it as if we did"."""
    helper = PooledHelper()
    a = helper.preset(A, CONNECTING)
    policy, _ = make(A, B, helper=helper)
    assert a.connect_calls == 0
    assert policy.timer_pending
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    assert sc(helper, B).connect_calls == 1


def test_subchannel_ready_at_start_is_selected_without_connecting_anything():
    """A61 "pick_first needs to be prepared for any subchannel to report
    READY at any time"."""
    helper = PooledHelper()
    helper.preset(B, READY)
    policy, _ = make(A, B, helper=helper)
    assert helper.state_sequence() == [READY] and picked(helper) == B
    assert helper.subchannel(A, live=False).shut_down
    assert not policy.timer_pending


def test_subchannel_ahead_of_the_pass_becoming_ready_wins():
    """A61: the first subchannel to report READY is chosen, even one the
    policy did not ask to connect."""
    _policy, helper = make(A, B, C)
    sc(helper, C).set_state(READY)
    assert picked(helper) == C
    assert helper.subchannel(A, live=False).shut_down


# -- sticky TRANSIENT_FAILURE and re-resolution (A62, TRAPS grpc-node#2602) ----


def test_reresolution_is_requested_every_time_each_address_has_failed_once_more():
    """grpc-node#2602 / A61 "when that number reaches the number of
    subchannels, we will request re-resolution" -- every time, not once."""
    _policy, helper = make(A, B)
    fail(helper, A)
    fail(helper, B)
    assert helper.reresolution_requests == 1
    for round_ in range(2, 6):
        for address in (A, B):
            sc(helper, address).set_state(IDLE)
            sc(helper, address).set_state(CONNECTING)
            fail(helper, address, f"round {round_}")
        assert helper.reresolution_requests == round_
    assert set(helper.state_sequence()[1:]) == {TF}
    assert CONNECTING not in helper.state_sequence()[1:]


def test_tf_picker_fails_non_wait_for_ready_rpcs_with_the_last_error():
    """A62: "Reporting TRANSIENT_FAILURE as the connectivity state" with a
    picker that fails RPCs; the text is C-core's."""
    _policy, helper = make(A, B)
    fail(helper, A, "first")
    fail(helper, B, "second")
    result = helper.pick()
    assert isinstance(result, PickFail)
    assert result.status == Status(
        UNAVAILABLE, "failed to connect to all addresses; last error: UNAVAILABLE: second"
    )


# -- IDLE after READY ----------------------------------------------------------


def test_connection_drop_reports_idle_requests_reresolution_and_waits_for_a_pick():
    """A62 Background: "If this connection breaks ... pick_first will not
    attempt to reconnect until the application requests ... or makes an
    RPC"; C-core GoIdle."""
    _policy, helper = make(A, B)
    sc(helper, A).set_state(READY)
    sc(helper, A).set_state(IDLE)
    assert helper.state is IDLE and helper.reresolution_requests == 1
    assert sc(helper, A).connect_calls == 1
    helper.clock.advance(60)
    assert sc(helper, A).connect_calls == 1  # no reconnect by itself
    assert isinstance(helper.pick(), PickQueue)  # queued, not failed
    assert sc(helper, A).connect_calls == 1  # not on the RPC thread
    helper.clock.advance(0)
    assert sc(helper, A).connect_calls == 2
    assert helper.state is CONNECTING


def test_selected_subchannel_failing_while_ready_goes_idle_not_tf():
    """C-core: any change of the selected subchannel is a failure of the
    connection -> GoIdle (IDLE, not TRANSIENT_FAILURE)."""
    _policy, helper = make(A)
    sc(helper, A).set_state(READY)
    fail(helper, A)
    assert helper.state_sequence() == [CONNECTING, READY, IDLE]


def test_reconnect_after_idle_starts_a_fresh_happy_eyeballs_pass():
    """C-core ExitIdleLocked -> a new subchannel list: first address first,
    250 ms timer to the next."""
    policy, helper = make(A, B)
    sc(helper, A).set_state(READY)
    sc(helper, A).set_state(IDLE)
    policy.exit_idle()
    a2, b2 = sc(helper, A), sc(helper, B)
    assert a2.connect_calls >= 1 and b2.connect_calls == 0
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    assert b2.connect_calls == 1


# -- address list updates in each phase -----------------------------------------


def test_update_while_connecting_restarts_the_pass_without_reporting_again():
    """C-core: a new list during the pass restarts it on the new list;
    CONNECTING is not reported twice."""
    policy, helper = make(A, B)
    sc(helper, A).set_state(CONNECTING)
    update(policy, eps(C, A))
    assert sc(helper, C).connect_calls == 1
    assert helper.subchannel(B, live=False).shut_down
    assert helper.state_sequence() == [CONNECTING]
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    sc(helper, A).set_state(READY)
    assert picked(helper) == A


def test_update_while_ready_keeping_the_selected_address_keeps_the_connection():
    """grpc-java updateAddresses_intersecting_ready / grpc-go "keep this
    connection": the connected address is in the new list."""
    policy, helper = make(A, B)
    sc(helper, A).set_state(READY)
    before = len(helper.states)
    update(policy, eps(C, A))
    assert not sc(helper, A).shut_down and picked(helper) == A
    assert len(helper.states) == before
    assert helper.live_subchannels() == [sc(helper, A)]


def test_update_while_ready_without_the_selected_address_goes_idle():
    """C-core: "none of the subchannels on the new list are in READY state
    ... we drop the current connection and report IDLE"."""
    policy, helper = make(A, B)
    sc(helper, A).set_state(READY)
    update(policy, eps(C, D))
    assert helper.subchannel(A, live=False).shut_down
    assert helper.state is IDLE and helper.reresolution_requests == 1
    assert isinstance(helper.pick(), PickQueue)
    helper.clock.advance(0)
    assert sc(helper, C).connect_calls == 1


def test_update_while_idle_is_stored_and_used_on_exit_idle():
    """C-core UpdateLocked: "If we are not in idle, start connection attempt
    immediately.  Otherwise, we defer the attempt into ExitIdleLocked()"."""
    policy, helper = make(A)
    sc(helper, A).set_state(READY)
    sc(helper, A).set_state(IDLE)
    update(policy, eps(C, D))
    assert all(s.connect_calls == 0 for s in helper.subchannels if s.address in (C, D))
    assert helper.state is IDLE
    policy.exit_idle()
    assert sc(helper, C).connect_calls == 1


def test_empty_update_reports_tf_and_a_later_list_reconnects_sticky():
    """C-core: empty list -> TRANSIENT_FAILURE "empty address list" and
    re-resolution; state_ stays TRANSIENT_FAILURE, so the next list's pass
    does not report CONNECTING."""
    policy, helper = make(A)
    status = update(policy, [])
    assert status is not None and status.code is UNAVAILABLE
    assert helper.state is TF and helper.last.status.details.startswith("empty address list")
    assert helper.reresolution_requests == 1
    assert helper.subchannel(A, live=False).shut_down
    update(policy, eps(B))
    assert sc(helper, B).connect_calls == 1
    assert helper.state_sequence() == [CONNECTING, TF]
    sc(helper, B).set_state(READY)
    assert helper.state is READY


def test_resolver_error_keeps_a_working_connection():
    """C-core: a resolver error after a good list keeps using the addresses."""
    policy, helper = make(A)
    sc(helper, A).set_state(READY)
    policy.resolver_error(Status(UNAVAILABLE, "dns down"))
    assert helper.state is READY and picked(helper) == A


# -- address order (A61 "Address List Handling", A62 shuffle) --------------------


def test_interleaving_alternates_families_starting_with_the_first_address_family():
    """A61 step 3 (RFC 8305 section 4); C-core interleaves on the flattened
    list, the family of the first address first."""
    v6 = ["[2001:db8::1]:443", "[2001:db8::2]:443", "[2001:db8::3]:443"]
    v4 = ["10.0.0.1:443", "10.0.0.2:443"]
    order, _ = order_addresses(
        [Endpoint((v4[0], v6[0])), Endpoint((v6[1], v6[2])), Endpoint((v4[1],))],
        False,
        random.Random(0),
    )
    assert order == (v4[0], v6[0], v4[1], v6[1], v6[2])


def test_unix_and_unix_abstract_are_separate_families():
    """C-core GetAddressFamily: one family per URI scheme."""
    order, _ = order_addresses(
        eps("unix:/a", "unix:/b", "unix-abstract:c", "unix-abstract:d"), False, random.Random(0)
    )
    assert order == ("unix:/a", "unix-abstract:c", "unix:/b", "unix-abstract:d")


def test_shuffle_moves_endpoints_never_addresses_inside_one():
    """A61 step 1: "The shuffling will change the order of the endpoints but
    will not touch the order of the addresses within each endpoint"."""
    endpoints = [Endpoint((f"10.0.{i}.1:1", f"10.0.{i}.2:1")) for i in range(8)]
    seen_orders = set()
    for seed in range(20):
        order, _ = order_addresses(endpoints, True, random.Random(seed))
        for i in range(0, len(order), 2):
            first, second = order[i], order[i + 1]
            assert first.endswith(".1:1") and second == first.replace(".1:1", ".2:1")
        seen_orders.add(order)
    assert len(seen_orders) > 10


def test_shuffle_then_interleave_on_the_flattened_list():
    """A61: shuffle endpoints, flatten, then interleave families."""
    endpoints = [Endpoint((f"[2001:db8::{i}]:1", f"10.0.0.{i}:1")) for i in range(1, 5)]
    order, _ = order_addresses(endpoints, True, random.Random(3))
    families = ["6" if a.startswith("[") else "4" for a in order]
    assert families == ["6", "4"] * 4


def test_shuffle_runs_once_per_update_and_reconnect_reuses_the_order():
    """A62 "This shuffling will be done when the LB policy receives an
    updated address list"; TRAPS grpc-go#8610."""
    helper = FakeHelper(seed=7)
    policy = PickFirst(helper)
    addresses = [f"10.0.0.{i}:1" for i in range(10)]
    update(policy, eps(*addresses), shuffle=True)
    first_order = policy.addresses
    assert list(first_order) != addresses
    first = helper.subchannel(first_order[0])
    first.set_state(READY)
    first.set_state(IDLE)
    policy.exit_idle()
    assert policy.addresses == first_order
    assert helper.subchannel(first_order[0]).connect_calls >= 1
    other = [a for a in addresses[::-1]]
    update(policy, eps(*other), shuffle=True)
    assert policy.addresses != tuple(other)


def test_shuffle_off_keeps_resolver_order():
    """A62: shuffling only when "shuffleAddressList" is true."""
    helper = FakeHelper(seed=7)
    policy = PickFirst(helper)
    addresses = [f"10.0.0.{i}:1" for i in range(10)]
    update(policy, eps(*addresses), shuffle=False)
    assert list(policy.addresses) == addresses


def test_update_while_ready_to_a_list_with_an_already_ready_subchannel_switches_to_it():
    """C-core: the new list's subchannels report their current state at once;
    one that is READY (shared through the subchannel pool) is selected, no
    IDLE in between."""
    helper = PooledHelper()
    policy, _ = make(A, B, helper=helper)
    sc(helper, A).set_state(READY)
    helper.preset(D, READY)
    update(policy, eps(C, D))
    assert helper.state_sequence() == [CONNECTING, READY, READY]
    assert picked(helper) == D
    assert helper.reresolution_requests == 0
    assert helper.subchannel(A, live=False).shut_down
    assert helper.subchannel(C, live=False).shut_down


def test_last_address_failing_while_an_earlier_attempt_is_pending_waits_for_it():
    """C-core PickFirstTest.HappyEyeballsLastSubchannelFailsWhileAnotherIsStillPending."""
    _policy, helper = make(A, B)
    a, b = sc(helper, A), sc(helper, B)
    a.set_state(CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    b.set_state(CONNECTING)
    fail(helper, B)
    assert helper.state_sequence() == [CONNECTING]  # a still connecting
    b.set_state(IDLE)
    assert b.connect_calls == 1
    fail(helper, A)
    assert helper.reresolution_requests == 1
    assert helper.state is TF and helper.last.status == Status(UNAVAILABLE, ALL_FAILED)
    assert (a.connect_calls, b.connect_calls) == (1, 2)  # b was IDLE: asked at once
    b.set_state(CONNECTING)
    b.set_state(READY)
    assert picked(helper) == B


def _timer_connect_order(addresses: list[str]) -> list[str]:
    _policy, helper = make(*addresses)
    order: list[str] = []
    for _ in addresses:
        for s in helper.subchannels:
            if s.connect_calls and s.address not in order:
                order.append(s.address)
                s.set_state(CONNECTING)
        helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    return order


def test_happy_eyeballs_interleaves_families_over_the_timer():
    """C-core PickFirstTest.HappyEyeballsAddressInterleaving."""
    v4 = ["127.0.0.1:443", "127.0.0.1:444", "127.0.0.1:445", "127.0.0.1:446"]
    v6 = ["[::1]:444", "[::1]:445"]
    assert _timer_connect_order(v4 + v6) == [v4[0], v6[0], v4[1], v6[1], v4[2], v4[3]]


def test_happy_eyeballs_interleaving_when_the_second_family_has_more_addresses():
    """C-core PickFirstTest.HappyEyeballsAddressInterleavingSecondFamilyHasMoreAddresses."""
    v6 = ["[::1]:444", "[::1]:445"]
    v4 = ["127.0.0.1:443", "127.0.0.1:444", "127.0.0.1:445", "127.0.0.1:446"]
    assert _timer_connect_order(v6 + v4) == [v6[0], v4[0], v6[1], v4[1], v4[2], v4[3]]


def test_first_address_going_idle_before_the_second_fails_is_retried_after_the_pass():
    """C-core PickFirstTest.FirstAddressGoesIdleBeforeSecondOneFails."""
    _policy, helper = make(A, B)
    a, b = sc(helper, A), sc(helper, B)
    a.set_state(CONNECTING)
    fail(helper, A)
    b.set_state(CONNECTING)
    a.set_state(IDLE)
    assert a.connect_calls == 1  # not during the pass
    fail(helper, B)
    assert helper.reresolution_requests == 1 and helper.state is TF
    assert a.connect_calls == 2  # at once after the pass
    a.set_state(CONNECTING)
    a.set_state(READY)
    assert helper.state is READY and picked(helper) == A


def test_goes_idle_when_the_connection_fails_then_reconnects_on_a_pick():
    """C-core PickFirstTest.GoesIdleWhenConnectionFailsThenCanReconnect."""
    _policy, helper = make(A, B)
    a = sc(helper, A)
    a.set_state(CONNECTING)
    a.set_state(READY)
    a.set_state(IDLE)
    assert helper.reresolution_requests == 1
    assert helper.state is IDLE and isinstance(helper.pick(), PickQueue)
    helper.clock.advance(0)
    assert sc(helper, A).connect_calls == 2
    sc(helper, A).set_state(CONNECTING)
    sc(helper, A).set_state(READY)
    assert helper.state is READY and picked(helper) == A


def test_shuffled_order_is_stable_across_reconnects_without_an_update():
    """C-core PickFirstTest.WithShuffle: "Address order should be stable
    between updates"."""
    helper = FakeHelper(seed=3)
    policy = PickFirst(helper)
    addresses = [f"127.0.0.1:{443 + i}" for i in range(6)]
    update(policy, eps(*addresses), shuffle=True)
    order = policy.addresses
    assert list(order) != addresses
    for _ in range(3):
        first = sc(helper, order[0])
        assert first.connect_calls >= 1
        first.set_state(READY)
        first.set_state(IDLE)
        policy.exit_idle()
        assert policy.addresses == order


def test_failure_before_the_timer_restarts_the_delay_for_the_next_address():
    """grpc-go TestPickFirstLeaf_HappyEyeballs_TF_ThenTimerFires; A61: the
    timer is cancelled on failure and a new one starts with the next attempt."""
    policy, helper = make(A, B, C)
    sc(helper, A).set_state(CONNECTING)
    helper.clock.advance(0.1)
    fail(helper, A)
    assert sc(helper, B).connect_calls == 1
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY - 0.1)  # t = 0.25: old deadline
    assert sc(helper, C).connect_calls == 0
    helper.clock.advance(0.1)  # t = 0.35 = 0.1 + 0.25
    assert sc(helper, C).connect_calls == 1
    assert not policy.timer_pending


def test_timer_is_not_started_when_the_frontier_reaches_the_last_address_by_failure():
    """grpc-go TestPickFirstLeaf_HappyEyeballs_TF_AfterEndOfList: failures
    move to the last address without a timer; TF only after every failure."""
    policy, helper = make(A, B)
    fail(helper, A)
    assert sc(helper, B).connect_calls == 1 and not policy.timer_pending
    sc(helper, B).set_state(CONNECTING)
    helper.clock.advance(5)
    assert helper.state is CONNECTING
    fail(helper, B)
    assert helper.state is TF
