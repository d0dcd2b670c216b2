"""grpcio's own asyncio client tests replayed through a pyxds.aio channel.

Source: grpc/grpc ``src/python/grpcio_tests/tests_aio/unit/call_test.py``
(TestUnaryUnaryCall, TestUnaryStreamCall, TestStreamUnaryCall,
TestStreamStreamCall).  pyxds.aio claims to be a drop-in
``grpc.aio.insecure_channel``: each scenario runs once through a plain
``grpc.aio.insecure_channel`` and once through ``pyxds.aio.insecure_channel``
(static target), against the same in-process grpcio server on 127.0.0.1, and
records what the application can see (values, exception types, codes,
details, ``done()`` / ``cancelled()`` / ``cancel()`` results, ``EOF``).  The
two records must be equal.  Unary-unary cases already replayed elsewhere are
not repeated here (``test_conformance_aio_unary_lean.py``: OK, cancel before
and in flight, task cancelled; ``test_conformance_channel_parity.py``:
cancelled before start, deadline)."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest

import pyxds.aio as pyxds_aio

SERVICE = "pyxds.test.AioCalls"
#: pause between streamed responses when a request asks for one (seconds)
INTERVAL = 0.05
FOREVER = 3600.0


def _stream(request: bytes, context: grpc.ServicerContext):
    """Request ``b"n[,pause]"``: n responses of 42 bytes, ``pause`` seconds
    before each but the first (``FOREVER`` blocks until cancelled)."""
    count, _, pause = request.decode().partition(",")
    for i in range(int(count)):
        if i and pause and context_wait(context, float(pause)):
            return
        yield b"r" * 42


def context_wait(context: grpc.ServicerContext, seconds: float) -> bool:
    """Sleep ``seconds`` unless the RPC ends first (then True)."""
    done = threading.Event()
    context.add_callback(done.set)
    return done.wait(seconds)


def _collect(requests, context: grpc.ServicerContext) -> bytes:
    return str(sum(len(r) for r in requests)).encode()


def _chat(requests, context: grpc.ServicerContext):
    """One 42-byte response per request (ping-pong)."""
    for request in requests:
        if request == b"slow" and context_wait(context, INTERVAL):
            return
        yield b"r" * 42


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


#: the calls' handlers (the other test_conformance_grpcio_aio_* files add theirs)
HANDLERS = {
    "Echo": grpc.unary_unary_rpc_method_handler(_echo),
    "Stream": grpc.unary_stream_rpc_method_handler(_stream),
    "Collect": grpc.stream_unary_rpc_method_handler(_collect),
    "Chat": grpc.stream_stream_rpc_method_handler(_chat),
}


def serve(
    service: str,
    handlers: dict[str, Any],
    *more: grpc.GenericRpcHandler,
    port: int = 0,
    **server_kwargs: Any,
) -> tuple[grpc.Server, str]:
    """A started grpcio server on 127.0.0.1 (``port`` 0: any) serving
    ``handlers`` under ``service`` (and ``more``); it and its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), **server_kwargs)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, handlers), *more)
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, f"127.0.0.1:{bound}"


def closed_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def address():
    server, address = serve(SERVICE, HANDLERS)
    yield address
    server.stop(None)


def channels(address: str) -> dict[str, Any]:
    return {
        "grpcio": lambda: grpc.aio.insecure_channel(address),
        "pyxds": lambda: pyxds_aio.insecure_channel(f"static:///{address}"),
    }


def run_both(address: str, scenario) -> dict[str, Any]:
    """``scenario(channel)`` on a connected grpc.aio channel and on a
    connected pyxds.aio channel; what each returned."""

    async def one(make) -> Any:
        channel = make()
        try:
            await channel.unary_unary(f"/{SERVICE}/Echo")(b"", timeout=5, wait_for_ready=True)
            return await asyncio.wait_for(scenario(channel), 10)
        finally:
            await channel.close()

    return {name: asyncio.run(one(make)) for name, make in channels(address).items()}


def assert_same(got: dict[str, Any]) -> None:
    assert got["pyxds"] == got["grpcio"]


async def outcome(awaitable_fn) -> tuple:
    """What awaiting ``awaitable_fn()`` gives the application."""
    try:
        value = await awaitable_fn()
    except grpc.aio.AioRpcError as err:
        return ("AioRpcError", err.code(), err.details())
    except asyncio.CancelledError:
        return ("CancelledError",)
    except Exception as err:
        return (type(err).__name__, str(err))
    if value is grpc.aio.EOF:
        return ("EOF",)
    return ("value", value)


def stream(ch: Any) -> Any:
    return ch.unary_stream(f"/{SERVICE}/Stream")


def collect(ch: Any) -> Any:
    return ch.stream_unary(f"/{SERVICE}/Collect")


def chat(ch: Any) -> Any:
    return ch.stream_stream(f"/{SERVICE}/Chat")


# -- TestUnaryUnaryCall ---------------------------------------------------------


def test_unary_result_and_error_are_cached_on_the_call_like_grpc_aio(address):
    """call_test.py TestUnaryUnaryCall.test_call_ok / test_call_rpc_error:
    awaiting a finished call again gives the same response object, or raises
    again (grpcio 1.85 raises a new, equal AioRpcError each time: the stored
    test's "same exception instance" no longer holds live)."""

    async def scenario(ch):
        ok = ch.unary_unary(f"/{SERVICE}/Echo")(b"x", timeout=5)
        before = ok.done()
        first = await ok
        again = await ok
        failed = ch.unary_unary(f"/{SERVICE}/Missing")(b"x", timeout=5)
        errors = []
        for _ in range(2):
            try:
                await failed
            except grpc.aio.AioRpcError as err:
                errors.append(err)
        return (
            before,
            ok.done(),
            first,
            first is again,
            len(errors),
            errors[0] is errors[1],
            errors[0].code(),
            failed.done(),
            await failed.code(),
        )

    got = run_both(address, scenario)
    assert got["grpcio"][:6] == (False, True, b"x", True, 2, False)
    assert_same(got)


def test_unary_call_attributes_are_awaitable_without_awaiting_the_call_like_grpc_aio(address):
    """call_test.py test_call_code_awaitable, test_call_details_awaitable,
    test_call_initial_metadata_awaitable, test_call_trailing_metadata_awaitable:
    each attribute alone, on a fresh call nobody awaits."""

    async def scenario(ch):
        echo = ch.unary_unary(f"/{SERVICE}/Echo")
        return (
            await echo(b"").code(),
            await echo(b"").details(),
            tuple(await echo(b"").initial_metadata()),
            tuple(await echo(b"").trailing_metadata()),
        )

    got = run_both(address, scenario)
    assert got["grpcio"] == (grpc.StatusCode.OK, "", (), ())
    assert_same(got)


# -- TestUnaryStreamCall --------------------------------------------------------


def test_unary_stream_cancel_after_a_read_like_grpc_aio(address):
    """call_test.py test_cancel_unary_stream / test_multiple_cancel_unary_stream:
    the first cancel() is True, later ones False; CANCELLED with grpc.aio's
    local details; a read afterwards raises CancelledError."""

    async def scenario(ch):
        call = stream(ch)(f"5,{INTERVAL}".encode())
        seen: list[Any] = [call.cancelled(), await outcome(call.read)]
        seen += [call.cancel(), call.cancel(), call.cancel()]
        seen += [await call.code(), await call.details(), call.cancel()]
        seen += [await outcome(call.read), call.cancelled(), call.done()]
        return seen

    got = run_both(address, scenario)
    assert got["grpcio"][2:6] == [
        True,
        False,
        False,
        grpc.StatusCode.CANCELLED,
    ]
    assert_same(got)


def test_unary_stream_cancel_before_any_read_like_grpc_aio(address):
    """call_test.py test_early_cancel_unary_stream."""

    async def scenario(ch):
        call = stream(ch)(f"5,{INTERVAL}".encode())
        return [
            call.cancelled(),
            call.cancel(),
            call.cancel(),
            await outcome(call.read),
            call.cancelled(),
            await call.code(),
            await call.details(),
        ]

    got = run_both(address, scenario)
    assert got["grpcio"][3] == ("CancelledError",)
    assert_same(got)


def test_unary_stream_reads_past_the_end_give_eof_like_grpc_aio(address):
    """call_test.py test_too_many_reads_unary_stream / test_late_cancel_unary_stream:
    every response, then EOF, then EOF again after the status; cancel()
    after the end is False and leaves OK."""

    async def scenario(ch):
        call = stream(ch)(b"5")
        reads = [await outcome(call.read) for _ in range(6)]
        code = await call.code()
        return [reads, code, await outcome(call.read), call.cancel(), await call.code()]

    got = run_both(address, scenario)
    assert got["grpcio"][0][-1] == ("EOF",)
    assert got["grpcio"][1:] == [grpc.StatusCode.OK, ("EOF",), False, grpc.StatusCode.OK]
    assert_same(got)


def test_unary_stream_async_for_yields_every_response_like_grpc_aio(address):
    """call_test.py test_unary_stream_async_generator."""

    async def scenario(ch):
        call = stream(ch)(b"5")
        before = call.cancelled()
        responses = [r async for r in call]
        return [before, responses, await call.code(), call.done()]

    got = run_both(address, scenario)
    assert got["grpcio"] == [False, [b"r" * 42] * 5, grpc.StatusCode.OK, True]
    assert_same(got)


@pytest.mark.parametrize("style", ["read", "async for"])
def test_unary_stream_reader_task_cancelled_cancels_the_call_like_grpc_aio(address, style):
    """call_test.py test_cancel_unary_stream_in_task_using_read /
    test_cancel_unary_stream_in_task_using_async_for: the server blocks after
    its first response; cancelling the task reading the call cancels the call."""

    async def scenario(ch):
        call = stream(ch)(f"2,{FOREVER}".encode())
        started = asyncio.Event()

        async def reader():
            started.set()
            if style == "read":
                await call.read()
                await call.read()
            else:
                async for _ in call:
                    pass

        task = asyncio.get_running_loop().create_task(reader())
        await started.wait()
        await asyncio.sleep(0.05)
        was_done = task.done()
        task.cancel()
        code = await call.code()
        return [was_done, code, await outcome(lambda: task), call.cancelled()]

    got = run_both(address, scenario)
    assert got["grpcio"][:3] == [False, grpc.StatusCode.CANCELLED, ("CancelledError",)]
    assert_same(got)


def test_unary_stream_time_remaining_counts_down_like_grpc_aio(address):
    """call_test.py test_time_remaining: the call's remaining time shrinks by
    the server's pause between two responses."""

    async def scenario(ch):
        call = stream(ch)(b"2,0.3", timeout=2)
        await call.read()
        first = call.time_remaining()
        await call.read()
        second = call.time_remaining()
        return [1.5 < first <= 2, 1.2 < second < 1.75, await call.code()]

    got = run_both(address, scenario)
    assert got["grpcio"] == [True, True, grpc.StatusCode.OK]
    assert_same(got)


def test_time_remaining_without_a_deadline_is_none_like_grpc_aio(address):
    """grpc.aio.Call.time_remaining(): None when the call has no deadline."""

    async def scenario(ch):
        call = stream(ch)(b"1")
        remaining = call.time_remaining()
        responses = [r async for r in call]
        unary = ch.unary_unary(f"/{SERVICE}/Echo")(b"")
        return [remaining, responses, unary.time_remaining(), await unary]

    got = run_both(address, scenario)
    assert got["grpcio"] == [None, [b"r" * 42], None, b""]
    assert_same(got)


# -- TestStreamUnaryCall --------------------------------------------------------


def test_stream_unary_cancel_after_writes_like_grpc_aio(address):
    """call_test.py test_cancel_stream_unary: cancel() after five writes is
    True and the call is cancelled at once; done_writing() afterwards is a
    no-op; awaiting raises CancelledError."""

    async def scenario(ch):
        call = collect(ch)()
        for _ in range(5):
            await call.write(b"\0" * 7)
        seen: list[Any] = [call.done(), call.cancelled(), call.cancel(), call.cancelled()]
        seen.append(await outcome(call.done_writing))
        seen.append(await outcome(lambda: call))
        seen += [await call.code(), await call.details()]
        return seen

    got = run_both(address, scenario)
    assert got["grpcio"][:6] == [False, False, True, True, ("value", None), ("CancelledError",)]
    assert_same(got)


def test_stream_unary_cancel_before_writing_like_grpc_aio(address):
    """call_test.py test_early_cancel_stream_unary: a write after cancel()
    raises asyncio.InvalidStateError; done_writing() is a no-op."""

    async def scenario(ch):
        call = collect(ch)()
        seen: list[Any] = [call.done(), call.cancelled(), call.cancel(), call.cancelled()]
        seen.append(await outcome(lambda: call.write(b"")))
        seen.append(await outcome(call.done_writing))
        seen.append(await outcome(lambda: call))
        return seen

    got = run_both(address, scenario)
    assert got["grpcio"][4][0] == "InvalidStateError"
    assert_same(got)


def test_stream_unary_write_after_done_writing_like_grpc_aio(address):
    """call_test.py test_write_after_done_writing: InvalidStateError, and the
    call still ends with the server's answer."""

    async def scenario(ch):
        call = collect(ch)()
        for _ in range(5):
            await call.write(b"\0" * 7)
        seen: list[Any] = [await outcome(call.done_writing)]
        seen.append(await outcome(lambda: call.write(b"")))
        seen.append(await outcome(call.done_writing))
        seen += [await outcome(lambda: call), await call.code()]
        return seen

    got = run_both(address, scenario)
    assert got["grpcio"][1][0] == "InvalidStateError"
    assert got["grpcio"][3:] == [("value", b"35"), grpc.StatusCode.OK]
    assert_same(got)


def _iterator_sees_cancel(ch_call, kind: str):
    """The call is cancelled while its request generator sleeps after its
    second request (an event says when): cancelled at a fixed time, under
    load the cancel sometimes found the generator at a ``yield`` (its
    request still being written), which ends it with GeneratorExit only,
    in grpc.aio as in pyxds (13 of 60 runs at load ~20: 4 grpc.aio, 9 pyxds)."""

    async def scenario(ch):
        saw: list[str] = []
        sleeping = asyncio.Event()

        async def requests():
            try:
                for i in range(5):
                    yield b"slow"
                    if i == 1:
                        sleeping.set()
                        await asyncio.sleep(30)  # the cancel comes meanwhile
                    await asyncio.sleep(INTERVAL)
            except asyncio.CancelledError:
                saw.append("CancelledError")
                raise
            finally:
                saw.append("closed")

        call = ch_call(ch)(requests())

        async def cancel_later():
            await sleeping.wait()
            call.cancel()

        later = asyncio.get_running_loop().create_task(cancel_later())
        if kind == "unary":
            result = [await outcome(lambda: call)]
        else:
            result = [await outcome(lambda: _drain(call))]
        await later
        for _ in range(100):
            if "closed" in saw:
                break
            await asyncio.sleep(0.01)
        return [result, saw, await call.code(), call.cancelled()]

    return scenario


async def _drain(call: Any) -> int:
    """How many responses the call gave (read with ``async for``)."""
    return len([r async for r in call])


def test_stream_unary_request_iterator_sees_the_cancel_like_grpc_aio(address):
    """call_test.py TestStreamUnaryCall.test_error_in_async_generator: the
    application's request async generator gets CancelledError when the call
    is cancelled; awaiting the call raises CancelledError."""
    got = run_both(address, _iterator_sees_cancel(collect, "unary"))
    assert got["grpcio"][0] == [("CancelledError",)]
    assert got["grpcio"][1] == ["CancelledError", "closed"]
    assert_same(got)


# -- TestStreamStreamCall -------------------------------------------------------


def test_stream_stream_request_iterator_sees_the_cancel_like_grpc_aio(address):
    """call_test.py TestStreamStreamCall.test_error_in_async_generator: the
    ``async for`` over the responses ends without an exception; the request
    generator gets CancelledError; the code is CANCELLED."""
    got = run_both(address, _iterator_sees_cancel(chat, "stream"))
    assert got["grpcio"][1] == ["CancelledError", "closed"]
    assert got["grpcio"][2] == grpc.StatusCode.CANCELLED
    assert_same(got)


@pytest.mark.parametrize(
    "when", ["after ping-pong", "pending read", "ongoing read", "early", "after done_writing"]
)
def test_stream_stream_cancel_like_grpc_aio(address, when):
    """call_test.py TestStreamStreamCall test_cancel, test_cancel_with_pending_read,
    test_cancel_with_ongoing_read, test_early_cancel, test_cancel_after_done_writing."""

    async def scenario(ch):
        call = chat(ch)()
        seen: list[Any] = []
        task = None
        if when == "after ping-pong":
            for _ in range(5):
                await call.write(b"")
                seen.append(await outcome(call.read))
        elif when == "pending read":
            await call.write(b"")
        elif when == "ongoing read":
            started = asyncio.Event()

            async def read():
                started.set()
                return await call.read()

            task = asyncio.get_running_loop().create_task(read())
            await started.wait()
            seen.append(task.done())
        elif when == "after done_writing":
            await call.done_writing()
        seen += [call.done(), call.cancelled(), call.cancel(), call.cancelled()]
        seen += [await call.code(), await call.details()]
        if task is not None:
            seen.append(await outcome(lambda: task))
        seen.append(await outcome(call.read))
        return seen

    got = run_both(address, scenario)
    assert grpc.StatusCode.CANCELLED in got["grpcio"]
    assert_same(got)


def test_stream_stream_late_cancel_keeps_ok_like_grpc_aio(address):
    """call_test.py TestStreamStreamCall.test_late_cancel."""

    async def scenario(ch):
        call = chat(ch)()
        await call.done_writing()
        code = await call.code()
        return [code, call.done(), call.cancelled(), call.cancel(), call.cancelled()]

    got = run_both(address, scenario)
    assert got["grpcio"] == [grpc.StatusCode.OK, True, False, False, False]
    assert_same(got)


def test_stream_stream_async_generator_and_too_many_reads_like_grpc_aio(address):
    """call_test.py test_async_generator / test_too_many_reads: requests from
    an async generator; reads past the end give EOF, also after the status."""

    async def scenario(ch):
        async def requests():
            for _ in range(5):
                yield b""

        call = chat(ch)(requests())
        reads = [await outcome(call.read) for _ in range(6)]
        code = await call.code()
        again = await outcome(call.read)
        other = chat(ch)(requests())
        return [reads, code, again, [r async for r in other], await other.code()]

    got = run_both(address, scenario)
    assert got["grpcio"][0][-1] == ("EOF",)
    assert got["grpcio"][1:3] == [grpc.StatusCode.OK, ("EOF",)]
    assert_same(got)


def test_stream_stream_read_after_done_writing_like_grpc_aio(address):
    """call_test.py test_read_write_after_done_writing: a write after
    done_writing() raises InvalidStateError; reads still get the responses."""

    async def scenario(ch):
        call = chat(ch)()
        await call.write(b"")
        await call.write(b"")
        await call.done_writing()
        late = await outcome(lambda: call.write(b""))
        reads = [await outcome(call.read) for _ in range(3)]
        return [late, reads, await call.code()]

    got = run_both(address, scenario)
    assert got["grpcio"][0][0] == "InvalidStateError"
    assert got["grpcio"][2] == grpc.StatusCode.OK
    assert_same(got)


def test_debug_error_string_of_each_kind_like_grpc_aio(address):
    """grpc.aio's Call.debug_error_string() (read by grpcio's interceptor
    tests, e.g. client_stream_stream_interceptor_test.py test_intercepts:
    "" for an OK call): OK, failed by the server (UNIMPLEMENTED), cancelled."""

    async def scenario(ch):
        out = []
        for method in ("Stream", "Missing"):
            call = (
                stream(ch)(b"2")
                if method == "Stream"
                else ch.unary_stream(f"/{SERVICE}/{method}")(b"")
            )
            await outcome(lambda c=call: _drain(c))
            text = await call.debug_error_string()
            out.append((type(text).__name__, text == "", "UNIMPLEMENTED" in text or "12" in text))
        call = chat(ch)()
        await call.done_writing()
        out.append(await outcome(call.debug_error_string))
        call = collect(ch)()
        call.cancel()
        out.append(await outcome(call.debug_error_string))
        unary = ch.unary_unary(f"/{SERVICE}/Echo")(b"")
        await unary
        out.append(await unary.debug_error_string())
        return out

    got = run_both(address, scenario)
    assert got["grpcio"][0] == ("str", True, False)
    assert got["grpcio"][1][:2] == ("str", False)
    assert got["pyxds"] == got["grpcio"]


@pytest.mark.parametrize("kind", ["unary_unary", "unary_stream", "stream_unary", "stream_stream"])
def test_cancel_in_flight_ends_the_call_before_it_returns_like_grpc_aio(address, kind):
    """call_test.py test_cancel_stream_unary ("the call is cancelled at
    once") and client_unary_stream_interceptor_test.py
    test_cancel_consuming_response_iterator (done() True right after):
    cancel() of a call in flight returns with the call done and its done
    callbacks run."""

    async def scenario(ch):
        if kind == "unary_unary":
            call = ch.unary_unary(f"/{SERVICE}/Echo")(b"")
        elif kind == "unary_stream":
            call = stream(ch)(f"2,{FOREVER}".encode())
            await call.read()
        elif kind == "stream_unary":
            call = collect(ch)()
            await call.write(b"")
        else:
            call = chat(ch)()
            await call.write(b"")
            await call.read()
        seen: list[bool] = []
        call.add_done_callback(lambda c: seen.append(c is call))
        cancelled = call.cancel()
        return [cancelled, call.done(), call.cancelled(), list(seen), await call.code()]

    got = run_both(address, scenario)
    assert got["grpcio"] == [True, True, True, [True], grpc.StatusCode.CANCELLED]
    assert got["pyxds"] == got["grpcio"]


def test_write_calls_that_end_leave_no_task_behind_like_grpc_aio(address):
    """A stream_unary / stream_stream call fed with write() that ends before
    done_writing() (server error, cancel, deadline): once it is over, no
    task of the channel is left waiting (grpc.aio's write() calls leave
    none; a task left pending is reported destroyed when the loop closes)."""

    async def scenario(ch):
        ends = []
        missing = ch.stream_stream(f"/{SERVICE}/Missing")()
        await outcome(lambda: missing.write(b""))
        # UNIMPLEMENTED, or INTERNAL when grpc.aio's write loses the race
        # with the server's answer (either side: docs/differences-from-c-core.md)
        refused = await outcome(missing.read)
        ends.append(refused[1] in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL))
        cancelled = collect(ch)()
        await cancelled.write(b"")
        cancelled.cancel()
        ends.append(await outcome(lambda: cancelled))
        late = chat(ch)(timeout=0.1)
        await late.write(b"")
        await late.read()
        ends.append((await outcome(late.read))[:2])
        for _ in range(20):
            await asyncio.sleep(0.01)
        me = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        # what is left besides run_both's own task awaiting this scenario
        # and the channel's own (pyxds watches each subchannel's state)
        names = [t.get_coro().__qualname__ for t in left]
        return [
            ends,
            sorted(n for n in names if "run_both" not in n and n != "AioTransport._watch"),
        ]

    got = run_both(address, scenario)
    assert got["grpcio"][1] == []
    assert got["pyxds"] == got["grpcio"]


def test_an_error_the_channel_makes_debugs_like_grpc_aio() -> None:
    """grpc/grpc tests_aio/unit/call_test.py reads ``debug_error_string()``
    of failed calls: for one its channel failed itself (the deadline of a
    wait_for_ready RPC to an address nobody listens on, so no transport
    call ever began), grpc.aio 1.85 gives ``CODE:details``; pyxds.aio gave
    "pyxds: ..." (the sync channel's form is held by
    test_conformance_grpcio_sync_api.py)."""
    dead = f"127.0.0.1:{closed_port()}"

    async def one(make) -> tuple:
        channel = make()
        try:
            await channel.unary_unary(f"/{SERVICE}/Echo")(b"", timeout=0.2, wait_for_ready=True)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.debug_error_string()
        finally:
            await channel.close()
        return ("ok",)

    got = {name: asyncio.run(one(make)) for name, make in channels(dead).items()}
    assert got["grpcio"] == (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "DEADLINE_EXCEEDED:Deadline Exceeded",
    )
    assert_same(got)
