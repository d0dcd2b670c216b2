"""Conformance scenarios for ``weighted_target_experimental`` (gRFC A28),
taken from the reference suites (grpc-go balancer/weightedtarget, grpc-java
WeightedTargetLoadBalancerTest, C-core weighted_target.cc) and replayed with
the real ``round_robin`` / ``pick_first`` leaves over :mod:`pyxds.testing`
fakes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import grpc

from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    PickComplete,
    PickFail,
    PickQueue,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.hierarchy import PATH_KEY
from pyxds.lb.weighted_target import CHILD_RETENTION, WeightedTargetFactory
from pyxds.testing import FakeHelper

try:
    from test_priority_leaf_support import (
        ON_UPDATE_HOOKS,
        ep,
        leaf,
        leaf_config,
        reset_leaves,
    )
except ImportError:  # pragma: no cover - package-style test collection
    from .test_priority_leaf_support import (  # type: ignore[no-redef]
        ON_UPDATE_HOOKS,
        ep,
        leaf,
        leaf_config,
        reset_leaves,
    )

CS = ConnectivityState
READY, IDLE, CONNECTING, TF = CS.READY, CS.IDLE, CS.CONNECTING, CS.TRANSIENT_FAILURE


def wt_config(targets: dict[str, tuple[int, str] | int]) -> Any:
    body: dict[str, Any] = {}
    for name, spec in targets.items():
        weight, policy = (spec, "round_robin") if isinstance(spec, int) else spec
        body[name] = {"weight": weight, "childPolicy": [{policy: {}}]}
    factory, parsed = registry.select([{"weighted_target_experimental": {"targets": body}}])
    assert factory.name == "weighted_target_experimental"
    return parsed


def endpoints(addresses: dict[str, list[str]]) -> list[Endpoint]:
    return [
        Endpoint((address,), {PATH_KEY: (target,)})
        for target, listed in addresses.items()
        for address in listed
    ]


class WT:
    def __init__(self, seed: int = 11) -> None:
        self.helper = FakeHelper(seed=seed)
        self.clock = self.helper.clock
        self.lb = WeightedTargetFactory().build(self.helper)

    def update(
        self, targets: dict[str, Any], addresses: dict[str, list[str]], note: str = ""
    ) -> Status | None:
        return self.lb.update(ResolverUpdate(endpoints(addresses), wt_config(targets), {}, note))

    def sub(self, address: str, live: bool = True):
        return self.helper.subchannel(address, live)

    def ready(self, *addresses: str) -> None:
        for address in addresses:
            self.sub(address).set_state(CONNECTING)
            self.sub(address).set_state(READY)

    @property
    def state(self) -> ConnectivityState:
        return self.helper.state

    def counts(self, n: int) -> Counter[str]:
        out: Counter[str] = Counter()
        for _ in range(n):
            result = self.helper.pick()
            assert isinstance(result, PickComplete), result
            out[result.subchannel.address] += 1
        return out

    def shut_down(self) -> list[str]:
        return [s.address for s in self.helper.subchannels if s.shut_down]


# ---------------------------------------------------------------------------
# grpc-go balancer/weightedtarget/weightedtarget_test.go
# ---------------------------------------------------------------------------


def test_targets_get_their_own_addresses_with_the_path_stripped_and_can_be_replaced():
    """grpc-go TestWeightedTarget: add, replace a target, change its policy."""
    w = WT()
    w.update({"cluster_1": 1}, {"cluster_1": ["1.1.1.1:1"]})
    sub1 = w.sub("1.1.1.1:1")
    assert sub1.attributes.get(PATH_KEY, ()) == ()
    w.ready("1.1.1.1:1")
    assert set(w.counts(5)) == {"1.1.1.1:1"}
    # Remove cluster_1, add cluster_2 (pick_first).
    w.update({"cluster_2": (1, "pick_first")}, {"cluster_2": ["2.2.2.2:2"]})
    assert w.state is CONNECTING  # cluster_1 no longer counts
    assert not sub1.shut_down  # retained 15 minutes
    w.ready("2.2.2.2:2")
    assert set(w.counts(5)) == {"2.2.2.2:2"}
    # Replace cluster_2's policy with round_robin and a new address.
    w.update({"cluster_2": 1}, {"cluster_2": ["3.3.3.3:3"]})
    w.ready("3.3.3.3:3")
    assert set(w.counts(5)) == {"3.3.3.3:3"}
    assert w.sub("2.2.2.2:2", live=False).shut_down
    w.clock.advance(CHILD_RETENTION)
    assert sub1.shut_down


def test_adding_and_removing_backends_of_one_target():
    """grpc-go TestWeightedTarget_OneSubBalancer_AddRemoveBackend."""
    w = WT()
    w.update({"cluster_1": 1}, {"cluster_1": ["a:1"]})
    w.ready("a:1")
    w.update({"cluster_1": 1}, {"cluster_1": ["a:1", "b:2"]})
    w.ready("b:2")
    assert set(w.counts(10)) == {"a:1", "b:2"}
    w.update({"cluster_1": 1}, {"cluster_1": ["b:2"]})
    assert w.shut_down() == ["a:1"]
    assert set(w.counts(10)) == {"b:2"}


def test_two_targets_share_picks_by_weight():
    """grpc-go TestWeightedTarget_TwoSubBalancers_OneBackend and
    _DifferentWeight_MoreBackends (2:1), checked statistically."""
    w = WT()
    w.update(
        {"cluster_1": 2, "cluster_2": 1},
        {"cluster_1": ["a:1", "b:2"], "cluster_2": ["c:3", "d:4"]},
    )
    w.ready("a:1", "b:2", "c:3", "d:4")
    n = 30_000
    counts = w.counts(n)
    share_1 = (counts["a:1"] + counts["b:2"]) / n
    assert abs(share_1 - 2 / 3) < 0.015
    assert abs(counts["a:1"] - counts["b:2"]) / n < 0.02  # round_robin inside


def test_removing_a_target_moves_its_traffic_and_retires_it_after_15_minutes():
    """grpc-go TestWeightedTarget_ThreeSubBalancers_RemoveBalancer."""
    w = WT()
    addresses = {"c1": ["a:1"], "c2": ["b:2"], "c3": ["c:3"]}
    w.update({"c1": 1, "c2": 1, "c3": 1}, addresses)
    w.ready("a:1", "b:2", "c:3")
    assert set(w.counts(200)) == {"a:1", "b:2", "c:3"}
    w.update({"c1": 1, "c3": 1}, {"c1": ["a:1"], "c3": ["c:3"]})
    assert set(w.counts(200)) == {"a:1", "c:3"}
    assert not w.sub("b:2").shut_down
    # The removed target's failures no longer matter.
    w.sub("b:2").set_state(TF)
    assert w.state is READY and set(w.counts(50)) == {"a:1", "c:3"}
    w.clock.advance(CHILD_RETENTION)
    assert w.sub("b:2", live=False).shut_down
    # Remove c1 too: only c3 serves.
    w.update({"c3": 1}, {"c3": ["c:3"]})
    assert set(w.counts(50)) == {"c:3"}


def test_weight_change_rebuilds_the_picker_only():
    """grpc-go TestWeightedTarget_TwoSubBalancers_ChangeWeight_MoreBackends."""
    w = WT()
    addresses = {"c1": ["a:1"], "c2": ["b:2"]}
    w.update({"c1": 1, "c2": 1}, addresses)
    w.ready("a:1", "b:2")
    created = list(w.helper.subchannels)
    reports = len(w.helper.states)
    w.update({"c1": 3, "c2": 1}, addresses)
    assert len(w.helper.states) == reports + 1
    assert w.helper.subchannels == created and w.shut_down() == []
    n = 20_000
    assert abs(w.counts(n)["a:1"] / n - 0.75) < 0.015


def test_one_target_failing_at_start_while_another_connects_queues_picks():
    """grpc-go TestWeightedTarget_InitOneSubBalancerTransientFailure; grpc-java
    balancingStateUpdatedFromChildBalancers (first step)."""
    w = WT()
    w.update({"c1": 1, "c2": 1}, {"c1": ["a:1"], "c2": ["b:2"]})
    w.sub("a:1").set_state(TF)
    assert w.state is CONNECTING
    assert TF not in w.helper.state_sequence()
    assert all(isinstance(w.helper.pick(), PickQueue) for _ in range(5))


def test_failing_targets_stay_failing_through_reconnect_attempts():
    """grpc-go TestBalancerGroup_SubBalancerTurnsConnectingFromTransientFailure."""
    w = WT()
    w.update({"c1": 1, "c2": 1}, {"c1": ["a:1"], "c2": ["b:2"]})
    w.sub("a:1").set_state(TF, "subConn connection error")
    w.sub("b:2").set_state(TF, "subConn connection error")
    assert w.state is TF
    for _ in range(5):
        result = w.helper.pick()
        assert isinstance(result, PickFail)
        assert "subConn connection error" in result.status.details
    reports = len(w.helper.states)
    w.sub("a:1").set_state(IDLE)  # backoff over: round_robin reconnects
    w.sub("a:1").set_state(CONNECTING)
    assert len(w.helper.states) == reports and w.state is TF
    w.sub("a:1").set_state(READY)
    assert w.state is READY and set(w.counts(10)) == {"a:1"}


def test_idle_target_makes_the_aggregate_idle_and_is_told_to_exit_idle():
    """grpc-go TestInitialIdle; C-core WeightedChild (IDLE -> ExitIdle at
    once, inside the report).  The IDLE is published, then pick_first's
    CONNECTING from its reconnect."""
    w = WT()
    w.update({"c1": (1, "pick_first")}, {"c1": ["a:1"]})
    w.ready("a:1")
    connects = w.sub("a:1").connect_calls
    published = len(w.helper.states)
    w.sub("a:1").set_state(IDLE)
    assert [report.state for report in w.helper.states[published:]] == [IDLE, CONNECTING]
    assert w.sub("a:1").connect_calls == connects + 1
    assert w.state is CONNECTING


def test_reports_during_the_update_collapse_into_one_state():
    """grpc-go TestUpdateStatePauses: a child reporting TRANSIENT_FAILURE then
    READY inside its update yields one READY report."""
    reset_leaves()
    try:
        helper = FakeHelper()
        lb = WeightedTargetFactory().build(helper)
        ON_UPDATE_HOOKS["c1"] = lambda: leaf("c1").report(TF)
        config = registry.select(
            [
                {
                    "weighted_target_experimental": {
                        "targets": {
                            "c1": {"weight": 1, "childPolicy": leaf_config("c1", on_update="READY")}
                        }
                    }
                }
            ]
        )[1]
        assert lb.update(ResolverUpdate([ep("a:1", "c1")], config, {})) is None
        assert helper.state_sequence() == [READY]
    finally:
        reset_leaves()


# ---------------------------------------------------------------------------
# grpc-java WeightedTargetLoadBalancerTest
# ---------------------------------------------------------------------------


def test_aggregate_follows_children_from_failure_to_ready_to_all_failing():
    """grpc-java balancingStateUpdatedFromChildBalancers."""
    w = WT()
    names = {f"t{i}": [f"10.0.0.{i}:80"] for i in range(4)}
    w.update({name: 10 * (i + 1) for i, name in enumerate(names)}, names)
    w.sub("10.0.0.1:80").set_state(TF, "aborted")
    assert w.state is CONNECTING
    w.ready("10.0.0.2:80")
    assert set(w.counts(50)) == {"10.0.0.2:80"}
    w.ready("10.0.0.3:80")
    assert set(w.counts(200)) == {"10.0.0.2:80", "10.0.0.3:80"}
    w.ready("10.0.0.0:80")
    assert set(w.counts(400)) == {"10.0.0.0:80", "10.0.0.2:80", "10.0.0.3:80"}
    w.sub("10.0.0.2:80").set_state(TF, "data loss")
    assert set(w.counts(200)) == {"10.0.0.0:80", "10.0.0.3:80"}
    w.sub("10.0.0.3:80").set_state(TF, "data loss")
    w.sub("10.0.0.0:80").set_state(TF, "cancelled")
    assert w.state is TF
    errors = set()
    for _ in range(300):
        result = w.helper.pick()
        assert isinstance(result, PickFail)
        errors.add(result.status.details.rsplit(": ", 1)[-1])
    assert errors <= {"aborted", "data loss", "cancelled"} and len(errors) >= 2


def _leaf_wt(names: list[str]):
    config = registry.select(
        [
            {
                "weighted_target_experimental": {
                    "targets": {n: {"weight": 1, "childPolicy": leaf_config(n)} for n in names}
                }
            }
        ]
    )[1]
    return ResolverUpdate([ep(f"{n}:1", n) for n in names], config, {})


def test_resolver_error_reaches_every_active_target_but_not_removed_ones():
    """grpc-java handleNameResolutionError (every child gets the error);
    C-core passes an address error only to targets of the current config."""
    reset_leaves()
    try:
        helper = FakeHelper()
        lb = WeightedTargetFactory().build(helper)
        lb.update(_leaf_wt(["a", "b", "c"]))
        error = Status(grpc.StatusCode.DATA_LOSS, "boom")
        lb.resolver_error(error)
        assert [leaf(n).resolver_errors for n in "abc"] == [[error]] * 3
        lb.update(_leaf_wt(["a", "c"]))
        error2 = Status(grpc.StatusCode.UNAVAILABLE, "boom 2")
        lb.resolver_error(error2)
        assert leaf("a").resolver_errors == [error, error2]
        assert leaf("b").resolver_errors == [error]
        assert leaf("c").resolver_errors == [error, error2]
    finally:
        reset_leaves()


# ---------------------------------------------------------------------------
# C-core weighted_target.cc
# ---------------------------------------------------------------------------


def test_no_targets_fails_with_c_core_words_and_the_update_succeeds():
    """C-core WeightedTargetLb::UpdateLocked with an empty target map."""
    w = WT()
    assert w.update({}, {}, note="EDS resource x: no localities") is None
    assert w.state is TF
    expected = "no children in weighted_target policy: EDS resource x: no localities"
    assert w.helper.last.status == Status(grpc.StatusCode.UNAVAILABLE, expected)
    assert w.helper.pick() == PickFail(Status(grpc.StatusCode.UNAVAILABLE, expected))


def test_target_rejecting_its_update_is_reported_as_errors_from_children():
    """C-core "errors from children: [child NAME: ...]"; the other target
    still serves (grpc#22831: one empty locality does not fail the rest)."""
    w = WT()
    status = w.update({"empty": 1, "full": 1}, {"full": ["a:1"]})
    assert status is not None and status.code is grpc.StatusCode.UNAVAILABLE
    assert status.details.startswith("errors from children: [child empty: ")
    assert TF not in w.helper.state_sequence()
    w.ready("a:1")
    assert w.state is READY and set(w.counts(20)) == {"a:1"}


def test_readding_a_removed_target_reuses_its_connections():
    """C-core WeightedChild reactivation (A28: "cached for 15 minutes")."""
    w = WT()
    w.update({"c1": 1, "c2": 1}, {"c1": ["a:1"], "c2": ["b:2"]})
    w.ready("a:1", "b:2")
    w.update({"c1": 1}, {"c1": ["a:1"]})
    w.clock.advance(CHILD_RETENTION - 1)
    created = list(w.helper.subchannels)
    w.update({"c1": 1, "c2": 1}, {"c1": ["a:1"], "c2": ["b:2"]})
    assert w.helper.subchannels == created
    assert set(w.counts(200)) == {"a:1", "b:2"}
    w.clock.advance(CHILD_RETENTION)
    assert w.shut_down() == []


def test_replacing_every_locality_queues_rpcs_instead_of_failing_them():
    """C-core EdsTest.ReplaceAllLocalitiesInPriority: no RPC fails while the
    only locality is replaced by a new one."""
    w = WT()
    w.update({"locality0": 1}, {"locality0": ["b0:80"]})
    w.ready("b0:80")
    w.update({"locality1": 1}, {"locality1": ["b1:80"]})
    assert not any(isinstance(w.helper.pick(), PickFail) for _ in range(20))
    assert TF not in w.helper.state_sequence()
    w.ready("b1:80")
    assert set(w.counts(20)) == {"b1:80"}


def test_removed_then_readded_locality_gets_the_new_endpoints():
    """C-core EdsTest.ConsistentWeightedTargetUpdates."""
    w = WT()
    w.update({"l0": 1, "l1": 1}, {"l0": ["b1:80"], "l1": ["b2:80"]})
    w.ready("b1:80", "b2:80")
    w.update({"l0": 1}, {"l0": ["b0:80", "b1:80"]})
    w.ready("b0:80")
    assert set(w.counts(50)) == {"b0:80", "b1:80"}
    l1 = w.lb.children["l1"].policy
    w.update({"l0": 1, "l1": 1}, {"l0": ["b0:80", "b1:80"], "l1": ["b2:80", "b3:80"]})
    assert w.lb.children["l1"].policy is l1
    w.ready("b3:80")
    assert set(w.counts(400)) == {"b0:80", "b1:80", "b2:80", "b3:80"}


def test_children_reporting_inside_each_update_give_one_parent_report_per_update():
    """grpc-java WeightedTargetLoadBalancerTest noDuplicateOverallBalancingStateUpdate:
    children that report TRANSIENT_FAILURE inside their update produce one
    aggregated report per parent update, not one per child."""
    reset_leaves()
    try:
        helper = FakeHelper()
        lb = WeightedTargetFactory().build(helper)

        def update(names):
            targets = {
                n: {"weight": 1, "childPolicy": leaf_config(n, on_update="TRANSIENT_FAILURE")}
                for n in names
            }
            config = registry.select([{"weighted_target_experimental": {"targets": targets}}])[1]
            lb.update(ResolverUpdate([ep(f"{n}:1", n) for n in names], config, {}))

        update(["t0"])
        assert helper.state_sequence() == [TF]
        update(["t0", "t1"])
        assert helper.state_sequence() == [TF, TF]
    finally:
        reset_leaves()


def test_child_reports_after_shutdown_are_ignored():
    """grpc-java WeightedTargetLoadBalancerTest
    raceBetweenShutdownAndChildLbBalancingStateUpdate."""
    w = WT()
    w.update({"c1": 1, "c2": 1}, {"c1": ["a:1"], "c2": ["b:2"]})
    sub = w.sub("a:1")
    w.lb.shutdown()
    reports = len(w.helper.states)
    sub.set_state(READY)
    w.clock.advance(CHILD_RETENTION)
    assert len(w.helper.states) == reports
    assert all(s.shut_down for s in w.helper.subchannels)


def test_failing_child_counts_as_failing_until_ready_even_if_it_reports_connecting():
    """grpc-go TestBalancerGroup_SubBalancerTurnsConnectingFromTransientFailure
    with a child that is not sticky itself (C-core WeightedChild keeps
    TRANSIENT_FAILURE for aggregation until READY)."""
    reset_leaves()
    try:
        helper = FakeHelper()
        lb = WeightedTargetFactory().build(helper)
        lb.update(_leaf_wt(["a", "b"]))
        leaf("a").report(TF, "a down")
        leaf("b").report(TF, "b down")
        assert helper.state is TF
        reports = len(helper.states)
        leaf("a").report(CONNECTING)
        assert len(helper.states) == reports and helper.state is TF
        assert all(isinstance(helper.pick(), PickFail) for _ in range(10))
        leaf("a").report(READY)
        assert helper.state is READY
    finally:
        reset_leaves()


def test_connecting_target_outranks_an_idle_one():
    """A28 / C-core aggregation order: READY, then CONNECTING, then IDLE."""
    w = WT()
    w.update({"idle": (1, "pick_first"), "conn": 1}, {"idle": ["a:1"], "conn": ["b:2"]})
    w.ready("a:1")
    w.sub("b:2").set_state(CONNECTING)
    assert w.state is READY
    w.sub("a:1").set_state(IDLE)  # pick_first goes IDLE; round_robin still connecting
    assert w.state is CONNECTING and isinstance(w.helper.pick(), PickQueue)


def test_resolver_error_without_targets_fails_with_it_until_the_next_update():
    """A resolver error with no target yet fails RPCs with that error; the
    next update reports its own state again (C-core's "no children")."""
    w = WT()
    error = Status(grpc.StatusCode.UNAVAILABLE, "dns down")
    w.lb.resolver_error(error)
    assert w.state is TF and w.helper.pick() == PickFail(error)
    w.update({}, {}, note="n")
    assert w.helper.last.status.details == "no children in weighted_target policy: n"
    w.lb.resolver_error(error)
    assert w.helper.last.status == error
    w.update({}, {}, note="n")
    assert w.helper.last.status.details == "no children in weighted_target policy: n"


def test_reset_backoff_reaches_the_subchannels_of_every_target():
    """grpc-go TestWeightedTarget_TwoSubBalancers_ResetBackoff."""
    w = WT()
    w.update({"c1": 1, "c2": 1}, {"c1": ["a:1"], "c2": ["b:2"]})
    w.sub("a:1").set_state(TF)
    w.sub("b:2").set_state(TF)
    w.lb.reset_backoff()
    assert w.sub("a:1").reset_backoff_calls >= 1
    assert w.sub("b:2").reset_backoff_calls >= 1
