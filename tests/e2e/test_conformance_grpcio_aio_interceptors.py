"""grpcio's asyncio unary-unary client interceptor tests replayed through
pyxds.aio.

Source: grpc/grpc ``src/python/grpcio_tests/tests_aio/unit/
client_unary_unary_interceptor_test.py`` (TestUnaryUnaryClientInterceptor,
TestInterceptedUnaryUnaryCall).  Each scenario gives the same interceptors to
``grpc.aio.insecure_channel`` and to ``pyxds.aio.insecure_channel`` (static
target), runs the same calls against the same grpcio server, and what the
application sees (responses, exceptions, the call's ``done()`` /
``cancelled()`` / ``cancel()``, code, details, metadata, done callbacks, what
the interceptors saw) must be equal.  Already replayed elsewhere
(``test_channel_aio_interceptors.py``): the order interceptors run in, an
invalid interceptor, an interceptor answering without its continuation,
errors through interceptors, cancel while an interceptor runs, a changed
method."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio
import pytest
from test_conformance_grpcio_aio_calls import _drain, closed_port, outcome, serve

import pyxds.aio as pyxds_aio

SERVICE = "pyxds.test.AioIntercepted"
ECHO_INITIAL = "x-grpc-test-echo-initial"
ECHO_TRAILING = "x-grpc-test-echo-trailing-bin"
#: the "Sleep" handler's pause (seconds)
SLEEP = 0.6
#: the deadline the tests give a "Sleep" call that must end
#: DEADLINE_EXCEEDED: well before the handler answers (at 0.1 against 0.2 s,
#: grpcio's own call once ended OK on a loaded machine, its deadline timer
#: late)
DEADLINE = 0.1


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    """_test_server.py's UnaryCall: echoes two metadata keys back."""
    metadata = dict(context.invocation_metadata())
    if ECHO_INITIAL in metadata:
        context.send_initial_metadata(((ECHO_INITIAL, metadata[ECHO_INITIAL]),))
    if ECHO_TRAILING in metadata:
        context.set_trailing_metadata(((ECHO_TRAILING, metadata[ECHO_TRAILING]),))
    return b"ok"


def _sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
    time.sleep(SLEEP)
    return b"slept"


@pytest.fixture(scope="module")
def address():
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Sleep": grpc.unary_unary_rpc_method_handler(_sleep),
    }
    server, address = serve(SERVICE, handlers)
    yield address
    server.stop(None)


def run_both(address: str, make_interceptors, scenario) -> dict[str, Any]:
    """``scenario(channel, interceptors)`` with fresh interceptors on each side."""
    makes = {
        "grpcio": lambda i: grpc.aio.insecure_channel(address, interceptors=i),
        "pyxds": lambda i: pyxds_aio.insecure_channel(f"static:///{address}", interceptors=i),
    }

    async def one(make) -> Any:
        interceptors = make_interceptors()
        async with make(interceptors) as ch:
            return await asyncio.wait_for(scenario(ch, interceptors), 10)

    return {name: asyncio.run(one(make)) for name, make in makes.items()}


def details_with(details: grpc.aio.ClientCallDetails, **changes: Any) -> grpc.aio.ClientCallDetails:
    fields = {
        "method": details.method,
        "timeout": details.timeout,
        "metadata": details.metadata,
        "credentials": details.credentials,
        "wait_for_ready": details.wait_for_ready,
    }
    fields.update(changes)
    return grpc.aio.ClientCallDetails(**fields)


async def view(call: Any) -> tuple:
    """What a finished intercepted call says about itself."""
    initial = await call.initial_metadata()
    trailing = await call.trailing_metadata()
    return (
        call.done(),
        call.cancelled(),
        await call.code(),
        await call.details(),
        None if initial is None else (type(initial).__name__, tuple(initial)),
        None if trailing is None else (type(trailing).__name__, tuple(trailing)),
    )


class Returns(grpc.aio.UnaryUnaryClientInterceptor):
    """Returns the continuation's call, awaited first or not."""

    def __init__(self, awaited: bool = False) -> None:
        self.awaited = awaited
        self.codes: list[Any] = []

    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details, request)
        if self.awaited:
            try:
                await call
            except grpc.RpcError:
                pass
        self.codes.append(await call.code())
        return call


@pytest.mark.parametrize("awaited", [False, True], ids=["returned", "awaited"])
@pytest.mark.parametrize("method", ["Echo", "Sleep"])
def test_intercepted_call_ok_and_deadline_like_grpc_aio(address, awaited, method):
    """test_status_code_Ok, test_call_ok, test_call_ok_awaited, test_call_rpc_error,
    test_call_rpc_error_awaited: the call the interceptor returns (awaited by
    it or not), OK or DEADLINE_EXCEEDED "Deadline Exceeded", with empty
    aio.Metadata both ways."""

    async def scenario(ch, interceptors):
        timeout = DEADLINE if method == "Sleep" else 10  # (a fresh channel connects first)
        call = ch.unary_unary(f"/{SERVICE}/{method}")(b"", timeout=timeout)
        result = await outcome(lambda: call)
        return [result, await view(call), interceptors[0].codes]

    got = run_both(address, lambda: [Returns(awaited)], scenario)
    code = grpc.StatusCode.OK if method == "Echo" else grpc.StatusCode.DEADLINE_EXCEEDED
    assert got["grpcio"][1][:3] == (True, False, code)
    assert got["grpcio"][2] == [code]
    assert got["pyxds"] == got["grpcio"]


class AddsTimeout(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(details_with(details, timeout=DEADLINE), request)


class RetriesOnce(grpc.aio.UnaryUnaryClientInterceptor):
    """test_retry's RetryInterceptor: a first call that times out, a second without timeout."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details_with(details, timeout=DEADLINE), request)
        try:
            await call
        except grpc.RpcError:
            pass
        self.calls.append(call)
        call = await continuation(details_with(details, timeout=None), request)
        self.calls.append(call)
        return call


def test_interceptor_adds_a_timeout_like_grpc_aio(address):
    """test_add_timeout: the interceptor's timeout ends the call DEADLINE_EXCEEDED."""

    async def scenario(ch, interceptors):
        call = ch.unary_unary(f"/{SERVICE}/Sleep")(b"")
        result = await outcome(lambda: call)
        return [result[:2], await view(call)]

    got = run_both(address, lambda: [AddsTimeout()], scenario)
    assert got["grpcio"][0] == ("AioRpcError", grpc.StatusCode.DEADLINE_EXCEEDED)
    assert got["pyxds"] == got["grpcio"]


def test_interceptor_retries_with_a_second_continuation_like_grpc_aio(address):
    """test_retry: two calls, the first DEADLINE_EXCEEDED, the second OK."""

    async def scenario(ch, interceptors):
        call = ch.unary_unary(f"/{SERVICE}/Sleep")(b"")
        result = await outcome(lambda: call)
        made = [await c.code() for c in interceptors[0].calls]
        return [result, await call.code(), made]

    got = run_both(address, lambda: [RetriesOnce()], scenario)
    assert got["grpcio"] == [
        ("value", b"slept"),
        grpc.StatusCode.OK,
        [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OK],
    ]
    assert got["pyxds"] == got["grpcio"]


class CallsTwice(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        for _ in range(2):
            call = await continuation(details, request)
            result = await call
        return result


class Counts(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.called = 0

    async def intercept_unary_unary(self, continuation, details, request):
        self.called += 1
        call = await continuation(details, request)
        return await call


def test_retry_through_a_second_interceptor_like_grpc_aio(address):
    """test_retry_with_multiple_interceptors: the inner interceptor runs once
    per continuation of the outer one; both return raw responses."""

    async def scenario(ch, interceptors):
        call = ch.unary_unary(f"/{SERVICE}/Echo")(b"")
        result = await outcome(lambda: call)
        return [result, await view(call), interceptors[1].called]

    got = run_both(address, lambda: [CallsTwice(), Counts()], scenario)
    assert got["grpcio"][0] == ("value", b"ok")
    assert got["grpcio"][2] == 2
    assert got["pyxds"] == got["grpcio"]


class AwaitsAndReturnsCall(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details, request)
        await call
        return call


class RawResponse(grpc.aio.UnaryUnaryClientInterceptor):
    response = b"raw"

    async def intercept_unary_unary(self, continuation, details, request):
        return RawResponse.response


def test_raw_response_from_an_interceptor_like_grpc_aio(address):
    """test_rpcresponse: the application gets the very object; the call is
    done, cannot be cancelled, OK, "" details, metadata None, no debug string."""

    async def scenario(ch, interceptors):
        call = ch.unary_unary(f"/{SERVICE}/Echo")(b"")
        response = await call
        return [
            response is RawResponse.response,
            call.cancel(),
            await view(call),
            await call.debug_error_string(),
        ]

    got = run_both(address, lambda: [AwaitsAndReturnsCall(), RawResponse()], scenario)
    assert got["grpcio"] == [True, False, (True, False, grpc.StatusCode.OK, "", None, None), None]
    assert got["pyxds"] == got["grpcio"]


class Blocks(grpc.aio.UnaryUnaryClientInterceptor):
    """Waits forever, before (``after`` False) or after its continuation's call ended."""

    def __init__(self, after: bool) -> None:
        self.after = after
        self.reached = asyncio.Event()

    async def intercept_unary_unary(self, continuation, details, request):
        if self.after:
            call = await continuation(details, request)
            await call
        self.reached.set()
        await asyncio.get_running_loop().create_future()


@pytest.mark.parametrize("after", [False, True], ids=["before rpc", "after rpc"])
def test_cancel_while_the_interceptor_waits_like_grpc_aio(address, after):
    """test_cancel_before_rpc / test_cancel_after_rpc: CancelledError, the
    call cancelled and done, CANCELLED with grpc.aio's local details,
    metadata None."""

    async def scenario(ch, interceptors):
        call = ch.unary_unary(f"/{SERVICE}/Echo")(b"")
        before = [call.cancelled(), call.done()]
        await interceptors[0].reached.wait()
        cancelled = call.cancel()
        return [before, cancelled, await outcome(lambda: call), await view(call)]

    got = run_both(address, lambda: [Blocks(after)], scenario)
    assert got["grpcio"][2] == ("CancelledError",)
    assert got["grpcio"][3] == (
        True,
        True,
        grpc.StatusCode.CANCELLED,
        "Locally cancelled by application!",
        None,
        None,
    )
    assert got["pyxds"] == got["grpcio"]


class CancelsItsCall(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, awaits: bool) -> None:
        self.awaits = awaits

    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details, request)
        call.cancel()
        if self.awaits:
            await call
        return call


@pytest.mark.parametrize("awaits", [True, False], ids=["awaiting", "not awaiting"])
def test_interceptor_cancels_its_call_like_grpc_aio(address, awaits):
    """test_cancel_inside_interceptor_after_rpc_awaiting / _not_awaiting."""

    async def scenario(ch, interceptors):
        call = ch.unary_unary(f"/{SERVICE}/Echo")(b"")
        return [await outcome(lambda: call), await view(call)]

    got = run_both(address, lambda: [CancelsItsCall(awaits)], scenario)
    assert got["grpcio"][0] == ("CancelledError",)
    assert got["pyxds"] == got["grpcio"]


class InjectsMetadata(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        metadata = grpc.aio.Metadata(
            *(details.metadata or ()), (ECHO_INITIAL, "extra info"), (ECHO_TRAILING, b"\x13\x37")
        )
        return await continuation(details_with(details, metadata=metadata), request)


def test_interceptor_adds_metadata_the_server_echoes_like_grpc_aio(address):
    """test_initial_metadata_modification."""

    async def scenario(ch, interceptors):
        call = ch.unary_unary(f"/{SERVICE}/Echo")(b"", metadata=(("app", "1"),))
        return [await outcome(lambda: call), await view(call)]

    got = run_both(address, lambda: [InjectsMetadata()], scenario)
    assert got["grpcio"][1][4] == ("Metadata", ((ECHO_INITIAL, "extra info"),))
    assert got["grpcio"][1][5] == ("Metadata", ((ECHO_TRAILING, b"\x13\x37"),))
    assert got["pyxds"] == got["grpcio"]


class WaitsForGo(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def intercept_unary_unary(self, continuation, details, request):
        await self.go.wait()
        return await continuation(details, request)


@pytest.mark.parametrize("when", ["before it finishes", "after it finishes", "before await"])
def test_done_callback_of_an_intercepted_call_like_grpc_aio(address, when):
    """test_add_done_callback_before_finishes, test_add_done_callback_after_finishes,
    test_add_done_callback_after_finishes_before_await."""

    async def scenario(ch, interceptors):
        called: list[bool] = []
        call = ch.unary_unary(f"/{SERVICE}/Echo")(b"")

        def callback(c: Any) -> None:
            called.append(c is call)

        if when != "after it finishes":
            call.add_done_callback(callback)
        interceptors[0].go.set()
        result = await call
        if when == "after it finishes":
            call.add_done_callback(callback)
        for _ in range(100):
            if called:
                break
            await asyncio.sleep(0.01)
        return [result, called]

    got = run_both(address, lambda: [WaitsForGo()], scenario)
    assert got["grpcio"] == [b"ok", [True]]
    assert got["pyxds"] == got["grpcio"]


# -- streaming interceptors -------------------------------------------------------
# client_unary_stream_interceptor_test.py, client_stream_unary_interceptor_test.py,
# client_stream_stream_interceptor_test.py (test_intercepts,
# test_intercepts_using_write(_and_read), test_multiple_interceptors_request_iterator,
# the Empty and WithRequestAndResponseIterator interceptors).


class CountedRequests:
    """An async request iterator that counts what passes through it."""

    def __init__(self, requests: Any) -> None:
        self.count = 0
        self._requests = requests

    async def _forward(self) -> Any:
        async for request in self._requests:
            self.count += 1
            yield request

    def __aiter__(self) -> Any:
        return self._forward()


class CountedResponses:
    """An async response iterator (returned in place of the call) that counts."""

    def __init__(self, responses: Any) -> None:
        self.count = 0
        self._responses = responses

    async def _forward(self) -> Any:
        async for response in self._responses:
            self.count += 1
            yield response

    def __aiter__(self) -> Any:
        return self._forward()


class StreamingPassThrough:
    """The tests' Empty interceptor (``wrap`` False) or their
    WithRequestAndResponseIterator one (``wrap`` True); one class per kind
    below (grpc.aio uses an interceptor for its first kind only,
    docs/differences-from-c-core.md)."""

    def __init__(self, wrap: bool) -> None:
        self.wrap = wrap
        self.requests: CountedRequests | None = None
        self.responses: CountedResponses | None = None

    def counts(self) -> tuple:
        return (
            None if self.requests is None else self.requests.count,
            None if self.responses is None else self.responses.count,
        )

    async def _intercept(self, continuation, details, request):
        if self.wrap and not isinstance(request, bytes):
            self.requests = CountedRequests(request)
            request = self.requests
        call = await continuation(details, request)
        if self.wrap and isinstance(self, grpc.aio.StreamUnaryClientInterceptor):
            return call
        if self.wrap:
            self.responses = CountedResponses(call)
            return self.responses
        return call


class UnaryStreamPassThrough(StreamingPassThrough, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await self._intercept(continuation, details, request)


class StreamUnaryPassThrough(StreamingPassThrough, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await self._intercept(continuation, details, request_iterator)


class StreamStreamPassThrough(StreamingPassThrough, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await self._intercept(continuation, details, request_iterator)


PASS_THROUGH = {
    "unary_stream": UnaryStreamPassThrough,
    "stream_unary": StreamUnaryPassThrough,
    "stream_stream": StreamStreamPassThrough,
}


def _stream_server():
    def stream(request: bytes, context: grpc.ServicerContext):
        for _ in range(5):
            yield b"r" * 7

    def collect(requests, context: grpc.ServicerContext) -> bytes:
        return b"%d" % sum(1 for _ in requests)

    def chat(requests, context: grpc.ServicerContext):
        for _ in requests:
            yield b"r" * 7

    handlers = {
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Collect": grpc.stream_unary_rpc_method_handler(collect),
        "Chat": grpc.stream_stream_rpc_method_handler(chat),
    }
    return serve(SERVICE, handlers)


@pytest.fixture(scope="module")
def stream_address():
    server, address = _stream_server()
    yield address
    server.stop(None)


async def _requests() -> Any:
    for _ in range(5):
        yield b"q"


async def _finished_view(call: Any) -> tuple:
    return (
        (type(await call.initial_metadata()).__name__, tuple(await call.initial_metadata())),
        (type(await call.trailing_metadata()).__name__, tuple(await call.trailing_metadata())),
        await call.code(),
        await call.details(),
        await call.debug_error_string(),
        call.cancel(),
        call.cancelled(),
        call.done(),
    )


@pytest.mark.parametrize("chain", [1, 2], ids=["one", "two"])
@pytest.mark.parametrize("wrap", [False, True], ids=["empty", "counting"])
@pytest.mark.parametrize(
    "kind",
    [
        "unary_stream",
        "stream_unary iterator",
        "stream_unary write",
        "stream_stream iterator",
        "stream_stream write",
    ],
)
def test_streaming_interceptors_like_grpc_aio(stream_address, kind, wrap, chain):
    """test_intercepts / test_intercepts_using_write(_and_read) /
    test_multiple_interceptors_request_iterator of the three streaming
    interceptor test files: every response arrives, the finished call says
    OK with empty aio.Metadata, "" details and debug string, cancel() False,
    and the counting interceptors saw every request and response."""

    async def scenario(ch, interceptors):
        out: list[Any] = []
        if kind == "unary_stream":
            call = ch.unary_stream(f"/{SERVICE}/Stream")(b"")
            out.append(await call.wait_for_connection())
            out.append([r async for r in call])
        elif kind == "stream_unary iterator":
            call = ch.stream_unary(f"/{SERVICE}/Collect")(_requests())
            out.append(await call.wait_for_connection())
            out.append(await call)
        elif kind == "stream_unary write":
            call = ch.stream_unary(f"/{SERVICE}/Collect")()
            for _ in range(5):
                await call.write(b"q")
            await call.done_writing()
            out.append(await call)
        elif kind == "stream_stream iterator":
            call = ch.stream_stream(f"/{SERVICE}/Chat")(_requests())
            out.append(await call.wait_for_connection())
            out.append([r async for r in call])
        else:
            call = ch.stream_stream(f"/{SERVICE}/Chat")()
            for _ in range(5):
                await call.write(b"q")
                out.append(await call.read())
            await call.done_writing()
        out.append(await _finished_view(call))
        out.append([i.counts() for i in interceptors])
        return out

    cls = PASS_THROUGH[kind.split()[0]]
    got = run_both(stream_address, lambda: [cls(wrap) for _ in range(chain)], scenario)
    assert got["grpcio"][-2][2] is grpc.StatusCode.OK
    assert got["pyxds"] == got["grpcio"]


@pytest.mark.parametrize("chain", [0, 1], ids=["none", "one"])
@pytest.mark.parametrize("wrap", [False, True], ids=["empty", "counting"])
def test_unary_stream_interceptor_reads_done_callbacks_and_errors_like_grpc_aio(
    stream_address, wrap, chain
):
    """client_unary_stream_interceptor_test.py test_response_iterator_using_read,
    test_too_many_reads, test_add_done_callback_interceptor_task_not_finished /
    _finished, test_intercepts_response_iterator_rpc_error (a closed port),
    test_cancel_consuming_response_iterator."""
    closed = f"127.0.0.1:{closed_port()}"

    async def scenario(ch, interceptors):
        out: list[Any] = []
        stream = ch.unary_stream(f"/{SERVICE}/Stream")
        call = stream(b"")
        seen: list[Any] = []
        call.add_done_callback(lambda c: seen.append("early"))
        out.append([await outcome(call.read) for _ in range(6)])
        out += [await call.code(), await outcome(call.read)]
        call.add_done_callback(lambda c: seen.append("late"))
        call = stream(b"")
        await call.wait_for_connection()
        call.add_done_callback(lambda c: seen.append("after connection"))
        out.append(len([r async for r in call]))
        cancelled = stream(b"")

        async def consume():
            async for _ in cancelled:
                cancelled.cancel()

        out.append(await outcome(consume))
        out += [cancelled.cancelled(), cancelled.done(), await cancelled.code()]
        for _ in range(100):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.01)
        out.append(sorted(seen))
        async with _channel_like(ch, closed, interceptors) as other:
            failing = other.unary_stream(f"/{SERVICE}/Stream")(b"")
            got = await outcome(lambda: _drain(failing))
            out += [got[:2], failing.done(), await failing.code()]
        return out

    cls = PASS_THROUGH["unary_stream"]
    got = run_both(stream_address, lambda: [cls(wrap) for _ in range(chain)], scenario)
    assert got["grpcio"][0][-1] == ("EOF",)
    assert got["grpcio"][-3:] == [
        ("AioRpcError", grpc.StatusCode.UNAVAILABLE),
        True,
        grpc.StatusCode.UNAVAILABLE,
    ]
    assert got["pyxds"] == got["grpcio"]


def _channel_like(ch: Any, address: str, interceptors: Any) -> Any:
    """A channel of the same kind as ``ch`` to ``address``."""
    if isinstance(ch, pyxds_aio.AioXdsChannel):
        return pyxds_aio.insecure_channel(f"static:///{address}", interceptors=interceptors)
    return grpc.aio.insecure_channel(address, interceptors=interceptors)
