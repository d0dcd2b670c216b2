"""round_robin: rotation, aggregate state, sticky TF, reconnect on IDLE,
re-resolution, subchannel reuse (TRAPS.md "pick_first and round_robin")."""

from __future__ import annotations

import collections

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
from pyxds.lb.round_robin import RoundRobin, RoundRobinConfig, RoundRobinPicker
from pyxds.testing import FakeHelper

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def eps(*addresses: str) -> list[Endpoint]:
    return [Endpoint((a,)) for a in addresses]


def make(addresses=("a:1", "b:1", "c:1"), seed=0) -> tuple[RoundRobin, FakeHelper]:
    helper = FakeHelper(seed=seed)
    policy = RoundRobin(helper)
    assert policy.update(ResolverUpdate(eps(*addresses), RoundRobinConfig())) is None
    return policy, helper


def picks(helper: FakeHelper, n: int) -> list[str]:
    out = []
    for _ in range(n):
        result = helper.pick()
        assert isinstance(result, PickComplete)
        out.append(result.subchannel.address)
    return out


def fail(helper: FakeHelper, address: str, text: str | None = None) -> None:
    sc = helper.subchannel(address)
    sc.set_state(CONNECTING)
    sc.set_state(TF, text)


# -- config ------------------------------------------------------------------


def test_config_is_empty_object_and_ignores_unknown_fields():
    factory, config = registry.select([{"round_robin": {"anything": 1}}])
    assert factory.name == "round_robin"
    assert config == RoundRobinConfig() == registry.select([{"round_robin": {}}])[1]


def test_config_error_when_not_an_object():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"round_robin": "fast"}])
    assert str(err.value) == 'round_robin: expected object, got "fast"'


# -- connecting --------------------------------------------------------------


def test_every_address_gets_a_subchannel_and_connects_at_once():
    _, helper = make()
    # creation order starts at a random endpoint (C-core EndpointList)
    assert sorted(s.address for s in helper.subchannels) == ["a:1", "b:1", "c:1"]
    assert [s.connect_calls for s in helper.subchannels] == [1, 1, 1]
    assert helper.state_sequence() == [CONNECTING]
    assert isinstance(helper.pick(), PickQueue)


def test_duplicate_addresses_get_one_subchannel():
    helper = FakeHelper()
    policy = RoundRobin(helper)
    policy.update(ResolverUpdate([*eps("a:1", "a:1"), Endpoint(("b:1", "a:1"))], None))
    assert sorted(s.address for s in helper.subchannels) == ["a:1", "b:1"]


def test_multi_address_endpoint_gets_a_subchannel_per_address():
    helper = FakeHelper()
    RoundRobin(helper).update(ResolverUpdate([Endpoint(("[::1]:1", "1.1.1.1:1"))], None))
    assert sorted(s.address for s in helper.subchannels) == ["1.1.1.1:1", "[::1]:1"]


# -- picking -------------------------------------------------------------------


def test_ready_with_one_subchannel_ready_and_picks_only_ready_ones():
    _, helper = make()
    helper.subchannel("b:1").set_state(READY)
    assert helper.state is READY
    assert set(picks(helper, 10)) == {"b:1"}


def test_picks_rotate_fairly_over_ready_subchannels():
    _, helper = make(("a:1", "b:1", "c:1", "d:1"))
    for sc in helper.subchannels:
        sc.set_state(READY)
    got = picks(helper, 400)
    assert collections.Counter(got) == {a: 100 for a in ("a:1", "b:1", "c:1", "d:1")}
    # strict rotation: every window of 4 consecutive picks holds each once
    for i in range(0, 400, 4):
        assert len(set(got[i : i + 4])) == 4


def test_rotation_starts_at_a_random_subchannel():
    firsts = set()
    for seed in range(30):
        _, helper = make(("a:1", "b:1", "c:1"), seed=seed)
        for sc in helper.subchannels:
            sc.set_state(READY)
        firsts.add(picks(helper, 1)[0])
    assert firsts == {"a:1", "b:1", "c:1"}


def test_start_index_comes_from_helper_random():
    results = []
    for _ in range(2):
        _, helper = make(("a:1", "b:1", "c:1", "d:1", "e:1"), seed=42)
        for sc in helper.subchannels:
            sc.set_state(READY)
        results.append(picks(helper, 7))
    assert results[0] == results[1]


def test_picker_results_are_preallocated():
    _, helper = make(("a:1", "b:1"))
    for sc in helper.subchannels:
        sc.set_state(READY)
    picker = helper.last.picker
    assert isinstance(picker, RoundRobinPicker)
    first = [picker.pick(None) for _ in range(4)]  # type: ignore[arg-type]
    assert first[0] is first[2] and first[1] is first[3]


def test_picker_changes_when_the_ready_set_changes():
    _, helper = make()
    helper.subchannel("a:1").set_state(READY)
    helper.subchannel("b:1").set_state(READY)
    assert set(picks(helper, 4)) == {"a:1", "b:1"}
    helper.subchannel("a:1").set_state(IDLE)
    assert set(picks(helper, 4)) == {"b:1"}


# -- IDLE reconnect, re-resolution ----------------------------------------------


def test_ready_to_idle_reconnects_at_once():
    # TRAPS: round_robin children going READY -> IDLE never reconnected (grpc-node#2667).
    _, helper = make()
    a = helper.subchannel("a:1")
    a.set_state(READY)
    a.set_state(IDLE)
    assert a.connect_calls == 2
    assert helper.reresolution_requests == 1
    assert helper.state is CONNECTING


def test_idle_after_backoff_reconnects_at_once():
    _, helper = make()
    a = helper.subchannel("a:1")
    fail(helper, "a:1")
    a.set_state(IDLE)
    assert a.connect_calls == 2


def test_every_subchannel_failure_requests_reresolution():
    _, helper = make()
    fail(helper, "a:1")
    fail(helper, "a:1")
    fail(helper, "b:1")
    assert helper.reresolution_requests == 3


# -- aggregate state and sticky TF ------------------------------------------------


def test_connecting_while_some_not_failed():
    _, helper = make()
    fail(helper, "a:1")
    fail(helper, "b:1")
    assert helper.state is CONNECTING


def test_transient_failure_when_all_failed_with_last_error():
    _, helper = make()
    fail(helper, "a:1")
    fail(helper, "b:1")
    fail(helper, "c:1", "refused")
    assert helper.state is TF
    assert helper.last.status == Status(
        UNAVAILABLE, "connections to all backends failing; last error: UNAVAILABLE: refused"
    )
    result = helper.pick()
    assert isinstance(result, PickFail) and result.status == helper.last.status


def test_transient_failure_is_sticky_through_reconnect_attempts():
    _, helper = make()
    for address in ("a:1", "b:1", "c:1"):
        fail(helper, address)
    for _ in range(3):
        for address in ("a:1", "b:1", "c:1"):
            sc = helper.subchannel(address)
            sc.set_state(IDLE)
            sc.set_state(CONNECTING)
            assert helper.state is TF
        for address in ("a:1", "b:1", "c:1"):
            sc = helper.subchannel(address)
            sc.set_state(TF)
    assert CONNECTING not in helper.state_sequence()[1:]
    helper.subchannel("c:1").set_state(READY)
    assert helper.state is READY
    assert set(picks(helper, 3)) == {"c:1"}


def test_transient_failure_status_is_refreshed_with_new_errors():
    _, helper = make(("a:1",))
    fail(helper, "a:1", "one")
    helper.subchannel("a:1").set_state(IDLE)
    helper.subchannel("a:1").set_state(CONNECTING)
    helper.subchannel("a:1").set_state(TF, "two")
    assert [r.status.details[-3:] for r in helper.states if r.state is TF] == ["one", "two"]


@pytest.mark.parametrize("serving", [READY, CONNECTING])
def test_failing_again_while_another_endpoint_serves_publishes_nothing_but_is_the_last_error(
    serving, monkeypatch
):
    """While one endpoint is READY (or CONNECTING), failing endpoints'
    further failures (pick_first re-reports each failed attempt) change
    neither the aggregate nor its picker: nothing is published and nothing
    aggregated anew (issue 18: one such report per failed attempt).  The
    latest failure is still the last error named once every endpoint fails
    (here when an update removes the serving one: C-core's last_failure_)."""
    policy, helper = make()
    helper.subchannel("a:1").set_state(CONNECTING)
    if serving is READY:
        helper.subchannel("a:1").set_state(READY)
    fail(helper, "b:1", "b once")
    fail(helper, "c:1", "c once")
    published = len(helper.states)
    aggregated = []
    original = RoundRobin._aggregate

    def counting(self):
        aggregated.append(1)
        original(self)

    monkeypatch.setattr(RoundRobin, "_aggregate", counting)
    for text in ("b twice", "c twice", "b thrice"):
        sc = helper.subchannel(text[0] + ":1")
        sc.set_state(IDLE)
        sc.set_state(CONNECTING)
        sc.set_state(TF, text)
    assert len(helper.states) == published and aggregated == []
    assert helper.state is serving
    policy.update(ResolverUpdate(eps("b:1", "c:1"), RoundRobinConfig()))
    assert helper.state is TF
    assert helper.last.status.details == (
        "connections to all backends failing; last error: UNAVAILABLE: b thrice"
    )


def test_same_state_is_not_reported_twice():
    _, helper = make()
    for sc in helper.subchannels:
        sc.set_state(CONNECTING)
    assert helper.state_sequence() == [CONNECTING]


# -- updates -------------------------------------------------------------------


def test_unchanged_addresses_keep_their_subchannels():
    policy, helper = make()
    a = helper.subchannel("a:1")
    a.set_state(READY)
    policy.update(ResolverUpdate(eps("a:1", "d:1"), RoundRobinConfig()))
    assert helper.subchannel("a:1") is a and not a.shut_down
    assert helper.subchannel("b:1", live=False).shut_down
    assert helper.subchannel("c:1", live=False).shut_down
    assert helper.subchannel("d:1").connect_calls == 1
    assert set(picks(helper, 4)) == {"a:1"}


def test_same_update_twice_is_a_no_op():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    before = (len(helper.states), len(helper.subchannels), helper.reresolution_requests)
    calls = [s.connect_calls for s in helper.subchannels]
    policy.update(ResolverUpdate(eps("a:1", "b:1", "c:1"), RoundRobinConfig()))
    after = (len(helper.states), len(helper.subchannels), helper.reresolution_requests)
    assert before == after
    assert [s.connect_calls for s in helper.subchannels] == calls


def test_removing_the_ready_subchannel_updates_the_picker():
    policy, helper = make()
    helper.subchannel("a:1").set_state(READY)
    helper.subchannel("b:1").set_state(READY)
    policy.update(ResolverUpdate(eps("b:1", "c:1"), RoundRobinConfig()))
    assert set(picks(helper, 4)) == {"b:1"}


def test_empty_list_is_rejected_with_transient_failure():
    policy, helper = make()
    status = policy.update(ResolverUpdate([], RoundRobinConfig()))
    assert status == Status(UNAVAILABLE, "empty address list")
    assert helper.state is TF and helper.last.status == status
    assert helper.live_subchannels() == []
    # C-core round_robin does not ask itself: the rejected update's status
    # tells the resolver (round_robin.cc UpdateLocked).
    assert helper.reresolution_requests == 0


def test_resolver_error_without_addresses_reports_it():
    helper = FakeHelper()
    policy = RoundRobin(helper)
    error = Status(UNAVAILABLE, "no such host")
    policy.resolver_error(error)
    assert helper.state is TF and helper.last.status == error


def test_resolver_error_with_addresses_is_ignored():
    policy, helper = make()
    policy.resolver_error(Status(UNAVAILABLE, "no such host"))
    assert helper.state_sequence() == [CONNECTING]


def test_shutdown_shuts_down_every_subchannel():
    policy, helper = make()
    policy.shutdown()
    assert all(s.shut_down for s in helper.subchannels)


def test_reset_backoff_reaches_every_subchannel():
    policy, helper = make()
    policy.reset_backoff()
    assert [s.reset_backoff_calls for s in helper.subchannels] == [1, 1, 1]


def test_round_robin_is_registered():
    factory = registry.get("round_robin")
    assert factory is not None and isinstance(factory.build(FakeHelper()), RoundRobin)
