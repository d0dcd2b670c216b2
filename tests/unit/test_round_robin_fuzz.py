"""Fuzz round_robin with arbitrary subchannel-state sequences and updates and
check its invariants after every event (TRAPS.md grpc-node#2667: IDLE
children must reconnect)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pyxds.lb import ConnectivityState, Endpoint, PickArgs, PickComplete, ResolverUpdate
from pyxds.lb.round_robin import RoundRobin, RoundRobinConfig
from pyxds.testing import FakeHelper

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
POOL = ("a:1", "b:1", "c:1", "d:1")
ARGS = PickArgs("/s/m")

state_change = st.tuples(
    st.just("state"), st.integers(0, 3), st.sampled_from([IDLE, CONNECTING, READY, TF])
)
actions = st.one_of(
    *([state_change] * 6),
    st.tuples(st.just("update"), st.lists(st.sampled_from(POOL), min_size=0, max_size=4)),
)


@settings(max_examples=300, deadline=None)
@given(
    first=st.lists(st.sampled_from(POOL), min_size=1, max_size=4),
    steps=st.lists(actions, max_size=50),
    seed=st.integers(0, 5),
)
def test_round_robin_invariants_hold_for_any_state_sequence(first, steps, seed):
    helper = FakeHelper(seed=seed)
    policy = RoundRobin(helper)
    calls_at_change: dict[int, int] = {}
    sticky = False
    seen = 0
    added_since_tf = False

    def apply(action):
        nonlocal added_since_tf
        if action[0] == "state":
            live = helper.live_subchannels()
            if live:
                sc = live[action[1] % len(live)]
                calls_at_change[id(sc)] = sc.connect_calls
                sc.set_state(action[2])
        else:
            before = {sc.address for sc in helper.live_subchannels()}
            policy.update(ResolverUpdate([Endpoint((a,)) for a in action[1]], RoundRobinConfig()))
            if {sc.address for sc in helper.live_subchannels()} - before:
                added_since_tf = True

    for action in [("update", first), *steps]:
        apply(action)
        live = helper.live_subchannels()
        # every IDLE subchannel has been asked to connect since it went IDLE
        for sc in live:
            if sc.state is IDLE:
                assert sc.connect_calls > calls_at_change.get(id(sc), 0), sc
        # one subchannel per address
        assert len({sc.address for sc in live}) == len(live)
        # READY picker returns READY subchannels only, and all of them in rotation
        if helper.states and helper.state is READY:
            ready = {sc.address for sc in live if sc.state is READY}
            picked = set()
            for _ in range(2 * len(ready)):
                result = helper.pick()
                assert isinstance(result, PickComplete)
                assert result.subchannel.state is READY and not result.subchannel.shut_down
                picked.add(result.subchannel.address)
            assert picked == ready
        if any(sc.state is READY for sc in live):
            assert helper.state is READY
        # sticky TF: only READY or a brand-new address may end TRANSIENT_FAILURE
        for report in helper.states[seen:]:
            if sticky and report.state is CONNECTING:
                assert added_since_tf, helper.state_sequence()
            if report.state is TF:
                sticky, added_since_tf = True, False
            elif report.state is READY:
                sticky = False
        seen = len(helper.states)
    policy.shutdown()
    assert all(sc.shut_down for sc in helper.subchannels)
