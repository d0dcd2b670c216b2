"""grpc.aio client interceptors on pyxds.aio channels: real grpcio backends
on 127.0.0.1, pyxds.server as control plane.

The routes: header ``x-env: canary`` -> cluster ``canary`` (backend "icanary"),
everything else -> cluster ``main`` (backend "imain").  An interceptor that
adds the header moves RPCs to the canary: interception runs before routing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from channel_fixtures import SERVICE, TARGET, header, route, running_backends, snapshot

import pyxds.aio
from pyxds.channel.aio import AioStreamStream, AioUnaryStream, AioUnaryUnary
from pyxds.server import ManagementServer

WHO = f"/{SERVICE}/Who"
META = f"/{SERVICE}/Meta"
STREAM = f"/{SERVICE}/Stream"
COLLECT = f"/{SERVICE}/Collect"
CHAT = f"/{SERVICE}/Chat"
FAIL = f"/{SERVICE}/Fail"
WAIT = 10.0  # bound of every wait in these tests


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("imain", "icanary")


@pytest.fixture(scope="module")
def server(backends):
    srv = ManagementServer().start()
    srv.set_snapshot(
        snapshot(
            [
                route(prefix="", headers=[header("x-env", exact="canary")], cluster="canary"),
                route(prefix="", cluster="main"),
            ],
            {"main": [[backends["imain"].address]], "canary": [[backends["icanary"].address]]},
        )
    )
    yield srv
    srv.stop()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def channel(server: ManagementServer, interceptors: Any) -> pyxds.aio.AioXdsChannel:
    return pyxds.aio.insecure_channel(
        TARGET, bootstrap=server.bootstrap(), interceptors=interceptors
    )


def with_header(details: grpc.aio.ClientCallDetails, key: str, value: str) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(key, value)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class Canary(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds ``x-env: canary`` to every RPC (every kind)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def _add(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(details)
        return await continuation(with_header(details, "x-env", "canary"), request)

    intercept_unary_unary = _add
    intercept_unary_stream = _add
    intercept_stream_unary = _add
    intercept_stream_stream = _add


class Recorder(grpc.aio.UnaryUnaryClientInterceptor):
    """Records when it runs, and the metadata it is handed; adds its own header."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        keys = [k for k, _ in details.metadata if k.startswith("x-order")]
        self.log.append(f"{self.name} in {','.join(keys)}")
        call = await continuation(with_header(details, f"x-order-{self.name}", "1"), request)
        response = await call
        self.log.append(f"{self.name} out")
        return response


def test_header_added_by_interceptor_routes_the_rpc_to_another_cluster(server, backends):
    canary = Canary()

    async def main() -> tuple[list[bytes], list[bytes]]:
        plain = pyxds.aio.insecure_channel(TARGET, bootstrap=server.bootstrap())
        intercepted = channel(server, [canary])
        try:
            got_plain = [
                await plain.unary_unary(WHO)(b"", timeout=WAIT, wait_for_ready=True)
                for _ in range(3)
            ]
            who = intercepted.unary_unary(WHO)
            got = [await who(b"", timeout=WAIT, wait_for_ready=True) for _ in range(3)]
            # the header reached the backend too, next to the caller's own metadata
            meta = await intercepted.unary_unary(META)(
                b"", timeout=WAIT, metadata=(("x-caller", "me"),)
            )
            assert b"x-env=canary" in meta and b"x-caller=me" in meta
            return got_plain, got
        finally:
            await plain.close()
            await intercepted.close()

    got_plain, got = run(main())
    assert got_plain == [b"imain"] * 3
    assert got == [b"icanary"] * 3
    # what the interceptor was handed: grpc.aio's types
    details = canary.seen[0]
    assert isinstance(details, grpc.aio.ClientCallDetails)
    assert details.method == WHO.encode()
    assert isinstance(details.metadata, grpc.aio.Metadata)
    assert details.timeout == WAIT and details.wait_for_ready is True


def test_interceptors_run_in_the_order_given_first_outermost(server, backends):
    log: list[str] = []

    async def main() -> bytes:
        async with channel(server, [Recorder("a", log), Recorder("b", log)]) as ch:
            return await ch.unary_unary(WHO)(b"", timeout=WAIT, wait_for_ready=True)

    assert run(main()) == b"imain"
    # b (inner) sees the header a (outer) added; it returns first
    assert log == ["a in ", "b in x-order-a", "b out", "a out"]


def test_unary_stream_interceptor_returns_the_call_or_rewrites_the_responses(server, backends):
    class Upper(grpc.aio.UnaryStreamClientInterceptor):
        def __init__(self, rewrite: bool) -> None:
            self.rewrite = rewrite

        async def intercept_unary_stream(self, continuation, details, request):
            call = await continuation(with_header(details, "x-env", "canary"), request)
            if not self.rewrite:
                return call

            async def upper():
                async for response in call:
                    yield response.upper()

            return upper()

    async def main() -> None:
        async with channel(server, [Upper(rewrite=False)]) as ch:
            assert isinstance(ch.unary_unary(WHO), AioUnaryUnary)  # no interceptor of its kind
            call = ch.unary_stream(STREAM)(b"3", timeout=WAIT, wait_for_ready=True)
            assert [r async for r in call] == [b"icanary"] * 3
            assert await call.code() is grpc.StatusCode.OK
            assert await call.details() == ""
            assert await call.trailing_metadata() is not None
            assert call.done()
            done = asyncio.Event()
            call.add_done_callback(lambda c: done.set())
            await asyncio.wait_for(done.wait(), WAIT)
            # read() on another call
            call = ch.unary_stream(STREAM)(b"2", timeout=WAIT)
            assert await call.read() == b"icanary"
            assert await call.read() == b"icanary"
            assert await call.read() is grpc.aio.EOF
            assert await call.code() is grpc.StatusCode.OK
        async with channel(server, [Upper(rewrite=True)]) as ch:
            call = ch.unary_stream(STREAM)(b"2", timeout=WAIT, wait_for_ready=True)
            done = asyncio.Event()
            call.add_done_callback(lambda c: done.set())  # added while the chain runs
            assert [r async for r in call] == [b"ICANARY"] * 2
            await asyncio.wait_for(done.wait(), WAIT)
            assert await call.code() is grpc.StatusCode.OK  # the status of the real call
            assert call.done()

    run(main())


def test_stream_stream_and_stream_unary_interceptors_rewrite_the_requests(server, backends):
    class Tag(grpc.aio.StreamStreamClientInterceptor, grpc.aio.StreamUnaryClientInterceptor):
        async def _tag(self, continuation, details, request_iterator):
            async def tagged():
                async for request in _aiter(request_iterator):
                    yield b"t-" + request

            return await continuation(with_header(details, "x-env", "canary"), tagged())

        intercept_stream_stream = _tag
        intercept_stream_unary = _tag

    async def main() -> None:
        async with channel(server, [Tag()]) as ch:
            assert isinstance(ch.unary_stream(STREAM), AioUnaryStream)
            chat = ch.stream_stream(CHAT)
            call = chat(iter([b"x", b"y"]), timeout=WAIT, wait_for_ready=True)
            assert [r async for r in call] == [b"icanary:t-x", b"icanary:t-y"]
            assert await call.code() is grpc.StatusCode.OK
            # write() / done_writing() without a request iterator, read() the answers
            call = chat(timeout=WAIT)
            await call.write(b"a")
            assert await call.read() == b"icanary:t-a"
            await call.write(b"b")
            await call.done_writing()
            assert await call.read() == b"icanary:t-b"
            assert await call.read() is grpc.aio.EOF
            assert await call.code() is grpc.StatusCode.OK
            with pytest.raises(asyncio.InvalidStateError):
                await call.write(b"late")
            # stream_unary
            collect = ch.stream_unary(COLLECT)
            assert await collect(iter([b"1", b"2", b"3"]), timeout=WAIT) == b"icanary:3"
            call = collect(timeout=WAIT)
            await call.write(b"1")
            await call.done_writing()
            assert await call == b"icanary:1"
            assert await call.code() is grpc.StatusCode.OK

    run(main())


async def _aiter(requests: Any) -> Any:
    if hasattr(requests, "__aiter__"):
        async for request in requests:
            yield request
    else:
        for request in requests:
            yield request


def test_interceptor_answering_without_calling_continuation(server, backends):
    class Cached(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            return b"cached:" + request

        async def intercept_stream_unary(self, continuation, details, request_iterator):
            return b"cached-stream"

    before = dict(backends["imain"].served)

    async def main() -> None:
        async with channel(server, [Cached()]) as ch:
            call = ch.unary_unary(WHO)(b"k", timeout=WAIT)
            assert await call == b"cached:k"
            assert await call.code() is grpc.StatusCode.OK
            assert await call.details() == ""
            assert call.done() and not call.cancelled()
            assert not call.cancel()  # already over
            fired = []
            call.add_done_callback(fired.append)
            assert fired == [call]
            assert await ch.stream_unary(COLLECT)(iter([b"1"]), timeout=WAIT) == b"cached-stream"

    run(main())
    assert dict(backends["imain"].served) == before  # no RPC was made


def test_errors_propagate_through_interceptors(server, backends):
    class Boom(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            if request == b"boom":
                raise RuntimeError("boom before the call")
            call = await continuation(details, request)
            return call

        async def intercept_unary_stream(self, continuation, details, request):
            raise KeyError("boom in a stream")

    async def main() -> None:
        async with channel(server, [Boom()]) as ch:
            with pytest.raises(RuntimeError, match="boom before the call"):
                await ch.unary_unary(WHO)(b"boom", timeout=WAIT)
            call = ch.unary_stream(STREAM)(b"1", timeout=WAIT)
            with pytest.raises(KeyError, match="boom in a stream"):
                async for _ in call:
                    pass
            assert call.done()
            # an RPC error of the real call reaches the caller and the call object
            call = ch.unary_unary(FAIL)(b"PERMISSION_DENIED", timeout=WAIT, wait_for_ready=True)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
            assert await call.code() is grpc.StatusCode.PERMISSION_DENIED
            assert await call.details() == "imain says no"

    run(main())


def test_cancel_while_an_interceptor_is_still_running(server, backends):
    class Hold(grpc.aio.UnaryUnaryClientInterceptor):
        def __init__(self, entered: asyncio.Event) -> None:
            self.entered = entered

        async def intercept_unary_unary(self, continuation, details, request):
            self.entered.set()
            await asyncio.Event().wait()  # until cancelled
            return await continuation(details, request)

    async def main() -> None:
        entered = asyncio.Event()
        async with channel(server, [Hold(entered)]) as ch:
            call = ch.unary_unary(WHO)(b"", timeout=WAIT)
            done = asyncio.Event()
            call.add_done_callback(lambda c: done.set())
            await asyncio.wait_for(entered.wait(), WAIT)
            assert not call.done()
            assert call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(call, WAIT)
            await asyncio.wait_for(done.wait(), WAIT)
            assert call.cancelled() and call.done()
            assert await call.code() is grpc.StatusCode.CANCELLED

    run(main())


def test_interceptor_may_change_the_method(server, backends):
    class Redirect(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            new = grpc.aio.ClientCallDetails(
                WHO.encode(),
                details.timeout,
                details.metadata,
                details.credentials,
                details.wait_for_ready,
            )
            return await continuation(new, request)

    async def main() -> bytes:
        async with channel(server, [Redirect()]) as ch:
            return await ch.unary_unary(f"/{SERVICE}/NoSuchMethod")(
                b"", timeout=WAIT, wait_for_ready=True
            )

    assert run(main()) == b"imain"


def test_not_an_interceptor_is_a_value_error_naming_its_type(server):
    class NotOne:
        pass

    with pytest.raises(ValueError, match="NotOne"):
        pyxds.aio.insecure_channel(TARGET, bootstrap=server.bootstrap(), interceptors=[NotOne()])
    # a sync grpc interceptor is not a grpc.aio one
    sync_interceptor = type(
        "SyncOne", (grpc.UnaryUnaryClientInterceptor,), {"intercept_unary_unary": None}
    )()
    with pytest.raises(ValueError, match="SyncOne"):
        pyxds.aio.secure_channel(
            TARGET,
            grpc.local_channel_credentials(),
            bootstrap=server.bootstrap(),
            interceptors=[Canary(), sync_interceptor],
        )

    async def grpcio_too() -> None:
        with pytest.raises(ValueError):
            grpc.aio.insecure_channel("127.0.0.1:1", interceptors=[NotOne()])

    run(grpcio_too())


def test_no_interceptors_keeps_the_plain_multicallables(server):
    async def main() -> None:
        for interceptors in (None, []):
            async with channel(server, interceptors) as ch:
                assert type(ch.unary_unary(WHO)) is AioUnaryUnary
                assert type(ch.stream_stream(CHAT)) is AioStreamStream

    run(main())


def test_same_interceptor_on_grpcio_aio_channel_behaves_the_same(server, backends):
    """Differential: the header-adding and recording interceptors on grpcio's
    own grpc.aio channel straight to the canary backend."""

    async def calls(ch: Any) -> tuple[bytes, list[bytes], list[bytes]]:
        meta = await ch.unary_unary(META)(b"", timeout=WAIT, wait_for_ready=True)
        streamed = [r async for r in ch.unary_stream(STREAM)(b"2", timeout=WAIT)]
        chat = ch.stream_stream(CHAT)(iter([b"q"]), timeout=WAIT)
        replies = [r async for r in chat]
        return meta, streamed, replies

    def interceptors(log: list[str]) -> list[Any]:
        return [Recorder("a", log), Canary(), Recorder("b", log)]

    async def main() -> tuple[Any, Any, list[str], list[str]]:
        log_pyxds: list[str] = []
        log_grpc: list[str] = []
        async with channel(server, interceptors(log_pyxds)) as ch:
            ours = await calls(ch)
        async with grpc.aio.insecure_channel(
            backends["icanary"].address, interceptors=interceptors(log_grpc)
        ) as ch:
            theirs = await calls(ch)
        return ours, theirs, log_pyxds, log_grpc

    ours, theirs, log_pyxds, log_grpc = run(main())

    def app_metadata(raw: bytes) -> list[str]:
        return sorted(kv for kv in raw.decode().split(";") if kv.startswith("x-"))

    expected = ["x-env=canary", "x-order-a=1", "x-order-b=1"]
    assert app_metadata(ours[0]) == app_metadata(theirs[0]) == expected
    assert ours[1:] == theirs[1:]
    assert ours[1] == [b"icanary"] * 2
    assert log_pyxds == log_grpc
