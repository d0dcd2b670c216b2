"""xds_cluster_manager_experimental (A28 "Routing LB policy" reshaped by A31):
a child per cluster, the pick delegated by ``call_attributes["cluster"]``."""

from __future__ import annotations

import grpc
import pytest
from test_cds_support import (
    CONNECTING,
    IDLE,
    READY,
    TF,
    build,
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
    FailPicker,
    LBConfigError,
    LoadBalancer,
    PickFail,
    PickQueue,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.xds_cluster_manager import CHILD_RETENTION
from pyxds.resolver.xds_config import XDS_CONFIG_ATTRIBUTE

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def manager_json(*clusters: str) -> list:
    children = {
        f"cluster:{c}": {"childPolicy": [{"cds_experimental": {"cluster": c}}]} for c in clusters
    }
    return [{"xds_cluster_manager_experimental": {"children": children}}]


def two_clusters():
    return xds_config(
        {
            "c1": eds_entry("c1", [locality(loc("a"), ["10.0.0.1:80"])]),
            "c2": eds_entry("c2", [locality(loc("b"), ["10.0.0.2:80"])]),
        }
    )


def update_for(config, xds):
    return ResolverUpdate((), config, {XDS_CONFIG_ATTRIBUTE: xds})


# ----------------------------------------------------------------- with real cds children


def test_picks_go_to_the_cluster_named_by_the_call_attribute():
    helper, policy, config = build(manager_json("c1", "c2"))
    assert policy.update(update_for(config, two_clusters())) is None
    connect_all(helper)
    assert set(picked_addresses(helper, 10, cluster="cluster:c1")) == {"10.0.0.1:80"}
    assert set(picked_addresses(helper, 10, cluster="cluster:c2")) == {"10.0.0.2:80"}


def test_unknown_cluster_fails_the_pick_naming_it():
    helper, policy, config = build(manager_json("c1"))
    policy.update(update_for(config, two_clusters()))
    connect_all(helper)
    result = helper.pick(cluster="cluster:nope")
    assert isinstance(result, PickFail)
    assert result.status == Status(
        UNAVAILABLE, 'xds cluster manager picker: unknown cluster "cluster:nope"'
    )


def test_pick_is_delegated_even_to_a_child_that_is_not_ready():
    helper, policy, config = build(manager_json("c1", "c2"))
    policy.update(update_for(config, two_clusters()))
    helper.subchannel("10.0.0.1:80").set_state(CONNECTING)
    helper.subchannel("10.0.0.1:80").set_state(READY)
    assert helper.state is READY
    # c2 has not connected: its RPCs queue in c2, they do not go to c1
    assert isinstance(helper.pick(cluster="cluster:c2"), PickQueue)


def test_removed_cluster_is_kept_15_minutes_then_shut_down():
    """A28 "When a child policy is removed, it will be cached for 15 minutes"
    (C-core xds_cluster_manager.cc ClusterChild::DeactivateLocked,
    kChildRetentionInterval): the removed cluster's picks fail at once as an
    unknown cluster, but its subchannels live until the 900 s timer fires."""
    helper, policy, config = build(manager_json("c1", "c2"))
    policy.update(update_for(config, two_clusters()))
    connect_all(helper)
    _, smaller = registry.select(manager_json("c1"))
    policy.update(update_for(smaller, two_clusters()))
    assert set(policy.children) == {"cluster:c1"}
    assert set(policy.retained) == {"cluster:c2"}
    assert isinstance(helper.pick(cluster="cluster:c2"), PickFail)
    helper.clock.advance(CHILD_RETENTION - 0.5)
    assert not helper.subchannel("10.0.0.2:80", live=False).shut_down
    helper.clock.advance(1.0)
    assert helper.subchannel("10.0.0.2:80", live=False).shut_down
    assert not helper.subchannel("10.0.0.1:80").shut_down
    assert policy.retained == {}


def test_cluster_re_added_within_15_minutes_reuses_its_subchannels():
    """C-core ClusterChild::UpdateLocked: re-adding a retained cluster cancels
    its timer and updates the same child, so its connected subchannel serves
    at once (READY, no new subchannel) and is not shut down later."""
    helper, policy, config = build(manager_json("c1", "c2"))
    policy.update(update_for(config, two_clusters()))
    connect_all(helper)
    made = len(helper.subchannels)
    _, smaller = registry.select(manager_json("c1"))
    policy.update(update_for(smaller, two_clusters()))
    helper.clock.advance(CHILD_RETENTION / 2)
    policy.update(update_for(config, two_clusters()))
    assert len(helper.subchannels) == made
    assert helper.state is READY
    assert set(picked_addresses(helper, 3, cluster="cluster:c2")) == {"10.0.0.2:80"}
    helper.clock.advance(CHILD_RETENTION)
    assert not any(s.shut_down for s in helper.subchannels)
    assert policy.retained == {} and set(policy.children) == {"cluster:c1", "cluster:c2"}


def test_one_state_report_per_update():
    helper, policy, config = build(manager_json("c1", "c2"))
    policy.update(update_for(config, two_clusters()))
    assert len(helper.states) == 1
    connect_all(helper)
    before = len(helper.states)
    moved = xds_config(
        {
            "c1": eds_entry("c1", [locality(loc("a"), ["10.0.0.5:80"])]),
            "c2": eds_entry("c2", [locality(loc("b"), ["10.0.0.6:80"])]),
        }
    )
    policy.update(update_for(config, moved))
    assert len(helper.states) == before + 1


def test_cluster_error_stays_local_to_that_cluster():
    helper, policy, config = build(manager_json("c1", "c2"))
    xds = xds_config(
        {"c1": eds_entry("c1", [locality(loc("a"), ["10.0.0.1:80"])]), "c2": not_found("c2")}
    )
    status = policy.update(update_for(config, xds))
    assert status is not None and "c2" in status.details
    connect_all(helper)
    assert helper.state is READY
    assert set(picked_addresses(helper, 5, cluster="cluster:c1")) == {"10.0.0.1:80"}
    failed = helper.pick(cluster="cluster:c2")
    assert isinstance(failed, PickFail) and failed.status == not_found("c2")


def test_same_config_twice_creates_nothing():
    helper, policy, config = build(manager_json("c1", "c2"))
    policy.update(update_for(config, two_clusters()))
    connect_all(helper)
    subchannels = len(helper.subchannels)
    _, again = registry.select(manager_json("c1", "c2"))
    assert again == config
    policy.update(update_for(again, two_clusters()))
    assert len(helper.subchannels) == subchannels
    assert not any(s.shut_down for s in helper.subchannels)


# ----------------------------------------------------------------- aggregation, driven by hand


class _Manual(LoadBalancer):
    instances: dict[str, _Manual] = {}

    def __init__(self, helper):
        self.helper = helper
        self.shut_down = False

    def update(self, update):
        _Manual.instances[update.config] = self

    def report(self, state, status=OK_STATUS):
        picker = FailPicker(status) if state is TF else QueuePicker()
        self.helper.update_state(state, status, picker)

    def resolver_error(self, status): ...
    def exit_idle(self): ...
    def reset_backoff(self): ...

    def shutdown(self):
        self.shut_down = True


class _ManualFactory(PolicyFactory):
    name = "test.manual"

    def parse_config(self, json_config):
        return json_config["id"]

    def build(self, helper):
        return _Manual(helper)


@pytest.fixture
def manual():
    registry.register(_ManualFactory())
    _Manual.instances = {}
    yield _Manual.instances
    registry.unregister("test.manual")


def manual_json(*ids):
    children = {i: {"childPolicy": [{"test.manual": {"id": i}}]} for i in ids}
    return [{"xds_cluster_manager_experimental": {"children": children}}]


def test_state_is_ready_then_connecting_then_idle_then_transient_failure(manual):
    helper, policy, config = build(manual_json("x", "y"))
    policy.update(ResolverUpdate((), config))
    assert helper.state is CONNECTING  # children that have not reported count as CONNECTING
    manual["x"].report(TF, Status(UNAVAILABLE, "x down"))
    assert helper.state is CONNECTING
    manual["y"].report(IDLE)
    assert helper.state is IDLE
    manual["y"].report(READY)
    assert helper.state is READY
    manual["y"].report(TF, Status(UNAVAILABLE, "y down"))
    assert helper.state is TF
    assert helper.last.status.code is UNAVAILABLE


def test_child_in_transient_failure_stays_there_until_ready(manual):
    helper, policy, config = build(manual_json("x", "y"))
    policy.update(ResolverUpdate((), config))
    manual["x"].report(TF)
    manual["y"].report(TF)
    assert helper.state is TF
    manual["x"].report(CONNECTING)  # a reconnect attempt is not a recovery
    assert helper.state is TF
    manual["x"].report(READY)
    assert helper.state is READY


def test_single_child_failure_status_is_passed_up(manual):
    helper, policy, config = build(manual_json("x"))
    policy.update(ResolverUpdate((), config))
    manual["x"].report(TF, Status(UNAVAILABLE, "CDS resource x does not exist"))
    assert helper.last.status.details == "CDS resource x does not exist"


def test_shutdown_shuts_every_child_down(manual):
    _, policy, config = build(manual_json("x", "y"))
    policy.update(ResolverUpdate((), config))
    policy.shutdown()
    assert manual["x"].shut_down and manual["y"].shut_down


def test_config_errors_name_the_field():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"xds_cluster_manager_experimental": {}}])
    assert str(err.value) == "xds_cluster_manager_experimental.children: required field missing"
    with pytest.raises(LBConfigError) as err:
        registry.select([{"xds_cluster_manager_experimental": {"children": {"cluster:a": {}}}}])
    assert str(err.value) == (
        'xds_cluster_manager_experimental.children["cluster:a"].childPolicy: required field missing'
    )
    with pytest.raises(LBConfigError) as err:
        registry.select(
            [
                {
                    "xds_cluster_manager_experimental": {
                        "children": {"cluster:a": {"childPolicy": [{"cds_experimental": {}}]}}
                    }
                }
            ]
        )
    assert str(err.value) == (
        'xds_cluster_manager_experimental.children["cluster:a"].childPolicy[0]'
        ".cds_experimental.cluster: required field missing"
    )
