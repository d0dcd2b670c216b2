"""Fuzz pick_first with arbitrary subchannel-state sequences (TRAPS.md:
"pick_first stopped trying to connect after a rare TF -> IDLE ordering",
grpc#38714, grpc#40162) and check its invariants after every event."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyxds.lb import ConnectivityState, Endpoint, PickArgs, PickComplete, ResolverUpdate
from pyxds.lb.pick_first import Phase, PickFirst, PickFirstConfig
from pyxds.testing import FakeHelper, FakeSubchannel

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
POOL = ("a:1", "b:1", "[::1]:1", "c:1")
ARGS = PickArgs("/s/m")

states = st.sampled_from([IDLE, CONNECTING, READY, TF])
state_change = st.tuples(st.just("state"), st.integers(0, 3), states)
actions = st.one_of(
    *([state_change] * 8),
    st.tuples(st.just("advance"), st.sampled_from([0.0, 0.1, 0.25, 0.3, 1.0])),
    st.tuples(st.just("advance"), st.sampled_from([0.0, 0.1, 0.25, 0.3, 1.0])),
    st.tuples(st.just("update"), st.lists(st.sampled_from(POOL), min_size=0, max_size=5)),
    st.tuples(st.just("exit_idle")),
    st.tuples(st.just("pick")),
)


class Checker:
    def __init__(self, shuffle: bool, seed: int) -> None:
        self.helper = FakeHelper(seed=seed)
        self.policy = PickFirst(self.helper)
        self.shuffle = shuffle
        # connect() count when each subchannel last changed state (creation: 0)
        self.calls_at_change: dict[int, int] = {}
        self.calls_at_shutdown: dict[int, int] = {}
        self.seen_reports = 0
        self.sticky = False

    def live(self) -> list[FakeSubchannel]:
        return self.helper.live_subchannels()

    def connect_pending(self, sc: FakeSubchannel) -> bool:
        return sc.connect_calls > self.calls_at_change.get(id(sc), 0)

    def apply(self, action: tuple) -> None:
        kind = action[0]
        if kind == "state":
            live = self.live()
            if not live:
                return
            sc = live[action[1] % len(live)]
            self.calls_at_change[id(sc)] = sc.connect_calls
            sc.set_state(action[2])
        elif kind == "advance":
            self.helper.clock.advance(action[1])
        elif kind == "update":
            endpoints = [Endpoint((a,)) for a in action[1]]
            self.policy.update(ResolverUpdate(endpoints, PickFirstConfig(self.shuffle)))
        elif kind == "exit_idle":
            self.policy.exit_idle()
        elif kind == "pick" and self.helper.states:
            self.helper.last.picker.pick(ARGS)

    def check(self) -> None:
        helper, policy = self.helper, self.policy
        # sticky TF: after TF, nothing but TF until READY
        for report in helper.states[self.seen_reports :]:
            if self.sticky:
                assert report.state in (TF, READY), helper.state_sequence()
            if report.state is TF:
                self.sticky = True
            elif report.state is READY:
                self.sticky = False
        self.seen_reports = len(helper.states)
        # shut-down subchannels are never asked to connect again
        for sc in helper.subchannels:
            if sc.shut_down:
                self.calls_at_shutdown.setdefault(id(sc), sc.connect_calls)
                assert sc.connect_calls == self.calls_at_shutdown[id(sc)]
        live = self.live()
        live_addresses = [sc.address for sc in live]
        assert len(set(live_addresses)) == len(live_addresses)
        assert set(live_addresses) <= set(policy.addresses)
        phase = policy.phase
        if helper.states and helper.state is READY:
            result = helper.pick()
            assert isinstance(result, PickComplete)
            assert result.subchannel.state is READY and not result.subchannel.shut_down
            assert phase is Phase.READY
        if phase is Phase.READY:
            assert helper.state is READY
            assert live == [policy.selected]
        if phase is Phase.FIRST_PASS:
            assert set(live_addresses) == set(policy.addresses)
            assert (
                policy.timer_pending
                or any(sc.state is CONNECTING for sc in live)
                or any(sc.state is IDLE and self.connect_pending(sc) for sc in live)
            ), (live, policy.addresses)
        if phase is Phase.RECONNECTING:
            assert helper.state is TF
            for sc in live:
                if sc.state is IDLE:
                    assert self.connect_pending(sc), sc


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    first=st.lists(st.sampled_from(POOL), min_size=1, max_size=4),
    steps=st.lists(actions, max_size=60),
    shuffle=st.booleans(),
    seed=st.integers(0, 3),
)
def test_pick_first_invariants_hold_for_any_state_sequence(first, steps, shuffle, seed):
    checker = Checker(shuffle, seed)
    checker.apply(("update", first))
    checker.check()
    for action in steps:
        checker.apply(action)
        checker.check()
    checker.policy.shutdown()
    assert all(sc.shut_down for sc in checker.helper.subchannels)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([IDLE, CONNECTING, TF])), max_size=80
    ),
    advances=st.lists(st.sampled_from([0.0, 0.25]), max_size=80),
)
def test_pick_first_without_ready_keeps_trying_and_stays_sticky(steps, advances):
    """Only failures and reconnects: after the first TF the policy reports
    nothing but TF, and re-resolves once per N failures after the pass."""
    checker = Checker(False, 0)
    checker.apply(("update", ["a:1", "b:1", "c:1"]))
    for (index, state), delay in zip(steps, advances + [0.0] * len(steps), strict=False):
        checker.apply(("state", index, state))
        checker.apply(("advance", delay))
        checker.check()
    seq = checker.helper.state_sequence()
    assert seq[0] is CONNECTING
    assert CONNECTING not in seq[1:] and READY not in seq
