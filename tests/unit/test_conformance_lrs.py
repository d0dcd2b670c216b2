"""Conformance: load reporting and xds_cluster_impl beyond the first round
(gRFC A27 "Load Reporting", A37 xds_cluster_impl, A64/A85 custom metrics).

Scenarios replayed from grpc-java ``LoadStatsManager2Test`` and
``LoadReportClientTest``, grpc-go ``clusterimpl/tests/balancer_test.go`` and
``clusterimpl/balancer_test.go``, grpc-java ``ClusterImplLoadBalancerTest``,
checked against C-core's ``lrs_client.cc`` where the three differ (C-core
decides where the gRFCs are silent).  Sans-IO: a FakeClock, the fake LRS
transport of :mod:`lrs_support`, FakeHelper subchannels."""

from __future__ import annotations

import itertools
from typing import Any

import grpc
from lrs_support import BOOTSTRAP, lrs_client
from test_cds_support import (
    attributes,
    build,
    connect,
    connect_all,
    dns_cluster,
    dns_entry,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    xds_config,
)
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.lb import ConnectivityState, Endpoint, PickComplete, PickDrop, ResolverUpdate, Status
from pyxds.lb.call_counters import cluster_counters
from pyxds.resolver.xds_config import XDS_CLIENT_ATTRIBUTE
from pyxds.testing import FakeClock, FakeHelper
from pyxds.xds.load_store import LoadStore
from pyxds.xds.lrs_state import cluster_stats_proto
from pyxds.xds.resources.types import BackendMetricPropagation

OK = Status(grpc.StatusCode.OK)
UNAVAILABLE = Status(grpc.StatusCode.UNAVAILABLE, "backend down")
SERVER = "xds.example:443"
IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
TF = ConnectivityState.TRANSIENT_FAILURE
_ids = itertools.count()


def fresh(prefix: str) -> str:
    return f"conf-lrs-{prefix}-{next(_ids)}"


# --------------------------------------------------------------------------- the store


def test_cluster_with_only_uncategorized_drops_reports_a_total_and_nothing_else():
    """grpc-java LoadStatsManager2Test.recordAndGetReport (the (cluster1,
    eds2) entry): one uncategorized drop and no locality gives a
    ClusterStats with no ``dropped_requests`` entry, ``total_dropped_requests``
    1 and no ``upstream_locality_stats``; C-core's CreateLrsRequest writes
    the same (categories only for categorized drops, the total adds the
    uncategorized ones)."""
    clock = FakeClock()
    store = LoadStore(clock)
    store.drop_stats(SERVER, "c1", "eds2").add(None)
    clock.advance(15)
    (report,) = store.take_report(SERVER, True, ())
    proto = cluster_stats_proto(report)
    assert (proto.cluster_name, proto.cluster_service_name) == ("c1", "eds2")
    assert list(proto.dropped_requests) == []
    assert proto.total_dropped_requests == 1
    assert list(proto.upstream_locality_stats) == []
    assert proto.load_report_interval.seconds == 15


def test_two_holders_of_one_drop_stats_add_up_categorized_and_uncategorized():
    """grpc-java LoadStatsManager2Test.sharedDropCounterStatsAggregation: two
    references to the drops of one (cluster, EDS service name) count into one
    report: lb 1, throttle 1, total 4 (2 categorized + 2 uncategorized)."""
    store = LoadStore(FakeClock())
    first = store.drop_stats(SERVER, "c1", "eds1")
    second = store.drop_stats(SERVER, "c1", "eds1")
    first.add("lb")
    second.add("throttle")
    first.add(None)
    second.add(None)
    (report,) = store.take_report(SERVER, True, ())
    proto = cluster_stats_proto(report)
    assert {d.category: d.dropped_count for d in proto.dropped_requests} == {
        "lb": 1,
        "throttle": 1,
    }
    assert proto.total_dropped_requests == 4


def test_drop_stats_released_after_a_report_are_reported_once_more_as_zero_then_forgotten():
    """grpc-java LoadStatsManager2Test.dropCounterDelayedDeletionAfterReported
    (C-core BuildLoadReportSnapshotLocked: a released stats object's final
    snapshot goes into the next report, then the entry is removed)."""
    store = LoadStore(FakeClock())
    drops = store.drop_stats(SERVER, "c1", "eds1")
    drops.add("lb")
    (report,) = store.take_report(SERVER, True, ())
    assert report.dropped_requests == {"lb": 1} and report.total_dropped_requests == 1
    store.release(drops)
    (report,) = store.take_report(SERVER, True, ())
    assert report.dropped_requests == {} and report.total_dropped_requests == 0
    assert store.take_report(SERVER, True, ()) == []
    assert not store.has_stats(SERVER)


def test_named_metrics_are_summed_without_validation_negative_values_included():
    """A64 "ORCA Integration": named metrics are opaque values, no validation;
    grpc-java LoadStatsManager2Test.recordAndGetReport sums 3.14159 + 1.618 +
    99 - 97.23 for named1 (4 requests) and -2.718 for named2 (1 request)."""
    store = LoadStore(FakeClock())
    stats = store.locality_stats(
        SERVER, "c1", "eds1", loc("r1"), BackendMetricPropagation(named_all=True)
    )
    for metrics in (
        {"named1": 3.14159},
        {"named1": 1.618},
        {"named1": 99.0},
        {"named1": -97.23, "named2": -2.718},
    ):
        stats.call_started()
        stats.add_backend_metrics(OrcaLoadReport(named_metrics=metrics))
        stats.call_finished(True)
    (report,) = store.take_report(SERVER, True, ())
    (upstream,) = cluster_stats_proto(report).upstream_locality_stats
    got = {
        m.metric_name: (m.num_requests_finished_with_metric, m.total_metric_value)
        for m in upstream.load_metric_stats
    }
    assert set(got) == {"named_metrics.named1", "named_metrics.named2"}
    assert got["named_metrics.named1"][0] == 4
    assert abs(got["named_metrics.named1"][1] - (3.14159 + 1.618 + 99.0 - 97.23)) < 1e-9
    assert got["named_metrics.named2"] == (1, -2.718)


# --------------------------------------------------------------------------- the LRS stream


def test_in_progress_calls_keep_every_report_non_zero_until_they_finish():
    """grpc-java LoadReportClientTest.periodicLoadReporting: 31 calls started
    and never finished are reported in progress in every later report (issued
    0 after the first); C-core's Snapshot::IsZero counts in-progress calls,
    so these reports are not skipped as all-zero.  Once they finish, one
    report carries the successes, one all-zero report follows, then none."""
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        server = client.lrs_server_for("c1")
        stats = client.load_store.locality_stats(server, "c1", "eds1", loc("r1", "z1", "s1"))
        for _ in range(31):
            stats.call_started()
        (transport,) = transports
        transport.respond(interval=10.0, clusters=["c1"])
        in_progress, issued = [], []
        for _ in range(3):
            clock.advance(10.0)
            (upstream,) = transport.reports()[-1].cluster_stats[0].upstream_locality_stats
            in_progress.append(upstream.total_requests_in_progress)
            issued.append(upstream.total_issued_requests)
        assert len(transport.reports()) == 3
        assert in_progress == [31, 31, 31] and issued == [31, 0, 0]
        for _ in range(31):
            stats.call_finished(True)
        clock.advance(10.0)
        (upstream,) = transport.reports()[-1].cluster_stats[0].upstream_locality_stats
        assert (upstream.total_successful_requests, upstream.total_requests_in_progress) == (31, 0)
        clock.advance(30.0)
        assert len(transport.reports()) == 5  # one all-zero report, then none
    finally:
        client.close()


def test_a_new_cluster_list_applies_from_the_next_report():
    """grpc-java LoadReportClientTest.periodicLoadReporting: the server asks
    for cluster1, then every cluster, then cluster2 only, then a cluster the
    client has no load for (a report with no ClusterStats); each report
    follows the list of the latest response."""
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        server = client.lrs_server_for("c1")
        one = client.load_store.locality_stats(server, "c1", "eds1", loc("r1"))
        two = client.load_store.locality_stats(server, "c2", "eds2", loc("r2"))
        one.call_started()
        two.call_started()
        (transport,) = transports

        def clusters_of_next_report(**response: Any) -> list[tuple[str, str]]:
            transport.respond(interval=10.0, **response)
            clock.advance(10.0)
            return sorted(
                (s.cluster_name, s.cluster_service_name)
                for s in transport.reports()[-1].cluster_stats
            )

        assert clusters_of_next_report(clusters=["c1"]) == [("c1", "eds1")]
        assert clusters_of_next_report(clusters=None) == [("c1", "eds1"), ("c2", "eds2")]
        assert clusters_of_next_report(clusters=["c2"]) == [("c2", "eds2")]
        before = len(transport.reports())
        assert clusters_of_next_report(clusters=["unknown.googleapis.com"]) == []
        assert len(transport.reports()) == before + 1
    finally:
        client.close()


# --------------------------------------------------------------------------- xds_cluster_impl


def impl_json(cluster: str, child: str = "round_robin") -> list[dict[str, Any]]:
    return [
        {
            "xds_cluster_impl_experimental": {
                "clusterName": cluster,
                "childPolicy": [{child: {}}],
            }
        }
    ]


def two_localities() -> list[Any]:
    return [
        locality(loc("region-1"), ["10.0.0.1:80"]),
        locality(loc("region-2"), ["10.0.0.2:80"], weight=2),
    ]


def update_for(client: Any, cluster: Any, config: Any, drops=()) -> ResolverUpdate:
    localities = two_localities()
    xds = xds_config({cluster.name: eds_entry(cluster, localities, drops=drops)})
    endpoints = [
        Endpoint(a.addresses, {"locality": lo.name, "locality_weight": lo.weight})
        for lo in localities
        for a in lo.endpoints
    ]
    return ResolverUpdate(endpoints, config, {**attributes(xds), XDS_CLIENT_ATTRIBUTE: client})


def start_policy(client: Any, cluster: Any, child: str = "round_robin", drops=()):
    helper = FakeHelper(seed=11)
    _, policy, config = build(impl_json(cluster.name, child), helper)
    assert policy.update(update_for(client, cluster, config, drops)) is None
    return helper, policy, config


def reported(transport: Any) -> dict[str, dict[str, int]]:
    """Per cluster: successes per locality region over every report so far
    (regions without any left out: like C-core, pyxds lists every locality it
    made a subchannel for, grpc-go only those with counts)."""
    out: dict[str, dict[str, int]] = {}
    for request in transport.reports():
        for stats in request.cluster_stats:
            per = out.setdefault(stats.cluster_name, {})
            for s in stats.upstream_locality_stats:
                if s.total_successful_requests:
                    region = s.locality.region
                    per[region] = per.get(region, 0) + s.total_successful_requests
    return out


def test_pick_first_load_is_reported_under_the_locality_of_the_endpoint_it_uses():
    """grpc-go TestLoadReportingPickFirstMultiLocality and grpc-java
    ClusterImplLoadBalancerTest.pickFirstLoadReport_onUpdateAddress: with
    pick_first over endpoints of two localities, calls on the first endpoint
    count for region-1; after it fails and pick_first moves to the second,
    calls count for region-2 (each subchannel carries its own locality)."""
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        cluster = eds_cluster(fresh("pf"), eds_service_name="svc", lrs_server=True)
        helper, policy, _ = start_policy(client, cluster, child="pick_first")
        connect(helper, "10.0.0.1:80")
        first = helper.pick()
        assert isinstance(first, PickComplete) and first.subchannel.address == "10.0.0.1:80"
        first.on_call_done(OK)
        (transport,) = transports
        transport.respond(interval=1.0)
        clock.advance(1.0)
        assert reported(transport) == {cluster.name: {"region-1": 1}}
        # the endpoint goes away: pick_first goes IDLE, reconnects (a pick
        # asks it to exit IDLE), fails on region-1 and settles on region-2
        helper.subchannel("10.0.0.1:80").set_state(IDLE)
        assert helper.state is IDLE
        policy.exit_idle()
        helper.subchannel("10.0.0.1:80").set_state(CONNECTING)
        helper.subchannel("10.0.0.1:80").set_state(TF, "refused")
        connect(helper, "10.0.0.2:80")
        second = helper.pick()
        assert isinstance(second, PickComplete) and second.subchannel.address == "10.0.0.2:80"
        second.on_call_done(OK)
        clock.advance(1.0)
        assert reported(transport) == {cluster.name: {"region-1": 1, "region-2": 1}}
    finally:
        client.close()


def test_update_with_the_same_lrs_server_keeps_the_stream_and_the_counts():
    """grpc-go TestConfigUpdateWithSameLoadReportingServerConfig: a new EDS
    config (here: drop everything) with the same LRS server neither closes
    the LRS stream nor opens a new one, and the counts taken before and after
    the update land in the same stream's reports."""
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        cluster = eds_cluster(fresh("same"), eds_service_name="svc", lrs_server=True)
        helper, policy, config = start_policy(client, cluster)
        connect_all(helper)
        (transport,) = transports
        transport.respond(interval=1.0)
        helper.pick().on_call_done(OK)
        policy.update(update_for(client, cluster, config, drops=[("everything", 1_000_000)]))
        dropped = helper.pick()
        assert isinstance(dropped, PickDrop)
        assert dropped.status.details == "EDS-configured drop: everything"
        clock.advance(1.0)
        assert len(transports) == 1 and len(transport.sent) == 1
        assert transport.cancelled == [] and transport.finished == []
        (request,) = transport.reports()
        (stats,) = request.cluster_stats
        assert sum(s.total_successful_requests for s in stats.upstream_locality_stats) == 1
        assert [(d.category, d.dropped_count) for d in stats.dropped_requests] == [
            ("everything", 1)
        ]
    finally:
        client.close()


def test_update_removing_the_lrs_server_flushes_once_then_ends_the_stream():
    """grpc-go TestUpdateLRSServerToNil: the cluster loses ``lrs_server``; the
    counts so far are reported once more, the LRS stream then ends, no new
    one opens, and later calls are counted nowhere."""
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        name = fresh("nolrs")
        cluster = eds_cluster(name, eds_service_name="svc", lrs_server=True)
        helper, policy, config = start_policy(client, cluster)
        connect_all(helper)
        (transport,) = transports
        transport.respond(interval=1.0)
        helper.pick().on_call_done(OK)
        without = eds_cluster(name, eds_service_name="svc", lrs_server=False)
        policy.update(update_for(client, without, config))
        later = helper.pick()
        assert isinstance(later, PickComplete)
        later.on_call_done(OK)
        clock.advance(1.0)
        (request,) = transport.reports()
        (stats,) = request.cluster_stats
        assert sum(s.total_successful_requests for s in stats.upstream_locality_stats) == 1
        assert transport.finished == [1] and transport.current == 0
        clock.advance(60.0)
        assert len(transports) == 1 and len(transport.sent) == 1
        assert client.load_store.servers() == []
    finally:
        client.close()


def test_calls_started_under_the_old_eds_service_name_release_the_old_counter():
    """TRAPS.md (grpc-go#4560) and C-core's call counter: circuit breaking is
    per (cluster, EDS service name).  After the EDS service name changes, new
    calls count under the new key (with its own max_requests) while a call
    picked before the change still ends on the old one."""
    name = fresh("svcname")
    helper, policy, config = start_policy(
        None, eds_cluster(name, eds_service_name="old", max_requests=1)
    )
    connect_all(helper)
    held = helper.pick()
    assert isinstance(held, PickComplete)
    assert isinstance(helper.pick(), PickDrop)  # "old" is full
    renamed = eds_cluster(name, eds_service_name="new", max_requests=1)
    policy.update(update_for(None, renamed, config))
    fresh_call = helper.pick()
    assert isinstance(fresh_call, PickComplete)  # "new" has its own slot
    assert cluster_counters(name, "new").in_flight == 1
    assert cluster_counters(name, "old").in_flight == 1
    held.on_call_done(OK)
    assert cluster_counters(name, "old").in_flight == 0
    assert cluster_counters(name, "new").in_flight == 1
    fresh_call.on_call_done(OK)


def test_logical_dns_cluster_has_circuit_breaking_and_reports_under_an_empty_locality():
    """grpc-go TestCircuitBreakingLogicalDNS and TestLRSLogicalDNS: the cds
    tree of a LOGICAL_DNS cluster runs xds_cluster_impl too; max_requests
    drops the call over the limit and load is reported for the cluster with
    no EDS service name and the empty locality (C-core's DNS endpoints have
    an unnamed locality; its LRS request still carries the ``locality``
    message, all fields empty)."""
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        name = fresh("dns")
        cluster = dns_cluster(name, max_requests=1, lrs_server=True)
        xds = xds_config({name: dns_entry(cluster, ["10.0.0.9:443"])})
        helper, policy, config = build([{"cds_experimental": {"cluster": name}}], FakeHelper())
        attrs = {**attributes(xds), XDS_CLIENT_ATTRIBUTE: client}
        assert policy.update(ResolverUpdate([], config, attrs)) is None
        connect_all(helper)
        held = helper.pick()
        assert isinstance(held, PickComplete)
        over = helper.pick()
        assert isinstance(over, PickDrop) and over.status.details == "circuit breaker drop"
        held.on_call_done(OK)
        (transport,) = transports
        transport.respond(interval=1.0)
        clock.advance(1.0)
        (request,) = transport.reports()
        (stats,) = request.cluster_stats
        assert (stats.cluster_name, stats.cluster_service_name) == (name, "")
        assert stats.total_dropped_requests == 1 and list(stats.dropped_requests) == []
        (upstream,) = stats.upstream_locality_stats
        assert upstream.HasField("locality")
        assert (upstream.locality.region, upstream.locality.zone, upstream.locality.sub_zone) == (
            "",
            "",
            "",
        )
        assert (upstream.total_issued_requests, upstream.total_successful_requests) == (1, 1)
        policy.shutdown()
    finally:
        client.close()


def test_resolver_error_before_any_config_fails_picks_with_it():
    """grpc-java ClusterImplLoadBalancerTest.
    nameResolutionError_beforeChildPolicyInstantiated_returnErrorPickerToUpstream:
    TRANSIENT_FAILURE with the resolver's status, no child made."""
    helper = FakeHelper()
    _, policy, _ = build(impl_json(fresh("err")), helper)
    error = Status(grpc.StatusCode.UNIMPLEMENTED, "not found")
    policy.resolver_error(error)
    assert helper.state is TF
    result = helper.pick()
    assert result.status == error
    assert policy.child is None and helper.subchannels == []


def test_resolver_error_after_a_config_goes_to_the_child_and_keeps_its_picks():
    """grpc-java ClusterImplLoadBalancerTest.
    nameResolutionError_afterChildPolicyInstantiated_propagateToDownstream:
    the error is handed to the child (round_robin keeps its READY picker)."""
    cluster = eds_cluster(fresh("err2"))
    helper, policy, _ = start_policy(None, cluster)
    connect_all(helper)
    reports = len(helper.states)
    policy.resolver_error(Status(grpc.StatusCode.UNAVAILABLE, "resolver down"))
    assert helper.state is ConnectivityState.READY
    assert len(helper.states) == reports
    result = helper.pick()
    assert isinstance(result, PickComplete)
    result.on_call_done(OK)


def test_a_new_child_policy_replaces_the_child_on_the_same_endpoints():
    """grpc-java ClusterImplLoadBalancerTest.handleResolvedAddresses_childPolicyChanges
    and grpc-go TestChildPolicyChangeOnConfigUpdate: a config naming another
    child policy builds it and shuts the old one down."""
    cluster = eds_cluster(fresh("child"))
    _, policy, _ = start_policy(None, cluster)
    assert type(policy.child).__name__ == "RoundRobin"
    old_child = policy.child
    _, _, pick_first_config = build(impl_json(cluster.name, "pick_first"), FakeHelper())
    policy.update(update_for(None, cluster, pick_first_config))
    assert type(policy.child).__name__ == "PickFirst"
    assert policy.child is not old_child


def test_child_reports_after_shutdown_are_not_passed_up():
    """grpc-go TestPickerUpdateAfterClose: once the policy is shut down, a
    late state report of its child is dropped, not forwarded to the parent."""
    cluster = eds_cluster(fresh("closed"))
    helper, policy, _ = start_policy(None, cluster)
    connect_all(helper)
    child_helper = policy.child.helper  # type: ignore[union-attr]
    reports = len(helper.states)
    policy.shutdown()
    child_helper.update_state(TF, UNAVAILABLE, helper.last.picker)
    assert len(helper.states) == reports


def test_circuit_breaker_admits_again_once_an_in_flight_call_is_cancelled():
    """C-core CdsTest.CircuitBreaking: max_requests 10; the eleventh call is
    dropped with UNAVAILABLE "circuit breaker drop"; a cancelled call frees
    its slot and the next call goes through."""
    name = fresh("cancel")
    helper, _, _ = start_policy(None, eds_cluster(name, max_requests=10))
    connect_all(helper)
    calls = [helper.pick() for _ in range(10)]
    assert all(isinstance(c, PickComplete) for c in calls)
    over = helper.pick()
    assert isinstance(over, PickDrop)
    assert over.status == Status(grpc.StatusCode.UNAVAILABLE, "circuit breaker drop")
    calls[0].on_call_done(Status(grpc.StatusCode.CANCELLED, "cancelled"))
    again = helper.pick()
    assert isinstance(again, PickComplete)
    for call in (*calls[1:], again):
        call.on_call_done(OK)
    assert cluster_counters(name).in_flight == 0


def test_drop_all_with_no_localities_drops_every_call_under_its_category():
    """C-core EdsTest.DropAll: an EDS resource with no localities and drops
    lb 10 %, throttle 100 %: every call fails with "EDS-configured drop: "
    (none with the empty-EDS error), about 10 % under lb, the rest under
    throttle, and the cluster is READY (its picker drops)."""
    name = fresh("dropall")
    cluster = eds_cluster(name)
    xds = xds_config({name: eds_entry(cluster, drops=[("lb", 100_000), ("throttle", 1_000_000)])})
    helper = FakeHelper(seed=5)
    _, policy, config = build([{"cds_experimental": {"cluster": name}}], helper)
    policy.update(ResolverUpdate([], config, attributes(xds)))
    assert helper.state is ConnectivityState.READY
    categories: dict[str, int] = {}
    for _ in range(2000):
        result = helper.pick()
        assert isinstance(result, PickDrop), result
        assert result.status.code is grpc.StatusCode.UNAVAILABLE
        category = result.status.details.removeprefix("EDS-configured drop: ")
        categories[category] = categories.get(category, 0) + 1
    assert set(categories) == {"lb", "throttle"}
    assert 150 < categories["lb"] < 250
    policy.shutdown()


def test_each_lrs_server_gets_its_own_stream_with_only_its_clusters():
    """grpc-go lrsclient TestReportLoad_ConnectionCreation (and C-core's
    LrsClient, keyed by server): clusters of two authorities with different
    xDS servers report on two streams, one per server, each carrying only the
    clusters whose CDS resource came from that server (A27 ``self``)."""
    other = "xdstp://b.example/envoy.config.cluster.v3.Cluster/c2"
    b_server = {"server_uri": "xds-b.example:443", "channel_creds": [{"type": "insecure"}]}
    bootstrap = {**BOOTSTRAP, "authorities": {"b.example": {"xds_servers": [b_server]}}}
    clock = FakeClock()
    client, transports = lrs_client(clock, bootstrap)
    try:
        server_a, server_b = client.lrs_server_for("c1"), client.lrs_server_for(other)
        uris = (server_a.server_uri, server_b.server_uri)
        assert uris == ("xds.example:443", "xds-b.example:443")
        client.load_store.locality_stats(server_a, "c1", "", loc("a")).call_started()
        client.load_store.locality_stats(server_b, other, "", loc("b")).call_started()
        assert len(transports) == 2
        by_server = {t.channel.server.server_uri: t for t in transports}
        for transport in transports:
            assert len(transport.sent) == 1  # one stream each
            transport.respond(interval=1.0)
        clock.advance(1.0)
        for uri, cluster in (("xds.example:443", "c1"), ("xds-b.example:443", other)):
            (request,) = by_server[uri].reports()
            assert [s.cluster_name for s in request.cluster_stats] == [cluster]
    finally:
        client.close()


def test_a_removed_locality_is_reported_until_its_calls_end_then_no_longer():
    """grpc-java ClusterImplLoadBalancerTest.recordLoadStats (subchannel
    shutdown releases its stats: reported one last time, then no longer) and
    C-core (a call keeps its locality stats alive): an EDS update drops
    region-2 while a call on it is in flight; the next reports still list
    region-2 with that call in progress, then its success, then never again,
    while region-1 goes on being reported."""
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        cluster = eds_cluster(fresh("gone"), eds_service_name="svc", lrs_server=True)
        helper, policy, config = start_policy(client, cluster)
        connect_all(helper)
        calls = {}
        while len(calls) < 2:
            result = helper.pick()
            calls.setdefault(result.subchannel.address, result)
        calls.pop("10.0.0.1:80").on_call_done(OK)
        in_flight = calls.pop("10.0.0.2:80")
        only_first = locality(loc("region-1"), ["10.0.0.1:80"])
        xds = xds_config({cluster.name: eds_entry(cluster, [only_first])})
        endpoints = [Endpoint(("10.0.0.1:80",), {"locality": only_first.name})]
        attrs = {**attributes(xds), XDS_CLIENT_ATTRIBUTE: client}
        policy.update(ResolverUpdate(endpoints, config, attrs))
        assert helper.subchannel("10.0.0.2:80", live=False).shut_down
        (transport,) = transports
        transport.respond(interval=1.0)

        def next_report() -> dict[str, tuple[int, int, int]]:
            helper.pick().on_call_done(OK)  # region-1 keeps counting
            clock.advance(1.0)
            (stats,) = transport.reports()[-1].cluster_stats
            return {
                s.locality.region: (
                    s.total_issued_requests,
                    s.total_successful_requests,
                    s.total_requests_in_progress,
                )
                for s in stats.upstream_locality_stats
            }

        first = next_report()
        assert first["region-2"] == (1, 0, 1)
        assert next_report()["region-2"] == (0, 0, 1)
        in_flight.on_call_done(OK)
        assert next_report()["region-2"] == (0, 1, 0)
        last = next_report()
        assert "region-2" not in last and last["region-1"] == (1, 1, 0)
    finally:
        client.close()
