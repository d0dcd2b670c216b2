"""Conformance: pyxds.orca's server side (gRFC A51) on real grpcio servers,
the scenarios test_orca_server.py does not replay:

* C++ ``test/cpp/end2end/orca_service_end2end_test.cc``
  (``OrcaServiceEnd2endTest.Basic``): two streams at different intervals
  on one service, each report the recorder's whole current state;
* A51 "Out of Band Metrics Reporting": "when the client disconnects [the
  service] should terminate the stream and cancel the timer immediately";
* grpc-java ``CallMetricRecorderTest.noMetricsRecordedAfterSnapshot``: a
  call's recorder used after the call changes nothing sent;
* grpc-go ``orca/call_metrics_test.go`` ``TestE2ECallMetricsStreaming``:
  client-streaming and bidi calls report at their end (sync and asyncio).
  (Its "no custom metrics" case, where a server recorder alone sends no
  trailer, is grpc-go's own: C++ and pyxds.orca send the server recorder's
  data on every call, test_orca_server.py
  test_server_recorder_alone_reports_on_every_call.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import grpc
import grpc.aio
import pytest
from ports import EXCLUSIVE
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

from pyxds.lb.orca import report_from_trailers
from pyxds.orca import (
    METHOD,
    CallMetricRecorder,
    OrcaAioServerInterceptor,
    OrcaServerInterceptor,
    ServerMetricRecorder,
    add_orca_service,
    call_metric_recorder,
)

SERVICE = "t.Conf"


def request(seconds: float) -> OrcaLoadReportRequest:
    r = OrcaLoadReportRequest()
    r.report_interval.FromNanoseconds(int(seconds * 1e9))
    return r


class Stream:
    """One StreamCoreMetrics call; ``read()`` returns (report, seconds since
    the previous report)."""

    def __init__(self, channel: grpc.Channel, interval: float) -> None:
        self.call = channel.unary_stream(
            METHOD,
            request_serializer=OrcaLoadReportRequest.SerializeToString,
            response_deserializer=OrcaLoadReport.FromString,
        )(request(interval), timeout=30)
        self._last = time.monotonic()

    def read(self) -> tuple[OrcaLoadReport, float]:
        report = next(self.call)
        now = time.monotonic()
        gap, self._last = now - self._last, now
        return report, gap

    def read_until(self, want: OrcaLoadReport, within: float = 5.0) -> OrcaLoadReport:
        """The first report equal to ``want`` within ``within`` seconds
        (reports sent before the recorder changed may be queued: while the
        test waits on one stream the other's pile up, four or more of them
        on a loaded machine)."""
        deadline = time.monotonic() + within
        while True:
            report, _gap = self.read()
            if report == want:
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"no report {want} in {within} s (last {report})")


def serve_orca(recorder: ServerMetricRecorder, workers: int, min_interval: float):
    """(a started sync server with OpenRcaService over ``recorder``, its address)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=[EXCLUSIVE])
    add_orca_service(server, recorder, min_report_interval=min_interval)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def orca_server():
    recorder = ServerMetricRecorder()
    server, address = serve_orca(recorder, 4, 0.0)
    channel = grpc.insecure_channel(address)
    yield recorder, channel
    channel.close()
    server.stop(None)


def test_two_streams_report_the_whole_current_state_each_at_its_interval(orca_server):
    """C++ OrcaServiceEnd2endTest.Basic, at 0.4 s and 0.2 s: the first
    report at once and empty (nothing set), then the recorder's state after
    each change: set, updated, cleared, named utilizations set, cleared and
    replaced as a whole."""
    recorder, channel = orca_server
    slow, fast = Stream(channel, 0.4), Stream(channel, 0.2)
    assert slow.read()[0] == OrcaLoadReport()
    assert fast.read()[0] == OrcaLoadReport()
    steps = [
        (
            lambda: recorder.set_application_utilization(0.5),
            OrcaLoadReport(application_utilization=0.5),
        ),
        (
            lambda: (
                recorder.set_application_utilization(1.8),
                recorder.set_cpu_utilization(0.3),
                recorder.set_memory_utilization(0.4),
            ),
            OrcaLoadReport(application_utilization=1.8, cpu_utilization=0.3, mem_utilization=0.4),
        ),
        (
            lambda: (
                recorder.clear_application_utilization(),
                recorder.clear_cpu_utilization(),
                recorder.clear_memory_utilization(),
                recorder.set_named_utilization("foo", 0.3),
            ),
            OrcaLoadReport(utilization={"foo": 0.3}),
        ),
        (
            lambda: (
                recorder.clear_named_utilization("foo"),
                recorder.set_named_utilization("bar", 0.2),
                recorder.set_named_utilization("baz", 0.1),
            ),
            OrcaLoadReport(utilization={"bar": 0.2, "baz": 0.1}),
        ),
        (
            lambda: recorder.set_all_named_utilization({"bar": 0.5, "quux": 0.9}),
            OrcaLoadReport(utilization={"bar": 0.5, "quux": 0.9}),
        ),
    ]
    for change, want in steps:
        change()
        slow.read_until(want)
        fast.read_until(want)
    # the same report again while nothing changes (A51: sent "regardless of
    # whether the data has changed"), each stream at no less than its interval
    gaps = {"slow": [], "fast": []}
    for _ in range(2):
        for name, stream in (("slow", slow), ("fast", fast)):
            report, gap = stream.read()
            assert report == want
            gaps[name].append(gap)
    slow.call.cancel()
    fast.call.cancel()
    assert min(gaps["slow"]) >= 0.4 * 0.8, gaps
    assert min(gaps["fast"]) >= 0.2 * 0.8, gaps


def test_a_stream_the_client_cancels_ends_at_once_on_a_sync_server():
    """A51: on disconnect the service ends the stream and its timer at once.
    One worker thread, a 30 s interval: after the client cancels, the next
    stream is served within 5 s (a service that waited out its interval
    would hold the only worker 30 s)."""
    recorder = ServerMetricRecorder()
    recorder.set_qps(1.0)
    server, address = serve_orca(recorder, 1, 30.0)
    try:
        with grpc.insecure_channel(address) as channel:
            first = Stream(channel, 30.0)
            assert first.read()[0].rps_fractional == 1.0
            first.call.cancel()
            second = Stream(channel, 30.0)
            got: list[OrcaLoadReport] = []
            reader = threading.Thread(target=lambda: got.append(second.read()[0]), daemon=True)
            reader.start()
            reader.join(5.0)
            second.call.cancel()
            assert got and got[0].rps_fractional == 1.0
    finally:
        server.stop(None)


def test_a_recorder_used_after_its_call_changes_nothing_sent():
    """grpc-java noMetricsRecordedAfterSnapshot: values recorded on a call's
    recorder once the call is over reach neither that call's trailer nor
    the next call's."""
    kept: list[CallMetricRecorder] = []

    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        recorder = call_metric_recorder()
        assert recorder is not None
        if request == b"first":
            recorder.record_cpu_utilization(0.25)
            kept.append(recorder)
        return b"ok"

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[OrcaServerInterceptor()],
        options=[EXCLUSIVE],
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"U": grpc.unary_unary_rpc_method_handler(unary)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.unary_unary(f"/{SERVICE}/U")
            _, first = method.with_call(b"first")
            kept[0].record_cpu_utilization(0.9).record_named_metric("late", 1.0)
            _, second = method.with_call(b"second")
    finally:
        server.stop(None)
    assert report_from_trailers(tuple(first.trailing_metadata())) == OrcaLoadReport(
        cpu_utilization=0.25
    )
    assert report_from_trailers(tuple(second.trailing_metadata())) is None


def _streaming_handlers(is_aio: bool) -> grpc.GenericRpcHandler:
    """/t.Conf/Bidi echoes each request, /t.Conf/Collect counts them; both
    record after reading the first request (the second value of a metric
    replacing the first)."""

    def record() -> None:
        recorder = call_metric_recorder()
        assert recorder is not None
        recorder.record_utilization("queue", 1.0).record_memory_utilization(0.5)
        recorder.record_request_cost("query", 0.25).record_utilization("queue", 0.75)

    if is_aio:

        async def bidi(requests, context):
            async for request in requests:
                record()
                yield request

        async def collect(requests, context) -> bytes:
            n = 0
            async for _ in requests:
                record()
                n += 1
            return str(n).encode()

    else:

        def bidi(requests, context):  # type: ignore[misc]
            for request in requests:
                record()
                yield request

        def collect(requests, context) -> bytes:  # type: ignore[misc]
            n = 0
            for _ in requests:
                record()
                n += 1
            return str(n).encode()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
            "Collect": grpc.stream_unary_rpc_method_handler(collect),
        },
    )


STREAMED = OrcaLoadReport(
    cpu_utilization=1.0,  # the server recorder's
    mem_utilization=0.5,
    request_cost={"query": 0.25},
    utilization={"queue": 0.75},
)


def _check_streaming_calls(channel_trailers) -> None:
    for trailers in channel_trailers:
        assert report_from_trailers(tuple(trailers)) == STREAMED


def test_client_and_bidi_streaming_calls_report_at_their_end_on_a_sync_server():
    """grpc-go TestE2ECallMetricsStreaming (a full-duplex call with a
    server recorder at cpu 1.0): the report, the server's values under the
    call's, in the trailer when the stream ends; also a client stream."""
    server_recorder = ServerMetricRecorder()
    server_recorder.set_cpu_utilization(1.0)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[OrcaServerInterceptor(server_recorder)],
        options=[EXCLUSIVE],
    )
    server.add_generic_rpc_handlers((_streaming_handlers(False),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            bidi = channel.stream_stream(f"/{SERVICE}/Bidi")(iter([b"a", b"b"]), timeout=10)
            assert list(bidi) == [b"a", b"b"]
            reply, collect = channel.stream_unary(f"/{SERVICE}/Collect").with_call(
                iter([b"a", b"b", b"c"]), timeout=10
            )
            assert reply == b"3"
            _check_streaming_calls([bidi.trailing_metadata(), collect.trailing_metadata()])
    finally:
        server.stop(None)


def test_client_and_bidi_streaming_calls_report_at_their_end_on_an_aio_server():
    """The same on a grpc.aio server with OrcaAioServerInterceptor."""

    async def run() -> list:
        server_recorder = ServerMetricRecorder()
        server_recorder.set_cpu_utilization(1.0)
        server = grpc.aio.server(
            interceptors=[OrcaAioServerInterceptor(server_recorder)], options=[EXCLUSIVE]
        )
        server.add_generic_rpc_handlers((_streaming_handlers(True),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                bidi = channel.stream_stream(f"/{SERVICE}/Bidi")(iter([b"a", b"b"]), timeout=10)
                assert [r async for r in bidi] == [b"a", b"b"]
                collect = channel.stream_unary(f"/{SERVICE}/Collect")(
                    iter([b"a", b"b", b"c"]), timeout=10
                )
                assert await collect == b"3"
                return [await bidi.trailing_metadata(), await collect.trailing_metadata()]
        finally:
            await server.stop(None)

    _check_streaming_calls(asyncio.run(run()))
