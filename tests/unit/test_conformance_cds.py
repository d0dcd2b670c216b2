"""Conformance: cds over aggregate and leaf clusters (gRFC A74 latest, A37,
A75).  Scenarios from C-core xds_cluster_type_end2end_test.cc
(AggregateClusterTest.ReconfigEdsWhileLogicalDnsChildFails,
MultipleClustersWithSameLocalities, UpdateOfChildCluster, DiamondDependency)
and grpc-go cdsbalancer aggregate cluster tests, run on a FakeHelper with
XdsConfigs made by hand."""

from __future__ import annotations

import grpc
from test_cds_support import (
    aggregate_entry,
    build,
    cds_update,
    connect,
    connect_all,
    dns_entry,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    picked_addresses,
    xds_config,
)

from pyxds.lb import ConnectivityState, PickFail, Status

TF = ConnectivityState.TRANSIENT_FAILURE


def cds(cluster):
    return build([{"cds_experimental": {"cluster": cluster}}])


def fail_all(helper):
    for subchannel in helper.live_subchannels():
        subchannel.set_state(ConnectivityState.CONNECTING)
        subchannel.set_state(TF, Status(grpc.StatusCode.UNAVAILABLE, "connection refused"))


def test_reconfig_eds_while_logical_dns_child_fails():
    """C-core ReconfigEdsWhileLogicalDnsChildFails: an EDS update moving
    localities between priorities, while the DNS leaf failed, reaches the
    backend of the locality now in priority 0."""
    l0, l1, l2 = loc("l0"), loc("l1"), loc("l2")
    dns_failed = dns_entry(
        "dns", [], note="DNS resolution failed for server.example.com:443: injected error"
    )

    def config(eds):
        return xds_config(
            {"agg": aggregate_entry("agg", ["eds", "dns"]), "eds": eds, "dns": dns_failed}
        )

    helper, policy, cfg = cds("agg")
    unreachable = eds_entry(
        "eds",
        [locality(l0, ["10.9.0.1:1"])],
        [locality(l1, ["10.9.0.2:1"]), locality(l2, ["10.9.0.3:1"])],
    )
    policy.update(cds_update(cfg, config(unreachable)))
    for _ in range(3):  # every priority of eds, then dns, fails
        fail_all(helper)
    assert helper.state is TF
    result = helper.pick()
    assert isinstance(result, PickFail)
    moved = eds_entry("eds", [locality(l1, ["10.0.0.1:80"])], [locality(l2, ["10.0.0.2:80"])])
    policy.update(cds_update(cfg, config(moved)))
    connect(helper, "10.0.0.1:80")
    assert set(picked_addresses(helper, 10)) == {"10.0.0.1:80"}


def test_two_leaf_clusters_with_the_same_locality_names_do_not_collide():
    """C-core MultipleClustersWithSameLocalities: each leaf has its own
    subtree, so a locality name reused by the other cluster is harmless."""
    shared = loc("locality1")
    helper, policy, cfg = cds("agg")

    def config(first_address):
        return xds_config(
            {
                "agg": aggregate_entry("agg", ["c1", "c2"]),
                "c1": eds_entry("c1", [locality(loc("locality0"), [first_address])]),
                "c2": eds_entry("c2", [locality(shared, ["10.0.0.2:80"])]),
            }
        )

    policy.update(cds_update(cfg, config("10.9.9.9:1")))
    fail_all(helper)
    connect(helper, "10.0.0.2:80")
    assert set(picked_addresses(helper, 5)) == {"10.0.0.2:80"}
    # c1 now uses c2's locality name and a reachable backend: back to c1.
    policy.update(
        cds_update(
            cfg,
            xds_config(
                {
                    "agg": aggregate_entry("agg", ["c1", "c2"]),
                    "c1": eds_entry("c1", [locality(shared, ["10.0.0.1:80"])]),
                    "c2": eds_entry("c2", [locality(shared, ["10.0.0.2:80"])]),
                }
            ),
        )
    )
    connect(helper, "10.0.0.1:80")
    assert set(picked_addresses(helper, 5)) == {"10.0.0.1:80"}


def test_update_of_a_child_cluster_under_an_unchanged_aggregate_is_applied():
    """C-core UpdateOfChildCluster: the leaf's EDS service name changes; the
    aggregate itself does not; traffic moves to the new endpoints."""
    helper, policy, cfg = cds("agg")
    first = eds_entry(
        eds_cluster("c1", eds_service_name="svc1"), [locality(loc("a"), ["10.0.0.1:80"])]
    )
    policy.update(cds_update(cfg, xds_config({"agg": aggregate_entry("agg", ["c1"]), "c1": first})))
    connect_all(helper)
    assert set(picked_addresses(helper, 5)) == {"10.0.0.1:80"}
    second = eds_entry(
        eds_cluster("c1", eds_service_name="svc2"), [locality(loc("a"), ["10.0.0.2:80"])]
    )
    policy.update(
        cds_update(cfg, xds_config({"agg": aggregate_entry("agg", ["c1"]), "c1": second}))
    )
    connect(helper, "10.0.0.2:80")
    assert set(picked_addresses(helper, 5)) == {"10.0.0.2:80"}


def test_diamond_aggregate_fails_over_across_deduplicated_leaves():
    """C-core DiamondDependency: top -> [c1, mid], mid -> [c1, c2]; leaves
    [c1, c2]: c1 first, c2 when c1 fails, back to c1 when it recovers."""
    helper, policy, cfg = cds("top")
    config = xds_config(
        {
            "top": aggregate_entry("top", ["c1", "c2"]),
            "mid": aggregate_entry("mid", ["c1", "c2"]),
            "c1": eds_entry("c1", [locality(loc("a"), ["10.0.0.1:80"])]),
            "c2": eds_entry("c2", [locality(loc("b"), ["10.0.0.2:80"])]),
        }
    )
    policy.update(cds_update(cfg, config))
    connect(helper, "10.0.0.1:80")
    assert set(picked_addresses(helper, 5)) == {"10.0.0.1:80"}
    first = helper.subchannel("10.0.0.1:80")
    first.set_state(TF, Status(grpc.StatusCode.UNAVAILABLE, "gone away"))
    connect(helper, "10.0.0.2:80")
    assert set(picked_addresses(helper, 5)) == {"10.0.0.2:80"}
    first.set_state(ConnectivityState.IDLE)
    connect(helper, "10.0.0.1:80")
    assert set(picked_addresses(helper, 5)) == {"10.0.0.1:80"}


def test_aggregate_with_no_leaves_fails_picks_with_c_core_text():
    """C-core DependencyLoopWithNoLeafClusters text, seen through the cds policy."""
    helper, policy, cfg = cds("cluster_name")
    status = Status(
        grpc.StatusCode.UNAVAILABLE,
        "aggregate cluster dependency graph for cluster_name has no leaf clusters",
    )
    policy.update(cds_update(cfg, xds_config({"cluster_name": status})))
    assert helper.state is TF
    result = helper.pick()
    assert isinstance(result, PickFail) and result.status == status
