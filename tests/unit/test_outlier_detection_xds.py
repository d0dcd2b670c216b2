"""Outlier detection through xDS (gRFC A50 "xDS Integration", "xDS
Validation"): the CDS ``outlier_detection`` field mapped to the
``outlier_detection_experimental`` config, NACKs naming the field, and the
cds policy running one outlier_detection per cluster above xds_cluster_impl
(A75)."""

from __future__ import annotations

import json

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from test_cds_support import (
    PICK_FIRST_POLICY,
    READY,
    build,
    cds_update,
    channel_subchannel,
    cluster_impl_of,
    connect_all,
    describe,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    xds_config,
)

from pyxds.lb import PickComplete, Status, registry
from pyxds.xds.resources import CLUSTER

FAIL = Status(grpc.StatusCode.UNAVAILABLE, "boom")
OK = Status(grpc.StatusCode.OK)


def decode(c: cluster_pb2.Cluster):
    result = CLUSTER.decode(c.SerializeToString())
    return result.resource, result.error


def proto_cluster() -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.ads.SetInParent()
    return c


def od_json(c: cluster_pb2.Cluster) -> dict:
    resource, error = decode(c)
    assert error is None, error
    assert resource.outlier_detection is not None
    return json.loads(resource.outlier_detection)


def test_cluster_without_outlier_detection_has_none():
    resource, error = decode(proto_cluster())
    assert error is None and resource.outlier_detection is None


def test_empty_outlier_detection_enables_success_rate_with_defaults_only():
    """A50: enforcing_success_rate unset means enabled (Envoy's default 100);
    enforcing_failure_percentage unset means disabled."""
    c = proto_cluster()
    c.outlier_detection.SetInParent()
    assert od_json(c) == {"successRateEjection": {}}


def test_every_field_maps_as_a50_lists():
    c = proto_cluster()
    od = c.outlier_detection
    od.interval.FromSeconds(2)
    od.base_ejection_time.FromMilliseconds(1500)
    od.max_ejection_time.FromSeconds(40)
    od.max_ejection_percent.value = 50
    od.success_rate_stdev_factor.value = 1000
    od.enforcing_success_rate.value = 90
    od.success_rate_minimum_hosts.value = 3
    od.success_rate_request_volume.value = 20
    od.failure_percentage_threshold.value = 60
    od.enforcing_failure_percentage.value = 80
    od.failure_percentage_minimum_hosts.value = 4
    od.failure_percentage_request_volume.value = 30
    mapped = od_json(c)
    assert mapped == {
        "interval": "2s",
        "baseEjectionTime": "1.500000000s",
        "maxEjectionTime": "40s",
        "maxEjectionPercent": 50,
        "successRateEjection": {
            "stdevFactor": 1000,
            "enforcementPercentage": 90,
            "minimumHosts": 3,
            "requestVolume": 20,
        },
        "failurePercentageEjection": {
            "threshold": 60,
            "enforcementPercentage": 80,
            "minimumHosts": 4,
            "requestVolume": 30,
        },
    }
    config = registry.select(
        [{"outlier_detection_experimental": {**mapped, "childPolicy": [{"round_robin": {}}]}}]
    )[1]
    assert config.base_ejection_time == 1.5


def test_enforcing_success_rate_zero_disables_success_rate():
    c = proto_cluster()
    c.outlier_detection.enforcing_success_rate.value = 0
    c.outlier_detection.success_rate_minimum_hosts.value = 9
    c.outlier_detection.enforcing_failure_percentage.value = 100
    assert od_json(c) == {"failurePercentageEjection": {"enforcementPercentage": 100}}


@pytest.mark.parametrize(
    "field",
    [
        "max_ejection_percent",
        "enforcing_success_rate",
        "failure_percentage_threshold",
        "enforcing_failure_percentage",
    ],
)
def test_percentage_above_100_is_nacked_naming_the_field(field):
    c = proto_cluster()
    getattr(c.outlier_detection, field).value = 101
    resource, error = decode(c)
    assert resource is None and f"outlier_detection.{field}" in error


def test_negative_duration_is_nacked_naming_the_field():
    c = proto_cluster()
    c.outlier_detection.interval.seconds = -1
    resource, error = decode(c)
    assert resource is None and "outlier_detection.interval" in error


def test_same_outlier_detection_twice_gives_equal_clusters():
    c = proto_cluster()
    c.outlier_detection.enforcing_failure_percentage.value = 100
    c.outlier_detection.interval.FromSeconds(1)
    assert decode(c)[0] == decode(c)[0]


# ---------------------------------------------------------------- cds tree


def cds_policy():
    return build([{"cds_experimental": {"cluster": "c1"}}])


def test_cds_puts_outlier_detection_once_above_xds_cluster_impl():
    """A75 "Aggregate Cluster Changes": outlier_detection -> xds_cluster_impl
    -> xds_override_host -> priority -> the cluster's policy in each
    priority (C-core's cds.cc order), one outlier_detection per cluster."""
    _helper, policy, config = cds_policy()
    od = json.dumps({"interval": "1s", "failurePercentageEjection": {}})
    cluster = eds_cluster("c1", outlier_detection=od)
    entry = eds_entry(
        cluster, [locality(loc("a"), ["10.0.0.1:80"])], [locality(loc("b"), ["10.0.1.1:80"])]
    )
    policy.update(cds_update(config, xds_config({"c1": entry})))
    tree = describe(policy)
    assert tree[0] == "cds"
    assert tree[1][0] == "outlier_detection"
    assert tree[1][1][0] == "xds_cluster_impl"
    assert tree[1][1][1][0] == "xds_override_host"
    priority = tree[1][1][1][1]
    assert priority[0] == "priority"
    built = [child for child in priority[1].values() if child is not None]
    assert built and all(child[0] == "xds_wrr_locality" for child in built)


def test_cds_outlier_detection_ejects_a_failing_endpoint():
    """The issue's scenario, sans-IO: failure percentage, two endpoints, one
    failing: after the interval every RPC goes to the good one."""
    helper, policy, config = cds_policy()
    od = json.dumps(
        {
            "interval": "1s",
            "maxEjectionPercent": 50,
            "failurePercentageEjection": {"minimumHosts": 2, "requestVolume": 5},
        }
    )
    cluster = eds_cluster("c1", outlier_detection=od)
    entry = eds_entry(cluster, [locality(loc("a"), ["10.0.0.1:80", "10.0.0.2:80"])])
    policy.update(cds_update(config, xds_config({"c1": entry})))
    connect_all(helper)
    assert helper.state is READY
    for _ in range(40):
        result = helper.pick()
        assert isinstance(result, PickComplete)
        result.on_call_done(FAIL if result.subchannel.address == "10.0.0.1:80" else OK)
    helper.clock.advance(1)
    addresses = set()
    for _ in range(40):
        result = helper.pick()
        addresses.add(result.subchannel.address)
        result.on_call_done(OK)
    assert addresses == {"10.0.0.2:80"}


def test_cds_without_outlier_detection_uses_a_no_op_config():
    helper, policy, config = cds_policy()
    cluster = eds_cluster("c1", lb_policy_config=PICK_FIRST_POLICY)
    entry = eds_entry(cluster, [locality(loc("a"), ["10.0.0.1:80"])])
    policy.update(cds_update(config, xds_config({"c1": entry})))
    connect_all(helper)
    assert helper.clock.pending == []  # no algorithm: no timer
    assert helper.state is READY


@pytest.mark.parametrize("od", [None, json.dumps({"failurePercentageEjection": {}})])
def test_cluster_picks_reach_the_real_subchannel_and_the_locality_counters(od):
    """With or without an algorithm, the pick reaches the channel's own
    subchannel (a counting outlier_detection unwraps it; a no-op one leaves
    its wrapper, whose ``core`` is the channel's), and the cluster's
    locality counters (load reporting) still count every call."""
    name = "c1-lrs" if od else "c1-lrs-noop"  # counters are per cluster, process-wide
    helper, policy, config = build([{"cds_experimental": {"cluster": name}}])
    cluster = eds_cluster(name, outlier_detection=od)
    entry = eds_entry(cluster, [locality(loc("a"), ["10.0.0.1:80", "10.0.0.2:80"])])
    policy.update(cds_update(config, xds_config({name: entry})))
    connect_all(helper)
    for _ in range(10):
        result = helper.pick()
        # the channel's own (a no-op outlier_detection's wrapper carries its core)
        assert channel_subchannel(result.subchannel) in helper.subchannels
        result.on_call_done(OK)
    load = cluster_impl_of(policy).counters.snapshot()
    assert sum(loc_load.succeeded for loc_load in load.localities) == 10
