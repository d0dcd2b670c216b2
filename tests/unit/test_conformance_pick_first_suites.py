"""Conformance: pick_first against scenarios of grpc-go's and grpc-java's own
pick_first test suites that tests/unit/test_conformance_pick_first.py (which
follows C-core's test/core/load_balancing/pick_first_test.cc) and
test_pick_first.py do not already cover.

Sources, each test names its case:

* grpc-go ``balancer/pickfirst/pickfirst_test.go`` and
  ``balancer/pickfirst/pickfirst_ext_test.go`` (the pickfirstleaf tests now
  live there);
* grpc-java ``core/src/test/java/io/grpc/internal/PickFirstLeafLoadBalancerTest.java``.

Where those implementations differ from C-core (the reference where the
gRFCs are silent), the assertions are C-core's and the docstring says what
the other implementation does.  The rules: gRFC A62 (sticky
TRANSIENT_FAILURE, re-resolution, shuffling) and A61 (happy eyeballs,
address interleaving).  Sans-IO: fake subchannels and a FakeClock.
"""

from __future__ import annotations

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
from pyxds.lb.pick_first import CONNECTION_ATTEMPT_DELAY, Phase, PickFirst, PickFirstConfig
from pyxds.testing import FakeHelper, FakeSubchannel

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

A, B, C = "10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3"
PREFIX = "failed to connect to all addresses; last error: "


def endpoints(*groups: tuple[str, ...] | str) -> list[Endpoint]:
    return [Endpoint(g if isinstance(g, tuple) else (g,)) for g in groups]


def start(*groups: tuple[str, ...] | str) -> tuple[PickFirst, FakeHelper]:
    helper = FakeHelper()
    policy = PickFirst(helper)
    assert policy.update(ResolverUpdate(endpoints(*groups), PickFirstConfig())) is None
    return policy, helper


def send(policy: PickFirst, *groups: tuple[str, ...] | str) -> Status | None:
    return policy.update(ResolverUpdate(endpoints(*groups), PickFirstConfig()))


def sub(helper: FakeHelper, address: str) -> FakeSubchannel:
    return helper.subchannel(address)


def failed_pick_details(helper: FakeHelper) -> str:
    result = helper.pick()
    assert isinstance(result, PickFail), result
    assert result.status.code is UNAVAILABLE
    return result.status.details


def picked_address(helper: FakeHelper) -> str:
    result = helper.pick()
    assert isinstance(result, PickComplete), result
    return result.subchannel.address


# -- sticky TRANSIENT_FAILURE and its picker (A62) ---------------------------------


def test_tf_picker_text_follows_the_newest_error_only_after_n_more_failures():
    """grpc-go pickfirst_test.go TestPickFirstLeaf_TFPickerUpdate: duplicates
    are dropped; a subchannel that failed and went IDLE is not reconnected
    before the pass ends; after TF every IDLE subchannel connects at once
    and one in backoff waits; the TF picker changes only after as many new
    failures as there are subchannels, and then carries the newest error."""
    _policy, helper = start(A, A, B, A)
    assert [s.address for s in helper.subchannels] == [A, B]
    a, b = sub(helper, A), sub(helper, B)
    assert a.connect_calls == 1
    a.set_state(CONNECTING)
    a.set_state(TF, "test err: connection refused")
    a.set_state(IDLE)
    assert a.connect_calls == 1  # not during the first pass
    assert helper.state is CONNECTING and isinstance(helper.pick(), PickQueue)
    assert b.connect_calls == 1
    b.set_state(CONNECTING)
    b.set_state(TF, "test err: connection refused")
    assert helper.state is TF
    assert failed_pick_details(helper) == PREFIX + "UNAVAILABLE: test err: connection refused"
    assert a.connect_calls == 2  # IDLE: connected at once, in parallel
    assert b.connect_calls == 1  # still backing off
    b.set_state(IDLE)
    assert b.connect_calls == 2
    reports = len(helper.states)
    b.set_state(CONNECTING)
    b.set_state(TF, "test err: unreachable")
    assert len(helper.states) == reports  # one failure of two: no new picker
    b.set_state(CONNECTING)
    b.set_state(TF, "test err: unreachable")
    assert len(helper.states) == reports + 1
    assert helper.state is TF
    assert failed_pick_details(helper) == PREFIX + "UNAVAILABLE: test err: unreachable"


def test_single_address_failure_reports_tf_then_connecting_is_not_reported_then_ready():
    """grpc-java PickFirstLeafLoadBalancerTest.pickWithDupAddressesUpDownUp
    and pickWithDupEagsUpDownUp: the same address twice (inside one endpoint,
    or as two endpoints) is one subchannel; its failure is the whole pass
    (TF and one re-resolution); CONNECTING after it is not reported; READY
    is.  grpc-java's TF picker carries the bare error; C-core's text (used
    here) prefixes it."""
    for groups in (((A, A),), (A, A)):
        _policy, helper = start(*groups)
        assert len(helper.subchannels) == 1
        a = sub(helper, A)
        a.set_state(CONNECTING)
        a.set_state(TF, "boom!")
        assert helper.state_sequence() == [CONNECTING, TF]
        assert helper.reresolution_requests == 1
        assert failed_pick_details(helper) == PREFIX + "UNAVAILABLE: boom!"
        a.set_state(CONNECTING)
        assert helper.state_sequence() == [CONNECTING, TF]
        assert failed_pick_details(helper) == PREFIX + "UNAVAILABLE: boom!"
        a.set_state(READY)
        assert helper.state_sequence() == [CONNECTING, TF, READY]
        assert picked_address(helper) == A


def test_connecting_after_sticky_tf_is_not_reported_and_a_later_ready_wins():
    """grpc-java PickFirstLeafLoadBalancerTest.multiple_backoffs: two rounds
    of CONNECTING and failure after TF keep TF; the second address becoming
    READY is reported and the first is shut down; the first reporting READY
    after that changes nothing."""
    _policy, helper = start(A, B)
    a, b = sub(helper, A), sub(helper, B)
    fail_text = "connection refused"
    a.set_state(CONNECTING)
    a.set_state(TF, fail_text)
    b.set_state(CONNECTING)
    b.set_state(TF, fail_text)
    assert helper.state_sequence() == [CONNECTING, TF]
    assert helper.reresolution_requests == 1
    for _ in range(2):
        a.set_state(CONNECTING)
        b.set_state(CONNECTING)
        assert helper.state is TF
        a.set_state(TF, fail_text)
        b.set_state(TF, fail_text)
        assert helper.state is TF
    assert all(state is not CONNECTING for state in helper.state_sequence()[1:])
    b.set_state(CONNECTING)
    b.set_state(READY)
    assert helper.state is READY and picked_address(helper) == B
    assert helper.subchannel(A, live=False).shut_down
    reports = len(helper.states)
    helper.subchannel(A, live=False).set_state(READY)
    assert len(helper.states) == reports and picked_address(helper) == B


def test_first_address_ready_after_its_backoff_wins_while_the_second_still_connects():
    """grpc-java PickFirstLeafLoadBalancerTest.backoff_faster_than_serial_connection:
    the first address failed, the pass moved on, and its backoff ended so
    fast that it connects before the second attempt finishes: it wins."""
    _policy, helper = start(A, B)
    a, b = sub(helper, A), sub(helper, B)
    a.set_state(CONNECTING)
    a.set_state(TF, "refused")
    assert b.connect_calls == 1
    b.set_state(CONNECTING)
    a.set_state(CONNECTING)
    assert helper.state is CONNECTING
    a.set_state(READY)
    assert helper.state_sequence() == [CONNECTING, READY]
    assert picked_address(helper) == A
    assert b.shut_down


# -- re-resolution: one request per failure pass (A62) -------------------------


def test_reresolution_after_the_pass_counts_any_n_failures_then_starts_over():
    """grpc-java PickFirstLeafLoadBalancerTest.nameResolutionAfterSufficientTFs_multipleEags
    (and _singleEag, the same addresses in one endpoint): TF and one
    re-resolution when the third address fails; then one more request per
    three failures, whichever subchannels they come from; the count starts
    again after each request."""
    for groups in ((A, B, C), ((A, B, C),)):
        _policy, helper = start(*groups)
        a, b, c = sub(helper, A), sub(helper, B), sub(helper, C)
        a.set_state(TF, "boom!")
        assert helper.state_sequence() == [CONNECTING]
        b.set_state(TF, "boom!")
        assert helper.reresolution_requests == 0 and helper.state_sequence() == [CONNECTING]
        c.set_state(TF, "boom!")
        assert helper.state_sequence() == [CONNECTING, TF]
        assert helper.reresolution_requests == 1
        for expected in (1, 1, 2):
            b.set_state(TF, "boom!")
            assert helper.reresolution_requests == expected
        for s, expected in ((a, 2), (b, 2), (c, 3)):
            s.set_state(TF, "boom!")
            assert helper.reresolution_requests == expected
        assert helper.state is TF


def test_pass_ends_only_when_the_last_attempt_fails_after_the_timer_ran_off_the_end():
    """grpc-java PickFirstLeafLoadBalancerTest
    .happy_eyeballs_connection_results_happen_after_get_to_end:
    all three attempts started by the 250 ms timer; failures of the first
    and (twice) of the second keep CONNECTING with no re-resolution; the
    third's failure ends the pass (TF, one request); three more failures of
    one subchannel make the next request."""
    policy, helper = start(A, B, C)
    helper.clock.advance(2 * CONNECTION_ATTEMPT_DELAY)
    a, b, c = sub(helper, A), sub(helper, B), sub(helper, C)
    assert (a.connect_calls, b.connect_calls, c.connect_calls) == (1, 1, 1)
    for s in (a, b, c):
        s.set_state(CONNECTING)
    assert not policy.timer_pending  # no timer after the last address
    a.set_state(TF, "simulated failure")
    assert helper.state is CONNECTING
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    assert helper.state is CONNECTING
    b.set_state(TF, "simulated failure")
    b.set_state(CONNECTING)
    b.set_state(TF, "simulated failure")
    assert helper.state is CONNECTING and helper.reresolution_requests == 0
    c.set_state(TF, "simulated failure")
    assert helper.state is TF and helper.reresolution_requests == 1
    for expected in (1, 1, 2):
        a.set_state(CONNECTING)
        a.set_state(TF, "simulated failure")
        assert helper.reresolution_requests == expected


# -- happy eyeballs (A61) ------------------------------------------------------------


def test_timer_starts_the_second_attempt_without_waiting_for_the_first():
    """grpc-go pickfirst_ext_test.go TestPickFirstLeaf_HappyEyeballs_TriggerConnectionDelay:
    the first attempt hangs; after exactly 250 ms the second address is
    tried; the second becomes READY and the first (still connecting) is
    shut down."""
    policy, helper = start(A, B)
    a, b = sub(helper, A), sub(helper, B)
    a.set_state(CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY - 0.001)
    assert b.connect_calls == 0
    helper.clock.advance(0.001)
    assert b.connect_calls == 1 and a.connect_calls == 1
    assert not policy.timer_pending  # B is the last address
    b.set_state(CONNECTING)
    b.set_state(READY)
    assert helper.state_sequence() == [CONNECTING, READY]
    assert picked_address(helper) == B
    assert a.shut_down


def test_connection_that_ends_after_the_winner_is_selected_is_ignored():
    """grpc-go TestPickFirstLeaf_HappyEyeballs_Ignore_Inflight_Cancellations
    (its metric part is about subchannel metrics, not pick_first's): the
    loser's late result, READY or failure, changes nothing."""
    _policy, helper = start(A, B)
    a, b = sub(helper, A), sub(helper, B)
    a.set_state(CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    b.set_state(CONNECTING)
    b.set_state(READY)
    reports, requests = len(helper.states), helper.reresolution_requests
    a.set_state(TF, "cancelled")
    a.set_state(READY)
    assert len(helper.states) == reports and helper.reresolution_requests == requests
    assert picked_address(helper) == B


def _creation_order(*addresses: str) -> list[str]:
    _policy, helper = start(*addresses)
    return [s.address for s in helper.subchannels]


def test_interleaving_with_ipv4_first():
    """grpc-go TestPickFirstLeaf_InterleavingIPV4Preferred (without its
    IPv4-mapped IPv6 address: grpc-go counts ``[::ffff:a.b.c.d]`` as IPv4,
    C-core by its socket family as IPv6)."""
    got = _creation_order(
        "1.1.1.1:1111", "2.2.2.2:2", "3.3.3.3:3", "[::1]:8080", "[::2]:8080", "[fe80::1%eth0]:3"
    )
    assert got == [
        "1.1.1.1:1111",
        "[::1]:8080",
        "2.2.2.2:2",
        "[::2]:8080",
        "3.3.3.3:3",
        "[fe80::1%eth0]:3",
    ]


def test_interleaving_with_ipv6_first():
    """grpc-go TestPickFirstLeaf_InterleavingIPv6Preferred."""
    got = _creation_order("[::1]:1", "1.1.1.1:1", "2.2.2.2:2", "[::2]:2", "3.3.3.3:3")
    assert got == ["[::1]:1", "1.1.1.1:1", "[::2]:2", "2.2.2.2:2", "3.3.3.3:3"]


# -- address list updates -------------------------------------------------------------


def test_update_during_the_pass_restarts_it_and_tf_needs_every_new_address_to_fail():
    """grpc-java PickFirstLeafLoadBalancerTest.lastAddressFailingNotTransientFailure:
    [A, B] with A failed and B connecting, then [C, B]: A is shut down, B's
    subchannel is kept; B's failure is not TF (C has not failed yet); C's
    failure is; a report from the dropped A changes nothing; B READY wins.
    C-core (followed here) restarts the pass on the new list, so C is asked
    to connect at once; grpc-java waits for B first."""
    policy, helper = start(A, B)
    a, b = sub(helper, A), sub(helper, B)
    a.set_state(CONNECTING)
    a.set_state(TF, "refused")
    b.set_state(CONNECTING)
    assert send(policy, C, B) is None
    assert a.shut_down and not b.shut_down and sub(helper, B) is b
    assert helper.state_sequence() == [CONNECTING]
    c = sub(helper, C)
    assert c.connect_calls == 1  # C-core: the new list's first address
    b.set_state(TF, "refused")
    assert helper.state is CONNECTING
    c.set_state(CONNECTING)
    c.set_state(TF, "refused")
    assert helper.state is TF and helper.reresolution_requests == 1
    a.set_state(READY)  # shut down: ignored
    assert helper.state is TF
    b.set_state(CONNECTING)
    b.set_state(READY)
    assert helper.state is READY and picked_address(helper) == B
    assert c.shut_down


def test_identical_update_in_tf_keeps_tf_and_does_not_reconnect():
    """grpc-java PickFirstLeafLoadBalancerTest.updateAddresses_identical_transient_failure
    and grpc-go TestPickFirstLeaf_ResolverUpdates_IdenticalLists: the same
    list again changes nothing: no subchannel is created, none connects, TF
    stays (pyxds's documented no-op; C-core restarts the pass, which here
    also keeps TF since both addresses are still failing)."""
    policy, helper = start(A, B)
    sub(helper, A).set_state(TF, "refused")
    sub(helper, B).set_state(TF, "refused")
    assert helper.state is TF
    created, reports = len(helper.subchannels), len(helper.states)
    send(policy, A, B)
    assert len(helper.subchannels) == created and len(helper.states) == reports
    assert (sub(helper, A).connect_calls, sub(helper, B).connect_calls) == (1, 1)
    assert helper.state is TF


def test_intersecting_update_in_tf_stays_tf_until_every_new_address_has_failed():
    """grpc-java PickFirstLeafLoadBalancerTest.updateAddresses_intersecting_transient_failure
    / updateAddresses_intersecting_enter_transient_failure: in TF, [A, B] ->
    [B, C]: sticky TF (no CONNECTING); B's subchannel (in backoff) is kept
    and skipped, C is tried; C failing re-reports TF and re-resolves."""
    policy, helper = start(A, B)
    a, b = sub(helper, A), sub(helper, B)
    a.set_state(TF, "refused")
    b.set_state(TF, "refused")
    assert helper.reresolution_requests == 1
    send(policy, B, C)
    assert a.shut_down and sub(helper, B) is b and b.connect_calls == 1
    c = sub(helper, C)
    assert c.connect_calls == 1
    assert helper.state_sequence() == [CONNECTING, TF]
    c.set_state(CONNECTING)
    c.set_state(TF, "refused again")
    assert helper.state_sequence() == [CONNECTING, TF, TF]
    assert helper.reresolution_requests == 2
    assert failed_pick_details(helper) == PREFIX + "UNAVAILABLE: refused again"


# -- IDLE after READY and exit_idle ----------------------------------------------------


def test_many_picks_on_the_idle_picker_start_one_pass():
    """grpc-java PickFirstLeafLoadBalancerTest.happy_eyeballs_pick_pushes_index_over_end
    and requestConnectionPicker: every pick on the IDLE picker queues and
    asks to leave IDLE; only the first request starts a pass (one connect on
    the first address, one timer); the rest find the policy busy."""
    policy, helper = start(A, B, C)
    a = sub(helper, A)
    a.set_state(READY)
    a.set_state(IDLE)
    assert helper.state is IDLE
    for _ in range(4):
        assert isinstance(helper.pick(), PickQueue)
    assert a.connect_calls == 1  # never inline on the pick
    helper.clock.advance(0)
    assert policy.phase is Phase.FIRST_PASS
    assert [s.address for s in helper.live_subchannels()] == [A, B, C]
    assert sub(helper, A).connect_calls == 2
    assert sub(helper, B).connect_calls == 0 and sub(helper, C).connect_calls == 0
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    assert sub(helper, B).connect_calls == 1 and sub(helper, C).connect_calls == 0


def test_ready_then_failure_goes_idle_and_the_next_pass_can_end_in_tf():
    """grpc-java PickFirstLeafLoadBalancerTest.ready_then_transient_failure_again:
    READY, then the connection fails: IDLE (never TF straight from READY),
    one re-resolution; exit_idle starts a pass whose failures report TF and
    re-resolve again."""
    policy, helper = start(A, B)
    a = sub(helper, A)
    a.set_state(CONNECTING)
    a.set_state(READY)
    a.set_state(TF, "connection reset")
    assert helper.state_sequence() == [CONNECTING, READY, IDLE]
    assert helper.reresolution_requests == 1
    policy.exit_idle()
    assert helper.state_sequence() == [CONNECTING, READY, IDLE, CONNECTING]
    # A is in backoff: the pass counts it as failed and tries B at once.
    assert sub(helper, B).connect_calls == 1
    sub(helper, B).set_state(CONNECTING)
    sub(helper, B).set_state(TF, "refused")
    assert helper.state_sequence() == [CONNECTING, READY, IDLE, CONNECTING, TF]
    assert helper.reresolution_requests == 2
    assert failed_pick_details(helper) == PREFIX + "UNAVAILABLE: refused"


def test_empty_list_after_ready_reports_tf_and_a_resolver_error_keeps_tf():
    """grpc-go TestPickFirst_ResolverError_ZeroAddresses_WithPreviousUpdate
    and TestPickFirstLeaf_EmptyAddressList; grpc-java
    nameResolutionError_emptyAddressList: an empty list after READY closes
    the connection and fails RPCs (UNAVAILABLE); a good list afterwards
    connects again, still reporting TF (sticky) until READY."""
    policy, helper = start(A)
    sub(helper, A).set_state(READY)
    status = send(policy)
    assert status is not None and status.code is UNAVAILABLE
    assert helper.state is TF and "empty address list" in failed_pick_details(helper)
    assert helper.subchannel(A, live=False).shut_down
    policy.resolver_error(Status(UNAVAILABLE, "resolver down"))
    assert helper.state is TF
    send(policy, B)
    b = sub(helper, B)
    assert b.connect_calls == 1 and helper.state is TF
    b.set_state(CONNECTING)
    assert helper.state is TF
    b.set_state(READY)
    assert helper.state is READY and picked_address(helper) == B


def test_update_after_a_pick_left_idle_but_before_any_report_connects_the_new_address():
    """grpc-go pickfirst_ext_test.go TestPickFirstLeaf_Reconnection (and C-core
    ResolverUpdateBeforeLeavingIdle from the other side): READY, drop, a pick
    asks the old address to connect; an update replacing it before that
    subchannel reported anything drops it and connects the new one."""
    policy, helper = start(A)
    a = sub(helper, A)
    a.set_state(CONNECTING)
    a.set_state(READY)
    a.set_state(IDLE)
    assert isinstance(helper.pick(), PickQueue)
    helper.clock.advance(0)
    assert a.connect_calls == 2 and helper.state is CONNECTING
    send(policy, B)
    assert a.shut_down
    b = sub(helper, B)
    assert b.connect_calls == 1
    assert helper.state_sequence() == [CONNECTING, READY, IDLE, CONNECTING]
    b.set_state(CONNECTING)
    b.set_state(READY)
    assert helper.state is READY and picked_address(helper) == B


def test_exit_idle_before_any_update_and_after_the_timer_ran_off_the_end_does_nothing():
    """grpc-java PickFirstLeafLoadBalancerTest.advance_index_then_request_connection:
    a connection request before any address list, and one after the timer
    walked past the last address, are harmless."""
    helper = FakeHelper()
    policy = PickFirst(helper)
    policy.exit_idle()
    assert helper.states == [] and helper.subchannels == []
    send(policy, A, B, C)
    helper.clock.advance(3 * CONNECTION_ATTEMPT_DELAY)
    policy.exit_idle()
    assert [s.connect_calls for s in helper.subchannels] == [1, 1, 1]
    assert helper.state_sequence() == [CONNECTING] and policy.phase is Phase.FIRST_PASS


def test_tf_status_is_unavailable_and_names_the_last_error_with_its_own_code():
    """grpc-java happy_eyeballs tests fail subchannels with UNAUTHENTICATED
    "simulated failure"; C-core's text (A62 leaves it open): the picker
    fails RPCs with UNAVAILABLE, the last error kept whole in the message."""
    _policy, helper = start(A, B)
    sub(helper, A).set_state(TF, Status(grpc.StatusCode.UNAUTHENTICATED, "simulated failure"))
    assert helper.state is CONNECTING
    sub(helper, B).set_state(TF, Status(grpc.StatusCode.UNAUTHENTICATED, "simulated failure"))
    assert helper.state is TF
    assert failed_pick_details(helper) == PREFIX + "UNAUTHENTICATED: simulated failure"
    assert helper.last.status.code is UNAVAILABLE


def test_identical_single_address_update_while_connecting_changes_nothing():
    """grpc-java PickFirstLeafLoadBalancerTest.updateAddresses_identicalSingleAddress_connecting
    and updateAddresses_identical_connecting: no subchannel created, no new
    connection request, no new report; the attempt in flight goes on."""
    policy, helper = start(A)
    a = sub(helper, A)
    a.set_state(CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    reports = len(helper.states)
    assert send(policy, A) is None
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
    assert len(helper.subchannels) == 1 and a.connect_calls == 1
    assert len(helper.states) == reports and isinstance(helper.pick(), PickQueue)
    a.set_state(READY)
    assert picked_address(helper) == A
