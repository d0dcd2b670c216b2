"""grpcio's asyncio compression and peer tests (client side) replayed
through pyxds.aio.

Sources (grpc/grpc ``src/python/grpcio_tests/tests_aio/unit/``):
``compression_test.py`` (TestCompression: channel-level and call-level
compression the server refuses (gzip disabled) or accepts (deflate), the
server setting its own compression and disabling it for one message, a
server whose default is deflate) and ``context_peer_test.py`` (the peer
the server sees for the client's connection).  Each scenario runs through
``grpc.aio.insecure_channel`` and ``pyxds.aio.insecure_channel`` (static
target) against the same grpcio server; what the application sees must be
equal.  Call-level compression of a unary call is also in
``test_conformance_aio_unary_lean.py``; here every kind."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from test_conformance_grpcio_aio_calls import outcome, serve

import pyxds.aio as pyxds_aio

SERVICE = "pyxds.test.AioCompression"
REQUEST = b"\x01" * 100
RESPONSE = b"\x02" * 100
#: the server accepts identity and deflate only (compression_test.py's bitset 3)
GZIP_DISABLED = ("grpc.compression_enabled_algorithms_bitset", 3)


def _unary(request: bytes, context: grpc.ServicerContext) -> bytes:
    return RESPONSE


def _stream(request: bytes, context: grpc.ServicerContext):
    yield RESPONSE
    yield RESPONSE


def _collect(requests, context: grpc.ServicerContext) -> bytes:
    return b"%d" % sum(1 for _ in requests)


def _set_compression(requests, context: grpc.ServicerContext):
    next(requests)
    context.set_compression(grpc.Compression.Deflate)
    yield RESPONSE


def _disable_next(requests, context: grpc.ServicerContext):
    next(requests)
    context.set_compression(grpc.Compression.Deflate)
    yield RESPONSE
    context.disable_next_message_compression()
    yield RESPONSE
    yield RESPONSE


def _peer(request: bytes, context: grpc.ServicerContext) -> bytes:
    return context.peer().encode()


def _server(**kwargs: Any) -> tuple[grpc.Server, str]:
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        "Collect": grpc.stream_unary_rpc_method_handler(_collect),
        "SetCompression": grpc.stream_stream_rpc_method_handler(_set_compression),
        "DisableNext": grpc.stream_stream_rpc_method_handler(_disable_next),
        "Peer": grpc.unary_unary_rpc_method_handler(_peer),
    }
    return serve(SERVICE, handlers, **kwargs)


@pytest.fixture(scope="module")
def address():
    server, address = _server(options=(GZIP_DISABLED,))
    yield address
    server.stop(None)


MAKERS = {
    "grpcio": lambda address, **kw: grpc.aio.insecure_channel(address, **kw),
    "pyxds": lambda address, **kw: pyxds_aio.insecure_channel(f"static:///{address}", **kw),
}


def run_both(address: str, scenario, **channel_kwargs: Any) -> dict[str, Any]:
    async def one(make) -> Any:
        async with make(address, **channel_kwargs) as ch:
            return await asyncio.wait_for(scenario(ch), 10)

    return {name: asyncio.run(one(make)) for name, make in MAKERS.items()}


async def _responses(call: Any) -> list[Any]:
    return [r async for r in call]


async def every_kind(ch: Any, **kwargs: Any) -> list[Any]:
    """One call of each kind (``kwargs``: the call's own options)."""
    out = [await outcome(lambda: ch.unary_unary(f"/{SERVICE}/Unary")(REQUEST, **kwargs))]
    stream = ch.unary_stream(f"/{SERVICE}/Stream")(REQUEST, **kwargs)
    out.append(await outcome(lambda: _responses(stream)))
    out.append(await stream.code())

    async def requests():
        for _ in range(3):
            yield REQUEST

    out.append(await outcome(lambda: ch.stream_unary(f"/{SERVICE}/Collect")(requests(), **kwargs)))
    chat = ch.stream_stream(f"/{SERVICE}/SetCompression")(**kwargs)
    await outcome(lambda: chat.write(REQUEST))
    await outcome(chat.done_writing)
    out.append(await outcome(lambda: _responses(chat)))
    out.append(await chat.code())
    return [o[:2] if isinstance(o, tuple) and o and o[0] == "AioRpcError" else o for o in out]


@pytest.mark.parametrize(
    "algorithm", [grpc.Compression.Gzip, grpc.Compression.Deflate], ids=["gzip", "deflate"]
)
def test_channel_level_compression_like_grpc_aio(address, algorithm):
    """compression_test.py test_channel_level_compression_baned_compression
    (gzip: UNIMPLEMENTED) / _allowed_compression (deflate: OK), every kind."""
    got = run_both(address, every_kind, compression=algorithm)
    first = got["grpcio"][0]
    if algorithm is grpc.Compression.Gzip:
        assert first == ("AioRpcError", grpc.StatusCode.UNIMPLEMENTED)
        assert_same_when_refused(got)
    else:
        assert first == ("value", RESPONSE)
        assert got["pyxds"] == got["grpcio"]


def assert_same_when_refused(got: dict[str, Any]) -> None:
    """The one-request kinds answer exactly as grpc.aio.  The calls that
    stream requests race the server's refusal with their first write, and
    grpc.aio replaces the status by INTERNAL "Internal error from Core"
    when the write loses (pyxds feeds write()'s requests through a request
    iterator, so it can lose where grpc.aio's own write() does not:
    docs/differences-from-c-core.md): UNIMPLEMENTED or INTERNAL there."""
    assert got["pyxds"][:3] == got["grpcio"][:3]
    refused = {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL}
    for side in ("grpcio", "pyxds"):
        collect, chat, chat_code = got[side][3:]
        assert collect[0] == chat[0] == "AioRpcError"
        assert {collect[1], chat[1], chat_code} <= refused, side


@pytest.mark.parametrize(
    "algorithm", [grpc.Compression.Gzip, grpc.Compression.Deflate], ids=["gzip", "deflate"]
)
def test_call_level_compression_like_grpc_aio(address, algorithm):
    """compression_test.py test_client_call_level_compression_baned_compression
    / _allowed_compression, every kind."""

    async def scenario(ch):
        return await every_kind(ch, compression=algorithm)

    got = run_both(address, scenario)
    if algorithm is grpc.Compression.Gzip:
        assert got["grpcio"][0] == ("AioRpcError", grpc.StatusCode.UNIMPLEMENTED)
        assert_same_when_refused(got)
    else:
        assert got["grpcio"][0] == ("value", RESPONSE)
        assert got["pyxds"] == got["grpcio"]


def test_server_sets_and_disables_compression_like_grpc_aio(address):
    """compression_test.py test_server_call_level_compression,
    test_server_disable_compression_stream."""

    async def scenario(ch):
        out = []
        for method in ("SetCompression", "DisableNext"):
            call = ch.stream_stream(f"/{SERVICE}/{method}")()
            await call.write(REQUEST)
            await call.done_writing()
            out.append([r async for r in call])
            out.append(await call.code())
        return out

    got = run_both(address, scenario)
    assert got["grpcio"] == [[RESPONSE], grpc.StatusCode.OK, [RESPONSE] * 3, grpc.StatusCode.OK]
    assert got["pyxds"] == got["grpcio"]


def test_server_default_compression_like_grpc_aio():
    """compression_test.py test_server_default_compression_algorithm."""
    server, address = _server(compression=grpc.Compression.Deflate)
    try:
        got = run_both(address, every_kind)
    finally:
        server.stop(None)
    assert got["grpcio"][0] == ("value", RESPONSE)
    assert got["pyxds"] == got["grpcio"]


def test_peer_the_server_sees_like_grpc_aio(address):
    """context_peer_test.py test_peer: the server's context.peer() for the
    client's connection is an ipv4: address on 127.0.0.1."""

    async def scenario(ch):
        peer = (await ch.unary_unary(f"/{SERVICE}/Peer")(b"")).decode()
        scheme, host, _port = peer.split(":")
        return (scheme, host)

    got = run_both(address, scenario)
    assert got["grpcio"] == ("ipv4", "127.0.0.1")
    assert got["pyxds"] == got["grpcio"]
