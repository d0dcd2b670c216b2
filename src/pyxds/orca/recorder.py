"""Metric recorders of a backend (gRFC A51 "Recorder APIs").

* :class:`ServerMetricRecorder`: per-server utilization data the application
  keeps current (A51 "Per-Server Recording"); read by the out-of-band
  service and, optionally, merged into every per-call report.  All metrics
  start unset; a value stays until replaced or cleared; out-of-range values
  are rejected (ignored, returning False) as C++'s recorder does.
* :class:`CallMetricRecorder`: one call's metrics (A51 "Per-Request
  Recording"), reached from a servicer with :func:`call_metric_recorder`
  while :class:`pyxds.orca.OrcaServerInterceptor` (or its aio twin) runs the
  call.  Recording a metric again replaces it.

Both produce an ``xds.data.orca.v3.OrcaLoadReport``; per-call values win
over per-server ones when the two are merged (A51 "The Server API").
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Mapping

from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

__all__ = ["ServerMetricRecorder", "CallMetricRecorder", "call_metric_recorder"]


def _non_negative(value: float) -> bool:
    return isinstance(value, (int, float)) and value >= 0 and not math.isinf(value)


def _unit(value: float) -> bool:
    return isinstance(value, (int, float)) and 0 <= value <= 1


class ServerMetricRecorder:
    """Per-server metrics (thread-safe; every method may be called at any time).

    Ranges (as C++'s ``ServerMetricRecorder``): CPU and application
    utilization in [0, inf); memory utilization and named utilizations in
    [0, 1]; QPS and EPS in [0, inf).  A setter given a value out of range
    changes nothing and returns False."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}
        self._utilization: dict[str, float] = {}

    def _set(self, field: str, value: float, ok: bool) -> bool:
        if not ok:
            return False
        with self._lock:
            self._values[field] = float(value)
        return True

    def _clear(self, field: str) -> None:
        with self._lock:
            self._values.pop(field, None)

    def set_cpu_utilization(self, value: float) -> bool:
        return self._set("cpu_utilization", value, _non_negative(value))

    def set_memory_utilization(self, value: float) -> bool:
        return self._set("mem_utilization", value, _unit(value))

    def set_application_utilization(self, value: float) -> bool:
        return self._set("application_utilization", value, _non_negative(value))

    def set_qps(self, value: float) -> bool:
        return self._set("rps_fractional", value, _non_negative(value))

    def set_eps(self, value: float) -> bool:
        return self._set("eps", value, _non_negative(value))

    def set_named_utilization(self, name: str, value: float) -> bool:
        if not _unit(value):
            return False
        with self._lock:
            self._utilization[name] = float(value)
        return True

    def set_all_named_utilization(self, values: Mapping[str, float]) -> None:
        """Replace every named utilization (no range check, as A51 says)."""
        with self._lock:
            self._utilization = {name: float(v) for name, v in values.items()}

    def clear_cpu_utilization(self) -> None:
        self._clear("cpu_utilization")

    def clear_memory_utilization(self) -> None:
        self._clear("mem_utilization")

    def clear_application_utilization(self) -> None:
        self._clear("application_utilization")

    def clear_qps(self) -> None:
        self._clear("rps_fractional")

    def clear_eps(self) -> None:
        self._clear("eps")

    def clear_named_utilization(self, name: str) -> None:
        with self._lock:
            self._utilization.pop(name, None)

    def report(self) -> OrcaLoadReport:
        """A copy of the current data (state of the world)."""
        with self._lock:
            values = dict(self._values)
            utilization = dict(self._utilization)
        return OrcaLoadReport(utilization=utilization, **values)


class CallMetricRecorder:
    """One call's metrics.  Setters return the recorder (chainable)."""

    __slots__ = ("_values", "_utilization", "_request_cost", "_named")

    def __init__(self) -> None:
        self._values: dict[str, float] = {}
        self._utilization: dict[str, float] = {}
        self._request_cost: dict[str, float] = {}
        self._named: dict[str, float] = {}

    def record_cpu_utilization(self, value: float) -> CallMetricRecorder:
        if _non_negative(value):
            self._values["cpu_utilization"] = float(value)
        return self

    def record_memory_utilization(self, value: float) -> CallMetricRecorder:
        if _unit(value):
            self._values["mem_utilization"] = float(value)
        return self

    def record_application_utilization(self, value: float) -> CallMetricRecorder:
        if _non_negative(value):
            self._values["application_utilization"] = float(value)
        return self

    def record_qps(self, value: float) -> CallMetricRecorder:
        if _non_negative(value):
            self._values["rps_fractional"] = float(value)
        return self

    def record_eps(self, value: float) -> CallMetricRecorder:
        if _non_negative(value):
            self._values["eps"] = float(value)
        return self

    def record_utilization(self, name: str, value: float) -> CallMetricRecorder:
        if _unit(value):
            self._utilization[name] = float(value)
        return self

    def record_request_cost(self, name: str, value: float) -> CallMetricRecorder:
        self._request_cost[name] = float(value)
        return self

    def record_named_metric(self, name: str, value: float) -> CallMetricRecorder:
        self._named[name] = float(value)
        return self

    def report(self, server: ServerMetricRecorder | None = None) -> OrcaLoadReport:
        """This call's report, over ``server``'s data when given (the call's
        own values win)."""
        out = server.report() if server is not None else OrcaLoadReport()
        for field, value in self._values.items():
            setattr(out, field, value)
        out.utilization.update(self._utilization)
        out.request_cost.update(self._request_cost)
        out.named_metrics.update(self._named)
        return out


_current: contextvars.ContextVar[CallMetricRecorder | None] = contextvars.ContextVar(
    "pyxds_orca_call_recorder", default=None
)


def call_metric_recorder() -> CallMetricRecorder | None:
    """The recorder of the call being served (None outside a call run by an
    ORCA interceptor)."""
    return _current.get()
