"""The lean reader of a sync subchannel's out-of-band ORCA stream
(pyxds/channel/grpc_aio_twin.py: :class:`Twin` and
:class:`UnaryStreamReader`, in place of ``grpc.aio.Channel`` and its
``UnaryStreamCall``), on real grpcio servers on loopback.

Differential against grpc.aio's own reader on the same server: the same
messages, status code and details for every way a stream ends (OK after
messages, an error after messages, UNIMPLEMENTED, a dead port).  A cancel
and the twin's ``close()`` end the call CANCELLED and the server sees it
end.  The unstarted call that sizes the twin's call arena never reaches a
server.  Through a sync pyxds channel (gRFC A51): the stream asks the
period it was given, reports come at that period, and the stream starts
again on the new connection after its backend died and came back."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import grpc
import grpc.aio
import pytest
from channel_fixtures import wait_until
from ports import EXCLUSIVE, HeldPort
from test_wrr_orca_channel import CountingOrca, on_serializer, subchannel_of

import pyxds._api as pyxds
from pyxds.channel import grpc_aio_twin
from pyxds.channel.subchannel import subchannel_options

pytestmark = pytest.mark.skipif(
    not grpc_aio_twin.available(), reason="the twin is made the public way on this grpcio"
)

SERVICE = "pyxds.test.Streams"


class Streams:
    """``Stream``: the request says how it ends (``ok3``: three messages,
    then OK; ``abort2``: two, then RESOURCE_EXHAUSTED).  ``Hold``: one
    message, then waits for the client to end the call.  Any other method
    is UNIMPLEMENTED.  Records every call that reaches it."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self.ended = threading.Event()

    def stream(self, request: bytes, context: grpc.ServicerContext):
        count = int(request[-1:])
        for i in range(count):
            yield b"m%d" % i
        if request.startswith(b"abort"):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too much")

    def hold(self, request: bytes, context: grpc.ServicerContext):
        context.add_callback(self.ended.set)
        yield b"first"
        deadline = time.monotonic() + 10
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.01)

    def handler(self) -> grpc.GenericRpcHandler:
        streams = self
        handlers = {
            f"/{SERVICE}/Stream": grpc.unary_stream_rpc_method_handler(self.stream),
            f"/{SERVICE}/Hold": grpc.unary_stream_rpc_method_handler(self.hold),
        }

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                streams.methods.append(details.method)
                return handlers.get(details.method)

        return Handler()


@pytest.fixture
def server():
    streams = Streams()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE])
    srv.add_generic_rpc_handlers((streams.handler(),))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield streams, f"127.0.0.1:{port}"
    srv.stop(None)


def make_twin(address: str) -> grpc_aio_twin.Twin:
    twin = grpc_aio_twin.twin(
        address, None, grpc_aio_twin.transport_options(subchannel_options(None)), None
    )
    assert isinstance(twin, grpc_aio_twin.Twin)
    return twin


class Sink:
    """What a UnaryStreamReader read: its messages and ends."""

    def __init__(self, messages: list[bytes]) -> None:
        self.messages = messages
        self.ends: list[tuple[grpc.StatusCode, str]] = []

    def message(self, raw: bytes) -> None:
        self.messages.append(raw)

    def end(self, code: grpc.StatusCode, details: str) -> None:
        self.ends.append((code, details))


async def read(twin, call, request: bytes, messages: list[bytes]) -> tuple[grpc.StatusCode, str]:
    """A UnaryStreamReader to its end (its messages into ``messages``);
    how it ended."""
    sink = Sink(messages)
    reader = grpc_aio_twin.UnaryStreamReader(twin, call, sink)
    reader.start(request)
    await reader.ended()
    assert len(sink.ends) == 1
    return sink.ends[0]


async def read_lean(address: str, method: str, request: bytes):
    twin = make_twin(address)
    messages: list[bytes] = []
    try:
        call = twin.call(method.encode())
        code, details = await read(twin, call, request, messages)
    finally:
        await twin.close()
    return messages, code, details


async def read_public(address: str, method: str, request: bytes):
    channel = grpc.aio.insecure_channel(address)
    messages: list[bytes] = []
    try:
        call = channel.unary_stream(method)(request)
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                messages.append(message)
            code, details = grpc.StatusCode.OK, await call.details()
        except grpc.aio.AioRpcError as err:
            code, details = err.code(), err.details()
    finally:
        await channel.close()
    return messages, code, details


@pytest.mark.parametrize(
    ("method", "request_", "code"),
    [
        ("Stream", b"ok3", grpc.StatusCode.OK),
        ("Stream", b"abort2", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("Stream", b"abort0", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("Missing", b"", grpc.StatusCode.UNIMPLEMENTED),
    ],
)
def test_the_lean_reader_sees_what_grpc_aio_sees(server, method, request_, code):
    _streams, address = server
    path = f"/{SERVICE}/{method}"
    lean = asyncio.run(read_lean(address, path, request_))
    public = asyncio.run(read_public(address, path, request_))
    assert lean == public
    assert lean[1] is code


def test_a_dead_port_ends_unavailable_as_with_grpc_aio():
    with HeldPort() as dead:
        lean = asyncio.run(read_lean(dead.address, f"/{SERVICE}/Stream", b"ok1"))
        public = asyncio.run(read_public(dead.address, f"/{SERVICE}/Stream", b"ok1"))
    assert lean[0] == public[0] == []
    assert lean[1] is public[1] is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("how", ["cancel", "close"])
def test_a_cancel_or_the_twins_close_ends_the_stream_cancelled(server, how):
    streams, address = server

    async def main():
        twin = make_twin(address)
        messages: list[bytes] = []
        call = twin.call(f"/{SERVICE}/Hold".encode())
        reader = asyncio.ensure_future(read(twin, call, b"", messages))
        for _ in range(500):  # bounded: 5 s
            if messages:
                break
            await asyncio.sleep(0.01)
        if how == "cancel":
            grpc_aio_twin.cancel(call)
            result = await asyncio.wait_for(reader, 5)
            await twin.close()
        else:
            await twin.close()
            result = await asyncio.wait_for(reader, 5)
        return messages, result

    messages, end = asyncio.run(main())
    assert messages == [b"first"]
    assert end == (grpc.StatusCode.CANCELLED, "")  # as grpc.aio's CancelledError
    assert streams.ended.wait(5)  # the server saw the call end


def test_the_lean_reader_reads_without_a_task(server):
    """No task while a UnaryStreamReader waits for messages (grpc.aio's
    status task and the reader's own were ~2 KB per ORCA stream, issue 18);
    a cancel still ends the call for both sides, and ``ended()`` with it."""
    streams, address = server

    async def main():
        twin = make_twin(address)
        messages: list[bytes] = []
        sink = Sink(messages)
        call = twin.call(f"/{SERVICE}/Hold".encode())
        before = len(asyncio.all_tasks())
        reader = grpc_aio_twin.UnaryStreamReader(twin, call, sink)
        reader.start(b"")
        for _ in range(500):  # bounded: 5 s
            if messages:
                break
            await asyncio.sleep(0.01)
        tasks = len(asyncio.all_tasks()) - before
        assert not reader.done()
        grpc_aio_twin.cancel(call)
        await asyncio.wait_for(reader.ended(), 5)
        await twin.close()
        return messages, tasks, sink.ends

    messages, tasks, ends = asyncio.run(main())
    assert messages == [b"first"]
    assert tasks == 0
    assert ends == [(grpc.StatusCode.CANCELLED, "")]
    assert streams.ended.wait(5)


def test_the_call_sizing_a_twins_arena_reaches_no_server(server):
    streams, address = server

    async def main():
        twin = make_twin(address)  # made with its sizing call
        try:
            call = twin.call(f"/{SERVICE}/Stream".encode())
            messages: list[bytes] = []
            code, _ = await read(twin, call, b"ok1", messages)
            return messages, code
        finally:
            await twin.close()

    assert asyncio.run(main()) == ([b"m0"], grpc.StatusCode.OK)
    time.sleep(0.2)  # bounded: anything else in flight would have arrived
    assert streams.methods == [f"/{SERVICE}/Stream"]


def serve_orca(service: CountingOrca, port: int = 0) -> tuple[grpc.Server, int]:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[EXCLUSIVE])
    srv.add_generic_rpc_handlers((service.generic_handler(),))
    port = srv.add_insecure_port(f"127.0.0.1:{port}")
    srv.start()
    return srv, port


def test_sync_oob_stream_honours_its_period_and_restarts_after_its_backend_comes_back():
    period = 0.3
    first = CountingOrca()
    srv, port = serve_orca(first)
    address = f"127.0.0.1:{port}"
    channel = pyxds.insecure_channel(address)
    times: list[float] = []
    held: HeldPort | None = None
    second = CountingOrca()
    srv2: grpc.Server | None = None
    try:
        handle = subchannel_of(channel, address)
        subscribed = time.monotonic()
        on_serializer(
            channel, lambda: handle.watch_orca_oob(period, lambda r: times.append(time.monotonic()))
        )
        assert wait_until(lambda: len(times) >= 4, 10)
        elapsed = time.monotonic() - subscribed
        assert first.intervals == [period] and first.open == 1
        # reports at the period asked for: never more than it allows since
        # the subscription (the backend sends one at once, then one a
        # period).  Not the gaps between arrivals: a late delivery narrows
        # the next gap, never adds a report (beside two busy loops one came
        # 0.13 s late, a 0.18 s gap, while the backend sent 0.30 s apart).
        assert len(times) <= elapsed / period + 1, (len(times), elapsed)

        srv.stop(None).wait(5)  # the backend dies
        held = HeldPort.again(port)  # refusing, until it comes back
        assert wait_until(lambda: handle.state.name != "READY", 10)
        assert wait_until(lambda: first.open == 0, 10)
        seen = len(times)
        held.release()
        srv2, _ = serve_orca(second, port)  # it comes back on its port
        on_serializer(channel, handle.connect)
        assert wait_until(lambda: handle.state.name == "READY", 10)
        assert wait_until(lambda: len(times) >= seen + 2, 10)
        assert second.intervals == [period] and second.open == 1  # one new stream
    finally:
        channel.close()
        if held is not None:
            held.release()
        if srv2 is not None:
            srv2.stop(None)
        srv.stop(None)


def _orca_server(streams):
    """A backend whose n-th OOB stream sends ``streams[n]`` (serialized
    messages), then stays open; returns (server, address, open times)."""
    from pyxds.channel.orca_oob import METHOD

    opened: list[float] = []

    def stream(request, context):
        opened.append(time.monotonic())
        yield from streams[min(len(opened), len(streams)) - 1]
        deadline = time.monotonic() + 10
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.01)

    service, method = METHOD.rsplit("/", 1)
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE])
    srv.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                service.lstrip("/"), {method: grpc.unary_stream_rpc_method_handler(stream)}
            ),
        )
    )
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    return srv, f"127.0.0.1:{port}", opened


def _report(cpu: float) -> bytes:
    from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

    return OrcaLoadReport(cpu_utilization=cpu).SerializeToString()


_NOT_A_REPORT = b"\xff\xff\xff"  # not a protobuf message


@pytest.fixture(params=["lean twin", "grpc.aio twin"])
def twin_kind(request, monkeypatch):
    """Both readers: the lean one, and grpc.aio's (a grpcio the lean twin
    was not checked against: the twin is made the public way)."""
    if request.param == "grpc.aio twin":
        monkeypatch.setattr(grpc_aio_twin, "VERIFIED", {"0" * 64: "not this one"})
        grpc_aio_twin.available.reset()
        yield request.param
        grpc_aio_twin.available.reset()  # checked again with the real fingerprints
    else:
        yield request.param


def _reports_over(streams, want: int) -> tuple[list[float], list[float]]:
    """A sync channel subscribed to the OOB stream of an :func:`_orca_server`
    sending ``streams``: the cpu_utilization of the first ``want`` reports
    (and of any that followed within 0.2 s), and when each stream opened."""
    srv, address, opened = _orca_server(streams)
    channel = pyxds.insecure_channel(address)
    reports: list = []
    try:
        handle = subchannel_of(channel, address)
        on_serializer(channel, lambda: handle.watch_orca_oob(0.1, reports.append))
        assert wait_until(lambda: len(reports) >= want, 10)
        time.sleep(0.2)  # bounded: anything else would have arrived
        return [r.cpu_utilization for r in reports], list(opened)
    finally:
        channel.close()
        srv.stop(None)


def test_a_report_that_does_not_parse_ends_the_call_and_the_stream_restarts_at_once(twin_kind):
    """C-core's rule (SubchannelStreamClient): a stream message that is not an
    OrcaLoadReport cancels the call; a call that had delivered a report
    restarts at once (its backoff reset).  The bad bytes reach no
    subscriber; the reports before and after do."""
    reports, opened = _reports_over(
        [[_report(0.25), _NOT_A_REPORT, _report(0.75)], [_report(0.5)]], 2
    )
    # 0.75 came after the bad message on the cancelled call: never read
    assert reports == [0.25, 0.5]
    assert len(opened) == 2
    assert opened[1] - opened[0] < 0.75  # at once: the backoff is 0.8 s at least


def test_a_first_message_that_does_not_parse_restarts_the_stream_after_the_backoff(twin_kind):
    """C-core's rule: a call cancelled before any report it parsed is
    retried after the backoff (1 s, jitter 0.2), not at once."""
    reports, opened = _reports_over([[_NOT_A_REPORT], [_report(0.5)]], 1)
    assert reports == [0.5]
    assert len(opened) == 2
    assert opened[1] - opened[0] >= 0.75
