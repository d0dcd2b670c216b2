"""The load-report store: what xds_cluster_impl counts and LRS reports
(gRFC A27 "Load Reporting", A37 "xds_cluster_impl_experimental LB Policy").

One store per :class:`pyxds.xds.client.XdsClient` (so one per bootstrap in
the process, shared by every channel and cluster using that client).  It is
keyed by ``(LRS server, cluster, EDS service name)`` and, below that, by
locality:

* :class:`DropStats`: per (server, cluster, EDS service name): EDS drops per
  category and uncategorized drops (the circuit breaker's);
* :class:`LocalityStats`: per (server, cluster, EDS service name, locality,
  backend metric propagation): calls issued, succeeded, failed, (derived) in
  progress, and the ORCA backend metrics of finished calls (A64 as amended
  by A85, below).

Stats objects are shared: :meth:`LoadStore.drop_stats` and
:meth:`LoadStore.locality_stats` return the live object for the key (made on
first use) and take a reference; :meth:`LoadStore.release` gives it back.  A
released object stays in the store until the next report has taken its last
counts (A27: a cluster that stops reporting is flushed once more); a
locality's object stays while calls started on it are still in progress, as
C-core's calls keep their locality stats alive.

Counting is lock-free and lossless: every count is a cumulative
``itertools.count`` (one ``next()`` is atomic in CPython) and a report takes
the difference from the values the previous report saw, so a call counted
while a report is being built shows up in this report or the next one, never
in neither and never in both.  The store's maps take a lock (made/released
from LB serializers, read by the LRS client).

:meth:`LoadStore.take_report` builds the :class:`ClusterLoadReport` list of
one server (C-core's BuildLoadReportSnapshotLocked): every entry of that
server is snapshotted (so counts of clusters the LRS server did not ask for
are dropped, not carried into a later report) and its measured interval
restarts; only the asked-for clusters are returned.  Stats of one locality
kept under several propagation configs (a cluster's config changed) are
added up into one locality entry.

Backend metrics (gRFC A64, A85; C-core's ``AddCallFinished``):
:meth:`LocalityStats.add_backend_metrics` takes the ORCA report a finished
call carried (each report counts once per metric it contributes).  With a
:class:`~pyxds.xds.resources.types.BackendMetricPropagation` from the
cluster's ``lrs_report_endpoint_metrics``: ``cpu_utilization``,
``mem_utilization`` and ``application_utilization`` each add the report's
value (0 included) and one request to the locality's field of that name;
``named_metrics.*`` (or ``named_metrics.<key>``) adds each (listed) entry of
the report's ``named_metrics`` under ``named_metrics.<key>`` in
``load_metric_stats``.  In the legacy mode (A64 before A85, when
GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION is false) every named metric is
added under its own name.  Sums are taken under a per-locality lock (only
calls that carried a report take it) and reset by each report.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Hashable
from dataclasses import field, replace
from typing import Any

from pyxds._values import dataclass
from pyxds.clock import Clock

__all__ = [
    "merge_reports",
    "ClusterLoadReport",
    "DropStats",
    "LoadStore",
    "LocalityLoadReport",
    "LocalityStats",
]


def _value(counter: itertools.count[int]) -> int:
    """The next value ``counter`` would return (= how many times it counted)."""
    return int(repr(counter)[6:-1])


#: (number of requests finished with the metric, total of its values)
MetricTotal = tuple[int, float]
#: the top-level ORCA utilizations A85 reports in fields of their own
UNNAMED_METRICS = ("cpu_utilization", "mem_utilization", "application_utilization")


def _add_totals(
    a: tuple[tuple[str, MetricTotal], ...], b: tuple[tuple[str, MetricTotal], ...]
) -> tuple[tuple[str, MetricTotal], ...]:
    merged: dict[str, MetricTotal] = dict(a)
    for name, (count, total) in b:
        old = merged.get(name, (0, 0.0))
        merged[name] = (old[0] + count, old[1] + total)
    return tuple(sorted(merged.items()))


@dataclass(frozen=True)
class LocalityLoadReport:
    """One locality's ``UpstreamLocalityStats`` of one interval.
    ``load_metric_stats``: (metric name, (requests, total)) sorted by name;
    ``unnamed_metrics``: the same for the A85 top-level fields
    (``cpu_utilization``...), only those counted."""

    locality: Any
    total_successful_requests: int = 0
    total_requests_in_progress: int = 0
    total_error_requests: int = 0
    total_issued_requests: int = 0
    load_metric_stats: tuple[tuple[str, MetricTotal], ...] = ()
    unnamed_metrics: tuple[tuple[str, MetricTotal], ...] = ()

    @property
    def is_zero(self) -> bool:
        return not (
            self.total_successful_requests
            or self.total_requests_in_progress
            or self.total_error_requests
            or self.total_issued_requests
            or self.load_metric_stats
            or self.unnamed_metrics
        )

    def plus(self, other: LocalityLoadReport) -> LocalityLoadReport:
        """Both intervals' counts added (``other``'s in-progress gauge)."""
        return LocalityLoadReport(
            self.locality,
            self.total_successful_requests + other.total_successful_requests,
            other.total_requests_in_progress,
            self.total_error_requests + other.total_error_requests,
            self.total_issued_requests + other.total_issued_requests,
            _add_totals(self.load_metric_stats, other.load_metric_stats),
            _add_totals(self.unnamed_metrics, other.unnamed_metrics),
        )


@dataclass(frozen=True)
class ClusterLoadReport:
    """One ``ClusterStats`` of one interval; ``load_report_interval`` in
    seconds, measured on the store's clock since the previous report of the
    same (cluster, EDS service name)."""

    cluster: str
    eds_service_name: str
    load_report_interval: float
    localities: tuple[LocalityLoadReport, ...] = ()
    dropped_requests: dict[str, int] = field(default_factory=dict)
    uncategorized_drops: int = 0

    @property
    def total_dropped_requests(self) -> int:
        """Categorized plus uncategorized drops (C-core's total)."""
        return self.uncategorized_drops + sum(self.dropped_requests.values())

    @property
    def is_zero(self) -> bool:
        return (
            not self.uncategorized_drops
            and not any(self.dropped_requests.values())
            and all(loc.is_zero for loc in self.localities)
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view (config dumps)."""
        return {
            "cluster_name": self.cluster,
            "cluster_service_name": self.eds_service_name,
            "load_report_interval": round(self.load_report_interval, 6),
            "upstream_locality_stats": [_locality_json(loc) for loc in self.localities],
            "dropped_requests": dict(self.dropped_requests),
            "total_dropped_requests": self.total_dropped_requests,
        }


def _locality_json(loc: LocalityLoadReport) -> dict[str, Any]:
    out: dict[str, Any] = {
        "locality": str(loc.locality),
        "total_successful_requests": loc.total_successful_requests,
        "total_requests_in_progress": loc.total_requests_in_progress,
        "total_error_requests": loc.total_error_requests,
        "total_issued_requests": loc.total_issued_requests,
    }
    for name, (count, total) in loc.unnamed_metrics:
        out[name] = {"num_requests_finished_with_metric": count, "total_metric_value": total}
    if loc.load_metric_stats:
        out["load_metric_stats"] = [
            {
                "metric_name": name,
                "num_requests_finished_with_metric": count,
                "total_metric_value": total,
            }
            for name, (count, total) in loc.load_metric_stats
        ]
    return out


def merge_reports(
    older: list[ClusterLoadReport], newer: list[ClusterLoadReport]
) -> list[ClusterLoadReport]:
    """``newer`` with the counts of ``older`` (a report that could not be
    sent) added: counts and intervals add up, in-progress gauges are the
    newer ones.  Clusters only in ``older`` are kept as they are."""
    by_key = {(r.cluster, r.eds_service_name): r for r in older}
    out = []
    for report in newer:
        old = by_key.pop((report.cluster, report.eds_service_name), None)
        if old is None:
            out.append(report)
            continue
        localities = {loc.locality: loc for loc in report.localities}
        for prev in old.localities:
            cur = localities.get(prev.locality)
            localities[prev.locality] = prev if cur is None else prev.plus(cur)
        dropped = dict(old.dropped_requests)
        for category, count in report.dropped_requests.items():
            dropped[category] = dropped.get(category, 0) + count
        out.append(
            ClusterLoadReport(
                report.cluster,
                report.eds_service_name,
                old.load_report_interval + report.load_report_interval,
                tuple(localities.values()),
                dropped,
                old.uncategorized_drops + report.uncategorized_drops,
            )
        )
    out.extend(by_key.values())
    return out


class DropStats:
    """Drops of one (server, cluster, EDS service name).  ``add(category)``
    counts an EDS drop, ``add(None)`` an uncategorized (circuit-breaker) drop.
    """

    __slots__ = ("key", "_categories", "_uncategorized", "_seen", "_seen_uncategorized", "refs")

    def __init__(self, key: tuple[Hashable, str, str]) -> None:
        self.key = key
        self._categories: dict[str, itertools.count[int]] = {}
        self._uncategorized = itertools.count()
        self._seen: dict[str, int] = {}
        self._seen_uncategorized = 0
        self.refs = 0

    def add(self, category: str | None) -> None:
        if category is None:
            next(self._uncategorized)
            return
        counter = self._categories.get(category)
        if counter is None:
            # setdefault is atomic: racing first drops share one counter.
            counter = self._categories.setdefault(category, itertools.count())
        next(counter)

    def _take(self) -> tuple[dict[str, int], int]:
        """Counts since the previous take (report side, under the store lock)."""
        dropped: dict[str, int] = {}
        for category, counter in list(self._categories.items()):
            total = _value(counter)
            delta = total - self._seen.get(category, 0)
            self._seen[category] = total
            if delta:
                dropped[category] = delta
        total = _value(self._uncategorized)
        uncategorized = total - self._seen_uncategorized
        self._seen_uncategorized = total
        return dropped, uncategorized

    def __repr__(self) -> str:
        return f"DropStats({self.key!r}, refs={self.refs})"


class LocalityStats:
    """Calls of one (server, cluster, EDS service name, locality), counted per
    RPC attempt: ``call_started()`` when a pick completes on this locality,
    ``call_finished(ok)`` when that attempt ends, or ``call_not_started()``
    when the channel could not start it (then it is not counted at all);
    ``add_backend_metrics(report)`` before ``call_finished`` when the attempt
    carried an ORCA report (module docstring, ``propagation``)."""

    __slots__ = (
        "key",
        "locality",
        "propagation",
        "_issued",
        "_succeeded",
        "_failed",
        "_not_started",
        "_seen",
        "_metrics_lock",
        "_named",
        "_unnamed",
        "wants_backend_metrics",
        "refs",
    )

    def __init__(
        self, key: tuple[Hashable, str, str], locality: Any, propagation: Any = None
    ) -> None:
        self.key = key
        self.locality = locality
        #: a BackendMetricPropagation, or None: no backend metrics
        self.propagation = propagation
        self._issued = itertools.count()
        self._succeeded = itertools.count()
        self._failed = itertools.count()
        self._not_started = itertools.count()
        self._seen = (0, 0, 0)
        self._metrics_lock = threading.Lock()
        self._named: dict[str, list[float]] = {}
        self._unnamed: dict[str, list[float]] = {}
        #: the propagation asks for ORCA metrics (xds_cluster_impl then reads
        #: each attempt's trailers)
        self.wants_backend_metrics = propagation is not None and not propagation.empty
        self.refs = 0

    def add_backend_metrics(self, report: Any) -> None:
        """Count one finished call's ORCA report (A64/A85 propagation)."""
        p = self.propagation
        if p is None or p.empty:
            return
        with self._metrics_lock:
            named = self._named
            if p.legacy:
                for key, value in report.named_metrics.items():
                    _bump(named, key, value)
                return
            unnamed = self._unnamed
            if p.cpu_utilization:
                _bump(unnamed, "cpu_utilization", report.cpu_utilization)
            if p.mem_utilization:
                _bump(unnamed, "mem_utilization", report.mem_utilization)
            if p.application_utilization:
                _bump(unnamed, "application_utilization", report.application_utilization)
            if p.named_all:
                for key, value in report.named_metrics.items():
                    _bump(named, f"named_metrics.{key}", value)
            elif p.named_keys:
                keys = p.named_keys
                for key, value in report.named_metrics.items():
                    if key in keys:
                        _bump(named, f"named_metrics.{key}", value)

    def call_started(self) -> None:
        next(self._issued)

    def call_finished(self, ok: bool) -> None:
        next(self._succeeded if ok else self._failed)

    def call_not_started(self) -> None:
        """A picked attempt the channel could not start: uncount it."""
        next(self._not_started)

    @property
    def in_progress(self) -> int:
        finished = _value(self._succeeded) + _value(self._failed)
        return _value(self._issued) - _value(self._not_started) - finished

    def _take(self) -> LocalityLoadReport:
        # Finished counts first: a call that finishes between the reads is
        # then still in progress in this report, never negative.
        succeeded = _value(self._succeeded)
        failed = _value(self._failed)
        not_started = _value(self._not_started)
        issued = _value(self._issued) - not_started
        seen_issued, seen_succeeded, seen_failed = self._seen
        self._seen = (issued, succeeded, failed)
        named: tuple[tuple[str, MetricTotal], ...] = ()
        unnamed: tuple[tuple[str, MetricTotal], ...] = ()
        if self._named or self._unnamed:
            with self._metrics_lock:
                taken_named, self._named = self._named, {}
                taken_unnamed, self._unnamed = self._unnamed, {}
            named = tuple(sorted((k, (int(v[0]), v[1])) for k, v in taken_named.items()))
            unnamed = tuple(
                (k, (int(taken_unnamed[k][0]), taken_unnamed[k][1]))
                for k in UNNAMED_METRICS
                if k in taken_unnamed
            )
        return LocalityLoadReport(
            self.locality,
            total_successful_requests=succeeded - seen_succeeded,
            total_requests_in_progress=issued - succeeded - failed,
            total_error_requests=failed - seen_failed,
            total_issued_requests=issued - seen_issued,
            load_metric_stats=named,
            unnamed_metrics=unnamed,
        )

    def __repr__(self) -> str:
        return f"LocalityStats({self.key!r}, {self.locality}, refs={self.refs})"


def _bump(totals: dict[str, list[float]], name: str, value: float) -> None:
    entry = totals.get(name)
    if entry is None:
        totals[name] = [1, value]
    else:
        entry[0] += 1
        entry[1] += value


class _ClusterEntry:
    __slots__ = ("drops", "localities", "last_report")

    def __init__(self, now: float) -> None:
        self.drops: DropStats | None = None
        #: (locality, propagation) -> its stats
        self.localities: dict[tuple[Any, Any], LocalityStats] = {}
        self.last_report = now

    def live(self) -> bool:
        return (self.drops is not None and self.drops.refs > 0) or any(
            s.refs > 0 for s in self.localities.values()
        )


class LoadStore:
    """See the module docstring.  ``on_needed(server)`` is called (outside the
    lock) when a server gets its first stats object, so the LRS stream to it
    can start; ``server`` is whatever the caller passed (a bootstrap server),
    ``key_of(server)`` its hashable identity."""

    def __init__(
        self,
        clock: Clock,
        on_needed: Callable[[Any], None] | None = None,
        key_of: Callable[[Any], Hashable] = lambda server: server,
    ) -> None:
        self._clock = clock
        self._on_needed = on_needed
        self._key_of = key_of
        self._lock = threading.Lock()
        self._servers: dict[Hashable, dict[tuple[str, str], _ClusterEntry]] = {}

    # -- LB side ----------------------------------------------------------------

    def drop_stats(self, server: Any, cluster: str, eds_service_name: str | None) -> DropStats:
        """The shared drop stats of the key, with one more reference."""
        skey = self._key_of(server)
        with self._lock:
            entry, new_server = self._entry(skey, cluster, eds_service_name or "")
            stats = entry.drops
            if stats is None:
                stats = entry.drops = DropStats((skey, cluster, eds_service_name or ""))
            stats.refs += 1
        if new_server and self._on_needed is not None:
            self._on_needed(server)
        return stats

    def locality_stats(
        self,
        server: Any,
        cluster: str,
        eds_service_name: str | None,
        locality: Any,
        propagation: Any = None,
    ) -> LocalityStats:
        """The shared stats of one locality (and backend metric
        propagation, A85), with one more reference."""
        skey = self._key_of(server)
        with self._lock:
            entry, new_server = self._entry(skey, cluster, eds_service_name or "")
            stats = entry.localities.get((locality, propagation))
            if stats is None:
                stats = LocalityStats(
                    (skey, cluster, eds_service_name or ""), locality, propagation
                )
                entry.localities[(locality, propagation)] = stats
            stats.refs += 1
        if new_server and self._on_needed is not None:
            self._on_needed(server)
        return stats

    def release(self, stats: DropStats | LocalityStats) -> None:
        """Give back one reference; the last one leaves the stats to be
        flushed by the next report."""
        with self._lock:
            if stats.refs > 0:
                stats.refs -= 1

    def _entry(self, skey: Hashable, cluster: str, eds: str) -> tuple[_ClusterEntry, bool]:
        clusters = self._servers.get(skey)
        new_server = clusters is None or not clusters
        if clusters is None:
            clusters = self._servers[skey] = {}
        entry = clusters.get((cluster, eds))
        if entry is None:
            entry = clusters[(cluster, eds)] = _ClusterEntry(self._clock.now())
        return entry, new_server

    # -- LRS side ----------------------------------------------------------------

    def has_stats(self, server: Any) -> bool:
        """True while the server has any stats (live, or waiting for a last flush)."""
        with self._lock:
            return bool(self._servers.get(self._key_of(server)))

    def take_report(
        self, server: Any, send_all_clusters: bool, clusters: Collection[str]
    ) -> list[ClusterLoadReport]:
        """Snapshot every (cluster, EDS service name) of ``server`` and restart
        its interval; return the reports of the clusters asked for."""
        skey = self._key_of(server)
        now = self._clock.now()
        out: list[ClusterLoadReport] = []
        with self._lock:
            entries = self._servers.get(skey)
            if not entries:
                return out
            for (cluster, eds), entry in list(entries.items()):
                dropped: dict[str, int] = {}
                uncategorized = 0
                if entry.drops is not None:
                    dropped, uncategorized = entry.drops._take()
                    if entry.drops.refs == 0:
                        entry.drops = None
                localities: dict[Any, LocalityLoadReport] = {}
                for name, stats in list(entry.localities.items()):
                    load = stats._take()
                    same = localities.get(load.locality)
                    if same is None:
                        localities[load.locality] = load
                    else:  # one locality under two propagation configs
                        merged = same.plus(load)
                        in_progress = same.total_requests_in_progress
                        localities[load.locality] = replace(
                            merged,
                            total_requests_in_progress=in_progress
                            + load.total_requests_in_progress,
                        )
                    if stats.refs == 0 and load.total_requests_in_progress == 0:
                        del entry.localities[name]
                interval = now - entry.last_report
                entry.last_report = now
                if send_all_clusters or cluster in clusters:
                    out.append(
                        ClusterLoadReport(
                            cluster,
                            eds,
                            interval,
                            tuple(localities.values()),
                            dropped,
                            uncategorized,
                        )
                    )
                if entry.drops is None and not entry.localities:
                    del entries[(cluster, eds)]
            if not entries:
                del self._servers[skey]
        return out

    def servers(self) -> list[Hashable]:
        with self._lock:
            return list(self._servers)
