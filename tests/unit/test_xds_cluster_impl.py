"""xds_cluster_impl_experimental: EDS drops, circuit breaking and call
counters (A37, A74 latest), with the process-wide counters of A37 "Use Global
Circuit Breaking Atomic" (TRAPS.md, grpc-go#4560)."""

from __future__ import annotations

import itertools

import grpc
import pytest
from test_cds_support import (
    READY,
    TF,
    aggregate_entry,
    attributes,
    build,
    connect_all,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    xds_config,
)

from pyxds.lb import (
    Endpoint,
    LBConfigError,
    PickArgs,
    PickComplete,
    PickDrop,
    PickQueue,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.call_counters import cluster_counters
from pyxds.lb.hierarchy import PATH_KEY
from pyxds.resolver.xds_config import cluster_entry
from pyxds.testing import FakeHelper

OK = Status(grpc.StatusCode.OK)
FAILED = Status(grpc.StatusCode.UNAVAILABLE, "boom")
_names = itertools.count()


def unique(prefix: str) -> str:
    """Counters are process-wide: give every test its own cluster name."""
    return f"{prefix}-{next(_names)}"


def impl_json(cluster: str, child: str = "round_robin") -> list:
    return [
        {"xds_cluster_impl_experimental": {"clusterName": cluster, "childPolicy": [{child: {}}]}}
    ]


def endpoints_of(*localities):
    out = []
    for lo in localities:
        for address in lo.endpoints:
            out.append(
                Endpoint(address.addresses, {"locality": lo.name, "locality_weight": lo.weight})
            )
    return out


def start(cluster_name, *, drops=(), max_requests=1024, eds_service_name=None, helper=None, seed=0):
    helper = helper or FakeHelper(seed=seed)
    cluster = eds_cluster(
        cluster_name, max_requests=max_requests, eds_service_name=eds_service_name
    )
    lo_a = locality(loc("a"), ["10.0.0.1:80"])
    lo_b = locality(loc("b"), ["10.0.0.2:80"])
    xds = xds_config({cluster_name: eds_entry(cluster, [lo_a, lo_b], drops=drops)})
    _, policy, config = build(impl_json(cluster_name), helper)
    status = policy.update(ResolverUpdate(endpoints_of(lo_a, lo_b), config, attributes(xds)))
    assert status is None
    connect_all(helper)
    return helper, policy, config, xds


def test_drop_rates_follow_parts_per_million_over_seeded_picks():
    name = unique("drops")
    helper, _, _, _ = start(name, drops=[("lb", 200_000), ("throttle", 250_000)])
    n = 20_000
    results = [helper.pick() for _ in range(n)]
    lb = sum(1 for r in results if isinstance(r, PickDrop) and r.status.details.endswith(": lb"))
    throttle = sum(
        1 for r in results if isinstance(r, PickDrop) and r.status.details.endswith(": throttle")
    )
    # lb drops 20%; throttle is drawn only for the 80% left: 0.8 * 25% = 20%.
    assert abs(lb / n - 0.20) < 0.015
    assert abs(throttle / n - 0.20) < 0.015
    load = cluster_counters(name).snapshot()
    assert load.dropped == {"lb": lb, "throttle": throttle}


def test_drop_status_names_the_category_in_c_core_words():
    helper, _, _, _ = start(unique("dropall"), drops=[("lb", 1_000_000)])
    result = helper.pick()
    assert isinstance(result, PickDrop)
    assert result.status == Status(grpc.StatusCode.UNAVAILABLE, "EDS-configured drop: lb")


def test_drop_everything_reports_ready_before_the_child_reports():
    name = unique("dropall")
    cluster = eds_cluster(name)
    xds = xds_config({name: eds_entry(cluster, [], drops=[("all", 1_000_000)])})
    helper, policy, config = build(impl_json(name, "pick_first"))
    policy.update(ResolverUpdate([], config, attributes(xds)))
    assert helper.state is READY
    assert isinstance(helper.pick(), PickDrop)


def test_circuit_breaker_drops_at_max_requests_and_recovers_when_calls_end():
    helper, _, _, _ = start(unique("cb"), max_requests=2)
    first, second = helper.pick(), helper.pick()
    assert isinstance(first, PickComplete) and isinstance(second, PickComplete)
    third = helper.pick()
    assert isinstance(third, PickDrop)
    assert third.status == Status(grpc.StatusCode.UNAVAILABLE, "circuit breaker drop")
    first.on_call_done(OK)
    assert isinstance(helper.pick(), PickComplete)


def test_circuit_breaker_is_shared_by_policies_of_the_same_cluster_and_service_name():
    name = unique("shared")
    helper1, _, _, _ = start(name, max_requests=3, eds_service_name="svc")
    helper2, _, _, _ = start(name, max_requests=3, eds_service_name="svc")
    other, _, _, _ = start(name, max_requests=3, eds_service_name="other-svc")
    calls = [helper1.pick(), helper2.pick(), helper1.pick()]
    assert all(isinstance(c, PickComplete) for c in calls)
    # Three in flight across both channels' policies: both now drop ...
    assert isinstance(helper1.pick(), PickDrop)
    assert isinstance(helper2.pick(), PickDrop)
    # ... while the same cluster with another EDS service name has its own count.
    assert isinstance(other.pick(), PickComplete)
    calls[1].on_call_done(OK)
    assert isinstance(helper1.pick(), PickComplete)
    assert cluster_counters(name, "svc").in_flight == 3


def test_locality_counters_record_started_succeeded_failed_and_in_flight():
    name = unique("loads")
    helper, _, _, _ = start(name)
    picks = [helper.pick() for _ in range(6)]
    # the channel gets its own subchannels back, never the policy's wrapper
    assert all(any(p.subchannel is s for s in helper.subchannels) for p in picks)
    by_address: dict[str, list] = {}
    for p in picks:
        by_address.setdefault(p.subchannel.address, []).append(p)
    a_calls = by_address["10.0.0.1:80"]
    a_calls[0].on_call_done(OK)
    a_calls[1].on_call_done(FAILED)
    load = cluster_counters(name).snapshot(reset=True)
    stats = {s.locality: s for s in load.localities}
    a = stats[loc("a")]
    assert (a.started, a.succeeded, a.failed, a.in_flight) == (len(a_calls), 1, 1, len(a_calls) - 2)
    assert stats[loc("b")].started == len(by_address["10.0.0.2:80"])
    assert load.in_flight == 4
    # reset zeroes the interval counts but not what is still in flight
    again = {s.locality: s for s in cluster_counters(name).snapshot().localities}
    assert again[loc("a")].started == 0 and again[loc("a")].in_flight == len(a_calls) - 2


def test_child_on_call_done_still_runs():
    name = unique("chain")
    helper, policy, _config, _xds = start(name)
    seen = []

    class Child:
        def pick(self, args):
            return PickComplete(helper.subchannels[0], seen.append)

    # Feed a child picker whose PickComplete has its own callback.
    policy._child_reported(READY, OK, Child())
    result = helper.pick()
    result.on_call_done(FAILED)
    assert seen == [FAILED]
    assert cluster_counters(name).in_flight == 0


def test_queue_and_fail_results_are_not_counted():
    name = unique("queue")
    cluster = eds_cluster(name, max_requests=1)
    lo = locality(loc("a"), ["10.0.0.9:80"])
    xds = xds_config({name: eds_entry(cluster, [lo])})
    helper, policy, config = build(impl_json(name))
    policy.update(ResolverUpdate(endpoints_of(lo), config, attributes(xds)))
    # round_robin not connected yet: picks queue, none counts as in flight
    for _ in range(3):
        assert isinstance(helper.pick(), PickQueue)
    assert cluster_counters(name).in_flight == 0


def test_drop_config_update_publishes_a_new_picker_without_a_child_report():
    name = unique("update")
    helper, policy, config, _xds = start(name)
    lo_a = locality(loc("a"), ["10.0.0.1:80"])
    lo_b = locality(loc("b"), ["10.0.0.2:80"])
    newer = xds_config({name: eds_entry(eds_cluster(name), [lo_a, lo_b], drops=[("x", 1_000_000)])})
    before = len(helper.states)
    policy.update(ResolverUpdate(endpoints_of(lo_a, lo_b), config, attributes(newer)))
    assert len(helper.states) == before + 1
    assert isinstance(helper.pick(), PickDrop)


def test_missing_xds_config_entry_fails_with_the_cluster_name():
    helper, policy, config = build(impl_json("nowhere"))
    status = policy.update(ResolverUpdate([], config, attributes(xds_config({}))))
    assert status is not None and "nowhere" in status.details
    assert helper.state is TF
    assert "xDS config has no entry for cluster nowhere" in helper.last.status.details


def test_the_cluster_entry_is_read_as_xds_cluster_impl_and_xds_override_host_need_it():
    """Both fail INTERNAL without the XdsConfig (naming themselves) or
    without the cluster's entry (xds_cluster_impl: a leaf's)."""
    leaf = eds_entry(eds_cluster("leaf"), [locality(loc("a"), ["10.0.0.1:80"])])
    failed = Status(grpc.StatusCode.UNAVAILABLE, "CDS resource gone does not exist")
    config = attributes(
        xds_config({"leaf": leaf, "agg": aggregate_entry("agg", ["leaf"]), "gone": failed})
    )
    assert cluster_entry(config, "leaf", "p", leaf=True) is leaf
    assert cluster_entry(config, "agg", "p").cluster.name == "agg"
    internal = grpc.StatusCode.INTERNAL
    assert cluster_entry({}, "leaf", "xds_override_host") == Status(
        internal, "xDS config not passed to xds_override_host LB policy"
    )
    for name, leaf_only in (("agg", True), ("gone", False), ("nowhere", False)):
        assert cluster_entry(config, name, "p", leaf=leaf_only) == Status(
            internal, f"xDS config has no entry for cluster {name}"
        )


def test_config_errors_name_the_field():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"xds_cluster_impl_experimental": {"childPolicy": [{"round_robin": {}}]}}])
    assert str(err.value) == "xds_cluster_impl_experimental.clusterName: required field missing"
    with pytest.raises(LBConfigError) as err:
        registry.select([{"xds_cluster_impl_experimental": {"clusterName": "c"}}])
    assert "xds_cluster_impl_experimental.childPolicy" in str(err.value)


def test_deprecated_fields_are_ignored_and_configs_compare_by_value():
    with_old = {
        "clusterName": "c",
        "edsServiceName": "svc",
        "maxConcurrentRequests": 5,
        "childPolicy": [{"round_robin": {}}],
    }
    _, a = registry.select([{"xds_cluster_impl_experimental": with_old}])
    _, b = registry.select(impl_json("c"))
    assert a == b


def test_picker_passes_pick_args_to_the_child():
    name = unique("args")
    helper, _, _, _ = start(name)
    result = helper.last.picker.pick(PickArgs("/svc/M", (("k", "v"),), {"cluster": "x"}))
    assert isinstance(result, PickComplete)


def test_endpoints_keep_their_paths_for_the_child():
    # xds_cluster_impl does not touch endpoints: a child keyed by path sees them.
    name = unique("paths")
    lo = locality(loc("a"), ["10.0.0.3:80"])
    endpoint = Endpoint(("10.0.0.3:80",), {PATH_KEY: ("p0",), "locality": lo.name})
    xds = xds_config({name: eds_entry(eds_cluster(name), [lo])})
    policy_json = [
        {
            "xds_cluster_impl_experimental": {
                "clusterName": name,
                "childPolicy": [
                    {
                        "priority_experimental": {
                            "children": {"p0": {"config": [{"round_robin": {}}]}},
                            "priorities": ["p0"],
                        }
                    }
                ],
            }
        }
    ]
    helper, policy, config = build(policy_json)
    policy.update(ResolverUpdate([endpoint], config, attributes(xds)))
    assert [s.address for s in helper.subchannels] == ["10.0.0.3:80"]
