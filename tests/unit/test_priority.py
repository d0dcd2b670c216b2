"""priority_experimental (gRFC A56, latest text; A115 option): one test per
rule of issue 3 and per TRAPS.md "priority" item.  Sans-IO: FakeClock,
FakeHelper and the test-only ``test_leaf`` policy."""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
import pytest

from pyxds.lb import ConnectivityState, PickFail, PickQueue, ResolverUpdate, Status, registry
from pyxds.lb import priority as priority_module
from pyxds.lb.errors import LBConfigError
from pyxds.lb.priority import (
    CHILD_RETENTION,
    FAILOVER_TIMEOUT,
    PriorityChild,
    PriorityConfig,
    PriorityFactory,
    PriorityLoadBalancer,
)
from pyxds.lb.registry import PolicySelection
from pyxds.testing import FakeHelper

try:
    from test_priority_leaf_support import (
        LEAF,
        ON_UPDATE_HOOKS,
        LeafConfig,
        ep,
        has_leaf,
        leaf,
        leaf_config,
        leaves,
        pick_subchannel,
        reset_leaves,
    )
except ImportError:  # pragma: no cover - package-style test collection
    from .test_priority_leaf_support import (  # type: ignore[no-redef]
        LEAF,
        ON_UPDATE_HOOKS,
        LeafConfig,
        ep,
        has_leaf,
        leaf,
        leaf_config,
        leaves,
        pick_subchannel,
        reset_leaves,
    )

CS = ConnectivityState
READY, IDLE, CONNECTING, TF = CS.READY, CS.IDLE, CS.CONNECTING, CS.TRANSIENT_FAILURE
EPS = 1e-6


@pytest.fixture(autouse=True)
def _fresh_leaves():
    reset_leaves()
    yield
    reset_leaves()


def config_json(priorities, children=None, ignore=(), extra=None) -> dict[str, Any]:
    names = list(dict.fromkeys(list(priorities) + list(children or ())))
    if children is None:
        children = {}
    body: dict[str, Any] = {}
    for name in names:
        child = {"config": children.get(name, leaf_config(name))}
        if name in ignore:
            child["ignore_reresolution_requests"] = True
        body[name] = child
    out = {"children": body, "priorities": list(priorities)}
    if extra:
        out.update(extra)
    return out


def parse(priorities, children=None, ignore=()) -> PriorityConfig:
    factory, parsed = registry.select(
        [{"priority_experimental": config_json(priorities, children, ignore)}]
    )
    assert factory.name == "priority_experimental"
    return parsed


def endpoints_for(names) -> list:
    return [ep(f"{name}-addr:80", name) for name in names]


class Harness:
    def __init__(self, destroy_removed_children: bool | None = None) -> None:
        self.helper = FakeHelper()
        self.clock = self.helper.clock
        self.lb: PriorityLoadBalancer = PriorityFactory(destroy_removed_children).build(self.helper)

    def update(self, priorities, children=None, endpoints=None, ignore=(), note=""):
        config = parse(priorities, children, ignore)
        if endpoints is None:
            endpoints = endpoints_for(list(dict.fromkeys(list(priorities) + list(children or ()))))
        return self.lb.update(ResolverUpdate(endpoints, config, resolution_note=note))

    @property
    def current(self) -> str | None:
        return self.lb.current_child

    @property
    def reports(self) -> int:
        return len(self.helper.states)

    def child(self, name):
        return self.lb.children[name]


# ---------------------------------------------------------------------------
# Rule 1: config parsing
# ---------------------------------------------------------------------------


def test_config_parses_into_frozen_equal_values():
    a = parse(["p0", "p1"], ignore=["p1"])
    b = parse(["p0", "p1"], ignore=["p1"])
    assert a == b and hash(a) == hash(b)
    assert a.priorities == ("p0", "p1")
    assert a.children["p1"] == PriorityChild(
        PolicySelection(LEAF, LeafConfig("p1")), ignore_reresolution_requests=True
    )
    assert a.children["p0"].ignore_reresolution_requests is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.priorities = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.children["p2"] = a.children["p0"]  # type: ignore[index]
    assert parse(["p0", "p1"]) != parse(["p1", "p0"])


def test_config_rejects_priority_missing_from_children():
    with pytest.raises(LBConfigError) as err:
        registry.select(
            [
                {
                    "priority_experimental": {
                        "children": {"p0": {"config": leaf_config("p0")}},
                        "priorities": ["p0", "p9"],
                    }
                }
            ]
        )
    assert err.value.path == "priority_experimental.priorities[1]"
    assert '"p9"' in str(err.value)


def test_config_rejects_priority_listed_twice():
    with pytest.raises(LBConfigError) as err:
        PriorityFactory().parse_config(config_json(["p0", "p1", "p0"]))
    assert err.value.path == "priorities[2]"
    assert "duplicate" in str(err.value) and "priorities[0]" in str(err.value)


def test_config_rejects_child_whose_config_selects_no_policy():
    body = config_json(["p0"], children={"p0": [{"no_such_policy": {}}]})
    with pytest.raises(LBConfigError) as err:
        registry.select([{"priority_experimental": body}])
    assert err.value.path == 'priority_experimental.children["p0"].config'
    assert "no_such_policy" in str(err.value)


def test_config_error_inside_child_policy_names_the_nested_field():
    body = config_json(["p0"], children={"p0": [{LEAF: {"tag": 7}}]})
    with pytest.raises(LBConfigError) as err:
        registry.select([{"priority_experimental": body}])
    assert err.value.path == 'priority_experimental.children["p0"].config[0].test_leaf.tag'


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"priorities": []}, "children"),
        ({"children": {}}, "priorities"),
        ({"children": [], "priorities": []}, "children"),
        ({"children": {}, "priorities": "p0"}, "priorities"),
        ({"children": {"p0": {}}, "priorities": []}, 'children["p0"].config'),
        ({"children": {"p0": 3}, "priorities": []}, 'children["p0"]'),
        (
            {
                "children": {
                    "p0": {"config": leaf_config("p0"), "ignore_reresolution_requests": 1}
                },
                "priorities": ["p0"],
            },
            'children["p0"].ignore_reresolution_requests',
        ),
        ({"children": {}, "priorities": [3]}, "priorities[0]"),
        ("nope", ""),
    ],
)
def test_config_errors_name_the_field(body, path):
    with pytest.raises(LBConfigError) as err:
        PriorityFactory().parse_config(body)
    assert err.value.path == path


def test_config_built_directly_is_validated_too():
    child = PriorityChild(PolicySelection(LEAF, LeafConfig("a")))
    with pytest.raises(LBConfigError):
        PriorityConfig({"a": child}, ("a", "b"))
    with pytest.raises(LBConfigError):
        PriorityConfig({"a": child}, ("a", "a"))
    assert PriorityConfig({"a": child}, ["a"]) == PriorityConfig({"a": child}, ("a",))


# ---------------------------------------------------------------------------
# Rule 2: lazy creation
# ---------------------------------------------------------------------------


def test_children_are_created_only_when_the_choice_reaches_them():
    h = Harness()
    h.update(["p0", "p1", "p2"])
    assert set(h.lb.children) == {"p0"}
    assert not has_leaf("p1") and not has_leaf("p2")
    leaf("p0").report(TF)
    assert set(h.lb.children) == {"p0", "p1"}
    assert not has_leaf("p2")
    leaf("p1").report(TF)
    assert set(h.lb.children) == {"p0", "p1", "p2"}


def test_usable_priority_never_creates_lower_priorities():
    h = Harness()
    h.update(["p0", "p1", "p2"])
    leaf("p0").report(READY)
    h.clock.advance(FAILOVER_TIMEOUT * 5)
    leaf("p0").report(IDLE)
    leaf("p0").report(READY)
    assert set(h.lb.children) == {"p0"}
    assert [s.address for s in h.helper.subchannels] == ["p0-addr:80"]


# ---------------------------------------------------------------------------
# Rule 3: child state and the failover timer
# ---------------------------------------------------------------------------


def test_connecting_p0_for_9_999s_keeps_p1_uncreated_and_picks_queued():
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(CONNECTING)
    h.clock.advance(FAILOVER_TIMEOUT - 0.001)
    assert not has_leaf("p1")
    assert h.helper.state is CONNECTING
    assert isinstance(h.helper.pick(), PickQueue)
    h.clock.advance(0.001)
    assert has_leaf("p1")
    assert h.current == "p1"


def test_failover_timer_expiry_reruns_the_choice_without_inventing_a_failure():
    h = Harness()
    h.update(["p0"])
    p0_picker = leaf("p0").report(CONNECTING)
    h.clock.advance(FAILOVER_TIMEOUT)
    assert TF not in h.helper.state_sequence()
    assert h.helper.last.state is CONNECTING
    assert h.helper.last.picker is p0_picker
    assert h.child("p0").state is CONNECTING and not h.child("p0").failover_pending


def test_failover_expiry_moves_on_but_keeps_the_childs_own_state():
    h = Harness()
    h.update(["p0", "p1"])
    before = h.reports
    h.clock.advance(FAILOVER_TIMEOUT)
    assert h.current == "p1"
    assert h.reports == before + 1
    assert h.child("p0").state is CONNECTING
    assert all(r.state is not TF for r in h.helper.states)


def test_p0_transient_failure_fails_over_at_once():
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(TF)
    assert h.clock.now() == 0.0
    assert h.current == "p1"
    p1_picker = leaf("p1").report(READY)
    assert h.helper.last.picker is p1_picker
    assert pick_subchannel(h.helper) == "p1-addr:80"


def test_ready_to_connecting_restarts_the_failover_timer():
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(READY)
    h.clock.advance(100)
    leaf("p0").report(CONNECTING)
    assert h.child("p0").failover_pending
    assert h.current == "p0"
    h.clock.advance(FAILOVER_TIMEOUT - 0.001)
    assert not has_leaf("p1")
    h.clock.advance(0.001)
    assert has_leaf("p1") and h.current == "p1"


def test_idle_to_connecting_is_a_reconnect_not_a_failure():
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(IDLE)
    assert h.current == "p0" and h.helper.state is IDLE
    leaf("p0").report(CONNECTING)
    assert h.current == "p0" and h.child("p0").failover_pending
    h.clock.advance(FAILOVER_TIMEOUT - 0.001)
    assert not has_leaf("p1")


def test_duplicate_connecting_reports_do_not_restart_the_failover_timer():
    h = Harness()
    h.update(["p0", "p1"])
    for _ in range(3):
        h.clock.advance(3)
        leaf("p0").report(CONNECTING)
    h.clock.advance(FAILOVER_TIMEOUT - 9 - EPS)
    assert not has_leaf("p1")
    h.clock.advance(EPS)
    assert has_leaf("p1")
    # Still CONNECTING after expiry: more duplicates never restart it.
    leaf("p0").report(CONNECTING)
    assert not h.child("p0").failover_pending
    assert h.current == "p1"


def test_transient_failure_to_connecting_does_not_start_the_failover_timer():
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(TF)
    leaf("p0").report(CONNECTING)
    assert not h.child("p0").failover_pending
    assert h.current == "p1"


@pytest.mark.parametrize("state", [READY, IDLE, TF])
def test_failover_timer_is_cancelled_by_ready_idle_and_transient_failure(state):
    h = Harness()
    h.update(["p0", "p1"])
    assert h.child("p0").failover_pending
    leaf("p0").report(state)
    assert not h.child("p0").failover_pending
    created_p1 = has_leaf("p1")
    assert created_p1 == (state is TF)
    h.clock.advance(FAILOVER_TIMEOUT * 2)
    assert has_leaf("p1") == created_p1


def test_each_childs_last_state_status_and_picker_are_kept():
    h = Harness()
    h.update(["p0", "p1"])
    picker = leaf("p0").report(TF, "p0 is down")
    child = h.child("p0")
    assert child.state is TF
    assert child.status == Status(grpc.StatusCode.UNAVAILABLE, "p0 is down")
    assert child.picker is picker
    # All priorities failing: the last one's own picker and status are used.
    leaf("p1").report(TF, "p1 is down")
    assert h.helper.last.state is TF
    assert h.helper.last.status.details == "p1 is down"
    assert h.helper.pick() == PickFail(Status(grpc.StatusCode.UNAVAILABLE, "p1 is down"))


# ---------------------------------------------------------------------------
# Rule 4: deactivation and retention
# ---------------------------------------------------------------------------


def _fail_over_to_p1(h: Harness) -> None:
    h.update(["p0", "p1"])
    leaf("p0").report(TF)
    leaf("p1").report(READY)
    assert h.current == "p1"


def test_p0_back_ready_switches_back_and_p1_is_destroyed_exactly_15_minutes_later():
    h = Harness()
    _fail_over_to_p1(h)
    p1 = leaf("p1")
    p0_picker = leaf("p0").report(READY)
    assert h.current == "p0" and h.helper.last.picker is p0_picker
    assert h.child("p1").deactivated
    h.clock.advance(CHILD_RETENTION - 0.001)
    assert not p1.shut_down and "p1" in h.lb.children
    h.clock.advance(0.001)
    assert p1.shut_down and "p1" not in h.lb.children
    assert h.helper.subchannel("p1-addr:80", live=False).shut_down


def test_p0_failing_again_within_15_minutes_reactivates_p1():
    h = Harness()
    _fail_over_to_p1(h)
    p1 = leaf("p1")
    leaf("p0").report(READY)
    h.clock.advance(CHILD_RETENTION - 1)
    leaf("p0").report(TF)
    assert h.current == "p1" and not h.child("p1").deactivated
    assert h.helper.last.picker is p1.last_picker
    h.clock.advance(CHILD_RETENTION * 3)
    assert not p1.shut_down
    assert len(leaves("p1")) == 1


def test_child_dropped_from_config_is_retained_15_minutes_then_destroyed():
    h = Harness()
    _fail_over_to_p1(h)
    p1 = leaf("p1")
    h.update(["p0"])
    assert h.child("p1").deactivated and not p1.shut_down
    h.clock.advance(CHILD_RETENTION - 0.001)
    assert not p1.shut_down
    h.clock.advance(0.001)
    assert p1.shut_down and "p1" not in h.lb.children


def test_readded_child_gets_its_new_config_but_is_reactivated_only_when_chosen():
    h = Harness()
    _fail_over_to_p1(h)
    p1 = leaf("p1")
    h.update(["p0"])
    leaf("p0").report(READY)
    h.clock.advance(100)
    h.update(["p0", "p1"], children={"p1": leaf_config("p1", version=2)})
    assert p1.config == LeafConfig("p1", version=2)
    assert h.child("p1").deactivated  # p0 READY: p1 not chosen, still retained
    # Its retention still counts from the first deactivation.
    h.clock.advance(CHILD_RETENTION - 100 - 0.001)
    assert not p1.shut_down
    leaf("p0").report(TF)
    assert h.current == "p1" and not h.child("p1").deactivated
    h.clock.advance(CHILD_RETENTION * 2)
    assert not p1.shut_down


def test_deactivating_twice_keeps_the_first_retention_deadline():
    h = Harness()
    _fail_over_to_p1(h)
    p1 = leaf("p1")
    leaf("p0").report(READY)  # deactivates p1 at t=0
    h.clock.advance(500)
    leaf("p0").report(IDLE)  # chooses p0 again: deactivates p1 again
    h.update(["p0"])  # and drops it from the config
    h.clock.advance(CHILD_RETENTION - 500)
    assert p1.shut_down


def test_stale_retention_timer_after_reactivation_does_not_destroy_the_child():
    h = Harness()
    _fail_over_to_p1(h)
    p1 = leaf("p1")
    leaf("p0").report(READY)  # p1 deactivated at t=0
    stale = [t for t in h.clock.pending if t.deadline == pytest.approx(CHILD_RETENTION)]
    assert len(stale) == 1
    h.clock.advance(100)
    leaf("p0").report(TF)  # p1 reactivated
    h.clock.advance(100)
    leaf("p0").report(READY)  # p1 deactivated again at t=200
    # The first timer's callback runs late (a dispatch racing its cancel):
    stale[0].fn()
    assert not p1.shut_down and "p1" in h.lb.children
    h.clock.advance(CHILD_RETENTION - 0.001)
    assert not p1.shut_down
    h.clock.advance(0.001)
    assert p1.shut_down


def test_stale_failover_timer_after_the_child_was_replaced_is_ignored():
    h = Harness()
    h.update(["p0", "p1"])
    first_timer = next(t for t in h.clock.pending if t.deadline == FAILOVER_TIMEOUT)
    h.update(["p1"])
    h.clock.advance(CHILD_RETENTION)  # old p0 destroyed
    assert "p0" not in h.lb.children
    h.update(["p0", "p1"])  # a new p0
    new_p0 = h.child("p0")
    assert new_p0.failover_pending and h.current == "p0"
    before = h.reports
    first_timer.fn()  # the old child's late callback
    assert new_p0.failover_pending and h.current == "p0"
    assert h.reports == before


def test_a115_option_destroys_children_dropped_from_the_config_at_once():
    h = Harness(destroy_removed_children=True)
    _fail_over_to_p1(h)
    p1 = leaf("p1")
    h.update(["p0"])
    assert p1.shut_down and "p1" not in h.lb.children
    # Lower priorities left behind are still retained with the option on.
    h.update(["p0", "p1"])
    leaf("p0").report(TF)
    leaf("p1").report(READY)
    leaf("p0").report(READY)
    assert h.child("p1").deactivated and not leaf("p1").shut_down


def test_a115_module_setting_is_read_when_a_policy_is_built(monkeypatch):
    monkeypatch.setattr(priority_module, "DESTROY_REMOVED_CHILDREN", True)
    lb = registry.get("priority_experimental").build(FakeHelper())
    assert lb.destroy_removed_children is True
    monkeypatch.setattr(priority_module, "DESTROY_REMOVED_CHILDREN", False)
    assert (
        registry.get("priority_experimental").build(FakeHelper()).destroy_removed_children is False
    )
    assert PriorityFactory(True).build(FakeHelper()).destroy_removed_children is True


def test_retention_is_the_default_for_children_dropped_from_the_config():
    assert priority_module.DESTROY_REMOVED_CHILDREN is False
    h = Harness()
    _fail_over_to_p1(h)
    h.update(["p0"])
    assert not leaf("p1").shut_down


# ---------------------------------------------------------------------------
# Rule 5: no choice while applying a parent update
# ---------------------------------------------------------------------------


def test_children_reporting_during_a_parent_update_trigger_exactly_one_choice():
    h = Harness()
    _fail_over_to_p1(h)
    before = h.reports
    # Both children report synchronously while being updated: p1 first says
    # CONNECTING, p0 then says READY.  One report reaches the parent.
    h.update(
        ["p0", "p1"],
        children={
            "p0": leaf_config("p0", on_update="READY"),
            "p1": leaf_config("p1", on_update="CONNECTING"),
        },
    )
    assert h.reports == before + 1
    assert h.helper.last.state is READY and h.current == "p0"
    assert h.helper.last.picker is leaf("p0").last_picker


def test_a_childs_report_during_the_parent_update_is_not_lost():
    h = Harness()
    _fail_over_to_p1(h)
    h.update(["p0", "p1"], children={"p0": leaf_config("p0", on_update="IDLE")})
    assert h.child("p0").state is IDLE
    assert h.current == "p0" and h.helper.state is IDLE


# ---------------------------------------------------------------------------
# Rule 6: the choice itself
# ---------------------------------------------------------------------------


def test_the_chosen_childs_own_picker_object_is_published():
    h = Harness()
    h.update(["p0", "p1"])
    for state in (CONNECTING, READY, IDLE, READY):
        picker = leaf("p0").report(state)
        assert h.helper.last.picker is picker
        assert h.helper.last.state is state


def test_idle_child_is_chosen_and_exit_idle_reaches_it_through_its_picker_and_parent():
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(IDLE)
    assert h.helper.state is IDLE and h.current == "p0"
    assert isinstance(h.helper.pick(), PickQueue)
    assert leaf("p0").exit_idle_calls == 1  # the child's own IDLE picker
    h.lb.exit_idle()
    assert leaf("p0").exit_idle_calls == 2


def test_choice_falls_back_to_first_connecting_then_to_the_last_priority():
    h = Harness()
    h.update(["p0", "p1", "p2"])
    leaf("p0").report(TF)
    leaf("p1").report(TF)
    assert h.current == "p2" and h.child("p2").failover_pending
    h.clock.advance(FAILOVER_TIMEOUT)
    assert h.current == "p2"  # pass 2: the only CONNECTING child
    p0_connecting = leaf("p0").report(CONNECTING)  # TF -> CONNECTING: no timer
    assert h.current == "p0" and h.helper.last.picker is p0_connecting
    leaf("p0").report(TF)
    assert h.current == "p2"
    p2_failed = leaf("p2").report(TF, "p2 down")
    assert h.current == "p2" and h.helper.last.picker is p2_failed
    assert h.helper.last.status.details == "p2 down"


def test_choice_is_idempotent_reruns_publish_the_same_child():
    h = Harness()
    h.update(["p0", "p1", "p2"])
    leaf("p0").report(TF)
    leaf("p1").report(CONNECTING)
    chosen, picker = h.current, h.helper.last.picker
    for _ in range(3):
        h.lb._choose()
        assert h.current == chosen and h.helper.last.picker is picker
    assert set(h.lb.children) == {"p0", "p1"}


def test_reordering_while_a_fails_and_b_connects_does_not_jump_to_c():
    h = Harness()
    h.update(["A", "B", "C"])
    leaf("A").report(TF)
    assert h.current == "B"
    leaf("B").report(CONNECTING)
    h.update(["B", "A", "C"])
    assert h.current == "B"
    assert not has_leaf("C")
    assert isinstance(h.helper.pick(), PickQueue)


def test_fail_back_to_recovered_higher_priority():
    h = Harness()
    h.update(["p0", "p1", "p2"])
    leaf("p0").report(TF)
    leaf("p1").report(TF)
    leaf("p2").report(READY)
    assert h.current == "p2"
    leaf("p1").report(READY)
    assert h.current == "p1" and pick_subchannel(h.helper) == "p1-addr:80"
    leaf("p0").report(READY)
    assert h.current == "p0" and pick_subchannel(h.helper) == "p0-addr:80"
    assert h.child("p1").deactivated and h.child("p2").deactivated


def test_moving_a_child_from_priority_1_to_0_keeps_the_child_object():
    h = Harness()
    _fail_over_to_p1(h)
    p1_leaf, p1_child = leaf("p1"), h.child("p1")
    subchannels = len(h.helper.subchannels)
    h.update(["p1", "p2"])
    assert h.child("p1") is p1_child and leaf("p1") is p1_leaf
    assert h.current == "p1" and pick_subchannel(h.helper) == "p1-addr:80"
    assert len(h.helper.subchannels) == subchannels
    assert h.child("p0").deactivated


def test_same_config_twice_is_a_no_op():
    h = Harness()
    _fail_over_to_p1(h)
    children = dict(h.lb.children)
    subchannels = list(h.helper.subchannels)
    picker = h.helper.last.picker
    for _ in range(2):
        assert h.update(["p0", "p1"]) is None
    assert dict(h.lb.children) == children
    assert h.helper.subchannels == subchannels
    assert all(s.connect_calls == 0 for s in subchannels)
    assert h.helper.last.picker is picker and h.helper.state is READY
    assert len(leaves("p0")) == len(leaves("p1")) == 1


def test_reports_from_children_below_a_usable_priority_cause_no_parent_churn():
    h = Harness()
    _fail_over_to_p1(h)
    leaf("p0").report(READY)
    before = h.reports
    leaf("p1").report(TF)
    leaf("p1").report(READY)
    assert h.reports == before and h.current == "p0"


# ---------------------------------------------------------------------------
# Rule 7: empty priorities
# ---------------------------------------------------------------------------


def test_empty_priority_list_reports_transient_failure():
    h = Harness()
    h.update([])
    expected = Status(grpc.StatusCode.UNAVAILABLE, "priority policy has empty priority list")
    assert h.helper.state is TF and h.helper.last.status == expected
    assert h.helper.pick() == PickFail(expected)
    assert h.current is None


def test_emptying_the_priority_list_retains_the_old_children():
    h = Harness()
    _fail_over_to_p1(h)
    h.update([])
    assert h.helper.state is TF
    assert h.child("p0").deactivated and h.child("p1").deactivated
    h.lb.exit_idle()  # no current child: nothing to do, no crash


# ---------------------------------------------------------------------------
# Rule 8: addresses, re-resolution, resolver errors, exit_idle, reset_backoff
# ---------------------------------------------------------------------------


def test_endpoints_are_split_by_the_first_path_element():
    h = Harness()
    endpoints = [
        ep("10.0.0.1:80", "p0", "x"),
        ep("10.0.0.2:80", "p1"),
        ep("10.0.0.3:80", "p0"),
        ep("10.0.0.4:80"),
    ]
    h.update(["p0", "p1"], endpoints=endpoints)
    leaf("p0").report(TF)
    got0 = leaf("p0").updates[-1].endpoints
    got1 = leaf("p1").updates[-1].endpoints
    assert [e.addresses for e in got0] == [("10.0.0.1:80",), ("10.0.0.3:80",)]
    assert [e.attributes["hierarchical_path"] for e in got0] == [("x",), ()]
    assert [e.addresses for e in got1] == [("10.0.0.2:80",)]


def test_child_without_endpoints_gets_an_empty_list():
    h = Harness()
    h.update(["p0"], endpoints=[])
    assert leaf("p0").updates[-1].endpoints == ()


def test_ignore_reresolution_requests_is_honoured_per_child():
    h = Harness()
    h.update(["p0", "p1"], ignore=["p1"])
    leaf("p0").report(TF)
    leaf("p0").helper.request_reresolution()
    assert h.helper.reresolution_requests == 1
    leaf("p1").helper.request_reresolution()
    assert h.helper.reresolution_requests == 1
    h.update(["p0", "p1"])  # the flag follows the config
    leaf("p1").helper.request_reresolution()
    assert h.helper.reresolution_requests == 2


def test_resolver_error_before_any_child_reports_transient_failure_with_the_error():
    h = Harness()
    error = Status(grpc.StatusCode.UNAVAILABLE, "xds: resource does not exist")
    h.lb.resolver_error(error)
    assert h.helper.state is TF and h.helper.last.status == error
    assert h.helper.pick() == PickFail(error)


def test_resolver_error_is_passed_to_every_child():
    h = Harness()
    _fail_over_to_p1(h)
    before = h.reports
    error = Status(grpc.StatusCode.UNAVAILABLE, "dns failed")
    h.lb.resolver_error(error)
    assert leaf("p0").resolver_errors == [error] == leaf("p1").resolver_errors
    assert h.reports == before  # no child changed: nothing to re-publish


def test_update_carrying_a_resolution_failure_reaches_the_children():
    h = Harness()
    failure = Status(grpc.StatusCode.UNAVAILABLE, "EDS failed")
    h.lb.update(ResolverUpdate(failure, parse(["p0"])))
    assert leaf("p0").updates[-1].endpoints == failure


def test_exit_idle_goes_to_the_current_child_and_reset_backoff_to_all():
    h = Harness()
    _fail_over_to_p1(h)
    h.lb.exit_idle()
    assert leaf("p1").exit_idle_calls == 1 and leaf("p0").exit_idle_calls == 0
    h.lb.reset_backoff()
    assert leaf("p0").reset_backoff_calls == 1 and leaf("p1").reset_backoff_calls == 1


def test_child_rejections_are_returned_as_errors_from_children():
    h = Harness()
    h.update(["p0"])
    status = h.update(["p0"], children={"p0": leaf_config("p0", reject=True)})
    assert status is not None and status.code is grpc.StatusCode.UNAVAILABLE
    assert status.details == (
        "errors from children: [child p0: UNAVAILABLE: p0 rejected its update]"
    )


def test_new_child_rejecting_its_first_update_requests_reresolution():
    h = Harness()
    h.update(["p0"], children={"p0": leaf_config("p0", reject=True)})
    assert h.helper.reresolution_requests == 1


def test_shutdown_shuts_every_child_and_late_timers_do_nothing():
    h = Harness()
    _fail_over_to_p1(h)
    leaf("p0").report(READY)
    p0, p1 = leaf("p0"), leaf("p1")
    before = h.reports
    h.lb.shutdown()
    assert p0.shut_down and p1.shut_down
    h.clock.advance(CHILD_RETENTION * 2)
    p0.report(TF)
    assert h.reports == before


def test_wrong_config_type_is_rejected_not_raised():
    h = Harness()
    status = h.lb.update(ResolverUpdate([], {"priorities": []}))
    assert status is not None and "PriorityConfig" in status.details


def test_cancelled_failover_timer_firing_late_does_not_end_the_restarted_one():
    h = Harness()
    h.update(["p0", "p1"])
    creation_timer = next(t for t in h.clock.pending if t.deadline == FAILOVER_TIMEOUT)
    leaf("p0").report(READY)
    h.clock.advance(1)
    leaf("p0").report(CONNECTING)  # restarts: due at 11 s
    creation_timer.fn()  # the cancelled one runs late
    assert h.child("p0").failover_pending and h.current == "p0"
    h.clock.advance(FAILOVER_TIMEOUT - 1 - EPS)
    assert not has_leaf("p1")
    h.clock.advance(1 + EPS)
    assert has_leaf("p1")


def test_report_from_a_higher_child_while_a_lower_one_is_created_is_honoured():
    h = Harness()
    h.update(["p0", "p1"])
    # Creating p1 makes p0 report READY re-entrantly (e.g. a shared
    # connection came up): the choice must see it before publishing.
    ON_UPDATE_HOOKS["p1"] = lambda: leaf("p0").report(READY)
    before = h.reports
    leaf("p0").report(TF)
    assert h.current == "p0" and h.helper.state is READY
    assert h.child("p1").deactivated
    assert h.helper.last.picker is leaf("p0").last_picker
    assert h.reports == before + 1


def test_reports_and_timers_of_children_dropped_from_the_config_cause_no_parent_churn():
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(TF)  # p1 created, failover pending
    h.update(["p0"])  # p1 dropped while its failover timer runs
    before = h.reports
    h.clock.advance(FAILOVER_TIMEOUT)
    leaf("p1").report(READY)
    leaf("p1").report(TF)
    assert h.reports == before and h.current == "p0"


def test_deactivating_a_connecting_child_keeps_its_failover_timer():
    # grpc#29332: a priority deactivated while connecting and reactivated
    # before it finished connecting still gets (only) its original window.
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(TF)  # p1 created at t=0, failover pending
    h.clock.advance(4)
    leaf("p0").report(READY)
    assert h.child("p1").deactivated and h.child("p1").failover_pending
    h.clock.advance(2)
    leaf("p0").report(TF)  # t=6: back to p1, still inside its window
    assert h.current == "p1" and h.child("p1").failover_pending
    h.clock.advance(FAILOVER_TIMEOUT - 6)
    assert not h.child("p1").failover_pending
    assert h.current == "p1" and h.helper.state is CONNECTING


# ---------------------------------------------------------------------------
# Scenarios of grpc-java PriorityLoadBalancerTest replayed on test leaves
# ---------------------------------------------------------------------------


def test_idle_children_fail_over_and_back_like_ready_ones():
    """grpc-java typicalPriorityFailOverFlowWithIdleUpdate: IDLE counts as
    usable exactly like READY (A56 step 2), in a four-priority flow."""
    h = Harness()
    h.update(["p0", "p1", "p2", "p3"])
    p0_idle = leaf("p0").report(IDLE)
    assert h.current == "p0" and h.helper.last.picker is p0_idle
    leaf("p0").report(TF)
    assert h.current == "p1" and h.helper.state is CONNECTING
    h.clock.advance(FAILOVER_TIMEOUT)
    assert h.current == "p2" and h.helper.state is CONNECTING
    p2_idle = leaf("p2").report(IDLE)
    assert h.current == "p2" and h.helper.last.picker is p2_idle
    p0_idle = leaf("p0").report(IDLE)
    assert h.current == "p0" and h.helper.last.picker is p0_idle
    leaf("p2").report(TF)
    assert h.current == "p0" and h.helper.last.picker is p0_idle
    # p1's timer expired and p2 failed: p3 is created at once.
    leaf("p0").report(TF)
    assert h.current == "p3" and h.helper.state is CONNECTING
    h.clock.advance(FAILOVER_TIMEOUT)
    assert h.current == "p1" and h.helper.state is CONNECTING  # pass 2
    leaf("p3").report(TF, "p3 foo")
    assert h.current == "p1" and isinstance(h.helper.pick(), PickQueue)
    leaf("p1").report(TF, "p1 bar")
    assert h.current == "p3" and h.helper.state is TF
    assert h.helper.last.status.details == "p3 foo"
    p2_idle = leaf("p2").report(IDLE)
    assert h.current == "p2" and h.helper.last.picker is p2_idle
    p0_idle = leaf("p0").report(IDLE)
    assert h.current == "p0"
    leaf("p0").report(TF)
    assert h.current == "p2" and h.helper.last.picker is p2_idle
    p3 = leaf("p3")
    h.clock.advance(CHILD_RETENTION)
    assert p3.shut_down
    assert not any(leaf(name).shut_down for name in ("p0", "p1", "p2"))


def test_duplicate_connecting_from_a_timed_out_child_publishes_nothing_new():
    """grpc-java failoverTimerNotRestartedOnDupConnecting (tail): p0 timed
    out and p1 is IDLE; p0 repeating CONNECTING neither restarts p0's timer
    nor moves the choice off p1."""
    h = Harness()
    h.update(["p0", "p1"])
    leaf("p0").report(IDLE)
    leaf("p0").report(CONNECTING)  # IDLE -> CONNECTING: timer restarts
    h.clock.advance(FAILOVER_TIMEOUT / 2)
    leaf("p0").report(CONNECTING)  # duplicate: no restart
    h.clock.advance(FAILOVER_TIMEOUT / 2)
    assert h.current == "p1"
    leaf("p1").report(IDLE)
    assert h.current == "p1" and h.helper.state is IDLE
    leaf("p0").report(CONNECTING)
    h.clock.advance(FAILOVER_TIMEOUT)
    assert h.current == "p1" and h.helper.state is IDLE
    assert CONNECTING not in h.helper.state_sequence()[-2:]
    assert not h.child("p0").failover_pending


def test_update_dropping_children_updates_the_kept_one_and_retains_the_others():
    """grpc-java acceptResolvedAddresses: p0 -> p1 -> p2 by failover timers;
    an update keeping only p1 (new config, new address, no attributes) gives
    p1 exactly that, and p0 and p2 are shut down 15 minutes later."""
    h = Harness()
    config = parse(["p0", "p1", "p2"])
    attributes = {"fakeKey": "fakeValue"}
    h.lb.update(ResolverUpdate([ep("10.0.0.1:8080", "p1")], config, attributes))
    assert leaf("p0").updates[-1].endpoints == ()
    assert dict(leaf("p0").updates[-1].attributes) == attributes
    assert not has_leaf("p1")
    h.clock.advance(FAILOVER_TIMEOUT)
    assert [e.addresses for e in leaf("p1").updates[-1].endpoints] == [("10.0.0.1:8080",)]
    assert dict(leaf("p1").updates[-1].attributes) == attributes
    h.clock.advance(FAILOVER_TIMEOUT)
    assert leaf("p2").updates[-1].endpoints == ()
    new_config = parse(["p1"], {"p1": leaf_config("p1", version=2)})
    assert h.lb.update(ResolverUpdate([ep("10.0.0.1:8081", "p1")], new_config)) is None
    p1_update = leaf("p1").updates[-1]
    assert [e.addresses for e in p1_update.endpoints] == [("10.0.0.1:8081",)]
    assert dict(p1_update.attributes) == {}
    assert p1_update.config == new_config.children["p1"].config.config
    assert len(leaves("p1")) == 1
    p0, p2 = leaf("p0"), leaf("p2")
    assert not p0.shut_down and not p2.shut_down
    h.clock.advance(CHILD_RETENTION)
    assert p0.shut_down and p2.shut_down and not leaf("p1").shut_down


@pytest.mark.parametrize("state", [READY, TF])
def test_the_current_childs_same_state_again_is_published_without_a_new_choice(state, monkeypatch):
    """The chosen child reporting its READY (or, every priority failing,
    its TRANSIENT_FAILURE) again with a new picker (an endpoint came, went
    or failed another connection attempt) is published as reported, and
    the choice is not walked again: it saw every other child as it is now
    (issue 18: one such report per failed attempt).  A report that changes
    a state still walks."""
    h = Harness()
    h.update(["p0", "p1"])
    if state is READY:
        leaf("p0").report(READY)
        expected = "p0"
    else:
        leaf("p0").report(TF)
        leaf("p1").report(TF)
        expected = "p1"
    assert h.current == expected
    walks = []
    original = PriorityLoadBalancer._choose_once

    def counting(self):
        walks.append(1)
        return original(self)

    monkeypatch.setattr(PriorityLoadBalancer, "_choose_once", counting)
    for attempt in range(5):
        picker = leaf(expected).report(state, None if state is READY else f"failed #{attempt}")
        last = h.helper.last
        assert (last.state, last.picker) == (state, picker) and h.current == expected
        if state is TF:
            assert last.status.details == f"failed #{attempt}"
    assert walks == []
    leaf(expected).report(CONNECTING)
    assert walks  # a change of state is a new choice
