"""Conformance fuzz: round_robin over pick_first children (A61) with
dual-stack endpoints, random subchannel reports, timers and updates.

Invariants after every event:
* a READY picker only returns live READY subchannels;
* round_robin is READY exactly when some endpoint's pick_first has a READY
  selected subchannel (C-core: "ANY child is READY => policy is READY");
* every address is held by at most one live subchannel;
* TRANSIENT_FAILURE is reported only when every endpoint's child is in
  TRANSIENT_FAILURE.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pyxds.lb import ConnectivityState, Endpoint, PickComplete, ResolverUpdate
from pyxds.lb.pick_first import CONNECTION_ATTEMPT_DELAY
from pyxds.lb.round_robin import RoundRobin, RoundRobinConfig
from pyxds.testing import FakeHelper

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE

POOL = [
    ("[2001:db8::1]:80", "10.0.0.1:80"),
    ("[2001:db8::2]:80", "10.0.0.2:80"),
    ("10.0.0.3:80",),
    ("[2001:db8::4]:80",),
    ("10.0.0.2:80", "10.0.0.5:80"),  # overlaps the second endpoint
]

endpoint_lists = st.lists(st.sampled_from(POOL), min_size=1, max_size=4).map(
    lambda groups: [Endpoint(g) for g in groups]
)
actions = st.one_of(
    st.tuples(st.just("state"), st.integers(0, 20), st.sampled_from([IDLE, CONNECTING, READY, TF])),
    st.tuples(st.just("update"), endpoint_lists),
    st.tuples(st.just("tick")),
)


@settings(max_examples=200, deadline=None)
@given(first=endpoint_lists, steps=st.lists(actions, max_size=40), seed=st.integers(0, 3))
def test_round_robin_over_pick_first_children_keeps_its_invariants(first, steps, seed):
    """A61 petiole policy + C-core round_robin aggregation, fuzzed."""
    helper = FakeHelper(seed=seed)
    policy = RoundRobin(helper)
    policy.update(ResolverUpdate(first, RoundRobinConfig()))
    for action in steps:
        if action[0] == "state":
            live = helper.live_subchannels()
            if live:
                live[action[1] % len(live)].set_state(action[2])
        elif action[0] == "update":
            policy.update(ResolverUpdate(action[1], RoundRobinConfig()))
        else:
            helper.clock.advance(CONNECTION_ATTEMPT_DELAY)
        live = helper.live_subchannels()
        # Removed READY endpoints may keep serving while a new list connects
        # (C-core's pending endpoint list); the new list may name their
        # addresses again (the channel's subchannel pool then shares one
        # connection).  Among the current endpoints each address is held once.
        draining = {id(sc) for child in policy._draining for sc in child.policy.subchannels}
        addresses = [s.address for s in live if id(s) not in draining]
        assert len(addresses) == len(set(addresses)), addresses
        assert all(s.state is READY for s in live if id(s) in draining)
        children = policy.children
        any_selected_ready = any(
            child.policy.selected is not None and child.policy.selected.state is READY
            for child in children
        )
        if not helper.states:
            continue
        state = helper.state
        assert (state is READY) == any_selected_ready, (state, children)
        if state is READY:
            for _ in range(len(children) + 1):
                result = helper.pick()
                assert isinstance(result, PickComplete)
                assert result.subchannel.state is READY and not result.subchannel.shut_down
        if state is TF:
            assert all(child.state is TF for child in children), children
