"""The LRS protocol of one ``StreamLoadStats`` stream, sans-IO (gRFC A27
"Load Reporting"; Envoy ``envoy.service.load_stats.v3.LoadReportingService``).

    state = LrsStreamState(node)
    send(state.initial_request())           # node + client feature
    changed = state.on_response(response)   # True: (re)start the report timer
    request = state.report_request(reports) # None: nothing to send this time

Rules (C-core's LrsClient, which pyxds follows):

* The first request carries only the node, with the client feature
  ``envoy.lrs.supports_send_all_clusters`` and without the ADS-only
  ``xds.config.resource-in-sotw`` (C-core's LRS node has the same features).
* A response sets which clusters to report (``send_all_clusters`` or the
  ``clusters`` list) and the interval, raised to at least
  :data:`MIN_LOAD_REPORTING_INTERVAL` (1 s).  A response identical to the
  current settings changes nothing; a new interval restarts the timer.
* Reports start only after the first response.  A report whose counts are
  all zero is sent once; the following all-zero ones are skipped until
  something is counted again.
* Each ``ClusterStats`` carries the cluster name, the EDS service name when
  not empty, one ``UpstreamLocalityStats`` per locality (its ``locality``
  message always present, empty for the unnamed locality of a LOGICAL_DNS
  cluster, as C-core writes it; with the backend
  metrics of A64/A85: ``cpu_utilization``, ``mem_utilization``,
  ``application_utilization`` and ``load_metric_stats``, when counted),
  ``dropped_requests`` per category, ``total_dropped_requests``
  (categorized plus uncategorized) and the measured ``load_report_interval``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyxds.xds.load_store import ClusterLoadReport

if TYPE_CHECKING:  # LRS's protos load with the first cluster reporting load
    from envoy.config.core.v3 import base_pb2
    from envoy.config.endpoint.v3 import load_report_pb2
    from envoy.service.load_stats.v3 import lrs_pb2

__all__ = [
    "LRS_CLIENT_FEATURE",
    "LRS_METHOD",
    "MIN_LOAD_REPORTING_INTERVAL",
    "LrsStreamState",
    "cluster_stats_proto",
]

LRS_METHOD = "/envoy.service.load_stats.v3.LoadReportingService/StreamLoadStats"
LRS_CLIENT_FEATURE = "envoy.lrs.supports_send_all_clusters"
MIN_LOAD_REPORTING_INTERVAL = 1.0
"""Seconds; shorter intervals asked by the server are raised to this (C-core's minimum)."""
_ADS_ONLY_FEATURES = frozenset({"xds.config.resource-in-sotw"})


def _set_locality(proto: base_pb2.Locality, locality: object) -> None:
    # Always present, even with every field empty (a LOGICAL_DNS cluster's
    # unnamed locality): C-core's LRS request always carries the message.
    proto.SetInParent()
    for name in ("region", "zone", "sub_zone"):
        value = getattr(locality, name, "")
        if value:
            setattr(proto, name, value)


def cluster_stats_proto(report: ClusterLoadReport) -> load_report_pb2.ClusterStats:
    """The ``ClusterStats`` of one report."""
    from envoy.config.endpoint.v3 import load_report_pb2

    stats = load_report_pb2.ClusterStats(cluster_name=report.cluster)
    if report.eds_service_name:
        stats.cluster_service_name = report.eds_service_name
    for loc in report.localities:
        out = stats.upstream_locality_stats.add(
            total_successful_requests=loc.total_successful_requests,
            total_requests_in_progress=loc.total_requests_in_progress,
            total_error_requests=loc.total_error_requests,
            total_issued_requests=loc.total_issued_requests,
        )
        _set_locality(out.locality, loc.locality)
        for name, (count, total) in loc.unnamed_metrics:  # A85 top-level fields
            field = getattr(out, name)
            field.num_requests_finished_with_metric = count
            field.total_metric_value = total
        for name, (count, total) in loc.load_metric_stats:  # A64 (names per A85)
            out.load_metric_stats.add(
                metric_name=name,
                num_requests_finished_with_metric=count,
                total_metric_value=total,
            )
    for category, count in report.dropped_requests.items():
        stats.dropped_requests.add(category=category, dropped_count=count)
    stats.total_dropped_requests = report.total_dropped_requests
    interval = max(0.0, report.load_report_interval)
    seconds, nanos = divmod(round(interval * 1e9), 1_000_000_000)
    stats.load_report_interval.seconds = seconds
    stats.load_report_interval.nanos = nanos
    return stats


class LrsStreamState:
    """One LRS stream's protocol state (see the module docstring)."""

    def __init__(
        self, node: base_pb2.Node | None, min_interval: float = MIN_LOAD_REPORTING_INTERVAL
    ) -> None:
        self._node = node
        self._min_interval = min_interval
        self.seen_response = False
        self.send_all_clusters = False
        self.clusters: frozenset[str] = frozenset()
        self.interval: float | None = None
        self._last_was_zero = False

    def initial_request(self) -> lrs_pb2.LoadStatsRequest:
        from envoy.service.load_stats.v3 import lrs_pb2

        request = lrs_pb2.LoadStatsRequest()
        if self._node is not None:
            request.node.CopyFrom(self._node)
            features = [f for f in request.node.client_features if f not in _ADS_ONLY_FEATURES]
            del request.node.client_features[:]
            request.node.client_features.extend(features)
        if LRS_CLIENT_FEATURE not in request.node.client_features:
            request.node.client_features.append(LRS_CLIENT_FEATURE)
        return request

    def on_response(self, response: lrs_pb2.LoadStatsResponse) -> bool:
        """Apply a response; True when the report timer must (re)start."""
        self.seen_response = True
        send_all = bool(response.send_all_clusters)
        clusters = frozenset() if send_all else frozenset(response.clusters)
        d = response.load_reporting_interval
        interval = max(self._min_interval, d.seconds + d.nanos / 1e9)
        restart: bool = interval != self.interval
        self.send_all_clusters = send_all
        self.clusters = clusters
        self.interval = interval
        return restart

    def report_request(
        self, reports: Sequence[ClusterLoadReport]
    ) -> lrs_pb2.LoadStatsRequest | None:
        """The request for one interval's reports, or None when it and the
        previous one are both all zero."""
        zero = all(r.is_zero for r in reports)
        skip = zero and self._last_was_zero
        self._last_was_zero = zero
        if skip:
            return None
        from envoy.service.load_stats.v3 import lrs_pb2

        request = lrs_pb2.LoadStatsRequest()
        for report in reports:
            request.cluster_stats.append(cluster_stats_proto(report))
        return request
