"""Property test: over random target sets, weights and child reports,
weighted_target_experimental's published state always follows A28's
aggregation rule as C-core applies it (READY > CONNECTING > IDLE >
TRANSIENT_FAILURE over active targets, TRANSIENT_FAILURE sticky until
READY), READY picks land only on READY targets, and removed targets
never count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pyxds.lb import ConnectivityState, PickComplete, PickFail, PickQueue, ResolverUpdate
from pyxds.lb.weighted_target import WeightedTargetFactory
from pyxds.testing import FakeHelper

try:
    from test_priority_leaf_support import ep, leaf, reset_leaves
    from test_weighted_target import parse
except ImportError:  # pragma: no cover - package-style test collection
    from .test_priority_leaf_support import ep, leaf, reset_leaves  # type: ignore[no-redef]
    from .test_weighted_target import parse  # type: ignore[no-redef]

CS = ConnectivityState
NAMES = ("a", "b", "c", "d")
STATES = [CS.READY, CS.IDLE, CS.CONNECTING, CS.TRANSIENT_FAILURE]

operations = st.one_of(
    st.tuples(
        st.just("update"),
        st.dictionaries(st.sampled_from(NAMES), st.integers(1, 5), max_size=4),
    ),
    st.tuples(st.just("report"), st.sampled_from(NAMES), st.sampled_from(STATES)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(operations, min_size=1, max_size=30))
def test_aggregate_state_and_picks_follow_the_rule(ops):
    reset_leaves()
    helper = FakeHelper(seed=5)
    lb = WeightedTargetFactory().build(helper)
    counted: dict[str, ConnectivityState] = {}  # the reference: per-target counted state
    active: set[str] = set()
    configured = False
    endpoints = [ep(f"{name}:80", name) for name in NAMES]
    for op in ops:
        if op[0] == "update":
            weights = op[1]
            lb.update(ResolverUpdate(endpoints, parse(weights)))
            for name in weights:
                counted.setdefault(name, CS.CONNECTING)
            active = set(weights)
            configured = True
        else:
            _, name, state = op
            if name not in counted:
                continue
            leaf(name).report(state)
            if (
                counted[name] is not CS.TRANSIENT_FAILURE
                or state is CS.READY
                or state is (CS.TRANSIENT_FAILURE)
            ):
                counted[name] = state
        if not configured:
            continue
        states = {counted[name] for name in active}
        if CS.READY in states:
            expected = CS.READY
        elif CS.CONNECTING in states:
            expected = CS.CONNECTING
        elif CS.IDLE in states:
            expected = CS.IDLE
        else:
            expected = CS.TRANSIENT_FAILURE
        assert helper.state is expected, (counted, active)
        results = [helper.pick() for _ in range(20)]
        if expected is CS.READY:
            ready = {f"{name}:80" for name in active if counted[name] is CS.READY}
            assert all(isinstance(r, PickComplete) for r in results)
            assert {r.subchannel.address for r in results} <= ready
        elif expected is CS.TRANSIENT_FAILURE:
            assert all(isinstance(r, PickFail) for r in results)
        else:
            assert all(isinstance(r, PickQueue) for r in results)
