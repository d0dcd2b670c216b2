"""Conformance: a leaf cluster's endpoints down to the priority tree (what
grpc-go calls cluster_resolver, C-core's cds policy since gRFC A74; pyxds
``lb/cds.py`` and ``lb/priority_names.py``), beyond ``test_cds.py`` and
``test_priority_names.py``.

Sources: gRFC A27 ("EDS", "Load Reporting"), A37 (LOGICAL_DNS), A56 ("child
naming"), A61 (``additional_addresses``), A115; C-core ``cds.cc``
(``ComputeChildNames``, ``PriorityEndpointIterator``),
``xds_cluster_impl.cc``, ``test/cpp/end2end/xds/xds_cluster_end2end_test.cc``,
``xds_cluster_type_end2end_test.cc``; grpc-go
``internal/xds/balancer/cdsbalancer/configbuilder_childname_test.go`` and
``configbuilder_test.go``; grpc-java ``ClusterResolverLoadBalancerTest``.
Sans-IO: XdsConfigs made by hand, the real policy tree on a FakeHelper."""

from __future__ import annotations

import collections
import itertools

import grpc
import pytest
from test_cds_support import (
    PICK_FIRST_POLICY,
    build,
    cds_update,
    connect_all,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    picked_addresses,
    xds_config,
)

from pyxds.lb import PickComplete, Status
from pyxds.lb.call_counters import cluster_counters
from pyxds.metrics import locality_label
from pyxds.testing import FakeHelper

OK = Status(grpc.StatusCode.OK)
RING_HASH_POLICY = '[{"ring_hash_experimental": {"minRingSize": 64, "maxRingSize": 64}}]'
POLICIES = {
    "round_robin": None,  # the default: xds_wrr_locality over round_robin
    "pick_first": PICK_FIRST_POLICY,
    "ring_hash": RING_HASH_POLICY,
}
_ids = itertools.count()
A, B = loc("a"), loc("b")


def cds(cluster: str, helper: FakeHelper | None = None):
    return build([{"cds_experimental": {"cluster": cluster}}], helper)


def fresh(prefix: str) -> str:
    return f"conf-resolver-{prefix}-{next(_ids)}"


def started(name: str) -> dict:
    return {s.locality: s.started for s in cluster_counters(name).snapshot().localities}


def settle(helper: FakeHelper) -> None:
    """Connect whatever the policy asks for (ring_hash asks on a pick)."""
    for _ in range(30):
        helper.pick(cluster="x")
        helper.clock.advance(0)  # ring_hash's connection request runs
        connect_all(helper)


def picks(helper: FakeHelper, n: int) -> collections.Counter:
    # "cluster" set: an xDS call, so ring_hash draws a random hash for it
    return collections.Counter(picked_addresses(helper, n, cluster="x"))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_calls_to_an_endpoint_moved_to_another_locality_count_for_the_new_locality(policy):
    """C-core xds_cluster_impl.cc: a subchannel's stats are those of the
    locality its endpoint had when the child created it, and round_robin
    (a new locality child), pick_first (a new subchannel list on every
    update) and ring_hash (the endpoint's pick_first child gets the new
    endpoint) all create it again after an EDS update moves the endpoint:
    A27's per-locality load follows the endpoint (grpcio 1.85 live:
    tests/e2e/test_differential_locality_move.py).  Before the fix, pyxds's
    pick_first and ring_hash kept the old wrapper and counted under a."""
    name = fresh(policy)
    kwargs = {"lb_policy_config": POLICIES[policy]} if POLICIES[policy] else {}
    cluster = eds_cluster(name, **kwargs)
    helper, lb, config = cds(name)
    first = eds_entry(cluster, [locality(A, ["10.0.0.1:80"]), locality(B, ["10.0.0.2:80"])])
    lb.update(cds_update(config, xds_config({name: first})))
    settle(helper)
    picks(helper, 8)
    moved = eds_entry(cluster, [locality(B, ["10.0.0.1:80", "10.0.0.2:80"])])
    lb.update(cds_update(config, xds_config({name: moved})))
    settle(helper)
    before = started(name)
    sent = picks(helper, 20)
    after = started(name)
    assert after.get(A, 0) - before.get(A, 0) == 0, (after, before, sent)
    assert after[B] - before.get(B, 0) == 20


def _pick_first_moving(name: str):
    """A pick_first cluster, a (10.0.0.1) and b (10.0.0.2), READY on
    10.0.0.1; and the update moving 10.0.0.1 to b (same address order, same
    priority child: b keeps its name)."""
    cluster = eds_cluster(name, lb_policy_config=PICK_FIRST_POLICY)
    helper, lb, config = cds(name)
    first = eds_entry(cluster, [locality(A, ["10.0.0.1:80"]), locality(B, ["10.0.0.2:80"])])
    lb.update(cds_update(config, xds_config({name: first})))
    connect_all(helper)
    moved = eds_entry(cluster, [locality(B, ["10.0.0.1:80", "10.0.0.2:80"])])
    return helper, lambda: lb.update(cds_update(config, xds_config({name: moved})))


def test_a_call_in_flight_when_its_endpoint_moves_ends_in_the_old_locality():
    """C-core: the call holds the stats of the wrapper it was picked on (the
    old wrapper); the next call is counted in the new locality."""
    name = fresh("in-flight")
    helper, move = _pick_first_moving(name)
    call = helper.pick()
    assert isinstance(call, PickComplete)
    counters = cluster_counters(name)
    old, new = counters.locality(A), counters.locality(B)
    assert old.in_flight == 1
    move()
    second = helper.pick()
    assert isinstance(second, PickComplete)
    assert second.subchannel.address == call.subchannel.address == "10.0.0.1:80"
    assert (old.in_flight, new.in_flight) == (1, 1)
    assert call.on_call_done is not None and second.on_call_done is not None
    call.on_call_done(OK)
    second.on_call_done(OK)
    assert (old.in_flight, old.succeeded, new.in_flight, new.succeeded) == (0, 1, 0, 1)


def test_a_moved_endpoints_calls_carry_the_new_locality_label():
    """A78 "Per-Call Metrics": ``grpc.lb.locality`` is the locality of the
    wrapper the call was picked on; after the move, the new one (C-core's new
    wrapper carries it)."""
    helper, move = _pick_first_moving(fresh("label"))
    before = helper.pick()
    assert isinstance(before, PickComplete) and before.attempt_labels is not None
    assert before.attempt_labels["grpc.lb.locality"] == locality_label(A)
    move()
    after = helper.pick()
    assert isinstance(after, PickComplete) and after.attempt_labels is not None
    assert after.subchannel.address == "10.0.0.1:80"
    assert after.attempt_labels["grpc.lb.locality"] == locality_label(B)
