"""Backend metrics (ORCA) for LB policies: the client side of gRFC A51.

* Per-call reports (A51 "Per-Request Metrics Reporting"): the backend sends a
  binary ``xds.data.orca.v3.OrcaLoadReport`` in the ``endpoint-load-metrics-bin``
  trailer.  A policy asks for the trailers of the calls it picks with
  ``PickComplete.on_call_trailers`` and reads the report with
  :func:`report_from_trailers`.  grpcio's C-core keeps that trailer to
  itself (Python never sees it), so the report is read from
  ``x-endpoint-load-metrics-bin`` when the standard key is absent:
  :mod:`pyxds.orca` backends send both.  With other backends, use OOB.
  The last parsed value is remembered by identity, so several policies
  reading the same call's trailers deserialize it once (A51 "The Client
  API").  A malformed value is no report (None): it never fails the RPC.
* Out-of-band reports (A51 "Out of Band Metrics Reporting"): a policy
  subscribes on a subchannel with :func:`watch_oob`, giving the reporting
  period it wants; the channel keeps one ``OpenRcaService/StreamCoreMetrics``
  stream per connected subchannel, shared by every subscriber, at the
  smallest period asked for (:mod:`pyxds.channel.orca_oob`).  Reports are
  delivered on the channel's serializer with the same message type as
  per-call ones.
* :func:`utilization` picks the utilization a report stands for (A58
  "Subchannel Weights", A114 ``metric_names_for_computing_utilization``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "trailer_report",
    "ORCA_TRAILER",
    "ORCA_TRAILER_MIRROR",
    "OrcaLoadReport",
    "report_from_trailers",
    "parse_report",
    "utilization",
    "watch_oob",
    "SUPPORTED_ROOT_METRICS",
    "SUPPORTED_MAP_METRICS",
    "supported_metric_name",
]

from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

ORCA_TRAILER = "endpoint-load-metrics-bin"
#: grpcio's C-core consumes ``endpoint-load-metrics-bin`` itself and never
#: shows it to Python: :mod:`pyxds.orca` backends send the same report under
#: this key too, which the channel does see.
ORCA_TRAILER_MIRROR = "x-endpoint-load-metrics-bin"

#: A114: the report fields a metric name may name directly ...
SUPPORTED_ROOT_METRICS = frozenset(
    {"application_utilization", "cpu_utilization", "mem_utilization"}
)
#: ... and the map fields a ``<map>.<key>`` name may look into.
SUPPORTED_MAP_METRICS = frozenset({"named_metrics", "utilization"})

_last: tuple[Any, OrcaLoadReport | None] = (None, None)


def supported_metric_name(name: str) -> bool:
    """Whether ``name`` is one A114 supports: a field of
    :data:`SUPPORTED_ROOT_METRICS`, or ``<map>.<key>`` with the map one of
    :data:`SUPPORTED_MAP_METRICS` (any key, empty included, as grpcio 1.85's
    C-core accepts)."""
    field, dot, _ = name.partition(".")
    return field in SUPPORTED_MAP_METRICS if dot else name in SUPPORTED_ROOT_METRICS


def parse_report(raw: Any) -> OrcaLoadReport | None:
    """An ``OrcaLoadReport`` from the trailer's bytes; None when malformed."""
    global _last
    cached_raw, cached = _last
    if raw is cached_raw:
        return cached
    report: OrcaLoadReport | None
    if not isinstance(raw, (bytes, bytearray)):
        report = None
    else:
        report = OrcaLoadReport()
        try:
            report.ParseFromString(bytes(raw))
        except Exception:
            report = None
    _last = (raw, report)
    return report


def report_from_trailers(trailers: Sequence[tuple[str, Any]]) -> OrcaLoadReport | None:
    """The ORCA report of a call's trailing metadata, or None (absent or
    malformed)."""
    return trailer_report(trailers)[1]


def trailer_report(
    trailers: Sequence[tuple[str, Any]],
) -> tuple[bool, OrcaLoadReport | None]:
    """(whether the trailers carry a report key pyxds can see, the report or
    None when absent or malformed).  A malformed report still says the
    backend's per-call reports are visible."""
    mirror = None
    for key, value in trailers:
        if key == ORCA_TRAILER:
            return True, parse_report(value)
        if key == ORCA_TRAILER_MIRROR:
            mirror = value
    if mirror is None:
        return False, None
    return True, parse_report(mirror)


def _usable(value: float) -> bool:
    return value > 0 and not math.isnan(value)


def utilization(report: OrcaLoadReport, metric_names: Sequence[str] = ()) -> float:
    """The utilization WRR divides QPS by.

    A114: the largest positive, non-NaN value among ``metric_names`` (each a
    root field of :data:`SUPPORTED_ROOT_METRICS` or ``<map>.<key>`` with the
    map one of :data:`SUPPORTED_MAP_METRICS`, split at the first dot);
    failing that (A58) ``application_utilization`` if positive, else
    ``cpu_utilization``."""
    best = 0.0
    for name in metric_names:
        field, dot, key = name.partition(".")
        if dot:
            if field not in SUPPORTED_MAP_METRICS:
                continue
            value = getattr(report, field).get(key)
            if value is None:
                continue
        elif field in SUPPORTED_ROOT_METRICS:
            value = getattr(report, field)
        else:
            continue
        if _usable(value) and value > best:
            best = value
    if best > 0:
        return best
    app: float = report.application_utilization
    if _usable(app):
        return app
    cpu: float = report.cpu_utilization
    return cpu


_WRAPPER_ATTRIBUTES = ("real", "subchannel", "delegate", "wrapped", "inner", "_subchannel")


def watch_oob(
    subchannel: Any,
    period: float,
    on_report: Callable[[OrcaLoadReport], None],
    on_unimplemented: Callable[[str], None] | None = None,
) -> Callable[[], None] | None:
    """Subscribe ``on_report`` to the out-of-band reports of ``subchannel``
    (any policy's wrapper around the channel's subchannel: wrappers are
    looked through), asking for one report every ``period`` seconds;
    ``on_unimplemented(details)`` is called (on the serializer) when the
    backend does not serve OpenRcaService.  Returns the unsubscribe
    function, or None when the subchannel cannot stream reports (a test
    fake without ``watch_orca_oob``)."""
    for _ in range(8):
        watch = getattr(subchannel, "watch_orca_oob", None)
        if watch is not None:
            unsubscribe: Callable[[], None]
            if on_unimplemented is None:
                unsubscribe = watch(period, on_report)
            else:
                unsubscribe = watch(period, on_report, on_unimplemented)
            return unsubscribe
        for name in _WRAPPER_ATTRIBUTES:
            inner = getattr(subchannel, name, None)
            if inner is not None and inner is not subchannel:
                subchannel = inner
                break
        else:
            return None
    return None
