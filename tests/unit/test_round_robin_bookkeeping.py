"""round_robin's per-report bookkeeping (module docstring "Cost": state
counts and the READY children kept in endpoint order) gives exactly what a
from-scratch recomputation over every child gives.

Seeded random sequences of subchannel transitions, direct child reports
(including READY pickers that are not pick_first's constant one, and a
READY child's picker reported again), endpoint
list updates (additions, removals, dual-stack endpoints sharing addresses,
empty lists), timer advances, exit_idle and reset_backoff drive two
policies side by side: the real one and a reference that overrides the
aggregation with the full scan round_robin had before (issue 18).  After
every step both must have published the same reports (state, status, picker
kind, READY results in the same order, same rotation start), and the real
policy's counts and READY list must equal a recomputation from its children.
"""

from __future__ import annotations

import random
from typing import Any

import grpc
import pytest

from pyxds.lb import (
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    FailPicker,
    PickArgs,
    PickComplete,
    Picker,
    PickResult,
    ResolverUpdate,
    Status,
)
from pyxds.lb.api import QueuePicker
from pyxds.lb.pick_first import all_ready_pickers
from pyxds.lb.round_robin import (
    RoundRobin,
    RoundRobinConfig,
    RoundRobinPicker,
    _Child,
    _DelegatingRoundRobinPicker,
)
from pyxds.testing import FakeHelper
from pyxds.testing.fakes import StateReport

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
STATES = (IDLE, CONNECTING, READY, TF)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
POOL = tuple(f"10.0.0.{i}:80" for i in range(14))
ARGS = PickArgs("/s/m")


class _FullRecompute(RoundRobin):
    """round_robin as it was before the bookkeeping: every report scans
    every child (the reference)."""

    def _on_child_state(
        self, child: _Child, state: ConnectivityState, status: Status, picker: Picker
    ) -> None:
        child.state, child.status, child.picker = state, status, picker
        if child in self._draining:
            if state is not READY:
                self._draining.remove(child)
                child.close()
            if not self._updating and not self._shutdown:
                self._aggregate()
            return
        if state is TF:
            self._last_failure = status.details
        if state is IDLE:
            child.policy.exit_idle()
        if not self._updating and not self._shutdown:
            self._aggregate()

    def _settle_draining(self) -> list[_Child]:
        if not self._draining:
            return []
        children = self._children.values()
        if any(c.state is READY for c in children) or all(c.state is TF for c in children):
            for child in self._draining:
                child.close()
            self._draining = []
        return [child for child in self._draining if child.state is READY]

    def _aggregate(self) -> None:
        serving = self._settle_draining()
        if serving:
            self._report_ready(serving)
            return
        children = self._children.values()
        ready = [child for child in children if child.state is READY]
        if ready:
            self._report_ready(ready)
            return
        if any(child.state in (CONNECTING, IDLE) for child in children):
            self._report(CONNECTING, OK_STATUS, QueuePicker(), key=(CONNECTING,))
            return
        status = Status(
            UNAVAILABLE, f"connections to all backends failing; last error: {self._last_failure}"
        )
        self._report(TF, status, FailPicker(status), key=(TF, status))

    def _report_ready(self, ready: list[_Child]) -> None:
        pickers = [child.picker for child in ready]
        key = (READY, *pickers)
        if key == self._reported_key:
            return
        start = self.helper.random.randrange(len(pickers))
        picker: Picker
        if all_ready_pickers(pickers):
            picker = RoundRobinPicker([p.result for p in pickers], start)
        else:
            picker = _DelegatingRoundRobinPicker(pickers, start)
        self._report(READY, OK_STATUS, picker, key)


class _Labelled(Picker):
    """A READY picker that is not pick_first's constant one (a custom leaf)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def pick(self, args: PickArgs) -> PickResult:
        raise AssertionError("not picked in this test")


def _picker_view(picker: Picker) -> Any:
    """What a published picker would do, in terms comparable across the two
    helpers (their subchannels are different objects)."""
    if isinstance(picker, RoundRobinPicker):
        first = picker.pick(ARGS)  # the rotation start
        assert isinstance(first, PickComplete)
        rest = [picker.pick(ARGS) for _ in range(len(picker.results) - 1)]
        return (
            "constant",
            [r.subchannel.address for r in picker.results],
            first.subchannel.address,
            [r.subchannel.address for r in rest if isinstance(r, PickComplete)],
        )
    if isinstance(picker, _DelegatingRoundRobinPicker):
        return ("delegating", [_leaf_view(p) for p in picker.pickers])
    return type(picker).__name__


def _leaf_view(picker: Picker) -> Any:
    if isinstance(picker, _Labelled):
        return picker.label
    result = picker.pick(ARGS)
    assert isinstance(result, PickComplete)
    return result.subchannel.address


def _report_view(report: StateReport) -> Any:
    picker = None if report.state is TF else _picker_view(report.picker)
    return (report.state, report.status.code, report.status.details, picker)


def _expected(policy: RoundRobin) -> tuple[ConnectivityState, list[_Child]]:
    """The aggregate state and the children serving, from scratch."""
    children = list(policy._children.values())
    serving = [c for c in policy._draining if c.state is READY]
    if serving:
        return READY, serving
    ready = [c for c in children if c.state is READY]
    if ready:
        return READY, ready
    if any(c.state in (CONNECTING, IDLE) for c in children):
        return CONNECTING, []
    return TF, []


def _check_bookkeeping(policy: RoundRobin) -> None:
    children = list(policy._children.values())
    assert [c.index for c in children] == list(range(len(children)))
    assert all(c.index == -1 for c in policy._draining)
    ready = [c for c in children if c.state is READY]
    assert policy._ready_children == ready
    assert policy._ready_at == [c.index for c in ready]
    assert policy._ready_pickers == [c.picker for c in ready]
    assert policy._ready_count == len(ready)
    assert policy._tf_count == sum(c.state is TF for c in children)
    assert policy._non_constant == sum(isinstance(c.picker, _Labelled) for c in ready)
    assert policy._ready_results == [
        None if isinstance(c.picker, _Labelled) else c.picker.result  # type: ignore[attr-defined]
        for c in ready
    ]
    # the draining rule has been applied
    if policy._draining:
        assert not ready and not all(c.state is TF for c in children)


def _random_update(rng: random.Random) -> list[Endpoint]:
    if rng.random() < 0.05:
        return []
    endpoints = []
    for _ in range(rng.randint(1, 8)):
        size = 1 if rng.random() < 0.8 else 2
        endpoints.append(Endpoint(tuple(rng.sample(POOL, size))))
    return endpoints


def _step(rng: random.Random, pair: list[tuple[RoundRobin, FakeHelper]]) -> str:
    """One random action applied identically to both policies."""
    roll = rng.random()
    helper = pair[0][1]
    if roll < 0.6:
        live = sorted({sc.address for sc in helper.live_subchannels()})
        if not live:
            return "none"
        address, state = rng.choice(live), rng.choice(STATES)
        text = f"refused {rng.randint(0, 3)}" if state is TF else None
        for _, h in pair:
            h.subchannel(address).set_state(state, text)
        return f"{address} -> {state.name}"
    if roll < 0.72:
        count = len(pair[0][0].children)
        if not count:
            return "none"
        at = rng.randrange(count)
        state = rng.choice(STATES)
        label = f"leaf{rng.randint(0, 2)}"
        again = rng.random() < 0.3  # a READY child reports its picker again
        for policy, _ in pair:
            child = policy.children[at]
            if state is READY and again and child.state is READY:
                child.update_state(state, OK_STATUS, child.picker)
            elif state is READY:
                child.update_state(state, OK_STATUS, _Labelled(label))
            elif state is TF:
                child.update_state(state, Status(UNAVAILABLE, label), QueuePicker())
            else:
                child.update_state(state, OK_STATUS, QueuePicker())
        return f"child {at} reports {state.name}"
    if roll < 0.9:
        endpoints = _random_update(rng)
        for policy, _ in pair:
            policy.update(ResolverUpdate(endpoints, RoundRobinConfig()))
        return f"update {[e.addresses for e in endpoints]}"
    if roll < 0.96:
        for _, h in pair:
            h.clock.advance(0.25)
        return "advance 250 ms"
    if roll < 0.98:
        for policy, _ in pair:
            policy.exit_idle()
        return "exit_idle"
    for policy, _ in pair:
        policy.reset_backoff()
    return "reset_backoff"


@pytest.mark.parametrize("seed", range(40))
def test_bookkeeping_publishes_what_a_full_recompute_publishes(seed: int) -> None:
    rng = random.Random(seed)
    helper, reference_helper = FakeHelper(seed=seed), FakeHelper(seed=seed)
    policy, reference = RoundRobin(helper), _FullRecompute(reference_helper)
    pair: list[tuple[RoundRobin, FakeHelper]] = [(policy, helper), (reference, reference_helper)]
    first = [Endpoint((a,)) for a in rng.sample(POOL, rng.randint(1, 8))]
    for p, _ in pair:
        p.update(ResolverUpdate(first, RoundRobinConfig()))
    history = ["first update"]
    for _ in range(250):
        history.append(_step(rng, pair))
        context = history[-6:]
        assert len(helper.states) == len(reference_helper.states), context
        new = helper.states[-1]
        assert _report_view(new) == _report_view(reference_helper.states[-1]), context
        assert helper.random.getstate() == reference_helper.random.getstate(), context
        assert [c.addresses for c in policy.children] == [
            c.addresses for c in reference.children
        ], context
        _check_bookkeeping(policy)
        if policy._children:
            state, serving = _expected(policy)
            assert new.state is state, context
            if state is READY and isinstance(new.picker, RoundRobinPicker):
                assert [r.subchannel for r in new.picker.results] == [
                    c.picker.subchannel  # type: ignore[attr-defined]
                    for c in serving
                ], context
    policy.shutdown()
    reference.shutdown()
    _check_bookkeeping(policy)
    assert all(sc.shut_down for sc in helper.subchannels)


def test_endpoints_ready_in_any_order_are_rotated_in_endpoint_order() -> None:
    """2000 endpoints becoming READY in random order: the READY list, grown
    one bisect-insert per report, is in endpoint order."""
    helper = FakeHelper(seed=3)
    policy = RoundRobin(helper)
    addresses = [f"10.1.{i // 250}.{i % 250}:80" for i in range(2000)]
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses], RoundRobinConfig()))
    order = list(addresses)
    random.Random(3).shuffle(order)
    for address in order:
        helper.subchannel(address).set_state(READY)
    assert policy._ready_count == 2000
    last = helper.states[-1]
    assert isinstance(last.picker, RoundRobinPicker)
    assert [r.subchannel.address for r in last.picker.results] == addresses
    _check_bookkeeping(policy)
