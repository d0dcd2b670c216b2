"""Conformance: xds_cluster_manager (A28 "Routing LB policy" as reshaped by
A31) and cds (A74 latest, A37, A75), cases not covered by
test_xds_cluster_manager.py, test_cds.py and test_conformance_cds.py.

Sources (each test names its own): grpc-java
xds/src/test/java/io/grpc/xds/ClusterManagerLoadBalancerTest.java and
CdsLoadBalancer2Test.java, grpc-go
internal/xds/balancer/clustermanager/clustermanager_test.go and
internal/xds/balancer/cdsbalancer/cdsbalancer_test.go, C-core
src/core/load_balancing/xds/xds_cluster_manager.cc (UpdateLocked,
UpdateStateLocked).  The cluster manager's children are recording stand-in
policies driven by hand, so each test chooses exactly what a child reports.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from test_cds_support import (
    CONNECTING,
    IDLE,
    READY,
    TF,
    aggregate_entry,
    build,
    cds_update,
    connect,
    connect_all,
    eds_entry,
    loc,
    locality,
    not_found,
    picked_addresses,
    xds_config,
)

from pyxds.lb import (
    OK_STATUS,
    LoadBalancer,
    PickArgs,
    Picker,
    PickFail,
    PickQueue,
    PickResult,
    PolicyFactory,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.xds_cluster_manager import CHILD_RETENTION

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
POLICY_A = "test.conformance_cm_a"
POLICY_B = "test.conformance_cm_b"


class LabelPicker(Picker):
    """Fails every pick with a status naming the child that made it, so a
    test can tell which child's picker answered."""

    def __init__(self, label: str) -> None:
        self.label = label

    def pick(self, args: PickArgs) -> PickResult:
        return PickFail(Status(UNAVAILABLE, f"picked by {self.label}"))


class Recorder(LoadBalancer):
    """A child policy that records what it is told and reports on demand."""

    built: list[Recorder] = []
    report_during_update: tuple[Any, Status] | None = None  # report this inside update()
    failing_label: str = ""  # update() of the child with this label returns an error

    def __init__(self, helper: Any, policy: str) -> None:
        self.helper = helper
        self.policy = policy
        self.label = ""
        self.updates = 0
        self.errors: list[Status] = []
        self.exit_idle_calls = 0
        self.shut_down = False
        Recorder.built.append(self)

    def update(self, update: ResolverUpdate) -> Status | None:
        self.label = update.config["id"]
        self.updates += 1
        if self.report_during_update is not None:
            self.report(*self.report_during_update)
        if self.label == self.failing_label:
            return Status(UNAVAILABLE, "no such thing")
        return None

    def report(self, state: Any, status: Status = OK_STATUS) -> None:
        self.helper.update_state(state, status, LabelPicker(f"{self.label}/{self.policy}"))

    def resolver_error(self, status: Status) -> None:
        self.errors.append(status)

    def exit_idle(self) -> None:
        self.exit_idle_calls += 1

    def reset_backoff(self) -> None: ...

    def shutdown(self) -> None:
        self.shut_down = True


class RecorderFactory(PolicyFactory):
    def __init__(self, name: str) -> None:
        self.name = name

    def parse_config(self, json_config: Any) -> Any:
        return dict(json_config)

    def build(self, helper: Any) -> Recorder:
        return Recorder(helper, self.name)


@pytest.fixture(autouse=True)
def recorders():
    for name in (POLICY_A, POLICY_B):
        registry.register(RecorderFactory(name))
    Recorder.built = []
    yield
    for name in (POLICY_A, POLICY_B):
        registry.unregister(name)


def manager_config(**children: str) -> Any:
    """``cluster name -> child policy name``; each child's config id is the
    cluster name."""
    json_children = {
        name: {"childPolicy": [{policy: {"id": name}}]} for name, policy in children.items()
    }
    _, config = registry.select([{"xds_cluster_manager_experimental": {"children": json_children}}])
    return config


def new_manager(**children: str):
    helper, policy, _ = build([{"xds_cluster_manager_experimental": {"children": {}}}])
    if children:
        policy.update(ResolverUpdate((), manager_config(**children)))
    return helper, policy


def child(label: str, live: bool = True) -> Recorder:
    found = [r for r in Recorder.built if r.label == label and r.shut_down is not live]
    assert len(found) == 1, (label, Recorder.built)
    return found[0]


def picked_by(helper: Any, cluster: str) -> str:
    result = helper.pick(cluster=cluster)
    if isinstance(result, PickQueue):
        return "queued"
    assert isinstance(result, PickFail), result
    return result.status.details


# ----------------------------------------------------------------- xds_cluster_manager


def test_config_update_keeps_kept_children_builds_new_ones_and_drops_removed_ones():
    """grpc-java ClusterManagerLoadBalancerTest.acceptResolvedAddressesUpdatesChannelPicker,
    grpc-go TestConfigUpdateAddCluster: children queue until they report; an
    update keeps the child of a cluster still present (same instance, updated
    again), builds the new one, and a removed cluster's picks fail (its child
    is retained, alive, for 15 minutes: C-core and grpc-java)."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    assert helper.state is CONNECTING
    assert picked_by(helper, "childA") == "queued"
    assert picked_by(helper, "childB") == "queued"
    a = child("childA")
    policy.update(ResolverUpdate((), manager_config(childA=POLICY_A, childC=POLICY_A)))
    assert child("childA") is a and a.updates == 2
    assert not child("childB").shut_down
    assert child("childC").updates == 1
    assert picked_by(helper, "childB") == 'xds cluster manager picker: unknown cluster "childB"'
    assert picked_by(helper, "childC") == "queued"


def test_picker_routes_each_cluster_to_its_childs_latest_picker():
    """grpc-java updateBalancingStateFromChildBalancers, grpc-go TestClusterPicks:
    one child READY makes the manager READY; each cluster's picks go to its
    own child's newest picker, the other still queues."""
    helper, _ = new_manager(childA=POLICY_A, childB=POLICY_B)
    child("childA").report(READY)
    assert helper.state is READY
    assert picked_by(helper, "childA") == f"picked by childA/{POLICY_A}"
    assert picked_by(helper, "childB") == "queued"
    child("childB").report(READY)
    assert picked_by(helper, "childB") == f"picked by childB/{POLICY_B}"


def test_report_from_a_removed_child_is_ignored():
    """grpc-java ignoreBalancingStateUpdateForDeactivatedChildLbs, C-core
    UpdateStateLocked ("Skip the children that are not in the latest
    update"): a retained child counts for neither the state nor the picker,
    whether it was READY when removed or reports READY later."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    child("childA").report(READY)
    assert helper.state is READY
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    assert helper.state is CONNECTING
    removed = child("childA")
    before = len(helper.states)
    removed.report(READY)
    assert len(helper.states) == before
    assert helper.state is CONNECTING


def test_report_after_shutdown_is_ignored():
    """grpc-java raceBetweenShutdownAndChildLbBalancingStateUpdate."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    a = child("childA")
    before = len(helper.states)
    policy.shutdown()
    assert a.shut_down
    a.report(READY)
    assert len(helper.states) == before


def test_resolver_error_before_any_child_fails_picks_with_that_error():
    """grpc-java handleNameResolutionError_beforeChildLbsInstantiated_returnErrorPicker."""
    helper, policy = new_manager()
    error = Status(UNAVAILABLE, "resolver error")
    policy.resolver_error(error)
    assert helper.state is TF
    result = helper.pick(cluster="anything")
    assert isinstance(result, PickFail) and result.status == error


def test_resolver_error_reaches_every_current_child_and_no_removed_one():
    """grpc-java handleNameResolutionError_afterChildLbsInstantiated_propagateToChildLbs
    and handleNameResolutionError_notPropagateToDeactivatedChildLbs."""
    _, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    error = Status(grpc.StatusCode.UNKNOWN, "unknown error")
    policy.resolver_error(error)
    assert child("childA").errors == []
    assert child("childB").errors == [error]


def test_children_reporting_during_an_update_make_one_report(monkeypatch):
    """grpc-java noDuplicateOverallBalancingStateUpdate, grpc-go
    TestUpdateStatePauses; C-core UpdateStateLocked ignores child reports
    while update_in_progress_: two children failing inside the update give one
    TRANSIENT_FAILURE report, with C-core's text."""
    helper, policy = new_manager()
    before = len(helper.states)
    monkeypatch.setattr(Recorder, "report_during_update", (TF, Status(UNAVAILABLE, "child failed")))
    policy.update(ResolverUpdate((), manager_config(childA=POLICY_A, childB=POLICY_B)))
    assert len(helper.states) == before + 1
    assert helper.state is TF
    assert helper.last.status == Status(UNAVAILABLE, "TRANSIENT_FAILURE from XdsClusterManagerLb")


def test_config_with_no_children_fails_every_pick_and_children_can_come_back():
    """grpc-go TestRoutingConfigUpdateDeleteAll: every cluster removed ->
    TRANSIENT_FAILURE (C-core: no child counts, so TRANSIENT_FAILURE) and
    picks fail as unknown clusters; re-adding the clusters serves again, at
    once for childA, whose retained child is still READY (C-core; grpc-go
    deletes removed children and starts CONNECTING)."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    child("childA").report(READY)
    policy.update(ResolverUpdate((), manager_config()))
    assert helper.state is TF
    assert picked_by(helper, "childA") == 'xds cluster manager picker: unknown cluster "childA"'
    policy.update(ResolverUpdate((), manager_config(childA=POLICY_A, childB=POLICY_B)))
    assert helper.state is READY
    assert picked_by(helper, "childA") == f"picked by childA/{POLICY_A}"
    assert picked_by(helper, "childB") == "queued"


def test_child_policy_change_switches_gracefully():
    """grpc-go TestClusterGracefulSwitch (and clustermanager e2e
    TestConfigUpdate_ChildPolicyChange): a cluster whose child policy changes
    keeps picking with the old policy while the new one is CONNECTING, then
    switches to the new one and shuts the old one down."""
    helper, policy = new_manager(childA=POLICY_A)
    old = child("childA")
    old.report(READY)
    policy.update(ResolverUpdate((), manager_config(childA=POLICY_B)))
    new = next(r for r in Recorder.built if r.policy == POLICY_B)
    new.report(CONNECTING)
    assert picked_by(helper, "childA") == f"picked by childA/{POLICY_A}"
    assert not old.shut_down
    new.report(READY)
    assert picked_by(helper, "childA") == f"picked by childA/{POLICY_B}"
    assert old.shut_down


def test_all_children_idle_is_idle_and_exit_idle_reaches_every_child():
    """grpc-go TestInitialIdle: children reporting IDLE make the manager IDLE;
    exit_idle wakes each of them."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    child("childA").report(IDLE)
    child("childB").report(IDLE)
    assert helper.state is IDLE
    policy.exit_idle()
    assert child("childA").exit_idle_calls == 1
    assert child("childB").exit_idle_calls == 1


# ----------------------------------------------------------------- retention (A28, C-core)


def test_removed_child_lives_15_minutes_then_is_shut_down():
    """gRFC A28 "When a child policy is removed, it will be cached for 15
    minutes"; C-core xds_cluster_manager.cc kChildRetentionInterval and
    OnDelayedRemovalTimerLocked, grpc-java ClusterManagerLoadBalancer
    DELAYED_CHILD_DELETION_TIME_MINUTES."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    a = child("childA")
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    helper.clock.advance(CHILD_RETENTION - 1)
    assert not a.shut_down
    helper.clock.advance(1)
    assert a.shut_down
    assert set(policy.retained) == set() and set(policy.children) == {"childB"}


def test_child_re_added_before_its_timer_is_the_same_child_with_the_new_config():
    """C-core ClusterChild::UpdateLocked ("Reactivate if needed": cancel the
    timer, update the existing child policy): the re-added child gets the new
    update, keeps its last picker, and the cancelled timer never fires; a
    second removal starts a fresh 15 minutes."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    a = child("childA")
    a.report(READY)
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    helper.clock.advance(600)
    policy.update(ResolverUpdate((), manager_config(childA=POLICY_A, childB=POLICY_B)))
    assert child("childA") is a and a.updates == 2
    assert picked_by(helper, "childA") == f"picked by childA/{POLICY_A}"
    helper.clock.advance(CHILD_RETENTION)
    assert not a.shut_down
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    helper.clock.advance(CHILD_RETENTION - 1)
    assert not a.shut_down
    helper.clock.advance(1)
    assert a.shut_down


def test_second_removal_of_a_retained_child_keeps_its_first_deadline():
    """C-core ClusterChild::DeactivateLocked ("If already deactivated, don't
    do that again"): an update that again leaves the child out does not
    restart its timer."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    a = child("childA")
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    helper.clock.advance(500)
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B, childC=POLICY_A)))
    helper.clock.advance(CHILD_RETENTION - 500)
    assert a.shut_down


def test_shutdown_shuts_retained_children_down_and_cancels_their_timers():
    """C-core ShutdownLocked / ClusterChild::Orphan: every child, retained or
    not, is shut down and its removal timer cancelled."""
    helper, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    a, b = child("childA"), child("childB")
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    assert len(helper.clock.pending) == 1
    policy.shutdown()
    assert a.shut_down and b.shut_down
    assert helper.clock.pending == []


def test_exit_idle_reaches_retained_children_too():
    """C-core XdsClusterManagerLb::ExitIdleLocked walks every child in
    children_, retained ones included (only resolver errors are limited to
    the config's children)."""
    _, policy = new_manager(childA=POLICY_A, childB=POLICY_B)
    policy.update(ResolverUpdate((), manager_config(childB=POLICY_B)))
    policy.exit_idle()
    assert child("childA").exit_idle_calls == 1
    assert child("childB").exit_idle_calls == 1


def test_child_update_errors_are_returned_in_c_core_words(monkeypatch):
    """C-core XdsClusterManagerLb::UpdateLocked: "errors from children:
    [child NAME: STATUS]"; the other children are still updated."""
    monkeypatch.setattr(Recorder, "failing_label", "bad")
    _, policy = new_manager()
    status = policy.update(ResolverUpdate((), manager_config(bad=POLICY_A, good=POLICY_A)))
    assert status is not None and status.code is UNAVAILABLE
    assert status.details.startswith("errors from children: [child bad: ")
    assert "no such thing" in status.details
    assert child("good").updates == 1


# ----------------------------------------------------------------- cds


def cds(cluster: str):
    return build([{"cds_experimental": {"cluster": cluster}}])


def good_config():
    return xds_config({"c": eds_entry("c", [locality(loc("a"), ["10.0.0.1:80"])])})


def test_cds_resolver_error_before_any_config_fails_picks_with_it():
    """grpc-java CdsLoadBalancer2Test
    .handleNameResolutionErrorFromUpstream_beforeChildLbCreated_failingPicker."""
    helper, policy, _ = cds("c")
    error = Status(UNAVAILABLE, "unreachable")
    policy.resolver_error(error)
    assert helper.state is TF
    result = helper.pick()
    assert isinstance(result, PickFail) and result.status == error


def test_cds_resolver_error_after_a_config_keeps_serving():
    """grpc-java handleNameResolutionErrorFromUpstream_afterChildLbCreated_fallThrough,
    grpc-go cdsbalancer TestResolverError: the error goes down the tree; a
    READY cluster stays READY and keeps its connections."""
    helper, policy, config = cds("c")
    policy.update(cds_update(config, good_config()))
    connect_all(helper)
    assert helper.state is READY
    policy.resolver_error(Status(UNAVAILABLE, "unreachable"))
    assert helper.state is READY
    assert set(picked_addresses(helper, 5)) == {"10.0.0.1:80"}
    assert not any(s.shut_down for s in helper.subchannels)


def test_cds_cluster_revoked_then_restored_serves_again():
    """grpc-java nonAggregateCluster_resourceRevoked, grpc-go
    TestClusterUpdate_ResourceNotFound: a cluster that stops existing fails
    with the resource's error and drops its connections; when it comes back
    the tree is rebuilt and serves."""
    helper, policy, config = cds("c")
    policy.update(cds_update(config, good_config()))
    connect_all(helper)
    policy.update(cds_update(config, xds_config({"c": not_found("c")})))
    assert helper.state is TF
    result = helper.pick()
    assert isinstance(result, PickFail) and result.status == not_found("c")
    assert all(s.shut_down for s in helper.subchannels)
    policy.update(cds_update(config, good_config()))
    connect_all(helper)
    assert helper.state is READY
    assert set(picked_addresses(helper, 5)) == {"10.0.0.1:80"}


def aggregate_over(*leaves: str):
    addresses = {"a": "10.0.1.1:80", "b": "10.0.2.1:80", "c": "10.0.3.1:80"}
    entries = {leaf: eds_entry(leaf, [locality(loc(leaf), [addresses[leaf]])]) for leaf in "abc"}
    return xds_config({"agg": aggregate_entry("agg", list(leaves)), **entries})


def test_aggregate_leaf_order_change_moves_the_traffic_to_the_new_first_leaf():
    """grpc-go cdsbalancer TestAggregateClusterSuccess_ThenUpdateChildClusters,
    grpc-java discoverAggregateCluster_createsPriorityLbPolicy (priorities in
    leaf order), A75: with every leaf READY, the first leaf in the new order
    takes the traffic."""
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, aggregate_over("a", "b")))
    connect_all(helper)
    assert set(picked_addresses(helper, 5)) == {"10.0.1.1:80"}
    policy.update(cds_update(config, aggregate_over("b", "a")))
    connect_all(helper)
    assert set(picked_addresses(helper, 5)) == {"10.0.2.1:80"}


def test_leaf_dropped_from_an_aggregate_loses_its_connections_and_a_new_one_serves():
    """grpc-go TestAggregateClusterSuccess_ThenUpdateChildClusters: [a, b] ->
    [c, b]: c becomes the first priority; a's subtree is gone once the
    priority policy's retention of removed children (A56, 15 minutes, kept by
    pyxds: docs/priority.md) ends."""
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, aggregate_over("a", "b")))
    connect_all(helper)
    policy.update(cds_update(config, aggregate_over("c", "b")))
    connect(helper, "10.0.3.1:80")
    assert set(picked_addresses(helper, 5)) == {"10.0.3.1:80"}
    helper.clock.advance(15 * 60)
    assert helper.subchannel("10.0.1.1:80", live=False).shut_down
    assert not helper.subchannel("10.0.3.1:80").shut_down
