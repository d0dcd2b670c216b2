"""Backends pyxds did not write: plain grpcio servers that report load the
way a Go or Java backend does (gRFC A51), without pyxds.orca.

* per call: the standard ``endpoint-load-metrics-bin`` trailer, a serialized
  ``xds.data.orca.v3.OrcaLoadReport`` (and no ``x-endpoint-load-metrics-bin``
  mirror: grpcio's C-core client consumes the standard key, so pyxds cannot
  see it);
* out of band: their own ``xds.service.orca.v3.OpenRcaService/StreamCoreMetrics``
  (a generic handler: one report at once, then one per requested interval,
  at least 0.1 s apart).

Method: ``/pyxds.test.Echo/Who`` (bytes in, the backend's name out).
"""

from __future__ import annotations

import collections
import threading
from concurrent import futures

import grpc
from ports import EXCLUSIVE
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

SERVICE = "pyxds.test.Echo"
ORCA_SERVICE = "xds.service.orca.v3.OpenRcaService"
STANDARD_TRAILER = "endpoint-load-metrics-bin"
MIRROR_TRAILER = "x-endpoint-load-metrics-bin"
MIN_INTERVAL = 0.1


class ForeignOrcaBackend:
    """A plain grpcio server reporting cpu ``cpu`` at 100 qps: per call in the
    standard trailer (``per_call``), out of band with its own OpenRcaService
    (``oob``).  ``report``: send this report instead, as is (values no
    recorder would accept included); ``mirror``: also send it per call as
    pyxds.orca's ``x-endpoint-load-metrics-bin``, so that a pyxds client
    reads the very bytes C-core reads; ``fail``: every call ends with this
    status (details: the backend's name), its report still sent."""

    def __init__(
        self,
        name: str,
        cpu: float = 0.0,
        per_call: bool = True,
        oob: bool = True,
        report: OrcaLoadReport | None = None,
        mirror: bool = False,
        fail: grpc.StatusCode | None = None,
    ) -> None:
        self.name = name
        self.cpu = cpu
        self.served: collections.Counter = collections.Counter()
        self.oob_streams = 0
        #: each StreamCoreMetrics request as it came (serialized)
        self.oob_requests: list[bytes] = []
        self._stop = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[EXCLUSIVE])

        def current() -> OrcaLoadReport:
            if report is not None:
                return report
            return OrcaLoadReport(cpu_utilization=self.cpu, rps_fractional=100.0)

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.served[name] += 1
            if per_call:
                payload = current().SerializeToString()
                keys = (STANDARD_TRAILER, MIRROR_TRAILER) if mirror else (STANDARD_TRAILER,)
                context.set_trailing_metadata(tuple((key, payload) for key in keys))
            if fail is not None:
                context.abort(fail, name)
            return name.encode()

        def stream_core_metrics(request: OrcaLoadReportRequest, context: grpc.ServicerContext):
            self.oob_streams += 1
            self.oob_requests.append(request.SerializeToString())
            interval = request.report_interval.seconds + request.report_interval.nanos / 1e9
            interval = max(interval, MIN_INTERVAL)
            while context.is_active() and not self._stop.is_set():
                yield current()
                self._stop.wait(interval)

        handlers = [
            grpc.method_handlers_generic_handler(
                SERVICE, {"Who": grpc.unary_unary_rpc_method_handler(who)}
            )
        ]
        if oob:
            handlers.append(
                grpc.method_handlers_generic_handler(
                    ORCA_SERVICE,
                    {
                        "StreamCoreMetrics": grpc.unary_stream_rpc_method_handler(
                            stream_core_metrics,
                            request_deserializer=OrcaLoadReportRequest.FromString,
                            response_serializer=OrcaLoadReport.SerializeToString,
                        )
                    },
                )
            )
        self._server.add_generic_rpc_handlers(tuple(handlers))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        self._server.stop(None).wait(5)
