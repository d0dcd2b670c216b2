"""Conformance: xds_cluster_impl drops and circuit breaking (gRFC A37, A74
latest, A27 drops).  Scenarios from C-core xds_cluster_end2end_test.cc
(DropTest, CdsTest circuit breaking), grpc-go clusterimpl balancer_test.go
(TestDropByCategory, TestDropCircuitBreaking), grpc-java
ClusterImplLoadBalancerTest (maxConcurrentRequests_appliedWithDefaultValue,
dropRpcsWithRespectToLbConfigDropCategories)."""

from __future__ import annotations

import itertools

import grpc
from test_cds_support import attributes, build, connect_all, eds_cluster, eds_entry, loc, locality
from test_cds_support import xds_config as make_xds_config

from pyxds.lb import Endpoint, PickComplete, PickDrop, ResolverUpdate, Status
from pyxds.lb.call_counters import cluster_counters
from pyxds.lb.xds_cluster_impl import DEFAULT_MAX_REQUESTS
from pyxds.testing import FakeHelper

OK = Status(grpc.StatusCode.OK)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_ids = itertools.count()


def unique(prefix):
    return f"conf-{prefix}-{next(_ids)}"


def impl_json(cluster):
    return [
        {
            "xds_cluster_impl_experimental": {
                "clusterName": cluster,
                "childPolicy": [{"round_robin": {}}],
            }
        }
    ]


LOCALITY = locality(loc("a"), ["10.0.0.1:80", "10.0.0.2:80"])


def endpoints():
    return [
        Endpoint(a.addresses, {"locality": LOCALITY.name, "locality_weight": 1})
        for a in LOCALITY.endpoints
    ]


def xds_for(name, drops=(), **cluster_kwargs):
    cluster = eds_cluster(name, **cluster_kwargs)
    return make_xds_config({name: eds_entry(cluster, [LOCALITY], drops=drops)})


def start(name, drops=(), seed=0, **cluster_kwargs):
    helper = FakeHelper(seed=seed)
    _, policy, config = build(impl_json(name), helper)
    policy.update(
        ResolverUpdate(endpoints(), config, attributes(xds_for(name, drops, **cluster_kwargs)))
    )
    connect_all(helper)
    return helper, policy, config


def test_default_max_requests_is_1024():
    """grpc-java maxConcurrentRequests_appliedWithDefaultValue; A32 default."""
    name = unique("default")
    helper, _, _ = start(name)
    calls = [helper.pick() for _ in range(DEFAULT_MAX_REQUESTS)]
    assert DEFAULT_MAX_REQUESTS == 1024
    assert all(isinstance(c, PickComplete) for c in calls)
    over = helper.pick()
    assert isinstance(over, PickDrop)
    assert over.status == Status(UNAVAILABLE, "circuit breaker drop")
    for call in calls:
        call.on_call_done(OK)


def test_eds_drop_is_checked_before_the_circuit_breaker():
    """C-core picker order: EDS drops first, then "circuit breaker drop"."""
    name = unique("order")
    helper, _, _ = start(name, drops=[("lb", 1_000_000)], max_requests=0)
    result = helper.pick()
    assert isinstance(result, PickDrop)
    assert result.status == Status(UNAVAILABLE, "EDS-configured drop: lb")


def test_first_category_that_draws_a_drop_names_the_drop():
    """C-core DropTest: categories are drawn in EDS order; 100% first category wins."""
    name = unique("first")
    helper, _, _ = start(name, drops=[("throttle", 1_000_000), ("lb", 1_000_000)])
    for _ in range(20):
        assert helper.pick().status.details == "EDS-configured drop: throttle"
    assert cluster_counters(name).snapshot().dropped == {"throttle": 20}


def test_dropped_picks_are_not_in_flight_calls():
    name = unique("notcounted")
    helper, _, _ = start(name, drops=[("lb", 1_000_000)])
    for _ in range(5):
        helper.pick()
    assert cluster_counters(name).in_flight == 0


def test_circuit_breaker_drop_is_an_uncategorized_drop():
    """A27/LRS: circuit breaker drops are reported as uncategorized drops."""
    name = unique("uncat")
    helper, _, _ = start(name, max_requests=1)
    call = helper.pick()
    assert isinstance(call, PickComplete)
    assert isinstance(helper.pick(), PickDrop)
    load = cluster_counters(name).snapshot()
    assert load.uncategorized_drops == 1 and load.dropped == {}
    call.on_call_done(OK)


def test_drops_fail_even_wait_for_ready_rpcs():
    """A drop is a PickDrop (fails wait_for_ready RPCs too), not a PickFail."""
    name = unique("wfr")
    helper, _, _ = start(name, drops=[("lb", 1_000_000)])
    assert type(helper.pick()) is PickDrop


def test_lowering_max_requests_applies_to_the_next_pick():
    """grpc-go TestDropCircuitBreaking: a new threshold takes effect at once."""
    name = unique("lower")
    helper, policy, config = start(name, max_requests=10)
    calls = [helper.pick() for _ in range(3)]
    assert all(isinstance(c, PickComplete) for c in calls)
    policy.update(ResolverUpdate(endpoints(), config, attributes(xds_for(name, max_requests=3))))
    assert isinstance(helper.pick(), PickDrop)
    calls[0].on_call_done(OK)
    assert isinstance(helper.pick(), PickComplete)


def test_removing_the_drop_config_stops_dropping():
    name = unique("undrop")
    helper, policy, config = start(name, drops=[("lb", 1_000_000)])
    assert isinstance(helper.pick(), PickDrop)
    policy.update(ResolverUpdate(endpoints(), config, attributes(xds_for(name))))
    result = helper.pick()
    assert isinstance(result, PickComplete)
    result.on_call_done(OK)


def test_drop_rate_statistics_over_many_picks():
    """C-core DropTest.Vanilla: 10% lb and 20% throttle of the rest."""
    name = unique("rates")
    helper, _, _ = start(name, drops=[("lb", 100_000), ("throttle", 200_000)], seed=4)
    n = 20_000
    dropped = 0
    for _ in range(n):
        result = helper.pick()
        if isinstance(result, PickDrop):
            dropped += 1
        else:
            result.on_call_done(OK)
    expected = 1 - (1 - 0.1) * (1 - 0.2)  # 28%
    assert abs(dropped / n - expected) < 0.015


def test_completed_call_releases_its_in_flight_slot_whatever_its_status():
    name = unique("release")
    helper, _, _ = start(name, max_requests=1)
    call = helper.pick()
    call.on_call_done(Status(grpc.StatusCode.INTERNAL, "backend failed"))
    assert cluster_counters(name).in_flight == 0
    again = helper.pick()
    assert isinstance(again, PickComplete)
    again.on_call_done(OK)
