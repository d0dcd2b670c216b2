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

from pyxds.lb import ConnectivityState, PickComplete, PickFail, Status
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


# ------------------------------------------------- A56 child naming (A74 cds)

#: grpc-go configbuilder_childname_test.go Test_nameGenerator_generate: per
#: case, the priorities (zones) of each update and the child numbers.  Where
#: grpc-go's generator and C-core's ComputeChildNames disagree, C-core's
#: numbers are the expected ones and grpc-go's are noted.
GO_NAME_TABLE = {
    "init, two new priorities": [([["L0"], ["L1"]], [0, 1])],
    "one new priority": [([["L0"]], [0]), ([["L0"], ["L1"]], [0, 1])],
    "merge two priorities": [
        ([["L0"], ["L1"], ["L2"]], [0, 1, 2]),
        ([["L0", "L1"], ["L2"]], [0, 2]),
    ],
    "swap two priorities": [
        ([["L0"], ["L1"], ["L2"]], [0, 1, 2]),
        ([["L1"], ["L0"], ["L2"]], [1, 0, 2]),
    ],
    "split priority": [([["L0", "L1"], ["L2"]], [0, 1]), ([["L0"], ["L1"], ["L2"]], [0, 2, 1])],
    "priority index preference": [([["L0"], ["L1"]], [0, 1]), ([["L1", "L0"]], [0])],
    "merge partial": [
        ([["L0", "L1"], ["L2", "L3"]], [0, 1]),
        ([["L0", "L1", "L2"], ["L3"]], [0, 1]),
        ([["L0", "L1"], ["L2", "L3"]], [0, 1]),
    ],
    "swap shift": [([["L0", "L1"], ["L2", "L3"]], [0, 1]), ([["L2"], ["L0", "L1"]], [1, 0])],
    "replace priority": [([["L0", "L1"], ["L2", "L3"]], [0, 1]), ([["L0", "L1"], ["L5"]], [0, 2])],
    # grpc-go: [0, 1] then [0, 1].  C-core walks a priority's localities in
    # (region, zone, sub_zone) order: L0 comes first and was in child 1, so
    # the merged priority is child 1 and L3's priority a new child 2.
    "reordered merge": [
        ([["L1", "L2"], ["L0", "L3"]], [0, 1]),
        ([["L0", "L1", "L2"], ["L3"]], [1, 2]),
        ([["L1", "L2"], ["L0", "L3"]], [1, 2]),
    ],
    "three-step shift stability": [
        ([["L0"], ["L1"]], [0, 1]),
        ([["L2"], ["L0"], ["L1"]], [2, 0, 1]),
        ([["L0"], ["L1"]], [0, 1]),
    ],
}


@pytest.mark.parametrize("case", sorted(GO_NAME_TABLE))
def test_priority_child_numbers_replay_the_grpc_go_name_generator_table(case):
    """grpc-go Test_nameGenerator_generate through the cds policy: the
    priority child names of each EDS update (C-core cds.cc
    ComputeChildNames; A56 "child naming")."""
    name = fresh("names")
    _helper, lb, config = cds(name)
    for step, (priorities, numbers) in enumerate(GO_NAME_TABLE[case]):
        entry = eds_entry(
            name,
            *[
                [
                    locality(loc("r", zone), [f"10.{step}.{p}.{i}:80"])
                    for i, zone in enumerate(zones)
                ]
                for p, zones in enumerate(priorities)
            ],
        )
        lb.update(cds_update(config, xds_config({name: entry})))
        assert lb.priority_names == [child_name(name, n) for n in numbers], (case, step)


def child_name(cluster: str, n: int) -> str:
    return f"{{cluster={cluster}, child_number={n}}}"


# ------------------------------------------------------------- A115 option


def _a115_flap(destroy: bool | None, monkeypatch):
    """A115 "Background" sequence through the cds policy, every subchannel
    READY; returns the helper and the addresses of the first update's
    priority 0 (AA, BB), which the second update drops (child 0)."""
    from pyxds.lb import priority

    if destroy is not None:
        monkeypatch.setattr(priority, "DESTROY_REMOVED_CHILDREN", destroy)
    aa, bb, cc, dd, ee = (loc("r", z) for z in ("aa", "bb", "cc", "dd", "ee"))
    name = fresh("a115")
    helper, lb, config = cds(name)

    def update(p0, p1):
        entry = eds_entry(
            name,
            [locality(x, [f"10.0.{ord(x.zone[0])}.{i}:80"]) for i, x in enumerate(p0)],
            [locality(x, [f"10.1.{ord(x.zone[0])}.{i}:80"]) for i, x in enumerate(p1)],
        )
        lb.update(cds_update(config, xds_config({name: entry})))

    update([aa, bb], [cc, dd])
    connect_all(helper)
    dropped = {f"10.0.{ord('a')}.0:80", f"10.0.{ord('b')}.1:80"}
    update([cc], [dd, ee])
    assert lb.priority_names == [child_name(name, 1), child_name(name, 2)]
    return helper, dropped


def test_a115_default_retains_a_dropped_priority_child_15_minutes_as_c_core(monkeypatch):
    """gRFC A115: C-core keeps A56's cache for children dropped from the
    config (its subchannel pool profits), so pyxds does by default: child 0
    (AA, BB) keeps its connections until the 15-minute timer."""
    from pyxds.lb.priority import CHILD_RETENTION

    helper, dropped = _a115_flap(None, monkeypatch)
    live = {s.address for s in helper.live_subchannels()}
    assert dropped <= live
    helper.clock.advance(CHILD_RETENTION - 1)
    assert dropped <= {s.address for s in helper.live_subchannels()}
    helper.clock.advance(1)
    assert not dropped & {s.address for s in helper.live_subchannels()}


def test_a115_option_destroys_a_dropped_priority_child_at_once(monkeypatch):
    """gRFC A115 "Proposal" (grpc-go and grpc-java by default): a child the
    cds policy drops from the priority config (names never come back) is
    destroyed at once, its connections closed."""
    helper, dropped = _a115_flap(True, monkeypatch)
    assert not dropped & {s.address for s in helper.live_subchannels()}


@pytest.mark.parametrize(
    ("value", "destroy"),
    [
        (None, False),
        ("true", False),
        ("TRUE", False),
        ("false", True),
        (" False ", True),
        ("no", False),
    ],
)
def test_a115_environment_variable_turns_the_cache_off_only_when_false(value, destroy):
    """gRFC A115 "Temporary environment variable protection":
    GRPC_EXPERIMENTAL_ENABLE_PRIORITY_LB_CHILD_POLICY_CACHE.  pyxds keeps
    C-core's default (cache on, C-core reads no such variable); ``false``
    turns it off as in grpc-go/grpc-java, whose default is off and
    ``true`` turns it back on.  Read once at import: a fresh interpreter."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("GRPC_EXPERIMENTAL_ENABLE_PRIORITY_LB_CHILD_POLICY_CACHE", None)
    if value is not None:
        env["GRPC_EXPERIMENTAL_ENABLE_PRIORITY_LB_CHILD_POLICY_CACHE"] = value
    code = "from pyxds.lb import priority; print(priority.DESTROY_REMOVED_CHILDREN)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == str(destroy), out.stderr


# ------------------------------------------------------------ A37 LOGICAL_DNS


def test_a_dns_answer_without_addresses_is_a_failure():
    """C-core's DNS resolvers answer a name without addresses with an error
    (c-ares "not found"; its dependency manager cannot take an empty list:
    ``PopulateDnsUpdate`` reads the first address): pyxds's resolver turns
    an empty getaddrinfo answer into UNAVAILABLE, which the dependency
    manager treats as any failed lookup (a note before data, the last
    addresses after)."""
    import threading

    from pyxds.resolver.dns import ThreadedDnsResolver

    resolver = ThreadedDnsResolver(getaddrinfo=lambda *a, **k: [], linger=0.05)
    got: list = []
    done = threading.Event()
    resolver.resolve("empty.example", 443, lambda r: (got.append(r), done.set()))
    assert done.wait(10)
    [result] = got
    assert isinstance(result, Status) and result.code is grpc.StatusCode.UNAVAILABLE
    assert result.details == "DNS resolution for empty.example:443 returned no addresses"
    resolver.shutdown()


# --------------------------------------- C-core xds_cluster_end2end_test.cc


def drive(helper: FakeHelper, dead: set[str] = frozenset()) -> None:
    """Every live subchannel the tree asked for connects (READY) or, at a
    ``dead`` address, fails (TRANSIENT_FAILURE), until nothing new is asked
    for (a failover creates the next priority's subchannels)."""
    from test_cds_support import CONNECTING, READY, TF

    for _ in range(10):
        todo = [
            s
            for s in helper.live_subchannels()
            if s.state is not (TF if s.address in dead else READY)
        ]
        if not todo:
            return
        for subchannel in todo:
            if subchannel.state is not CONNECTING:
                subchannel.set_state(CONNECTING)
            subchannel.set_state(TF if subchannel.address in dead else READY)


def _priorities(name: str, *priorities: dict[str, list[str]]):
    """An EDS entry: each priority a {zone: addresses} mapping."""
    return eds_entry(
        name,
        *[
            [locality(loc("r", zone), addresses) for zone, addresses in p.items()]
            for p in priorities
        ],
    )


DEAD = "10.9.9.9:80"


def test_priority_child_name_churn_never_reuses_a_deactivated_childs_name():
    """C-core FailoverTest.PriorityChildNameChurn: P0 unreachable; P1/P2
    moves (l2 from P2 to P1, a new l3; then a new l4 in P1): child numbers
    0,1,2 -> 0,2,3 -> 0,4,3 (1 is never reused), and the third update's
    traffic goes to l4's backend, none to P2's l3 during the change."""
    name = fresh("churn")
    helper, lb, config = cds(name)

    def update(*priorities):
        lb.update(cds_update(config, xds_config({name: _priorities(name, *priorities)})))
        drive(helper, {DEAD})

    update({"l0": [DEAD]}, {"l1": ["10.0.0.1:80"]}, {"l2": ["10.0.0.2:80"]})
    assert set(picks(helper, 10)) == {"10.0.0.1:80"}
    update({"l0": [DEAD]}, {"l2": ["10.0.0.2:80"]}, {"l3": ["10.0.0.3:80"]})
    assert lb.priority_names == [child_name(name, n) for n in (0, 2, 3)]
    assert set(picks(helper, 10)) == {"10.0.0.2:80"}
    update({"l0": [DEAD]}, {"l4": ["10.0.0.4:80"]}, {"l3": ["10.0.0.3:80"]})
    assert lb.priority_names == [child_name(name, n) for n in (0, 4, 3)]
    assert set(picks(helper, 10)) == {"10.0.0.4:80"}


def test_moving_every_locality_of_the_current_priority_up_keeps_serving():
    """C-core FailoverTest.MoveAllLocalitiesInCurrentPriorityToHigherPriority:
    P0 [l0: unreachable], P1 [l1: b0, b1] serves on P1; then P0 [l0, l1:
    b0, b1, b2] (P1 gone): P0 keeps child 0 (l0 sorts first), l1's
    endpoints serve from it, b2 included, and no pick fails."""
    name = fresh("move-up")
    helper, lb, config = cds(name)
    b = [f"10.0.1.{i}:80" for i in range(3)]
    lb.update(
        cds_update(config, xds_config({name: _priorities(name, {"l0": [DEAD]}, {"l1": b[:2]})}))
    )
    drive(helper, {DEAD})
    assert set(picks(helper, 10)) == set(b[:2])
    moved = _priorities(name, {"l0": [DEAD], "l1": b})
    lb.update(cds_update(config, xds_config({name: moved})))
    assert lb.priority_names == [child_name(name, 0)]
    for _ in range(5):  # while b2 connects: old endpoints or queued, never failed
        result = helper.pick()
        assert not isinstance(result, PickFail), result
        drive(helper, {DEAD})
    assert set(picks(helper, 30)) == set(b)


def test_reordered_priorities_serve_from_the_new_highest_ready_priority():
    """C-core FailoverTest.UpdatePriority: l3 (P0) serves; the update makes
    l1 P0: calls go to l1's backend only."""
    name = fresh("reorder")
    helper, lb, config = cds(name)
    zones = {f"l{i}": [f"10.0.2.{i}:80"] for i in range(4)}
    order1 = ["l3", "l0", "l1", "l2"]
    lb.update(
        cds_update(config, xds_config({name: _priorities(name, *[{z: zones[z]} for z in order1])}))
    )
    drive(helper)
    assert set(picks(helper, 10)) == {"10.0.2.3:80"}
    order2 = ["l1", "l2", "l0", "l3"]
    lb.update(
        cds_update(config, xds_config({name: _priorities(name, *[{z: zones[z]} for z in order2])}))
    )
    drive(helper)
    assert set(picks(helper, 10)) == {"10.0.2.1:80"}


def test_a_priority_whose_only_locality_has_no_endpoints_is_skipped_at_once():
    """C-core FailoverTest.DoesNotUsePriorityWithNoEndpoints: P0's only
    locality is empty: P1 serves without waiting for the failover timer."""
    name = fresh("empty-p0")
    helper, lb, config = cds(name)
    entry = _priorities(name, {"l3": []}, {"l0": ["10.0.3.0:80"]}, {"l1": ["10.0.3.1:80"]})
    lb.update(cds_update(config, xds_config({name: entry})))
    drive(helper)
    assert set(picks(helper, 10)) == {"10.0.3.0:80"}
    assert helper.clock.now() == 0


def test_a_locality_emptied_then_its_old_endpoint_flapping_then_refilled_serves_again():
    """C-core EdsTest.LocalityBecomesEmptyWithDeactivatedChildStateUpdate
    (grpc#32486): the locality's endpoint is removed (calls fail saying the
    locality is empty), the removed endpoint's connection drops and comes
    back (a report from a deactivated child), then the endpoint is re-added:
    calls succeed again, and the flapping never changed the failure."""
    name = fresh("emptied")
    helper, lb, config = cds(name)
    full = _priorities(name, {"l0": ["10.0.4.0:80"]})
    lb.update(cds_update(config, xds_config({name: full})))
    drive(helper)
    assert set(picks(helper, 3)) == {"10.0.4.0:80"}
    lb.update(cds_update(config, xds_config({name: _priorities(name, {"l0": []})})))
    failed = helper.pick()
    assert isinstance(failed, PickFail)
    text = failed.status.details
    assert "contains no endpoints" in text, text  # hand-made entry: cds's own note
    for subchannel in helper.subchannels:
        if not subchannel.shut_down:
            subchannel.set_state(ConnectivityState.IDLE)
            subchannel.set_state(ConnectivityState.CONNECTING)
            subchannel.set_state(ConnectivityState.TRANSIENT_FAILURE)
            again = helper.pick()
            assert isinstance(again, PickFail) and again.status.details == text
    lb.update(cds_update(config, xds_config({name: full})))
    drive(helper)
    assert set(picks(helper, 3)) == {"10.0.4.0:80"}


def test_a_locality_removed_and_added_back_serves_its_new_endpoints():
    """C-core EdsTest.ConsistentWeightedTargetUpdates: l1 removed (l0 gains
    b0), then l1 back with b2 and a new b3: b3 gets calls."""
    name = fresh("readd")
    helper, lb, config = cds(name)
    b = [f"10.0.5.{i}:80" for i in range(4)]

    def update(**zones):
        lb.update(cds_update(config, xds_config({name: _priorities(name, zones)})))
        drive(helper)

    update(l0=[b[1]], l1=[b[2]])
    assert set(picks(helper, 20)) == {b[1], b[2]}
    update(l0=[b[0], b[1]])
    assert set(picks(helper, 20)) == {b[0], b[1]}
    update(l0=[b[0], b[1]], l1=[b[2], b[3]])
    assert set(picks(helper, 40)) == set(b)


def test_replacing_every_locality_of_the_only_priority_queues_calls_and_fails_none():
    """C-core EdsTest.ReplaceAllLocalitiesInPriority: l0 [b0] -> l1 [b1]:
    a new priority child (l1 was in no child), calls queue until it
    connects (none fails), then go to b1."""
    name = fresh("replace")
    helper, lb, config = cds(name)
    lb.update(cds_update(config, xds_config({name: _priorities(name, {"l0": ["10.0.6.0:80"]})})))
    drive(helper)
    lb.update(cds_update(config, xds_config({name: _priorities(name, {"l1": ["10.0.6.1:80"]})})))
    assert lb.priority_names == [child_name(name, 1)]
    result = helper.pick()
    assert not isinstance(result, PickFail), result
    drive(helper)
    assert set(picks(helper, 5)) == {"10.0.6.1:80"}


# ------------------------------------------------------------------ A113


def _weights(helper: FakeHelper, name: str, entry) -> list[int]:
    """The ``weight`` of each endpoint the cds policy handed down, as its
    subchannel (one per endpoint, in EDS order) was created with it."""
    _helper, lb, config = cds(name, helper)
    lb.update(cds_update(config, xds_config({name: entry})))
    return [s.attributes["weight"] for s in helper.subchannels]


@pytest.mark.parametrize(
    ("env", "weights"),
    [
        # C-core PriorityEndpointIteratorTest.OldWeightsWhenDisabled (and the
        # default): locality weight x endpoint weight
        (None, [1000, 1000, 1000]),
        ("false", [1000, 1000, 1000]),
        # C-core PriorityEndpointIteratorTest.NormalizedWeights: UQ1.31
        ("true", [536870912, 536870912, 1073741824]),
    ],
)
def test_endpoint_weights_are_normalized_only_with_the_a113_switch(env, weights, monkeypatch):
    """gRFC A113 "CDS LB Policy changes": with
    GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING on, an endpoint's weight is its
    locality's normalized weight in the priority times its own normalized
    weight in the locality (UQ1.31); off (grpcio 1.85's default), the raw
    product.  Localities of weight 10: two endpoints of weight 100, and
    one.  (Live: tests/e2e/test_differential_a113_weights.py.)"""
    from pyxds.lb.pick_first import WEIGHTED_SHUFFLING_ENV

    monkeypatch.delenv(WEIGHTED_SHUFFLING_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(WEIGHTED_SHUFFLING_ENV, env)
    name = fresh("a113")
    entry = eds_entry(
        name,
        [
            locality(loc("r", "sz1"), ["10.0.7.1:80", "10.0.7.2:80"], 10, [100, 100]),
            locality(loc("r", "sz2"), ["10.0.7.3:80"], 10, [100]),
        ],
    )
    assert _weights(FakeHelper(), name, entry) == weights


def test_a_normalized_weight_that_rounds_to_zero_is_one(monkeypatch):
    """A113: ``if (weight == 0) weight = 1``."""
    from pyxds.lb.pick_first import WEIGHTED_SHUFFLING_ENV

    monkeypatch.setenv(WEIGHTED_SHUFFLING_ENV, "true")
    name = fresh("a113-zero")
    entry = eds_entry(
        name,
        [
            locality(loc("r", "big"), ["10.0.8.1:80"], 4_000_000_000),
            locality(loc("r", "tiny"), ["10.0.8.2:80", "10.0.8.3:80"], 1, [1, 4_000_000_000]),
        ],
    )
    assert _weights(FakeHelper(), name, entry)[1] == 1


@pytest.mark.parametrize(("env", "weighted"), [(None, False), ("true", True), ("0", False)])
def test_pick_first_shuffle_is_weighted_only_with_the_a113_switch(env, weighted, monkeypatch):
    """gRFC A113 "Changes within Pick First", behind
    GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING as in grpcio 1.85 (default off:
    a uniform shuffle whatever the weights; live, C-core's first choice of
    weights 1 and 9 was 24:16 off and 6:34 on).  Weights 1 and 9: the heavy
    endpoint comes first ~90% of the time on, ~50% off."""
    import random

    from pyxds.lb import Endpoint
    from pyxds.lb.pick_first import WEIGHTED_SHUFFLING_ENV, order_addresses

    monkeypatch.delenv(WEIGHTED_SHUFFLING_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(WEIGHTED_SHUFFLING_ENV, env)
    endpoints = [Endpoint(("a:1",), {"weight": 1}), Endpoint(("b:1",), {"weight": 9})]
    rng = random.Random(3)
    first = collections.Counter(order_addresses(endpoints, True, rng)[0][0] for _ in range(2000))
    share = first["b:1"] / 2000
    assert (0.87 < share < 0.93) if weighted else (0.45 < share < 0.55), share


#: C-core CdsChildNameStateTest (the cds policy's unit test, 2026): the
#: sub_zones of each update's priorities -> (child numbers, next number).
C_CORE_NAME_STATE = {
    "InitialUpdate": [([["aa", "bb"], ["cc", "dd"]], [0, 1], 2)],
    "UpdateNewChildNumber": [
        ([["aa", "bb"], ["cc", "dd"]], [0, 1], 2),
        ([["aa", "bb"], ["ee"]], [0, 2], 3),
    ],
    "UpdateReusesChildNumbers": [
        ([["aa", "bb"], ["cc", "dd"]], [0, 1], 2),
        ([["cc"], ["aa", "bb"]], [1, 0], 2),
    ],
    "LocalityMovingBetweenPriorities": [
        ([["aa", "bb"], ["cc", "dd"]], [0, 1], 2),
        ([["aa", "bb", "cc"], ["dd"]], [0, 1], 2),
        ([["aa", "bb"], ["cc", "dd"]], [0, 1], 2),
    ],
    "LocalityMovingBetweenPrioritiesSuboptimal": [
        ([["bb", "cc"], ["aa", "dd"]], [0, 1], 2),
        ([["aa", "bb", "cc"], ["dd"]], [1, 2], 3),
        ([["bb", "cc"], ["aa", "dd"]], [1, 2], 3),
    ],
}


@pytest.mark.parametrize("case", sorted(C_CORE_NAME_STATE))
def test_child_name_state_replays_c_core_cds_test(case):
    """C-core CdsChildNameStateTest: the numbers and the next
    available number after each update (A56 "child naming", A115)."""
    from pyxds.lb.priority_names import assign_child_numbers

    state = None
    for step, (priorities, numbers, next_number) in enumerate(C_CORE_NAME_STATE[case]):
        names = [[loc("foo", "bar", z) for z in zones] for zones in priorities]
        state = assign_child_numbers(state, names)
        assert (list(state.child_numbers), state.next_number) == (numbers, next_number), step


def test_a_moved_endpoint_is_found_when_the_update_shifts_every_position():
    """The relocation looks only at endpoints that are new objects: by
    position, then (when many moved, here 100 after an endpoint inserted at
    the front) by identity.  The moved endpoint still counts for its new
    locality, the shifted ones stay in theirs."""
    name = fresh("shifted")
    cluster = eds_cluster(name, lb_policy_config=RING_HASH_POLICY)
    helper, lb, config = cds(name)
    a = [f"10.1.0.{i}:80" for i in range(100)]
    first = eds_entry(cluster, [locality(A, a), locality(B, ["10.1.1.0:80"])])
    lb.update(cds_update(config, xds_config({name: first})))
    impl = lb.child.child  # outlier_detection -> xds_cluster_impl
    settle(helper)  # ring_hash connects what picks land on
    tracked = {s.address for s in impl._subchannels}
    moved = max((x for x in a if x in tracked), key=a.index)
    rest = [x for x in a if x != moved]
    shifted = eds_entry(
        cluster, [locality(A, ["10.1.0.200:80", *rest]), locality(B, ["10.1.1.0:80", moved])]
    )
    lb.update(cds_update(config, xds_config({name: shifted})))
    localities = {s.address: s.locality for s in impl._subchannels}
    assert localities[moved] == B
    assert all(localities[x] == A for x in rest if x in localities)
