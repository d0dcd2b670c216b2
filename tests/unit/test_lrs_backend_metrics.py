"""LRS custom metrics (gRFC A64 as amended by A85): the ORCA reports of
finished calls, aggregated per locality into ``load_metric_stats`` and the
``cpu_utilization`` / ``mem_utilization`` / ``application_utilization``
fields, with C-core's names, counts and sums; on a FakeClock with the fake
LRS transport, through xds_cluster_impl's picks."""

from __future__ import annotations

import itertools

import grpc
import pytest
from lrs_support import lrs_client
from test_cds_support import attributes, build, connect_all, eds_cluster, eds_entry, loc, locality
from test_cds_support import xds_config as make_xds_config
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.lb import Endpoint, PickComplete, ResolverUpdate, Status
from pyxds.lb.orca import ORCA_TRAILER_MIRROR
from pyxds.resolver.xds_config import XDS_CLIENT_ATTRIBUTE
from pyxds.testing import FakeClock
from pyxds.xds.load_store import LoadStore, LocalityLoadReport, merge_reports
from pyxds.xds.lrs_state import cluster_stats_proto
from pyxds.xds.resources.types import BackendMetricPropagation

OK = Status(grpc.StatusCode.OK)
SERVER = "xds.example:443"
ALL_NAMED = BackendMetricPropagation(named_all=True)
LEGACY = BackendMetricPropagation(legacy=True)
TOP = BackendMetricPropagation(
    cpu_utilization=True, mem_utilization=True, application_utilization=True
)
_names = itertools.count()

# A64 "Aggregation": three reports of one locality
A64_REPORTS = (
    OrcaLoadReport(named_metrics={"key1": 1.0, "key2": 2.0}),
    OrcaLoadReport(named_metrics={"key2": 3.0, "key3": 4.0}),
    OrcaLoadReport(),
)


def one_locality(propagation, reports) -> LocalityLoadReport:
    store = LoadStore(FakeClock())
    stats = store.locality_stats(SERVER, "c", "svc", loc("a"), propagation)
    for report in reports:
        stats.call_started()
        stats.add_backend_metrics(report)
        stats.call_finished(True)
    (cluster,) = store.take_report(SERVER, True, ())
    (locality_report,) = cluster.localities
    return locality_report


def test_a64_example_with_named_metrics_star_has_a85_names():
    got = one_locality(ALL_NAMED, A64_REPORTS)
    assert got.load_metric_stats == (
        ("named_metrics.key1", (1, 1.0)),
        ("named_metrics.key2", (2, 5.0)),
        ("named_metrics.key3", (1, 4.0)),
    )
    assert got.unnamed_metrics == ()


def test_a64_example_in_legacy_mode_has_the_raw_names():
    """GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION=false: A64 as first written."""
    got = one_locality(LEGACY, A64_REPORTS)
    assert got.load_metric_stats == (("key1", (1, 1.0)), ("key2", (2, 5.0)), ("key3", (1, 4.0)))


def test_listed_named_metrics_only():
    got = one_locality(BackendMetricPropagation(named_keys=frozenset({"key2"})), A64_REPORTS)
    assert got.load_metric_stats == (("named_metrics.key2", (2, 5.0)),)


def test_top_level_utilizations_count_every_report_zeros_included():
    """C-core adds cpu/mem/application for every call that carried a
    report, whatever the value (seen: mem 0.0 counted 5 times)."""
    reports = (
        OrcaLoadReport(cpu_utilization=0.5, application_utilization=0.25),
        OrcaLoadReport(cpu_utilization=0.25),
    )
    got = one_locality(TOP, reports)
    assert dict(got.unnamed_metrics) == {
        "cpu_utilization": (2, 0.75),
        "mem_utilization": (2, 0.0),
        "application_utilization": (2, 0.25),
    }
    assert got.load_metric_stats == ()


def test_no_propagation_counts_nothing():
    for propagation in (None, BackendMetricPropagation()):
        got = one_locality(propagation, A64_REPORTS)
        assert got.load_metric_stats == () and got.unnamed_metrics == ()
        assert got.total_successful_requests == 3


def test_metrics_are_reset_by_each_report():
    store = LoadStore(FakeClock())
    stats = store.locality_stats(SERVER, "c", "svc", loc("a"), ALL_NAMED)
    stats.add_backend_metrics(A64_REPORTS[0])
    (first,) = store.take_report(SERVER, True, ())
    assert first.localities[0].load_metric_stats
    (second,) = store.take_report(SERVER, True, ())
    assert second.localities[0].load_metric_stats == ()
    assert second.is_zero


def test_a_report_with_only_metrics_is_not_zero():
    report = LocalityLoadReport(loc("a"), load_metric_stats=(("named_metrics.x", (1, 2.0)),))
    assert not report.is_zero


def test_one_locality_under_two_propagations_is_one_entry():
    """A85: the propagation is a key of the locality stats; a cluster whose
    config changed reports one UpstreamLocalityStats per locality."""
    store = LoadStore(FakeClock())
    old = store.locality_stats(SERVER, "c", "svc", loc("a"), ALL_NAMED)
    new = store.locality_stats(SERVER, "c", "svc", loc("a"), TOP)
    assert old is not new
    for stats in (old, new):
        stats.call_started()
        stats.add_backend_metrics(OrcaLoadReport(cpu_utilization=0.5, named_metrics={"q": 2.0}))
        stats.call_finished(True)
    (cluster,) = store.take_report(SERVER, True, ())
    (merged,) = cluster.localities
    assert merged.total_successful_requests == 2
    assert merged.load_metric_stats == (("named_metrics.q", (1, 2.0)),)
    assert dict(merged.unnamed_metrics)["cpu_utilization"] == (1, 0.5)


def test_unsent_reports_merge_metrics_too():
    older = one_locality(ALL_NAMED, A64_REPORTS[:1])
    newer = one_locality(ALL_NAMED, A64_REPORTS[1:])
    from pyxds.xds.load_store import ClusterLoadReport

    (merged,) = merge_reports(
        [ClusterLoadReport("c", "svc", 1.0, (older,))],
        [ClusterLoadReport("c", "svc", 1.0, (newer,))],
    )
    assert merged.localities[0].load_metric_stats == (
        ("named_metrics.key1", (1, 1.0)),
        ("named_metrics.key2", (2, 5.0)),
        ("named_metrics.key3", (1, 4.0)),
    )


def test_the_lrs_proto_carries_c_core_s_fields():
    from pyxds.xds.load_store import ClusterLoadReport

    reports = (OrcaLoadReport(cpu_utilization=0.5, named_metrics={"foo": 3.0}),)
    propagation = BackendMetricPropagation(cpu_utilization=True, named_all=True)
    loc_report = one_locality(propagation, reports)
    stats = cluster_stats_proto(ClusterLoadReport("c", "svc", 1.0, (loc_report,)))
    (upstream,) = stats.upstream_locality_stats
    assert upstream.cpu_utilization.num_requests_finished_with_metric == 1
    assert upstream.cpu_utilization.total_metric_value == 0.5
    assert not upstream.HasField("mem_utilization")
    (named,) = upstream.load_metric_stats
    assert (named.metric_name, named.num_requests_finished_with_metric) == ("named_metrics.foo", 1)
    assert named.total_metric_value == 3.0


# -- through xds_cluster_impl's picks -------------------------------------------------------


def start(client, propagation, helper=None, child=None):
    """xds_cluster_impl over ``child`` (round_robin by default) on one
    endpoint, connected."""
    from pyxds.testing import FakeHelper

    name = f"lrs-metrics-{next(_names)}"
    helper = helper or FakeHelper(seed=3)
    cluster = eds_cluster(name, eds_service_name="svc", lrs_server=True, lrs_metrics=propagation)
    lo = locality(loc("a"), ["10.0.0.1:80"])
    xds = make_xds_config({name: eds_entry(cluster, [lo])})
    _, policy, config = build(
        [
            {
                "xds_cluster_impl_experimental": {
                    "clusterName": name,
                    "childPolicy": [child or {"round_robin": {}}],
                }
            }
        ],
        helper,
    )
    endpoints = [Endpoint(a.addresses, {"locality": lo.name}) for a in lo.endpoints]
    attrs = {**attributes(xds), XDS_CLIENT_ATTRIBUTE: client}
    assert policy.update(ResolverUpdate(endpoints, config, attrs)) is None
    connect_all(helper)
    return helper, policy


def call(helper, report: OrcaLoadReport | None) -> None:
    result = helper.pick()
    assert isinstance(result, PickComplete)
    if report is not None:
        assert result.on_call_trailers is not None
        result.on_call_trailers(((ORCA_TRAILER_MIRROR, report.SerializeToString()),))
    elif result.on_call_trailers is not None:
        result.on_call_trailers((("x-other", "1"),))
    result.on_call_done(OK)


@pytest.mark.parametrize("propagation", [ALL_NAMED, LEGACY])
def test_calls_through_cluster_impl_report_their_orca_metrics(propagation):
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        helper, _ = start(client, propagation)
        for report in (*A64_REPORTS, None):
            call(helper, report)
        (transport,) = transports
        transport.respond(interval=1.0)
        clock.advance(1.0)
        (request,) = transport.reports()
        (stats,) = request.cluster_stats
        (upstream,) = stats.upstream_locality_stats
        assert upstream.total_successful_requests == 4
        prefix = "" if propagation.legacy else "named_metrics."
        assert [
            (m.metric_name, m.num_requests_finished_with_metric, m.total_metric_value)
            for m in upstream.load_metric_stats
        ] == [(f"{prefix}key1", 1, 1.0), (f"{prefix}key2", 2, 5.0), (f"{prefix}key3", 1, 4.0)]
    finally:
        client.close()


def test_a_cluster_without_propagation_adds_no_trailers_hook():
    clock = FakeClock()
    client, _transports = lrs_client(clock)
    try:
        helper, _ = start(client, BackendMetricPropagation())
        result = helper.pick()
        assert result.on_call_trailers is None  # the plain pick stays plain
        result.on_call_done(OK)
    finally:
        client.close()
