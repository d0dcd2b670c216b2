"""The management server's LRS service (gRFC A27 "Load Reporting"; Envoy
``envoy.service.load_stats.v3.LoadReportingService/StreamLoadStats``).

Per stream: the first request names the node; the server answers with its
current settings (``send_all_clusters`` or a ``clusters`` list, and
``load_reporting_interval``) and again whenever they change
(:meth:`LrsService.configure`).  Every later request is recorded as one
:class:`LoadReportRecord` per ``ClusterStats``, so tests and ``pyxds serve``
users can read what each client reported (:meth:`LrsService.reports`,
:meth:`LrsService.totals`), and counted per node, an empty one too
(:meth:`LrsService.report_count`: a client's report timer fired).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field
from types import EllipsisType
from typing import Any

import grpc
from envoy.config.endpoint.v3 import load_report_pb2
from envoy.service.load_stats.v3 import lrs_pb2, lrs_pb2_grpc
from google.protobuf import json_format

from pyxds._values import dataclass

__all__ = ["LoadReportRecord", "LoadTotals", "LrsService"]

_log = logging.getLogger(__name__)
_END = object()
_CHANGED = object()


@dataclass(frozen=True)
class LoadReportRecord:
    """One ``ClusterStats`` a client sent, with its node id, its client
    features (from the stream's first request), the stream's number and the
    (monotonic) time it arrived."""

    node_id: str
    stream: int
    received_at: float
    stats: load_report_pb2.ClusterStats
    client_features: tuple[str, ...] = ()

    @property
    def cluster(self) -> str:
        name: str = self.stats.cluster_name
        return name

    def to_json(self) -> dict[str, Any]:
        """The node id and the ClusterStats in proto JSON (field names as in the proto)."""
        return {
            "node_id": self.node_id,
            "cluster_stats": json_format.MessageToDict(
                self.stats, preserving_proto_field_name=True
            ),
        }

    @property
    def eds_service_name(self) -> str:
        name: str = self.stats.cluster_service_name
        return name


@dataclass
class LoadTotals:
    """Reports of one cluster summed over every interval."""

    issued: dict[tuple[str, str, str], int] = field(default_factory=dict)
    succeeded: dict[tuple[str, str, str], int] = field(default_factory=dict)
    errors: dict[tuple[str, str, str], int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    total_dropped: int = 0
    reports: int = 0
    last_in_progress: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def add(self, stats: load_report_pb2.ClusterStats) -> None:
        self.reports += 1
        for loc in stats.upstream_locality_stats:
            key = (loc.locality.region, loc.locality.zone, loc.locality.sub_zone)
            self.issued[key] = self.issued.get(key, 0) + loc.total_issued_requests
            self.succeeded[key] = self.succeeded.get(key, 0) + loc.total_successful_requests
            self.errors[key] = self.errors.get(key, 0) + loc.total_error_requests
            self.last_in_progress[key] = loc.total_requests_in_progress
        for drop in stats.dropped_requests:
            self.dropped[drop.category] = self.dropped.get(drop.category, 0) + drop.dropped_count
        self.total_dropped += stats.total_dropped_requests

    def counts(self) -> dict[str, Any]:
        """The totals without the bookkeeping (for equality checks), zero
        entries left out."""
        return {
            "issued": {k: v for k, v in self.issued.items() if v},
            "succeeded": {k: v for k, v in self.succeeded.items() if v},
            "errors": {k: v for k, v in self.errors.items() if v},
            "dropped": {k: v for k, v in self.dropped.items() if v},
            "total_dropped": self.total_dropped,
        }


class _LrsStream:
    def __init__(self, service: LrsService, number: int) -> None:
        self.service = service
        self.number = number
        # a LoadStatsRequest (no stubs: Any), _CHANGED or _END
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.node_id = ""
        self.client_features: tuple[str, ...] = ()

    def _read(self, requests: Iterator[lrs_pb2.LoadStatsRequest]) -> None:
        try:
            for request in requests:
                self.events.put(request)
        except Exception:  # the RPC ended (cancelled, reset)
            pass
        finally:
            self.events.put(_END)

    def run(
        self, requests: Iterator[lrs_pb2.LoadStatsRequest], context: grpc.ServicerContext
    ) -> Iterator[lrs_pb2.LoadStatsResponse]:
        context.add_callback(lambda: self.events.put(_END))
        threading.Thread(
            target=self._read, args=(requests,), name="pyxds-lrs-reader", daemon=True
        ).start()
        started = False
        self.service._attach(self)
        try:
            while True:
                event = self.events.get()
                if event is _END:
                    return
                if event is _CHANGED:
                    if started:
                        yield self.service._response()
                    continue
                if not started:
                    started = True
                    self.node_id = event.node.id
                    self.client_features = tuple(event.node.client_features)
                    self.service._record_initial(self, event)
                    yield self.service._response()
                    if not event.cluster_stats:
                        continue
                self.service._record(self, event)
        finally:
            self.service._detach(self)


# xds-protos' generated servicer base has no stubs (it is Any to mypy)
class LrsService(lrs_pb2_grpc.LoadReportingServiceServicer):  # type: ignore[misc]  # no stubs
    """See the module docstring.  ``interval`` in seconds; ``clusters`` None
    asks for every cluster (``send_all_clusters``)."""

    def __init__(
        self,
        interval: float = 1.0,
        clusters: Sequence[str] | None = None,
    ) -> None:
        self._interval = interval
        self._clusters = None if clusters is None else tuple(clusters)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._streams: list[_LrsStream] = []
        self._records: list[LoadReportRecord] = []
        self._initial: list[lrs_pb2.LoadStatsRequest] = []
        self._total_streams = 0
        self._report_counts: dict[str, int] = {}
        #: Called with each LoadReportRecord as it arrives (on the stream's
        #: thread; e.g. ``pyxds serve --print-load-reports``).
        self.on_report: Callable[[LoadReportRecord], None] | None = None

    # -- settings ------------------------------------------------------------

    def configure(
        self, interval: float | None = None, clusters: Sequence[str] | EllipsisType | None = ...
    ) -> None:
        """Change the interval and/or clusters (None: all) and tell every open stream."""
        with self._lock:
            if interval is not None:
                self._interval = interval
            if not isinstance(clusters, EllipsisType):
                self._clusters = None if clusters is None else tuple(clusters)
            streams = list(self._streams)
        for stream in streams:
            stream.events.put(_CHANGED)

    def _response(self) -> lrs_pb2.LoadStatsResponse:
        with self._lock:
            interval, clusters = self._interval, self._clusters
        response = lrs_pb2.LoadStatsResponse()
        if clusters is None:
            response.send_all_clusters = True
        else:
            response.clusters.extend(clusters)
        seconds, nanos = divmod(round(interval * 1e9), 1_000_000_000)
        response.load_reporting_interval.seconds = seconds
        response.load_reporting_interval.nanos = nanos
        return response

    # -- the RPC ---------------------------------------------------------------

    def StreamLoadStats(
        self, request_iterator: Iterator[lrs_pb2.LoadStatsRequest], context: grpc.ServicerContext
    ) -> Iterator[lrs_pb2.LoadStatsResponse]:
        with self._lock:
            self._total_streams += 1
            number = self._total_streams
        return _LrsStream(self, number).run(request_iterator, context)

    def close_streams(self) -> int:
        """End every open LRS stream (the client reconnects); returns how many."""
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.events.put(_END)
        return len(streams)

    def _attach(self, stream: _LrsStream) -> None:
        with self._cond:
            self._streams.append(stream)
            self._cond.notify_all()

    def _detach(self, stream: _LrsStream) -> None:
        with self._cond:
            if stream in self._streams:
                self._streams.remove(stream)
            self._cond.notify_all()

    def _record_initial(self, stream: _LrsStream, request: lrs_pb2.LoadStatsRequest) -> None:
        with self._cond:
            self._initial.append(request)
            self._cond.notify_all()

    def _record(self, stream: _LrsStream, request: lrs_pb2.LoadStatsRequest) -> None:
        now = time.monotonic()
        records = [
            LoadReportRecord(stream.node_id, stream.number, now, stats, stream.client_features)
            for stats in request.cluster_stats
        ]
        with self._cond:
            self._records.extend(records)
            self._report_counts[stream.node_id] = self._report_counts.get(stream.node_id, 0) + 1
            self._cond.notify_all()
        callback = self.on_report
        if callback is not None:
            for record in records:
                try:
                    callback(record)
                except Exception:  # a reader's bug must not end the client's stream
                    _log.exception("LRS on_report callback failed")

    # -- reading ---------------------------------------------------------------

    def stream_count(self, node_id: str | None = None) -> int:
        """Open LRS streams (of ``node_id``, or all)."""
        with self._lock:
            return sum(1 for s in self._streams if node_id is None or s.node_id == node_id)

    @property
    def total_streams(self) -> int:
        with self._lock:
            return self._total_streams

    def initial_requests(self) -> list[lrs_pb2.LoadStatsRequest]:
        """The first request of every stream (node and client features)."""
        with self._lock:
            return list(self._initial)

    def reports(
        self, cluster: str | None = None, node_id: str | None = None
    ) -> list[LoadReportRecord]:
        """Every ClusterStats received (of a cluster / node), oldest first."""
        with self._lock:
            return [
                r
                for r in self._records
                if (cluster is None or r.cluster == cluster)
                and (node_id is None or r.node_id == node_id)
            ]

    def report_count(self, node_id: str) -> int:
        """How many reports ``node_id`` sent: its requests after each
        stream's first, an empty one too (gRFC A27: a client sends one at
        each report interval, but skips an all-zero report after another
        all-zero one, as C-core does; so the first interval's report of a
        stream is always counted, empty or not)."""
        with self._lock:
            return self._report_counts.get(node_id, 0)

    def totals(self, cluster: str, node_id: str | None = None) -> LoadTotals:
        """The reports of ``cluster`` summed over every interval."""
        totals = LoadTotals()
        for record in self.reports(cluster, node_id):
            totals.add(record.stats)
        return totals

    def last_report(self, cluster: str, node_id: str | None = None) -> LoadReportRecord | None:
        found = self.reports(cluster, node_id)
        return found[-1] if found else None

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._initial.clear()
            self._report_counts.clear()

    def wait_until(self, predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Block until ``predicate()`` is truthy (re-checked on every report or
        stream change); TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._lock.release()
                try:
                    found = predicate()
                finally:
                    self._lock.acquire()
                if found:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"timed out after {timeout}s waiting for load reports")
                self._cond.wait(min(remaining, 0.1))
