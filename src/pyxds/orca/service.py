"""The out-of-band ORCA service: ``xds.service.orca.v3.OpenRcaService``
(gRFC A51 "Out of Band Metrics Reporting", server side).

``StreamCoreMetrics`` streams the :class:`~pyxds.orca.recorder.ServerMetricRecorder`'s
data: one report at once, then one per interval, always the whole current
data (state of the world, sent whether or not it changed), until the client
goes away.  The interval is the client's ``report_interval``, raised to the
service's ``min_report_interval`` (30 s by default, as A51 says; 0 or unset
asks for the minimum).

    recorder = ServerMetricRecorder()
    add_orca_service(server, recorder)            # grpc.server or grpc.aio.server
    recorder.set_cpu_utilization(0.5)

Works for sync and asyncio servers: :func:`add_orca_service` registers the
matching handler.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import grpc.aio
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

from pyxds.orca.recorder import ServerMetricRecorder

__all__ = [
    "SERVICE_NAME",
    "METHOD",
    "DEFAULT_MIN_REPORT_INTERVAL",
    "OrcaService",
    "add_orca_service",
]

SERVICE_NAME = "xds.service.orca.v3.OpenRcaService"
METHOD = f"/{SERVICE_NAME}/StreamCoreMetrics"
DEFAULT_MIN_REPORT_INTERVAL = 30.0


def _serialize(report: OrcaLoadReport) -> bytes:
    data: bytes = report.SerializeToString()
    return data


class OrcaService:
    """``OpenRcaService`` over one recorder (module docstring)."""

    def __init__(
        self,
        recorder: ServerMetricRecorder,
        min_report_interval: float = DEFAULT_MIN_REPORT_INTERVAL,
    ) -> None:
        self.recorder = recorder
        self.min_report_interval = float(min_report_interval)

    def interval(self, request: OrcaLoadReportRequest) -> float:
        """The reporting interval for ``request`` (A51: at least the minimum)."""
        asked: float = request.report_interval.seconds + request.report_interval.nanos / 1e9
        return max(asked, self.min_report_interval)

    # -- sync server -------------------------------------------------------
    def stream_core_metrics(self, request: OrcaLoadReportRequest, context: Any) -> Any:
        interval = self.interval(request)
        gone = threading.Event()
        context.add_callback(gone.set)
        while context.is_active() and not gone.is_set():
            yield self.recorder.report()
            if gone.wait(interval):
                return

    def generic_handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "StreamCoreMetrics": grpc.unary_stream_rpc_method_handler(
                    self.stream_core_metrics,
                    request_deserializer=OrcaLoadReportRequest.FromString,
                    response_serializer=_serialize,
                )
            },
        )

    # -- asyncio server ----------------------------------------------------
    async def stream_core_metrics_async(self, request: OrcaLoadReportRequest, context: Any) -> Any:
        interval = self.interval(request)
        while True:
            yield self.recorder.report()
            await asyncio.sleep(interval)

    def aio_generic_handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "StreamCoreMetrics": grpc.unary_stream_rpc_method_handler(
                    self.stream_core_metrics_async,
                    request_deserializer=OrcaLoadReportRequest.FromString,
                    response_serializer=_serialize,
                )
            },
        )


def add_orca_service(
    server: Any,
    recorder: ServerMetricRecorder,
    min_report_interval: float = DEFAULT_MIN_REPORT_INTERVAL,
) -> OrcaService:
    """Register ``OpenRcaService`` on ``server`` (sync or asyncio) before it
    starts; returns the service."""
    service = OrcaService(recorder, min_report_interval)
    if isinstance(server, grpc.aio.Server):
        server.add_generic_rpc_handlers((service.aio_generic_handler(),))
    else:
        server.add_generic_rpc_handlers((service.generic_handler(),))
    return service
