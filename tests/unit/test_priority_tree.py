"""The A56 example tree with real policies: priority_experimental ->
weighted_target_experimental -> round_robin, fed the four addresses of A56's
"Hierarchical Addresses" section.  Each address must reach exactly its leaf
(path stripped on the way down), children are created lazily, and failover /
fail-back work end to end."""

from __future__ import annotations

import pytest

from pyxds.lb import ConnectivityState, Endpoint, PickComplete, PickQueue, ResolverUpdate, registry
from pyxds.lb.hierarchy import PATH_KEY
from pyxds.lb.priority import CHILD_RETENTION, FAILOVER_TIMEOUT, PriorityFactory
from pyxds.testing import FakeHelper

round_robin = pytest.importorskip("pyxds.lb.round_robin")

CS = ConnectivityState

A56_ADDRESSES = {
    "10.0.0.1:80": ("child0", "localityA"),
    "10.0.0.2:80": ("child0", "localityB"),
    "10.0.0.3:80": ("child1", "localityC"),
    "10.0.0.4:80": ("child1", "localityD"),
}


def tree_config(localities: dict[str, tuple[str, ...]] | None = None):
    localities = localities or {
        "child0": ("localityA", "localityB"),
        "child1": ("localityC", "localityD"),
    }
    children = {
        child: {
            "config": [
                {
                    "weighted_target_experimental": {
                        "targets": {
                            loc: {"weight": 1, "childPolicy": [{"round_robin": {}}]} for loc in locs
                        }
                    }
                }
            ]
        }
        for child, locs in localities.items()
    }
    return registry.select(
        [{"priority_experimental": {"children": children, "priorities": list(localities)}}]
    )[1]


def a56_endpoints() -> list[Endpoint]:
    return [Endpoint((address,), {PATH_KEY: path}) for address, path in A56_ADDRESSES.items()]


def leaf_policy(lb, child: str, locality: str):
    weighted_target = lb.children[child].policy
    return weighted_target.children[locality].policy


def picks(helper: FakeHelper, n: int = 40) -> set[str]:
    out = set()
    for _ in range(n):
        result = helper.pick()
        assert isinstance(result, PickComplete), result
        out.add(result.subchannel.address)
    return out


@pytest.fixture
def tree():
    helper = FakeHelper(seed=7)
    lb = PriorityFactory().build(helper)
    assert lb.update(ResolverUpdate(a56_endpoints(), tree_config())) is None
    return helper, lb


def test_a56_example_tree_routes_each_address_to_its_own_leaf(tree):
    helper, lb = tree
    # Lazy: only child0's subtree exists.
    assert set(lb.children) == {"child0"}
    assert sorted(s.address for s in helper.subchannels) == ["10.0.0.1:80", "10.0.0.2:80"]
    assert [s.address for s in leaf_policy(lb, "child0", "localityA").subchannels] == [
        "10.0.0.1:80"
    ]
    assert [s.address for s in leaf_policy(lb, "child0", "localityB").subchannels] == [
        "10.0.0.2:80"
    ]
    assert helper.state is CS.CONNECTING and isinstance(helper.pick(), PickQueue)
    helper.subchannel("10.0.0.1:80").set_state(CS.READY)
    assert helper.state is CS.READY and picks(helper) == {"10.0.0.1:80"}
    helper.subchannel("10.0.0.2:80").set_state(CS.READY)
    assert picks(helper) == {"10.0.0.1:80", "10.0.0.2:80"}
    # child0 fails: child1's subtree is built and gets exactly its addresses.
    helper.subchannel("10.0.0.1:80").set_state(CS.TRANSIENT_FAILURE)
    helper.subchannel("10.0.0.2:80").set_state(CS.TRANSIENT_FAILURE)
    assert set(lb.children) == {"child0", "child1"}
    assert [s.address for s in leaf_policy(lb, "child1", "localityC").subchannels] == [
        "10.0.0.3:80"
    ]
    assert [s.address for s in leaf_policy(lb, "child1", "localityD").subchannels] == [
        "10.0.0.4:80"
    ]
    for address in ("10.0.0.3:80", "10.0.0.4:80"):
        assert helper.subchannel(address).attributes.get(PATH_KEY, ()) == ()
    helper.subchannel("10.0.0.4:80").set_state(CS.READY)
    assert picks(helper) == {"10.0.0.4:80"}
    helper.subchannel("10.0.0.3:80").set_state(CS.READY)
    assert picks(helper) == {"10.0.0.3:80", "10.0.0.4:80"}


def test_a56_tree_fails_back_and_retires_the_lower_subtree_after_15_minutes(tree):
    helper, lb = tree
    helper.subchannel("10.0.0.1:80").set_state(CS.TRANSIENT_FAILURE)
    helper.subchannel("10.0.0.2:80").set_state(CS.TRANSIENT_FAILURE)
    helper.subchannel("10.0.0.3:80").set_state(CS.READY)
    assert picks(helper) == {"10.0.0.3:80"}
    helper.subchannel("10.0.0.1:80").set_state(CS.READY)
    assert picks(helper) == {"10.0.0.1:80"}
    lower = helper.subchannel("10.0.0.3:80")
    helper.clock.advance(CHILD_RETENTION - 0.001)
    assert not lower.shut_down
    helper.clock.advance(0.001)
    assert lower.shut_down and set(lb.children) == {"child0"}


def test_a56_tree_connecting_priority_waits_for_the_failover_timer(tree):
    helper, lb = tree
    helper.clock.advance(FAILOVER_TIMEOUT - 0.001)
    assert set(lb.children) == {"child0"} and isinstance(helper.pick(), PickQueue)
    helper.clock.advance(0.001)
    assert set(lb.children) == {"child0", "child1"}


def test_a56_tree_moving_a_child_up_a_priority_keeps_its_connections(tree):
    helper, lb = tree
    helper.subchannel("10.0.0.1:80").set_state(CS.TRANSIENT_FAILURE)
    helper.subchannel("10.0.0.2:80").set_state(CS.TRANSIENT_FAILURE)
    helper.subchannel("10.0.0.3:80").set_state(CS.READY)
    created = len(helper.subchannels)
    child1 = lb.children["child1"]
    # EDS moved child1's localities up: priorities [child1, child2].
    config = tree_config({"child1": ("localityC", "localityD"), "child2": ("localityE",)})
    endpoints = [
        Endpoint(("10.0.0.3:80",), {PATH_KEY: ("child1", "localityC")}),
        Endpoint(("10.0.0.4:80",), {PATH_KEY: ("child1", "localityD")}),
        Endpoint(("10.0.0.5:80",), {PATH_KEY: ("child2", "localityE")}),
    ]
    lb.update(ResolverUpdate(endpoints, config))
    assert lb.children["child1"] is child1 and lb.current_child == "child1"
    assert len(helper.subchannels) == created  # no new connection; child2 not built
    assert picks(helper) == {"10.0.0.3:80"}


def test_a56_tree_same_update_twice_changes_nothing(tree):
    helper, lb = tree
    helper.subchannel("10.0.0.1:80").set_state(CS.READY)
    helper.subchannel("10.0.0.2:80").set_state(CS.READY)
    subchannels = list(helper.subchannels)
    picker = helper.last.picker
    lb.update(ResolverUpdate(a56_endpoints(), tree_config()))
    assert helper.subchannels == subchannels
    assert all(not s.shut_down for s in subchannels)
    assert helper.last.picker is picker


def test_same_locality_name_in_two_priorities_gets_two_distinct_leaves():
    helper = FakeHelper(seed=3)
    lb = PriorityFactory().build(helper)
    config = tree_config({"p0": ("zone-a",), "p1": ("zone-a",)})
    endpoints = [
        Endpoint(("10.0.1.1:80",), {PATH_KEY: ("p0", "zone-a")}),
        Endpoint(("10.0.2.1:80",), {PATH_KEY: ("p1", "zone-a")}),
    ]
    lb.update(ResolverUpdate(endpoints, config))
    helper.subchannel("10.0.1.1:80").set_state(CS.TRANSIENT_FAILURE)
    p0_leaf, p1_leaf = leaf_policy(lb, "p0", "zone-a"), leaf_policy(lb, "p1", "zone-a")
    assert p0_leaf is not p1_leaf
    assert [s.address for s in p0_leaf.subchannels] == ["10.0.1.1:80"]
    assert [s.address for s in p1_leaf.subchannels] == ["10.0.2.1:80"]
    helper.subchannel("10.0.2.1:80").set_state(CS.READY)
    assert picks(helper) == {"10.0.2.1:80"}


def test_priority_without_endpoints_fails_over_at_once():
    # cds gives a priority whose EDS data is missing an empty endpoint list
    # (TRAPS.md, grpc-go#6462): its round_robin fails while being created,
    # and the same choice moves on to the next priority.
    helper = FakeHelper(seed=11)
    lb = PriorityFactory().build(helper)
    endpoints = [
        Endpoint(("10.0.0.3:80",), {PATH_KEY: ("child1", "localityC")}),
        Endpoint(("10.0.0.4:80",), {PATH_KEY: ("child1", "localityD")}),
    ]
    lb.update(ResolverUpdate(endpoints, tree_config()))
    assert set(lb.children) == {"child0", "child1"}
    assert lb.children["child0"].state is CS.TRANSIENT_FAILURE
    assert lb.current_child == "child1" and helper.clock.now() == 0.0
    helper.subchannel("10.0.0.3:80").set_state(CS.READY)
    assert picks(helper) == {"10.0.0.3:80"}
