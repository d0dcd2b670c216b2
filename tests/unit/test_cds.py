"""cds_experimental (A74 latest, A37, A75, A52, A62): the subtree of one
cluster, built from an XdsConfig made by hand, down to real subchannels on a
FakeHelper through the real priority / weighted_target / round_robin /
pick_first policies."""

from __future__ import annotations

import collections

import grpc
from test_cds_support import (
    CONNECTING,
    IDLE,
    PICK_FIRST_POLICY,
    READY,
    TF,
    FakeDependencyManager,
    aggregate_entry,
    build,
    cds_update,
    connect,
    connect_all,
    describe,
    dns_cluster,
    dns_entry,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    not_found,
    picked_addresses,
    xds_config,
)

from pyxds.lb import (
    LBConfigError,
    PickComplete,
    PickFail,
    Status,
    registry,
)
from pyxds.testing import FakeHelper

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def cds(cluster: str, dynamic: bool = False, helper: FakeHelper | None = None):
    body = {"cluster": cluster}
    if dynamic:
        body["isDynamic"] = True
    return build([{"cds_experimental": body}], helper)


def child_name(cluster: str, n: int) -> str:
    return f"{{cluster={cluster}, child_number={n}}}"


A, B, C = loc("a"), loc("b"), loc("c")


def two_priority_eds(name="c1", **kwargs):
    return eds_entry(
        name,
        [
            locality(A, ["10.0.0.1:80", "10.0.0.2:80"], weight=2),
            locality(B, ["10.0.0.3:80"], weight=3),
        ],
        [locality(C, ["10.0.1.1:80"])],
        **kwargs,
    )


# ----------------------------------------------------------------- EDS leaf


def test_eds_cluster_tree_is_od_cluster_impl_override_host_priority_wrr_locality_rr():
    """C-core's leaf tree (cds.cc, A75 "Aggregate Cluster Changes"):
    outlier_detection, xds_cluster_impl and xds_override_host above the
    priority policy, the cluster's policy in each priority."""
    _helper, policy, config = cds("c1")
    assert policy.update(cds_update(config, xds_config({"c1": two_priority_eds()}))) is None
    tree = describe(policy)
    assert tree[0] == "cds"
    assert tree[1][0] == "outlier_detection"
    impl = tree[1][1]
    assert impl[0] == "xds_cluster_impl"
    override_host = impl[1]
    assert override_host[0] == "xds_override_host"
    priority = override_host[1]
    assert priority[0] == "priority"
    assert set(priority[1]) <= {child_name("c1", 0), child_name("c1", 1)}
    assert priority[1][child_name("c1", 0)] == (
        "xds_wrr_locality",
        ("weighted_target", {str(A): "round_robin", str(B): "round_robin"}),
    )
    assert policy.priority_names == [child_name("c1", 0), child_name("c1", 1)]


def test_eds_endpoints_carry_locality_and_weight_locality_times_endpoint():
    helper, policy, config = cds("c1")
    entry = eds_entry(
        "c1", [locality(A, ["10.0.0.1:80", "10.0.0.2:80"], weight=3, endpoint_weights=[1, 5])]
    )
    policy.update(cds_update(config, xds_config({"c1": entry})))
    attrs = {s.address: s.attributes for s in helper.subchannels}
    assert attrs["10.0.0.1:80"]["weight"] == 3
    assert attrs["10.0.0.2:80"]["weight"] == 15
    assert attrs["10.0.0.1:80"]["locality"] == A
    assert attrs["10.0.0.1:80"]["locality_weight"] == 3


def test_eds_hierarchical_path_is_priority_child_then_locality():
    # A custom LB policy (A52) as the cluster's policy sees what each priority
    # child gets: the priority level has stripped its own name.
    seen: dict[str, list] = collections.defaultdict(list)

    from pyxds.lb import LoadBalancer, PolicyFactory, QueuePicker

    class Recorder(LoadBalancer):
        def __init__(self, helper):
            self.helper = helper

        def update(self, update):
            seen[update.resolution_note or "ok"].append(list(update.endpoints))
            self.helper.update_state(CONNECTING, Status(grpc.StatusCode.OK), QueuePicker())

        def resolver_error(self, status): ...
        def exit_idle(self): ...
        def reset_backoff(self): ...
        def shutdown(self): ...

    class RecorderFactory(PolicyFactory):
        name = "test.recorder"

        def parse_config(self, json_config):
            return "recorder"

        def build(self, helper):
            return Recorder(helper)

    registry.register(RecorderFactory())
    try:
        _helper, policy, config = cds("c1")
        cluster = eds_cluster("c1", lb_policy_config='[{"test.recorder": {}}]')
        entry = eds_entry(cluster, [locality(A, ["10.0.0.1:80"]), locality(B, ["10.0.0.3:80"])])
        policy.update(cds_update(config, xds_config({"c1": entry})))
    finally:
        registry.unregister("test.recorder")
    (endpoints,) = seen["ok"]
    assert [(e.addresses, e.attributes["hierarchical_path"]) for e in endpoints] == [
        (("10.0.0.1:80",), (str(A),)),
        (("10.0.0.3:80",), (str(B),)),
    ]


def test_eds_picks_follow_locality_weights():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    assert helper.state is READY
    picks = collections.Counter(picked_addresses(helper, 3000))
    share_b = picks["10.0.0.3:80"] / 3000
    assert abs(share_b - 0.6) < 0.04  # locality b has weight 3 of 5
    assert picks["10.0.1.1:80"] == 0  # priority 1 unused while priority 0 is READY


def test_eds_priority_fails_over_to_the_next_priority_child():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    for address in ("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"):
        helper.subchannel(address).set_state(TF)
    connect(helper, "10.0.1.1:80")  # priority 1's subchannel, created by the failover
    assert set(picked_addresses(helper, 10)) == {"10.0.1.1:80"}


def test_eds_children_ignore_reresolution_requests_but_logical_dns_does_not():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    subchannel = helper.subchannel("10.0.0.1:80")
    subchannel.set_state(TF)
    subchannel.set_state(IDLE)
    assert helper.reresolution_requests == 0

    dns_helper, dns_policy, dns_config = cds("d1")
    dns_policy.update(cds_update(dns_config, xds_config({"d1": dns_entry("d1", ["10.1.0.1:80"])})))
    connect_all(dns_helper)
    dns_helper.subchannel("10.1.0.1:80").set_state(TF)
    assert dns_helper.reresolution_requests >= 1


def test_same_cluster_config_twice_is_a_no_op():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    reports, subchannels = len(helper.states), len(helper.subchannels)
    # Equal values, not the same objects; another cluster changing does not matter.
    again = xds_config({"c1": two_priority_eds(), "other": eds_entry("other", [])})
    assert policy.update(cds_update(config, again)) is None
    assert len(helper.states) == reports
    assert len(helper.subchannels) == subchannels
    assert not any(s.shut_down for s in helper.subchannels)


def test_eds_update_changing_one_locality_keeps_the_other_subchannels():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    before = {s.address: s for s in helper.live_subchannels()}
    changed = eds_entry(
        "c1",
        [
            locality(A, ["10.0.0.1:80", "10.0.0.2:80"], weight=2),
            locality(B, ["10.0.0.4:80"], weight=3),  # b's endpoint replaced
        ],
        [locality(C, ["10.0.1.1:80"])],
    )
    policy.update(cds_update(config, xds_config({"c1": changed})))
    assert policy.priority_names == [child_name("c1", 0), child_name("c1", 1)]
    for address in ("10.0.0.1:80", "10.0.0.2:80"):
        assert helper.subchannel(address) is before[address]
    created = [s.address for s in helper.subchannels[len(before) :]]
    assert created == ["10.0.0.4:80"]
    # round_robin (as C-core) keeps b's old READY endpoint serving until the
    # new one is READY, then shuts it down.
    assert not before["10.0.0.3:80"].shut_down
    helper.subchannel("10.0.0.4:80").set_state(READY)
    assert before["10.0.0.3:80"].shut_down


def test_priority_child_names_follow_the_a115_sequence():
    aa, bb, cc, dd, ee = (loc("r", z) for z in ("aa", "bb", "cc", "dd", "ee"))

    def entry(p0, p1):
        return eds_entry(
            "c1",
            [locality(x, [f"10.0.{i}.1:80"]) for i, x in enumerate(p0)],
            [locality(x, [f"10.1.{i}.1:80"]) for i, x in enumerate(p1)],
        )

    _helper, policy, config = cds("c1")
    names = []
    for p0, p1 in (([aa, bb], [cc, dd]), ([cc], [dd, ee]), ([aa, bb], [cc, dd])):
        policy.update(cds_update(config, xds_config({"c1": entry(p0, p1)})))
        names.append(policy.priority_names)
    assert names == [
        [child_name("c1", 0), child_name("c1", 1)],
        [child_name("c1", 1), child_name("c1", 2)],
        [child_name("c1", 3), child_name("c1", 1)],
    ]


# ----------------------------------------------------------------- EDS problems


def test_eds_error_before_first_data_gives_one_empty_failing_priority_saying_why():
    helper, policy, config = cds("c1")
    note = "EDS resource c1: does not exist"
    policy.update(cds_update(config, xds_config({"c1": eds_entry("c1", missing=True, note=note)})))
    assert policy.priority_names == [child_name("c1", 0)]
    assert helper.state is TF
    assert note in helper.last.status.details
    result = helper.pick()
    assert isinstance(result, PickFail) and note in result.status.details


def test_all_endpoints_unhealthy_says_so():
    helper, policy, config = cds("c1")
    entry = eds_entry("c1", [locality(A, [])], excluded=3)
    policy.update(cds_update(config, xds_config({"c1": entry})))
    assert helper.state is TF
    assert "EDS resource c1: all endpoints unhealthy" in helper.last.status.details


def test_eds_without_endpoints_says_so():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": eds_entry("c1")})))
    assert helper.state is TF
    assert "EDS resource c1 contains no endpoints" in helper.last.status.details


# ----------------------------------------------------------------- LOGICAL_DNS


def test_logical_dns_cluster_has_one_priority_with_one_endpoint():
    helper, policy, config = cds("d1")
    entry = dns_entry("d1", ["10.1.0.1:80", "10.1.0.2:80"])
    policy.update(cds_update(config, xds_config({"d1": entry})))
    assert policy.priority_names == [child_name("d1", 0)]
    tree = describe(policy)
    assert tree[1][1][1][1][1][child_name("d1", 0)] == (
        "xds_wrr_locality",
        ("weighted_target", {str(loc("", "")): "round_robin"}),
    )
    connect_all(helper)
    assert helper.state is READY


# ----------------------------------------------------------------- aggregate


def aggregate_config(eds_ok=True, dns_ok=True):
    return xds_config(
        {
            "agg": aggregate_entry("agg", ["e1", "d1"]),
            "e1": eds_entry("e1", [locality(A, ["10.0.0.1:80"])])
            if eds_ok
            else eds_entry("e1", missing=True, note="EDS resource e1: does not exist"),
            "d1": dns_entry("d1", ["10.1.0.1:80"]),
        }
    )


def test_aggregate_is_priority_over_one_cds_per_leaf_in_order():
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, aggregate_config()))
    tree = describe(policy)
    assert tree[0] == "cds"
    assert tree[1][0] == "priority"
    assert tree[1][1]["e1"][0] == "cds"
    assert tree[1][1]["e1"][1][0] == "outlier_detection"
    assert tree[1][1]["e1"][1][1][0] == "xds_cluster_impl"
    # d1 is the lower priority: not created while e1 may still connect
    assert tree[1][1].get("d1") is None
    connect_all(helper)
    assert set(picked_addresses(helper, 10)) == {"10.0.0.1:80"}


def test_aggregate_fails_over_from_eds_to_logical_dns_and_back():
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, aggregate_config()))
    connect_all(helper)
    helper.subchannel("10.0.0.1:80").set_state(TF)
    connect(helper, "10.1.0.1:80")
    assert set(picked_addresses(helper, 10)) == {"10.1.0.1:80"}
    connect(helper, "10.0.0.1:80")
    assert set(picked_addresses(helper, 10)) == {"10.0.0.1:80"}


def test_eds_error_before_first_data_lets_the_next_aggregate_priority_take_over():
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, aggregate_config(eds_ok=False)))
    connect_all(helper)
    assert helper.state is READY
    assert set(picked_addresses(helper, 10)) == {"10.1.0.1:80"}


def test_logical_dns_error_before_first_data_lets_the_next_aggregate_priority_take_over():
    # TRAPS grpc-go#6462, the DNS half: a LOGICAL_DNS leaf whose first
    # resolution failed is an empty failing priority, so the next leaf of the
    # aggregate serves at once (no failover timer), and the DNS leaf is used
    # again once it resolves.
    def config(dns):
        return xds_config(
            {
                "agg": aggregate_entry("agg", ["d1", "e1"]),
                "d1": dns,
                "e1": eds_entry("e1", [locality(A, ["10.0.0.1:80"])]),
            }
        )

    helper, policy, cfg = cds("agg")
    note = "DNS resolution failed for dns.example:443: no such host"
    policy.update(cds_update(cfg, config(dns_entry("d1", [], note=note))))
    connect_all(helper)
    assert helper.clock.now() == 0.0
    assert helper.state is READY
    assert set(picked_addresses(helper, 10)) == {"10.0.0.1:80"}
    policy.update(cds_update(cfg, config(dns_entry("d1", ["10.1.0.1:80"]))))
    connect(helper, "10.1.0.1:80")
    assert set(picked_addresses(helper, 10)) == {"10.1.0.1:80"}


def test_aggregate_skips_a_leaf_in_error():
    helper, policy, config = cds("agg")
    xds = xds_config(
        {
            "agg": aggregate_entry("agg", ["gone", "d1"]),
            "gone": not_found("gone"),
            "d1": dns_entry("d1", ["10.1.0.1:80"]),
        }
    )
    policy.update(cds_update(config, xds))
    connect_all(helper)
    assert set(picked_addresses(helper, 10)) == {"10.1.0.1:80"}


def test_aggregate_with_every_child_missing_fails_picks_naming_the_cluster():
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, xds_config({"agg": aggregate_entry("agg", [])})))
    assert helper.state is TF
    result = helper.pick()
    assert isinstance(result, PickFail)
    assert result.status == Status(
        UNAVAILABLE, "aggregate cluster dependency graph for agg has no leaf clusters"
    )


def test_aggregate_passes_leaf_changes_down_even_when_the_aggregate_is_unchanged():
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, aggregate_config()))
    connect_all(helper)
    moved = xds_config(
        {
            "agg": aggregate_entry("agg", ["e1", "d1"]),
            "e1": eds_entry("e1", [locality(A, ["10.0.0.9:80"])]),
            "d1": dns_entry("d1", ["10.1.0.1:80"]),
        }
    )
    policy.update(cds_update(config, moved))
    connect_all(helper)
    assert set(picked_addresses(helper, 10)) == {"10.0.0.9:80"}


# ----------------------------------------------------------------- type changes and errors


def test_cluster_type_change_eds_to_aggregate_and_back_rebuilds_the_tree():
    helper, policy, config = cds("c1")
    eds = eds_entry("c1", [locality(A, ["10.0.0.1:80"])])
    policy.update(cds_update(config, xds_config({"c1": eds})))
    connect_all(helper)
    assert describe(policy)[1][0] == "outlier_detection"

    as_aggregate = xds_config(
        {
            "c1": aggregate_entry("c1", ["c2"]),
            "c2": eds_entry("c2", [locality(B, ["10.0.0.2:80"])]),
        }
    )
    policy.update(cds_update(config, as_aggregate))
    # the child's policy name changed: its handler switches gracefully, the
    # old tree picking until the new one is ready
    assert set(picked_addresses(helper, 10)) == {"10.0.0.1:80"}
    connect_all(helper)
    assert describe(policy)[1][0] == "priority"
    assert set(picked_addresses(helper, 10)) == {"10.0.0.2:80"}
    assert helper.subchannel("10.0.0.1:80", live=False).shut_down

    policy.update(cds_update(config, xds_config({"c1": eds})))
    connect_all(helper)
    assert describe(policy)[1][0] == "outlier_detection"
    assert policy.priority_names == [child_name("c1", 0)]
    assert set(picked_addresses(helper, 10)) == {"10.0.0.1:80"}
    assert helper.subchannel("10.0.0.2:80", live=False).shut_down
    assert [s.address for s in helper.live_subchannels()] == ["10.0.0.1:80"]


def test_cluster_type_change_eds_to_logical_dns():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    dns = dns_entry(dns_cluster("c1"), ["10.1.0.1:80"])
    policy.update(cds_update(config, xds_config({"c1": dns})))
    connect_all(helper)
    assert set(picked_addresses(helper, 10)) == {"10.1.0.1:80"}
    assert [s.address for s in helper.live_subchannels()] == ["10.1.0.1:80"]


def test_cluster_error_destroys_the_subtree_and_fails_with_that_error():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    error = not_found("c1")
    assert policy.update(cds_update(config, xds_config({"c1": error}))) == error
    assert helper.state is TF and helper.last.status == error
    assert policy.child is None
    assert helper.live_subchannels() == []
    # and it comes back
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    assert helper.state is READY


def test_static_cluster_missing_from_xds_config_fails():
    helper, policy, config = cds("c9")
    status = policy.update(cds_update(config, xds_config({})))
    assert status == Status(UNAVAILABLE, "xDS config has no entry for static cluster c9")
    assert helper.state is TF and helper.last.status == status


def test_dynamic_cluster_subscribes_once_waits_for_its_entry_and_releases_at_shutdown():
    manager = FakeDependencyManager()
    helper, policy, config = cds("dyn", dynamic=True)
    assert policy.update(cds_update(config, xds_config({}), manager)) is None
    assert manager.subscribed == ["dyn"]
    assert helper.states == []  # ignored: still waiting, no failure
    entry = eds_entry("dyn", [locality(A, ["10.0.0.7:80"])])
    policy.update(cds_update(config, xds_config({"dyn": entry}), manager))
    connect_all(helper)
    assert helper.state is READY
    assert manager.subscribed == ["dyn"]
    policy.shutdown()
    assert manager.released == ["dyn"]
    assert helper.live_subchannels() == []


def test_dynamic_cluster_without_dependency_manager_fails():
    helper, policy, config = cds("dyn", dynamic=True)
    status = policy.update(cds_update(config, xds_config({})))
    assert status is not None and status.code is grpc.StatusCode.INTERNAL
    assert helper.state is TF


def test_shutdown_shuts_every_subchannel_down():
    helper, policy, config = cds("agg")
    policy.update(cds_update(config, aggregate_config()))
    connect_all(helper)
    policy.shutdown()
    assert helper.live_subchannels() == []


# ----------------------------------------------------------------- A62 / A52


def test_pick_first_via_xds_runs_pick_first_under_each_priority():
    helper, policy, config = cds("pf")
    cluster = eds_cluster("pf", lb_policy_config=PICK_FIRST_POLICY)
    entry = eds_entry(cluster, [locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    policy.update(cds_update(config, xds_config({"pf": entry})))
    tree = describe(policy)
    assert tree[1][1][1][1][1][child_name("pf", 0)] == "pick_first"
    connect_all(helper)
    picks = picked_addresses(helper, 20)
    assert len(set(picks)) == 1


def test_config_requires_a_cluster_name():
    import pytest

    with pytest.raises(LBConfigError) as err:
        registry.select([{"cds_experimental": {"isDynamic": True}}])
    assert str(err.value) == "cds_experimental.cluster: required field missing"
    with pytest.raises(LBConfigError) as err:
        registry.select([{"cds_experimental": {"cluster": "c", "isDynamic": "yes"}}])
    assert str(err.value) == 'cds_experimental.isDynamic: expected boolean, got "yes"'
    _, a = registry.select([{"cds_experimental": {"cluster": "c"}}])
    _, b = registry.select([{"cds_experimental": {"cluster": "c", "isDynamic": False}}])
    assert a == b


def test_picks_complete_on_a_ready_cluster():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    assert isinstance(helper.pick(), PickComplete)


# ----------------------------------------------------------------- TRAPS: EDS shaping


def test_an_empty_locality_next_to_a_healthy_one_does_not_fail_the_cluster():
    # grpc#22831: one empty locality made weighted_target report TRANSIENT_FAILURE.
    helper, policy, config = cds("c1")
    entry = eds_entry("c1", [locality(A, ["10.0.0.1:80"]), locality(B, [])])
    policy.update(cds_update(config, xds_config({"c1": entry})))
    connect_all(helper)
    assert helper.state is READY
    assert set(picked_addresses(helper, 10)) == {"10.0.0.1:80"}


def test_same_locality_in_two_priorities_gets_separate_children():
    # grpc-java#9683: children are keyed by (priority, locality), so the
    # endpoints of locality a in priority 1 are not merged into priority 0.
    helper, policy, config = cds("c1")
    entry = eds_entry("c1", [locality(A, ["10.0.0.1:80"])], [locality(A, ["10.0.9.1:80"])])
    policy.update(cds_update(config, xds_config({"c1": entry})))
    assert [s.address for s in helper.subchannels] == ["10.0.0.1:80"]
    helper.subchannel("10.0.0.1:80").set_state(TF)
    connect(helper, "10.0.9.1:80")
    assert set(picked_addresses(helper, 10)) == {"10.0.9.1:80"}


def test_logical_dns_error_before_first_data_fails_with_the_resolution_note():
    helper, policy, config = cds("d1")
    note = "DNS resolution failed for dns.example:443: no such host"
    policy.update(cds_update(config, xds_config({"d1": dns_entry("d1", [], note=note)})))
    assert helper.state is TF
    assert note in helper.last.status.details


def test_a_new_cluster_name_starts_over_and_releases_the_old_subscription():
    manager = FakeDependencyManager()
    helper, policy, config = cds("one", dynamic=True)
    xds = xds_config(
        {
            "one": eds_entry("one", [locality(A, ["10.0.0.1:80"])]),
            "two": eds_entry("two", [locality(B, ["10.0.0.2:80"])]),
        }
    )
    policy.update(cds_update(config, xds, manager))
    _, other = registry.select([{"cds_experimental": {"cluster": "two", "isDynamic": True}}])
    policy.update(cds_update(other, xds, manager))
    assert manager.subscribed == ["one", "two"] and manager.released == ["one"]
    assert [s.address for s in helper.live_subchannels()] == ["10.0.0.2:80"]
    assert policy.priority_names == [child_name("two", 0)]


def test_good_eds_replaced_by_all_unhealthy_fails_saying_so_and_drops_connections():
    helper, policy, config = cds("c1")
    policy.update(cds_update(config, xds_config({"c1": two_priority_eds()})))
    connect_all(helper)
    unhealthy = eds_entry("c1", [locality(A, []), locality(B, [])], excluded=3)
    policy.update(cds_update(config, xds_config({"c1": unhealthy})))
    assert helper.state is TF
    assert "EDS resource c1: all endpoints unhealthy" in helper.last.status.details
    result = helper.pick()
    assert isinstance(result, PickFail)
    assert "all endpoints unhealthy" in result.status.details


def test_calls_are_counted_per_locality_through_the_whole_tree():
    from pyxds.lb.call_counters import cluster_counters

    helper, policy, config = cds("counted")
    entry = eds_entry(
        eds_cluster("counted", eds_service_name="counted-svc"),
        [locality(A, ["10.0.0.1:80"]), locality(B, ["10.0.0.2:80"])],
    )
    policy.update(cds_update(config, xds_config({"counted": entry})))
    connect_all(helper)
    counters = cluster_counters("counted", "counted-svc")
    before = {s.locality: s.started for s in counters.snapshot().localities}
    picks = collections.Counter(picked_addresses(helper, 40))
    after = {s.locality: s.started for s in counters.snapshot().localities}
    assert after[A] - before.get(A, 0) == picks["10.0.0.1:80"]
    assert after[B] - before.get(B, 0) == picks["10.0.0.2:80"]
    assert counters.in_flight == 0
