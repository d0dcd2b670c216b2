"""Outlier detection in cds's A75 tree: one outlier_detection per cluster,
above xds_cluster_impl, seeing every endpoint of every priority and every
pick, a session's included.

Sources: gRFC A75 "Aggregate Cluster Changes" ("move the outlier_detection,
xds_cluster_impl, and xds_override_host LB policies up above the priority
policy ... outlier detection and stateful session affinity working across
priorities within a cluster"); C-core's ``src/core/load_balancing/xds/cds.cc``
``CreateChildPolicyConfigForLeafCluster`` (outlier_detection ->
xds_cluster_impl -> xds_override_host -> priority); A50 "Outlier Detection
Behavior" (max_ejection_percent over the policy's endpoints, minimum_hosts
over the endpoints with enough calls); A55/A75's picker pseudo-code (a
session picks on the subchannel's connectivity state, which C-core's
outlier detection does not change: it ejects through the health watch, A61).

Sans-IO: the cds policy over a FakeHelper, its FakeClock and FakeSubchannels.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from test_cds_support import (
    CONNECTING,
    IDLE,
    READY,
    ROUND_ROBIN_POLICY,
    TF,
    build,
    cds_update,
    connect,
    connect_all,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    xds_config,
)

from pyxds.lb import PickArgs, PickComplete, PickQueue, Status
from pyxds.lb.xds_override_host import OVERRIDE_HOST_ATTRIBUTE, OverrideHostAttribute

OK = Status(grpc.StatusCode.OK)
FAIL = Status(grpc.StatusCode.UNAVAILABLE, "backend failed")


def _cluster_tree(name: str, od: dict[str, Any], *priorities: list[str]) -> Any:
    """A leaf EDS cluster ``name`` (round_robin) whose priorities hold one
    locality each with ``priorities[i]``'s endpoints, and outlier detection
    ``od``; every subchannel READY.  Returns the FakeHelper."""
    helper, policy, config = build([{"cds_experimental": {"cluster": name}}])
    cluster = eds_cluster(
        name, lb_policy_config=ROUND_ROBIN_POLICY, outlier_detection=json.dumps(od)
    )
    entry = eds_entry(
        cluster, *[[locality(loc(f"p{i}"), addresses)] for i, addresses in enumerate(priorities)]
    )
    assert policy.update(cds_update(config, xds_config({name: entry}))) is None
    connect_all(helper)
    assert helper.state is READY
    return helper


def _serve(helper: Any, picks: int, failing: set[str], **call_attributes: Any) -> list[str]:
    """``picks`` RPCs: each fails on an address in ``failing``, else succeeds."""
    out = []
    for _ in range(picks):
        result = helper.pick(**call_attributes)
        assert isinstance(result, PickComplete), result
        address = result.subchannel.address
        if result.on_call_done is not None:
            result.on_call_done(FAIL if address in failing else OK)
        out.append(address)
    return out


def test_max_ejection_percent_counts_the_endpoints_of_every_priority():
    """A50 step 3.1 ("if the percentage of ejected addresses is greater than
    max_ejection_percent, stop"), over the cluster (A75): priority 0 has
    a, b, x (a and b fail every call), priority 1 has three more endpoints,
    maxEjectionPercent 30.  Over the cluster's 6 endpoints, a is ejected
    (1/6 < 30 %), then b (2/6 >= 30 % stops there): only x serves.  (One
    outlier_detection per priority saw 3 endpoints: 1/3 >= 30 % after a,
    so b kept serving.)"""
    od = {
        "interval": "1s",
        "baseEjectionTime": "30s",
        "maxEjectionPercent": 30,
        "failurePercentageEjection": {
            "threshold": 50,
            "enforcementPercentage": 100,
            "minimumHosts": 3,
            "requestVolume": 5,
        },
    }
    p0 = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]
    p1 = ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"]
    helper = _cluster_tree("od-a75-max-percent", od, p0, p1)
    failing = {"10.0.0.1:80", "10.0.0.2:80"}
    assert set(_serve(helper, 30, failing)) == set(p0)  # priority 0 serves
    helper.clock.advance(1)
    assert set(_serve(helper, 30, failing)) == {"10.0.0.3:80"}


def test_success_rate_minimum_hosts_counts_endpoints_of_both_priorities_in_one_interval():
    """A50 success rate: "if the number of addresses with request volume of
    at least request_volume is less than minimum_hosts, stop", counted over
    the cluster (A75).  In one interval priority 0's a (every call fails)
    and b serve, then priority 0 loses its connections and priority 1's c
    and d serve: four endpoints with enough calls (minimumHosts 3), mean
    success rate 75 %, a at 0 % is under the threshold and is ejected.  When
    priority 0 comes back, only b serves.  (Per priority, priority 0 had two
    such endpoints, fewer than 3: nothing was ejected.)"""
    od = {
        "interval": "10s",
        "baseEjectionTime": "30s",
        "maxEjectionPercent": 50,
        "successRateEjection": {
            "stdevFactor": 1000,
            "enforcementPercentage": 100,
            "minimumHosts": 3,
            "requestVolume": 4,
        },
    }
    a, b, c, d = "10.0.0.1:80", "10.0.0.2:80", "10.0.1.1:80", "10.0.1.2:80"
    helper = _cluster_tree("od-a75-success-rate", od, [a, b], [c, d])
    assert set(_serve(helper, 20, {a})) == {a, b}
    for address in (a, b):  # priority 0 loses its connections: fail over
        helper.subchannel(address).set_state(TF)
    for address in (c, d):  # priority 1's subchannels
        connect(helper, address)
    assert set(_serve(helper, 20, {a})) == {c, d}
    helper.clock.advance(10)  # the sweep
    for address in (a, b):  # priority 0 reconnects and serves again
        connect(helper, address)
    assert set(_serve(helper, 20, set())) == {b}


def test_a_session_pick_is_counted_and_an_ejected_endpoint_keeps_its_session():
    """A75: outlier detection above xds_override_host counts a session's
    picks (C-core's tree): every RPC of a session pinned to a fails, plain
    RPCs go to b and a and succeed: a's failure percentage (over its
    session's calls too) is over the threshold, and a is ejected, so plain
    RPCs go to b only.  The session stays on a: A55/A75's picker reads the
    subchannel's connectivity state, which an ejection (C-core: the health
    watch, A61) does not change.  (With outlier detection per priority below
    xds_override_host, a's session calls were not counted: a's share of
    failures stayed under the threshold and it was never ejected.)"""
    od = {
        "interval": "1s",
        "baseEjectionTime": "30s",
        "maxEjectionPercent": 50,
        "failurePercentageEjection": {
            "threshold": 50,
            "enforcementPercentage": 100,
            "minimumHosts": 2,
            "requestVolume": 5,
        },
    }
    a, b = "10.0.0.1:80", "10.0.0.2:80"
    helper = _cluster_tree("od-a75-session", od, [a, b])

    def session_pick() -> PickComplete:
        attribute = OverrideHostAttribute(a)
        result = helper.last.picker.pick(
            PickArgs("/svc/Method", (), {OVERRIDE_HOST_ATTRIBUTE: attribute})
        )
        assert isinstance(result, PickComplete), result
        assert attribute.actual_address_list == a
        return result

    for _ in range(12):
        result = session_pick()
        assert result.subchannel.address == a
        assert result.on_call_done is not None
        result.on_call_done(FAIL)
    assert set(_serve(helper, 10, set())) == {a, b}  # 5 successes each
    helper.clock.advance(1)
    assert set(_serve(helper, 20, set())) == {b}
    for _ in range(3):  # the session keeps its endpoint
        assert session_pick().subchannel.address == a


def test_a_pick_first_cluster_is_counted_but_its_picks_do_not_move():
    """grpc#32967 / A61 under the A75 tree: C-core ejects through the health
    watch, which pick_first reads only under a petiole policy; a cluster
    whose policy is pick_first (A62), under priority, xds_override_host and
    xds_cluster_impl, keeps picking its endpoint when outlier detection
    ejects it.  pyxds looks through those three to the cluster's policy
    (outlier_detection.ejection_reaches)."""
    od = {
        "interval": "1s",
        "baseEjectionTime": "30s",
        "maxEjectionPercent": 100,
        "failurePercentageEjection": {
            "threshold": 50,
            "enforcementPercentage": 100,
            "minimumHosts": 1,
            "requestVolume": 5,
        },
    }
    a, b = "10.0.0.1:80", "10.0.0.2:80"
    helper, policy, config = build([{"cds_experimental": {"cluster": "od-a75-pf"}}])
    cluster = eds_cluster(
        "od-a75-pf", lb_policy_config='[{"pick_first": {}}]', outlier_detection=json.dumps(od)
    )
    entry = eds_entry(cluster, [locality(loc("p0"), [a, b])])
    assert policy.update(cds_update(config, xds_config({"od-a75-pf": entry}))) is None
    connect_all(helper)
    assert set(_serve(helper, 10, {a})) == {a}
    helper.clock.advance(1)
    outlier_detection = policy.child
    assert outlier_detection.ejected == [frozenset({a})]  # counted and ejected ...
    connect_all(helper)
    assert set(_serve(helper, 10, {a})) == {a}  # ... but pick_first does not move


def test_an_outlier_detection_config_change_updates_the_cluster_in_place():
    """A50 "xDS Integration" with A75's tree: the cluster's outlier detection
    config is the top policy's config, so a CDS update changing it (here:
    none, a no-op config, then an algorithm) updates that policy in place:
    the subchannels stay, and from then on the calls are counted and the
    failing endpoint is ejected.  (C-core: the child's UpdateLocked with the
    new config.)"""
    a, b = "10.0.0.1:80", "10.0.0.2:80"
    name = "od-a75-config-change"
    helper, policy, config = build([{"cds_experimental": {"cluster": name}}])

    def update(od: dict[str, Any] | None) -> None:
        cluster = eds_cluster(
            name,
            lb_policy_config=ROUND_ROBIN_POLICY,
            outlier_detection=json.dumps(od) if od is not None else None,
        )
        entry = eds_entry(cluster, [locality(loc("p0"), [a, b])])
        assert policy.update(cds_update(config, xds_config({name: entry}))) is None

    update(None)
    connect_all(helper)
    top = policy.child
    subchannels = list(helper.subchannels)
    assert set(_serve(helper, 20, {a})) == {a, b}
    helper.clock.advance(10)  # no algorithm: no sweep
    assert set(_serve(helper, 20, {a})) == {a, b}
    update(
        {
            "interval": "1s",
            "maxEjectionPercent": 50,
            "failurePercentageEjection": {"minimumHosts": 2, "requestVolume": 5},
        }
    )
    assert policy.child is top and helper.subchannels == subchannels
    assert set(_serve(helper, 20, {a})) == {a, b}
    helper.clock.advance(1)
    assert set(_serve(helper, 20, {a})) == {b}
    assert helper.subchannels == subchannels


def test_an_ejected_endpoint_s_session_follows_its_connectivity_while_ejected():
    """A75's picker pseudo-code reads ``entry.subchannel.connectivity_state``:
    while outlier detection holds an ejected endpoint's reports back from the
    cluster's policy, the session still sees the connection's own state.  The
    connection drops during the ejection: the session's pick asks it to
    connect and queues (not a pick of a lost connection, not another
    endpoint: the cookie's endpoint is only skipped in TRANSIENT_FAILURE);
    once it is READY again the session is served there."""
    od = {
        "interval": "1s",
        "baseEjectionTime": "300s",
        "maxEjectionPercent": 50,
        "failurePercentageEjection": {"minimumHosts": 2, "requestVolume": 5, "threshold": 50},
    }
    a, b = "10.0.0.1:80", "10.0.0.2:80"
    helper = _cluster_tree("od-a75-session-drop", od, [a, b])
    assert set(_serve(helper, 20, {a})) == {a, b}
    helper.clock.advance(1)
    assert set(_serve(helper, 10, set())) == {b}  # a is ejected

    def session_pick() -> Any:
        return helper.last.picker.pick(
            PickArgs("/svc/Method", (), {OVERRIDE_HOST_ATTRIBUTE: OverrideHostAttribute(a)})
        )

    assert session_pick().subchannel.address == a
    real_a = helper.subchannel(a)
    real_a.set_state(IDLE)  # the connection drops while a is ejected
    connects = real_a.connect_calls
    assert isinstance(session_pick(), PickQueue)
    helper.clock.advance(0)  # the picker's hop to connect
    assert real_a.connect_calls > connects
    real_a.set_state(CONNECTING)
    assert isinstance(session_pick(), PickQueue)
    real_a.set_state(READY)
    assert session_pick().subchannel.address == a
    assert set(_serve(helper, 10, set())) == {b}  # still ejected for the others
