"""pyxds.orca: backend metrics (ORCA, gRFC A51) for Python gRPC servers.

grpcio has no ORCA server API; this package is it, so a Python fleet can
drive ``weighted_round_robin`` (A58) in any gRPC client, grpcio's C-core
included.

* Per-call reports: install :class:`OrcaServerInterceptor` (or
  :class:`OrcaAioServerInterceptor`), then in a handler::

      recorder = call_metric_recorder()
      recorder.record_cpu_utilization(0.4).record_qps(120.0)

  The metrics go back in the ``endpoint-load-metrics-bin`` trailer.
* Out-of-band reports: :func:`add_orca_service` registers
  ``xds.service.orca.v3.OpenRcaService`` streaming a
  :class:`ServerMetricRecorder` the application keeps current.

See docs/orca.md.
"""

from pyxds.orca.interceptor import ORCA_TRAILER, OrcaAioServerInterceptor, OrcaServerInterceptor
from pyxds.orca.recorder import CallMetricRecorder, ServerMetricRecorder, call_metric_recorder
from pyxds.orca.service import (
    DEFAULT_MIN_REPORT_INTERVAL,
    METHOD,
    SERVICE_NAME,
    OrcaService,
    add_orca_service,
)

__all__ = [
    "ORCA_TRAILER",
    "OrcaServerInterceptor",
    "OrcaAioServerInterceptor",
    "CallMetricRecorder",
    "ServerMetricRecorder",
    "call_metric_recorder",
    "OrcaService",
    "add_orca_service",
    "SERVICE_NAME",
    "METHOD",
    "DEFAULT_MIN_REPORT_INTERVAL",
]
