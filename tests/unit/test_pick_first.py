"""pick_first: A62 (sticky TF, shuffling), A61 (happy eyeballs, interleaving),
A113 (weighted shuffling), and the TRAPS.md "pick_first and round_robin" traps."""

from __future__ import annotations

import collections
import random

import grpc
import pytest

from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    LBConfigError,
    PickComplete,
    PickFail,
    PickQueue,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.pick_first import (
    CONNECTION_ATTEMPT_DELAY,
    Phase,
    PickFirst,
    PickFirstConfig,
    interleave_families,
    order_addresses,
    shuffle_endpoints,
)
from pyxds.testing import FakeHelper, FakeSubchannel

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def eps(*addresses: str, **attributes) -> list[Endpoint]:
    return [Endpoint((a,), attributes) for a in addresses]


def make(
    addresses=("a:1", "b:1", "c:1"), shuffle=False, seed=0, endpoints=None
) -> tuple[PickFirst, FakeHelper]:
    helper = FakeHelper(seed=seed)
    policy = PickFirst(helper)
    if endpoints is None:
        endpoints = eps(*addresses)
    assert policy.update(ResolverUpdate(endpoints, PickFirstConfig(shuffle))) is None
    return policy, helper


def connect_order(helper: FakeHelper) -> list[str]:
    """Addresses whose subchannels were asked to connect, in creation order."""
    return [s.address for s in helper.subchannels if s.connect_calls]


def fail(helper: FakeHelper, address: str, text: str | None = None) -> None:
    sc = helper.subchannel(address)
    sc.set_state(CONNECTING)
    sc.set_state(TF, text)


def fail_attempts(sc: FakeSubchannel, status: Status, times: int) -> None:
    """``times`` failed attempts of one subchannel, each ending in IDLE
    (its backoff over: pick_first in RECONNECTING connects it again)."""
    for _ in range(times):
        sc.set_state(CONNECTING)
        sc.set_state(TF, status)
        sc.set_state(IDLE)


def fail_all_first_pass(helper: FakeHelper, addresses) -> None:
    for address in addresses:
        fail(helper, address)


# -- config -------------------------------------------------------------------


def test_config_parses_shuffle_flag_and_ignores_unknown_fields():
    factory, config = registry.select([{"pick_first": {"shuffleAddressList": True, "x": 1}}])
    assert factory.name == "pick_first"
    assert config == PickFirstConfig(shuffle_address_list=True)
    assert registry.select([{"pick_first": {}}])[1] == PickFirstConfig()
    with pytest.raises(LBConfigError, match="expected object, got null"):
        registry.select([{"pick_first": None}])  # as grpcio 1.85


def test_config_error_names_the_shuffle_field():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"pick_first": {"shuffleAddressList": "yes"}}])
    assert str(err.value) == 'pick_first.shuffleAddressList: expected boolean, got "yes"'


def test_config_error_for_non_object_config():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"pick_first": [1]}])
    assert str(err.value).startswith("pick_first: expected object")


def test_config_error_path_under_a_parent_list():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"pick_first": {"shuffleAddressList": 1}}], path='children["p0"].config')
    assert err.value.path == 'children["p0"].config[0].pick_first.shuffleAddressList'


def test_configs_are_frozen_values_with_equality():
    assert PickFirstConfig(True) == PickFirstConfig(True)
    assert hash(PickFirstConfig(True)) == hash(PickFirstConfig(True))
    with pytest.raises(AttributeError):
        PickFirstConfig().shuffle_address_list = True  # type: ignore[misc]


# -- first pass: order and the 250 ms happy-eyeballs delay ----------------------


def test_first_update_reports_connecting_with_queue_picker_and_connects_first_address():
    policy, helper = make()
    assert helper.state_sequence() == [CONNECTING]
    assert isinstance(helper.pick(), PickQueue)
    assert connect_order(helper) == ["a:1"]
    assert policy.phase is Phase.FIRST_PASS


def test_next_address_starts_exactly_after_connection_attempt_delay():
    assert CONNECTION_ATTEMPT_DELAY == 0.25
    _, helper = make()
    helper.subchannel("a:1").set_state(CONNECTING)
    helper.clock.advance(0.249)
    assert connect_order(helper) == ["a:1"]
    helper.clock.advance(0.001)
    assert connect_order(helper) == ["a:1", "b:1"]
    helper.clock.advance(0.249)
    assert connect_order(helper) == ["a:1", "b:1"]
    helper.clock.advance(0.001)
    assert connect_order(helper) == ["a:1", "b:1", "c:1"]
    # the earlier attempts are not interrupted
    assert not any(s.shut_down for s in helper.subchannels)


def test_no_timer_after_the_last_address():
    policy, helper = make(("a:1", "b:1"))
    helper.clock.advance(0.25)
    assert connect_order(helper) == ["a:1", "b:1"]
    assert not policy.timer_pending
    assert helper.clock.pending == []


def test_failure_moves_on_at_once_and_cancels_the_timer():
    policy, helper = make()
    fail(helper, "a:1")
    assert connect_order(helper) == ["a:1", "b:1"]
    assert helper.clock.now() == 0
    # The old timer was cancelled: 0.25 s after the start nothing new happens;
    # c starts 0.25 s after b started.
    helper.clock.advance(0.249)
    assert connect_order(helper) == ["a:1", "b:1"]
    helper.clock.advance(0.001)
    assert connect_order(helper) == ["a:1", "b:1", "c:1"]
    assert policy.phase is Phase.FIRST_PASS


def test_failure_of_an_earlier_attempt_does_not_skip_ahead():
    _, helper = make()
    helper.clock.advance(0.25)  # a and b attempted, b is the frontier
    fail(helper, "a:1")
    assert connect_order(helper) == ["a:1", "b:1"]
    helper.clock.advance(0.25)
    assert connect_order(helper) == ["a:1", "b:1", "c:1"]


def test_first_ready_wins_and_others_are_shut_down():
    policy, helper = make()
    helper.clock.advance(0.5)  # a, b, c all attempted
    helper.subchannel("b:1").set_state(READY)
    assert helper.state is READY
    result = helper.pick()
    assert isinstance(result, PickComplete) and result.subchannel.address == "b:1"
    assert [s.address for s in helper.live_subchannels()] == ["b:1"]
    assert policy.selected is helper.subchannel("b:1")
    assert helper.clock.pending == []


def test_ready_picker_returns_one_constant_result():
    _, helper = make()
    helper.subchannel("a:1").set_state(READY)
    assert helper.pick() is helper.pick()


def test_ready_before_attempt_is_still_chosen():
    # A61 (C-core subchannel sharing): any subchannel may report READY at any time.
    _, helper = make()
    helper.subchannel("c:1").set_state(READY)
    assert helper.state is READY
    assert helper.pick().subchannel.address == "c:1"


def test_subchannel_that_is_already_failing_is_skipped_at_once():
    _policy, helper = make()
    helper.subchannel("b:1").set_state(TF)  # b in backoff before we reach it
    fail(helper, "a:1")
    assert connect_order(helper) == ["a:1", "c:1"]


def test_subchannel_already_connecting_counts_as_attempted_and_starts_timer():
    policy, helper = make()
    helper.subchannel("b:1").set_state(CONNECTING)
    fail(helper, "a:1")
    assert helper.subchannel("b:1").connect_calls == 0
    assert policy.timer_pending
    helper.clock.advance(0.25)
    assert connect_order(helper) == ["a:1", "c:1"]


def test_attempt_that_ends_in_idle_without_failure_is_retried():
    policy, helper = make(("a:1",))
    sc = helper.subchannel("a:1")
    sc.set_state(CONNECTING)
    sc.set_state(IDLE)
    assert sc.connect_calls == 2
    assert policy.phase is Phase.FIRST_PASS


# -- all failed: TF, re-resolution, parallel reconnect, sticky -------------------


def test_transient_failure_reported_only_when_every_address_failed_once():
    policy, helper = make()
    fail(helper, "a:1")
    fail(helper, "b:1")
    assert helper.state_sequence() == [CONNECTING]
    assert helper.reresolution_requests == 0
    fail(helper, "c:1", "boom")
    assert helper.state_sequence() == [CONNECTING, TF]
    assert helper.last.status == Status(
        UNAVAILABLE, "failed to connect to all addresses; last error: UNAVAILABLE: boom"
    )
    result = helper.pick()
    assert isinstance(result, PickFail) and result.status == helper.last.status
    assert helper.reresolution_requests == 1
    assert policy.phase is Phase.RECONNECTING


def test_pass_waits_for_earlier_attempt_still_in_flight():
    _, helper = make(("a:1", "b:1"))
    helper.subchannel("a:1").set_state(CONNECTING)
    helper.clock.advance(0.25)
    fail(helper, "b:1")
    assert helper.state_sequence() == [CONNECTING]  # a is still connecting
    helper.subchannel("a:1").set_state(TF)
    assert helper.state_sequence() == [CONNECTING, TF]


def test_after_pass_idle_subchannels_connect_at_once_in_parallel():
    _, helper = make()
    fail(helper, "a:1")
    helper.subchannel("a:1").set_state(IDLE)  # a's backoff ended during the pass
    assert helper.subchannel("a:1").connect_calls == 1
    fail(helper, "b:1")
    fail(helper, "c:1")
    assert helper.state is TF
    assert helper.subchannel("a:1").connect_calls == 2  # connected when the pass ended
    for address in ("b:1", "c:1"):
        sc = helper.subchannel(address)
        before = sc.connect_calls
        sc.set_state(IDLE)
        assert sc.connect_calls == before + 1


def test_sticky_transient_failure_across_several_backoff_rounds():
    addresses = ("a:1", "b:1", "c:1")
    _, helper = make(addresses)
    fail_all_first_pass(helper, addresses)
    assert helper.reresolution_requests == 1
    for round_number in range(1, 5):
        for address in addresses:
            sc = helper.subchannel(address)
            sc.set_state(IDLE)  # backoff over
            sc.set_state(CONNECTING)
        # after N-1 further failures: no new report, no new re-resolution
        for address in addresses[:-1]:
            helper.subchannel(address).set_state(TF, f"err {round_number} {address}")
        assert helper.reresolution_requests == round_number
        helper.subchannel(addresses[-1]).set_state(TF, f"last {round_number}")
        assert helper.reresolution_requests == round_number + 1
        assert helper.last.status.details == (
            f"failed to connect to all addresses; last error: UNAVAILABLE: last {round_number}"
        )
    # CONNECTING was never reported after TF
    seq = helper.state_sequence()
    assert seq[0] is CONNECTING and set(seq[1:]) == {TF}
    assert len(seq) == 1 + 5


def test_failures_are_counted_not_per_subchannel():
    # A61: N failures of any subchannels trigger a re-report and re-resolution.
    _, helper = make(("a:1", "b:1"))
    fail_all_first_pass(helper, ("a:1", "b:1"))
    a = helper.subchannel("a:1")
    for _ in range(2):
        a.set_state(IDLE)
        a.set_state(CONNECTING)
        a.set_state(TF, "only a")
    assert helper.reresolution_requests == 2
    assert helper.states[-1].status.details.endswith("only a")


def test_ready_after_sticky_tf_is_reported():
    _, helper = make(("a:1", "b:1"))
    fail_all_first_pass(helper, ("a:1", "b:1"))
    helper.subchannel("b:1").set_state(IDLE)
    helper.subchannel("b:1").set_state(CONNECTING)
    assert helper.state is TF
    helper.subchannel("b:1").set_state(READY)
    assert helper.state_sequence() == [CONNECTING, TF, READY]
    assert [s.address for s in helper.live_subchannels()] == ["b:1"]


# -- READY drops: IDLE picker, exit_idle -------------------------------------------


def test_ready_connection_drop_reports_idle_and_requests_reresolution():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    helper.subchannel("a:1").set_state(IDLE)  # GOAWAY / max connection age
    assert helper.state_sequence() == [CONNECTING, READY, IDLE]
    assert helper.reresolution_requests == 1
    assert policy.phase is Phase.IDLE
    assert helper.subchannel("a:1").connect_calls == 1  # no reconnect by itself


def test_goaway_does_not_fail_queued_picks():
    # TRAPS: READY -> IDLE is not a failure (grpc#29428).
    _, helper = make()
    helper.subchannel("a:1").set_state(READY)
    helper.subchannel("a:1").set_state(IDLE)
    assert helper.last.status.ok
    assert isinstance(helper.pick(), PickQueue)
    assert TF not in helper.state_sequence()


def test_idle_picker_schedules_exit_idle_not_inline_and_queues():
    policy, helper = make()
    sc = helper.subchannel("a:1")
    sc.set_state(READY)
    sc.set_state(IDLE)
    picker = helper.last.picker
    assert isinstance(helper.pick(), PickQueue)
    assert sc.connect_calls == 1  # nothing ran on the pick thread
    assert policy.phase is Phase.IDLE
    helper.clock.advance(0)
    assert policy.phase is Phase.FIRST_PASS
    assert sc.connect_calls == 2
    assert helper.state is CONNECTING
    # the old picker triggers once only
    helper.last.picker  # noqa: B018
    assert isinstance(picker.pick(None), PickQueue)  # type: ignore[arg-type]
    helper.clock.advance(0)
    assert sc.connect_calls == 2


def test_exit_idle_reconnects_with_the_same_order():
    policy, helper = make(("a:1", "b:1", "c:1"), shuffle=True, seed=3)
    order = policy.addresses
    helper.subchannel(order[0]).set_state(READY)
    helper.subchannel(order[0]).set_state(IDLE)
    policy.exit_idle()
    assert policy.addresses == order
    assert helper.state is CONNECTING
    helper.clock.advance(0.5)
    started = [a for a in order if helper.subchannel(a).connect_calls]
    assert started == list(order)


def test_exit_idle_when_not_idle_is_ignored():
    policy, helper = make()
    policy.exit_idle()
    assert helper.state_sequence() == [CONNECTING]
    assert connect_order(helper) == ["a:1"]


def test_ready_to_transient_failure_also_goes_idle():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    helper.subchannel("a:1").set_state(TF)
    assert helper.state is IDLE
    assert policy.phase is Phase.IDLE


# -- updates -----------------------------------------------------------------


def test_update_while_ready_keeping_the_address_keeps_the_connection():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    reports = len(helper.states)
    created = len(helper.subchannels)
    assert policy.update(ResolverUpdate(eps("z:1", "a:1"), PickFirstConfig())) is None
    assert len(helper.subchannels) == created
    assert not helper.subchannel("a:1").shut_down
    assert len(helper.states) == reports
    assert helper.pick().subchannel.address == "a:1"
    assert policy.addresses == ("z:1", "a:1")


def test_update_while_ready_without_the_address_drops_it_and_goes_idle():
    policy, helper = make()
    old = helper.subchannel("a:1")
    old.set_state(READY)
    policy.update(ResolverUpdate(eps("x:1", "y:1"), PickFirstConfig()))
    assert old.shut_down
    assert helper.state is IDLE
    assert helper.reresolution_requests == 1
    policy.exit_idle()
    assert connect_order(helper)[-1] == "x:1"


def test_update_while_idle_stores_the_list_without_connecting():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    helper.subchannel("a:1").set_state(IDLE)
    created = len(helper.subchannels)
    policy.update(ResolverUpdate(eps("b:1", "c:1"), PickFirstConfig()))
    assert len(helper.subchannels) == created
    assert helper.subchannel("a:1", live=False).shut_down
    assert helper.state is IDLE
    policy.exit_idle()
    assert connect_order(helper)[-1] == "b:1"


def test_same_update_twice_is_a_no_op():
    policy, helper = make()
    helper.clock.advance(0.1)
    reports, created = len(helper.states), len(helper.subchannels)
    calls = [s.connect_calls for s in helper.subchannels]
    policy.update(ResolverUpdate(eps("a:1", "b:1", "c:1"), PickFirstConfig()))
    assert (len(helper.states), len(helper.subchannels)) == (reports, created)
    assert [s.connect_calls for s in helper.subchannels] == calls
    assert not any(s.shut_down for s in helper.subchannels)
    # and the timer was not restarted: b starts at 0.25
    helper.clock.advance(0.15)
    assert connect_order(helper) == ["a:1", "b:1"]


def test_same_update_twice_when_ready_is_a_no_op():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    before = (len(helper.states), len(helper.subchannels), helper.reresolution_requests)
    policy.update(ResolverUpdate(eps("a:1", "b:1", "c:1"), PickFirstConfig()))
    assert before == (len(helper.states), len(helper.subchannels), helper.reresolution_requests)


def test_new_list_while_connecting_reuses_subchannels_and_restarts_in_new_order():
    policy, helper = make(("a:1", "b:1", "c:1"))
    fail(helper, "a:1")  # a failed, b is trying
    a, b, c = (helper.subchannel(x) for x in ("a:1", "b:1", "c:1"))
    policy.update(ResolverUpdate(eps("d:1", "a:1", "b:1"), PickFirstConfig()))
    assert c.shut_down
    assert not a.shut_down and not b.shut_down
    d = helper.subchannel("d:1")
    assert d.connect_calls == 1
    helper.clock.advance(0.25)  # a is failing (known state): skipped at once, b is tried
    assert a.connect_calls == 1
    assert policy.timer_pending is False  # b is the last address
    assert helper.state_sequence() == [CONNECTING]


def test_new_list_while_in_transient_failure_stays_sticky():
    policy, helper = make(("a:1", "b:1"))
    fail_all_first_pass(helper, ("a:1", "b:1"))
    policy.update(ResolverUpdate(eps("c:1", "a:1"), PickFirstConfig()))
    assert helper.subchannel("b:1", live=False).shut_down
    helper.subchannel("c:1").set_state(CONNECTING)
    helper.subchannel("c:1").set_state(TF, "c down")
    # new pass complete (a still failing from before): TF again, fresh error
    assert helper.state_sequence() == [CONNECTING, TF, TF]
    assert helper.last.status.details.endswith("c down")
    assert helper.reresolution_requests == 2


def test_duplicate_addresses_are_connected_once():
    policy, helper = make(endpoints=[*eps("a:1", "b:1", "a:1"), Endpoint(("b:1", "c:1"))])
    assert policy.addresses == ("a:1", "b:1", "c:1")
    assert [s.address for s in helper.subchannels] == ["a:1", "b:1", "c:1"]


def test_empty_list_is_rejected_with_transient_failure():
    helper = FakeHelper()
    policy = PickFirst(helper)
    status = policy.update(ResolverUpdate([], PickFirstConfig()))
    assert status == Status(UNAVAILABLE, "empty address list")
    assert helper.state is TF
    assert helper.last.status == status
    assert isinstance(helper.pick(), PickFail)


def test_empty_list_after_ready_drops_everything():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    status = policy.update(ResolverUpdate([Endpoint(())], PickFirstConfig(), resolution_note="x"))
    assert status == Status(UNAVAILABLE, "empty address list: x")
    assert helper.live_subchannels() == []
    assert helper.state is TF
    # the next list is a new start, TF stays sticky until READY
    policy.update(ResolverUpdate(eps("b:1"), PickFirstConfig()))
    assert helper.state is TF
    assert helper.subchannel("b:1").connect_calls == 1
    helper.subchannel("b:1").set_state(READY)
    assert helper.state is READY


# -- resolver errors -------------------------------------------------------------


def test_resolver_error_before_any_addresses_reports_transient_failure():
    helper = FakeHelper()
    policy = PickFirst(helper)
    error = Status(UNAVAILABLE, "DNS resolution failed")
    policy.resolver_error(error)
    assert helper.state is TF and helper.last.status == error


def test_resolver_error_while_working_is_ignored():
    policy, helper = make()
    policy.resolver_error(Status(UNAVAILABLE, "dns down"))
    assert helper.state_sequence() == [CONNECTING]
    helper.subchannel("a:1").set_state(READY)
    policy.resolver_error(Status(UNAVAILABLE, "dns down"))
    assert helper.state_sequence() == [CONNECTING, READY]


def test_resolver_error_in_transient_failure_is_reported():
    policy, helper = make(("a:1",))
    fail(helper, "a:1")
    policy.resolver_error(Status(UNAVAILABLE, "dns down"))
    assert helper.last.status.details == "dns down"
    assert helper.state is TF


def test_update_carrying_an_error_status_is_a_resolver_error():
    policy, helper = make()
    error = Status(UNAVAILABLE, "no DNS")
    assert policy.update(ResolverUpdate(error, PickFirstConfig())) == error
    assert helper.state_sequence() == [CONNECTING]


# -- shuffle (A62, A113) and interleaving (A61) -----------------------------------


def test_shuffle_uses_helper_random_and_is_reproducible():
    orders = {make(tuple(f"h{i}:1" for i in range(8)), True, seed=7)[0].addresses for _ in range(3)}
    assert len(orders) == 1
    other = make(tuple(f"h{i}:1" for i in range(8)), True, seed=8)[0].addresses
    assert other != next(iter(orders))


def test_no_shuffle_keeps_resolver_order():
    policy, _ = make(tuple(f"h{i}:1" for i in range(8)), False, seed=7)
    assert policy.addresses == tuple(f"h{i}:1" for i in range(8))


def test_shuffle_happens_once_per_update():
    # TRAPS: shuffle was skipped for some updates (grpc-go#8610).
    addresses = tuple(f"h{i}:1" for i in range(10))
    policy, helper = make(addresses, True, seed=1)
    seen = {policy.addresses}
    for _ in range(5):
        policy.update(ResolverUpdate(eps(*addresses), PickFirstConfig(True)))
        seen.add(policy.addresses)
    assert len(seen) >= 5
    # the first connection attempt follows the shuffled order
    assert helper.subchannel(policy.addresses[0]).connect_calls >= 1


def test_shuffle_is_endpoint_level_only():
    endpoints = [Endpoint((f"10.0.0.{i}:1", f"10.0.1.{i}:1")) for i in range(6)]
    rng = random.Random(5)
    for _ in range(20):
        order, _ = order_addresses(endpoints, True, rng)
        for i in range(0, 12, 2):
            _prefix, index = order[i].rsplit(".", 1)
            assert order[i].startswith("10.0.0.")
            assert order[i + 1] == f"10.0.1.{index}"


def test_shuffle_distribution_is_uniform_first_place():
    endpoints = eps("a:1", "b:1", "c:1", "d:1")
    rng = random.Random(11)
    counts = collections.Counter(
        shuffle_endpoints(endpoints, rng)[0].addresses[0] for _ in range(8000)
    )
    for address in ("a:1", "b:1", "c:1", "d:1"):
        assert 1800 < counts[address] < 2200


def test_weighted_shuffle_first_place_follows_weights():
    # A113: P(first) = w / sum(w) for the Efraimidis-Spirakis key.
    endpoints = [
        Endpoint(("a:1",), {"weight": 1}),
        Endpoint(("b:1",), {"weight": 3}),
        Endpoint(("c:1",), {"weight": 6}),
    ]
    rng = random.Random(2)
    n = 20000
    counts = collections.Counter(
        shuffle_endpoints(endpoints, rng)[0].addresses[0] for _ in range(n)
    )
    for address, weight in (("a:1", 1), ("b:1", 3), ("c:1", 6)):
        expected = n * weight / 10
        assert abs(counts[address] - expected) < 5 * (expected * (1 - weight / 10)) ** 0.5


def test_weighted_shuffle_defaults_missing_or_bad_weight_to_one():
    endpoints = [
        Endpoint(("a:1",), {"weight": 1}),
        Endpoint(("b:1",), {}),
        Endpoint(("c:1",), {"weight": "heavy"}),
        Endpoint(("d:1",), {"weight": 0}),
    ]
    rng = random.Random(4)
    counts = collections.Counter(
        shuffle_endpoints(endpoints, rng)[0].addresses[0] for _ in range(8000)
    )
    for address in ("a:1", "b:1", "c:1", "d:1"):
        assert 1750 < counts[address] < 2250


def test_interleave_alternates_families_starting_with_the_first():
    assert interleave_families(["[::1]:1", "[::2]:1", "1.1.1.1:1", "1.1.1.2:1", "1.1.1.3:1"]) == [
        "[::1]:1",
        "1.1.1.1:1",
        "[::2]:1",
        "1.1.1.2:1",
        "1.1.1.3:1",
    ]
    assert interleave_families(["1.1.1.1:1", "1.1.1.2:1", "[::1]:1"]) == [
        "1.1.1.1:1",
        "[::1]:1",
        "1.1.1.2:1",
    ]


def test_interleave_applies_to_the_whole_flattened_list():
    endpoints = [Endpoint(("[::1]:1", "[::2]:1")), Endpoint(("1.1.1.1:1",))]
    policy, helper = make(endpoints=endpoints)
    assert policy.addresses == ("[::1]:1", "1.1.1.1:1", "[::2]:1")
    helper.clock.advance(0.25)
    assert connect_order(helper) == ["[::1]:1", "1.1.1.1:1"]


# -- shutdown, reset_backoff, registration ---------------------------------------


def test_shutdown_shuts_down_subchannels_and_cancels_timers():
    policy, helper = make()
    policy.shutdown()
    assert all(s.shut_down for s in helper.subchannels)
    assert helper.clock.pending == []
    reports = len(helper.states)
    helper.clock.advance(1)
    assert len(helper.states) == reports
    assert policy.phase is Phase.SHUTDOWN


def test_exit_idle_scheduled_by_picker_after_shutdown_does_nothing():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    helper.subchannel("a:1").set_state(IDLE)
    helper.pick()
    policy.shutdown()
    helper.clock.advance(0)
    assert helper.state is IDLE
    assert policy.phase is Phase.SHUTDOWN


def test_reset_backoff_reaches_every_subchannel():
    policy, helper = make()
    policy.reset_backoff()
    assert [s.reset_backoff_calls for s in helper.subchannels] == [1, 1, 1]


def test_pick_first_is_registered():
    factory = registry.get("pick_first")
    assert factory is not None
    assert isinstance(factory.build(FakeHelper()), PickFirst)


def test_update_while_ready_reorders_and_reconnect_uses_the_new_order():
    policy, helper = make(("a:1", "b:1", "c:1"))
    helper.subchannel("b:1").set_state(READY)
    policy.update(ResolverUpdate(eps("c:1", "b:1", "a:1"), PickFirstConfig()))
    assert helper.state is READY
    b = helper.subchannel("b:1")
    b.set_state(IDLE)
    before = b.connect_calls
    policy.exit_idle()
    assert helper.subchannel("c:1").connect_calls == 1
    assert b.connect_calls == before  # not yet: c is first now
    helper.clock.advance(0.25)
    assert b.connect_calls == before + 1


def test_subchannel_ready_while_idle_is_selected_on_exit_idle():
    policy, helper = make(("a:1", "b:1"))
    a = helper.subchannel("a:1")
    a.set_state(READY)
    a.set_state(IDLE)
    a.set_state(READY)  # e.g. reconnected for another user of the subchannel
    assert helper.state is IDLE  # reports in IDLE are only recorded
    policy.exit_idle()
    assert helper.state_sequence() == [CONNECTING, READY, IDLE, READY]
    assert helper.pick().subchannel is a


def test_resolver_error_before_first_update_makes_the_first_pass_sticky():
    helper = FakeHelper()
    policy = PickFirst(helper)
    policy.resolver_error(Status(UNAVAILABLE, "dns down"))
    policy.update(ResolverUpdate(eps("a:1"), PickFirstConfig()))
    assert helper.state_sequence() == [TF]
    assert helper.subchannel("a:1").connect_calls == 1
    helper.subchannel("a:1").set_state(READY)
    assert helper.state_sequence() == [TF, READY]


def test_stale_timer_after_new_pass_does_not_advance():
    policy, helper = make(("a:1", "b:1", "c:1"))
    helper.clock.advance(0.2)
    policy.update(ResolverUpdate(eps("c:1", "b:1", "a:1"), PickFirstConfig()))
    helper.clock.advance(0.05)  # the first pass's timer would have fired here
    assert helper.subchannel("b:1").connect_calls == 0
    helper.clock.advance(0.2)
    assert helper.subchannel("b:1").connect_calls == 1


def test_subchannel_reports_after_shutdown_are_ignored():
    policy, helper = make(("a:1",))
    sc = helper.subchannel("a:1")
    policy.shutdown()
    sc.set_state(READY)  # FakeSubchannel forgets watchers on shutdown; nothing may reach us
    assert helper.state_sequence() == [CONNECTING]


class ReentrantHelper(FakeHelper):
    """A parent that calls back into the policy from inside update_state."""

    def __init__(self) -> None:
        super().__init__()
        self.policy: PickFirst | None = None
        self.on_report = None

    def update_state(self, state, status, picker) -> None:
        super().update_state(state, status, picker)
        if self.on_report is not None:
            hook, self.on_report = self.on_report, None
            hook(state)


def test_parent_calling_exit_idle_inside_the_idle_report_starts_a_clean_pass():
    helper = ReentrantHelper()
    policy = PickFirst(helper)
    policy.update(ResolverUpdate(eps("a:1", "b:1"), PickFirstConfig()))
    a = helper.subchannel("a:1")
    a.set_state(READY)
    helper.on_report = lambda state: policy.exit_idle() if state is IDLE else None
    a.set_state(IDLE)
    assert helper.state_sequence() == [CONNECTING, READY, IDLE, CONNECTING]
    assert policy.phase is Phase.FIRST_PASS
    assert a.connect_calls == 2 and policy.timer_pending


def test_parent_sending_an_update_inside_the_tf_report_is_applied_cleanly():
    helper = ReentrantHelper()
    policy = PickFirst(helper)
    policy.update(ResolverUpdate(eps("a:1"), PickFirstConfig()))
    helper.on_report = lambda state: policy.update(
        ResolverUpdate(eps("b:1", "c:1"), PickFirstConfig())
    )
    fail(helper, "a:1")
    assert helper.state is TF
    assert policy.phase is Phase.FIRST_PASS
    assert connect_order(helper) == ["a:1", "b:1"]
    assert helper.subchannel("a:1", live=False).shut_down


def test_reconnecting_re_reports_each_failure_and_the_same_error_with_one_picker():
    """RECONNECTING over one address re-reports TRANSIENT_FAILURE and asks
    for re-resolution after every failure (C-core); the same error again is
    reported with the same status and picker (issue 18: a new pair per failed
    attempt lived through the backoff, into the oldest GC generation), and a
    new error with a new one."""
    policy, helper = make(("a:1",))
    sc = helper.subchannel("a:1")
    same = Status(UNAVAILABLE, "refused")
    fail_attempts(sc, same, 3)
    assert policy.phase is Phase.RECONNECTING
    assert helper.state_sequence() == [CONNECTING, TF, TF, TF]
    assert helper.reresolution_requests == 3
    reports = helper.states[1:]
    expected = Status(UNAVAILABLE, "failed to connect to all addresses; last error: " + str(same))
    assert all(r.status == expected for r in reports)
    assert reports[0].picker is reports[1].picker is reports[2].picker
    assert isinstance(helper.pick(), PickFail) and helper.pick().status == expected
    sc.set_state(CONNECTING)
    sc.set_state(TF, "timed out")
    assert helper.state_sequence()[-1] is TF
    assert helper.last.status.details.endswith("last error: UNAVAILABLE: timed out")
    assert helper.last.picker is not reports[0].picker
    assert helper.pick().status == helper.last.status


def test_the_very_same_failure_again_is_not_put_in_words_again(monkeypatch):
    """A subchannel reuses its failure's status while the text is the same
    (issue 18); pick_first then re-reports without formatting that failure
    again (five Python calls per failed attempt).  Another failure object,
    even of the same text, is formatted, and the reports are what
    formatting every time gives: the same text the same status and picker,
    a new text a new one."""
    worded: list[Status] = []
    original = Status.__str__

    def counting(self: Status) -> str:
        worded.append(self)
        return original(self)

    monkeypatch.setattr(Status, "__str__", counting)
    _, helper = make(("a:1",))
    sc = helper.subchannel("a:1")
    same = Status(UNAVAILABLE, "refused")
    fail_attempts(sc, same, 4)
    assert worded == [same]
    first = helper.last
    twin = Status(UNAVAILABLE, "refused")
    sc.set_state(CONNECTING)
    sc.set_state(TF, twin)
    assert worded == [same, twin]
    assert (helper.last.status, helper.last.picker) == (first.status, first.picker)
    sc.set_state(IDLE)
    sc.set_state(CONNECTING)
    sc.set_state(TF, same)
    assert worded == [same, twin, same]
    assert helper.last.status is first.status
    sc.set_state(IDLE)
    sc.set_state(CONNECTING)
    sc.set_state(TF, "reset")
    assert helper.last.status.details.endswith("last error: UNAVAILABLE: reset")
    assert helper.last.picker is not first.picker
    assert [r.state for r in helper.states[1:]] == [TF] * 7


def test_two_policies_failing_with_the_same_error_report_their_own_pickers():
    """The reused picker is per policy, never shared between endpoints."""
    _, one = make(("a:1",))
    _, two = make(("a:1",))
    for helper in (one, two):
        fail(helper, "a:1", "refused")
    assert one.last.status == two.last.status
    assert one.last.picker is not two.last.picker
