"""pyxds.orca, the backend side of gRFC A51, on real grpcio servers (sync and
asyncio) over loopback: per-call metrics reach the trailer (merged over the
per-server recorder, the call's values winning), aborts and the handler's
own trailers keep working, response streams report at their end, nothing
recorded means no trailer; the OpenRcaService streams the recorder at the
requested interval raised to the minimum."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import grpc.aio
import pytest
from ports import EXCLUSIVE
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

from pyxds.lb.orca import ORCA_TRAILER_MIRROR, report_from_trailers
from pyxds.orca import (
    METHOD,
    CallMetricRecorder,
    OrcaAioServerInterceptor,
    OrcaServerInterceptor,
    OrcaService,
    ServerMetricRecorder,
    add_orca_service,
    call_metric_recorder,
)

SERVICE = "t.S"


def record(recorder: CallMetricRecorder | None) -> None:
    assert recorder is not None
    recorder.record_cpu_utilization(0.25).record_qps(40.0).record_eps(2.0)
    recorder.record_named_metric("queue", 7.0).record_utilization("gpu", 0.5)
    recorder.record_request_cost("db", 3.0).record_memory_utilization(0.4)
    recorder.record_application_utilization(0.6)


def sync_handlers() -> grpc.GenericRpcHandler:
    def unary(request: bytes, context) -> bytes:
        if request == b"record":
            record(call_metric_recorder())
        if request == b"own-trailer":
            context.set_trailing_metadata((("x-mine", "1"),))
            record(call_metric_recorder())
        if request == b"abort":
            record(call_metric_recorder())
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
        return b"ok"

    def stream(request: bytes, context):
        for i in range(3):
            if i == 2:
                record(call_metric_recorder())
            yield b"x"

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "U": grpc.unary_unary_rpc_method_handler(unary),
            "S": grpc.unary_stream_rpc_method_handler(stream),
        },
    )


@pytest.fixture(scope="module")
def sync_server():
    server_recorder = ServerMetricRecorder()
    server_recorder.set_cpu_utilization(0.9)  # overridden by the call's 0.25
    server_recorder.set_named_utilization("disk", 0.3)  # kept
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[OrcaServerInterceptor(server_recorder)],
        options=[EXCLUSIVE],
    )
    server.add_generic_rpc_handlers((sync_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield channel
    channel.close()
    server.stop(None)


def check_report(trailers) -> OrcaLoadReport:
    report = report_from_trailers(tuple(trailers))
    assert report is not None
    assert report.cpu_utilization == pytest.approx(0.25)
    assert report.rps_fractional == pytest.approx(40.0)
    assert report.eps == pytest.approx(2.0)
    assert report.mem_utilization == pytest.approx(0.4)
    assert report.application_utilization == pytest.approx(0.6)
    assert dict(report.named_metrics) == {"queue": 7.0}
    assert dict(report.request_cost) == {"db": 3.0}
    assert dict(report.utilization) == pytest.approx({"gpu": 0.5, "disk": 0.3})
    return report


def test_per_call_metrics_reach_the_trailer_over_the_server_recorder(sync_server):
    _, call = sync_server.unary_unary(f"/{SERVICE}/U").with_call(b"record")
    check_report(call.trailing_metadata())


def test_handler_trailing_metadata_is_kept(sync_server):
    _, call = sync_server.unary_unary(f"/{SERVICE}/U").with_call(b"own-trailer")
    trailers = tuple(call.trailing_metadata())
    assert ("x-mine", "1") in [(k, v) for k, v in trailers]
    check_report(trailers)


def test_aborted_call_keeps_its_status_and_reports(sync_server):
    with pytest.raises(grpc.RpcError) as err:
        sync_server.unary_unary(f"/{SERVICE}/U")(b"abort")
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details() == "busy"
    check_report(err.value.trailing_metadata())


def test_response_stream_reports_at_its_end(sync_server):
    call = sync_server.unary_stream(f"/{SERVICE}/S")(b"")
    assert list(call) == [b"x"] * 3
    check_report(call.trailing_metadata())


def test_server_recorder_alone_reports_on_every_call(sync_server):
    _, call = sync_server.unary_unary(f"/{SERVICE}/U").with_call(b"nothing")
    report = report_from_trailers(tuple(call.trailing_metadata()))
    assert report is not None and report.cpu_utilization == pytest.approx(0.9)


def test_nothing_recorded_sends_no_trailer():
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[OrcaServerInterceptor()],
        options=[EXCLUSIVE],
    )
    server.add_generic_rpc_handlers((sync_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _, call = channel.unary_unary(f"/{SERVICE}/U").with_call(b"nothing")
            keys = [k for k, _ in call.trailing_metadata()]
            assert ORCA_TRAILER_MIRROR not in keys
    finally:
        server.stop(None)


def test_outside_a_call_there_is_no_recorder():
    assert call_metric_recorder() is None


def test_recorders_reject_out_of_range_values():
    server = ServerMetricRecorder()
    assert not server.set_memory_utilization(1.5)
    assert not server.set_qps(-1.0)
    assert not server.set_named_utilization("x", 2.0)
    assert server.set_cpu_utilization(1.7)  # CPU may exceed 1 (several cores)
    assert server.report() == OrcaLoadReport(cpu_utilization=1.7)
    server.clear_cpu_utilization()
    assert server.report() == OrcaLoadReport()
    call = CallMetricRecorder().record_cpu_utilization(-1).record_utilization("u", 1.5)
    assert call.report() == OrcaLoadReport()


# -- asyncio server --------------------------------------------------------------------


def test_aio_interceptor_reports_unary_and_streams():
    async def unary(request: bytes, context) -> bytes:
        record(call_metric_recorder())
        return b"ok"

    async def stream(request: bytes, context):
        for _ in range(2):
            yield b"x"
        record(call_metric_recorder())

    async def run() -> None:
        server_recorder = ServerMetricRecorder()
        server_recorder.set_named_utilization("disk", 0.3)
        server = grpc.aio.server(
            interceptors=[OrcaAioServerInterceptor(server_recorder)], options=[EXCLUSIVE]
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "U": grpc.unary_unary_rpc_method_handler(unary),
                        "S": grpc.unary_stream_rpc_method_handler(stream),
                    },
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(f"/{SERVICE}/U")(b"")
                assert await call == b"ok"
                check_report(await call.trailing_metadata())
                call = channel.unary_stream(f"/{SERVICE}/S")(b"")
                assert [r async for r in call] == [b"x", b"x"]
                check_report(await call.trailing_metadata())
        finally:
            await server.stop(None)

    asyncio.run(run())


# -- OpenRcaService --------------------------------------------------------------------


def request(seconds: float) -> OrcaLoadReportRequest:
    r = OrcaLoadReportRequest()
    r.report_interval.FromNanoseconds(int(seconds * 1e9))
    return r


def test_interval_is_raised_to_the_minimum():
    service = OrcaService(ServerMetricRecorder(), min_report_interval=1.0)
    assert service.interval(request(0)) == 1.0
    assert service.interval(request(0.2)) == 1.0
    assert service.interval(request(3.0)) == 3.0
    assert OrcaService(ServerMetricRecorder()).interval(request(1.0)) == 30.0  # A51 default


def read_reports(channel, n: int, interval: float) -> list[OrcaLoadReport]:
    stream = channel.unary_stream(
        METHOD,
        request_serializer=OrcaLoadReportRequest.SerializeToString,
        response_deserializer=OrcaLoadReport.FromString,
    )(request(interval), timeout=10)
    out = []
    for report in stream:
        out.append(report)
        if len(out) == n:
            stream.cancel()
            break
    return out


def test_oob_service_streams_the_recorder_state_of_the_world():
    recorder = ServerMetricRecorder()
    recorder.set_cpu_utilization(0.5)
    recorder.set_named_utilization("disk", 0.2)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[EXCLUSIVE])
    add_orca_service(server, recorder, min_report_interval=0.05)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reports = read_reports(channel, 3, 0.05)
    finally:
        server.stop(None)
    assert all(r.cpu_utilization == pytest.approx(0.5) for r in reports)
    assert all(dict(r.utilization) == pytest.approx({"disk": 0.2}) for r in reports)


def test_oob_service_on_an_aio_server():
    async def run() -> list[OrcaLoadReport]:
        recorder = ServerMetricRecorder()
        recorder.set_qps(12.0)
        server = grpc.aio.server(options=[EXCLUSIVE])
        add_orca_service(server, recorder, min_report_interval=0.05)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_stream(
                    METHOD,
                    request_serializer=OrcaLoadReportRequest.SerializeToString,
                    response_deserializer=OrcaLoadReport.FromString,
                )(request(0.05), timeout=10)
                out = []
                async for report in call:
                    out.append(report)
                    recorder.set_qps(13.0)
                    if len(out) == 2:
                        call.cancel()
                        break
                return out
        finally:
            await server.stop(None)

    reports = asyncio.run(run())
    assert [r.rps_fractional for r in reports] == pytest.approx([12.0, 13.0])
