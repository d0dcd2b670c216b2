"""grpcio's asyncio channel-argument and outside-init tests replayed
through pyxds.aio.

Sources (grpc/grpc ``src/python/grpcio_tests/tests_aio/unit/``):
``channel_argument_test.py`` (test_client, test_invalid_client_args,
test_max_message_length_applied) and ``outside_init_test.py``
(test_behavior_outside_asyncio, test_multi_ephemeral_loops; client parts).
Each scenario runs through ``grpc.aio.insecure_channel`` and
``pyxds.aio.insecure_channel`` (static target) against the same grpcio
server; what the application sees must be equal."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from test_conformance_grpcio_aio_calls import serve

import pyxds.aio as pyxds_aio

SERVICE = "pyxds.test.AioOptions"
MAX = 1024


def _sized(request: bytes, context: grpc.ServicerContext):
    """One response per size in the request ("512,2048")."""
    for size in request.decode().split(","):
        yield b"x" * int(size)


@pytest.fixture(scope="module")
def address():
    handlers = {
        "Sized": grpc.unary_stream_rpc_method_handler(_sized),
        "Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r),
    }
    server, address = serve(SERVICE, handlers)
    yield address
    server.stop(None)


MAKERS = {
    "grpcio": lambda address, **kw: grpc.aio.insecure_channel(address, **kw),
    "pyxds": lambda address, **kw: pyxds_aio.insecure_channel(f"static:///{address}", **kw),
}


class _Pointer:
    """channel_argument_test.py's _TestPointerWrapper."""

    def __int__(self) -> int:
        return 123456


ARGS = (
    ("arg1", b"bytes_val"),
    ("arg2", "str_val"),
    ("arg3", 1),
    ("arg4", "str_val"),
    ("arg6", _Pointer()),
)


def test_unknown_channel_arguments_are_accepted_like_grpc_aio(address):
    """channel_argument_test.py test_client: arguments of every value type
    nobody knows; the channel is made, serves a call and closes."""

    async def scenario(make):
        async with make(address, options=ARGS) as ch:
            return await ch.unary_unary(f"/{SERVICE}/Echo")(b"x", timeout=5)

    got = {name: asyncio.run(scenario(make)) for name, make in MAKERS.items()}
    assert got == {"grpcio": b"x", "pyxds": b"x"}


@pytest.mark.parametrize(
    "options", [{"foo": "bar"}, (("key",),), "str"], ids=["dict", "one", "str"]
)
def test_invalid_channel_arguments_raise_like_grpc_aio(address, options):
    """channel_argument_test.py test_invalid_client_args: ValueError or
    TypeError from the constructor; the same class in both."""

    async def scenario(make):
        try:
            ch = make(address, options=options)
        except (ValueError, TypeError) as err:
            return type(err).__name__
        await ch.close()
        return "made"

    got = {name: asyncio.run(scenario(make)) for name, make in MAKERS.items()}
    assert got["grpcio"] in ("ValueError", "TypeError")
    assert got["pyxds"] == got["grpcio"]


def test_max_receive_message_length_applies_to_responses_like_grpc_aio(address):
    """channel_argument_test.py test_max_message_length_applied: the first
    response (MAX/2) arrives, the second (2*MAX) ends the call
    RESOURCE_EXHAUSTED with details naming the limit."""

    async def scenario(make):
        options = (("grpc.max_receive_message_length", MAX),)
        async with make(address, options=options) as ch:
            call = ch.unary_stream(f"/{SERVICE}/Sized")(f"{MAX // 2},{MAX * 2}".encode())
            first = len(await call.read())
            try:
                await call.read()
                second: Any = "no error"
            except grpc.aio.AioRpcError as err:
                second = (err.code(), err.details())
            return [first, second, await call.code(), await call.details()]

    got = {name: asyncio.run(scenario(make)) for name, make in MAKERS.items()}
    assert got["grpcio"][0] == MAX // 2
    assert got["grpcio"][1][0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(MAX) in got["grpcio"][1][1]
    assert got["pyxds"] == got["grpcio"]


def test_channel_made_outside_a_loop_like_grpc_aio(address):
    """outside_init_test.py test_behavior_outside_asyncio: making the channel
    outside any event loop does not raise (test frameworks share such
    objects)."""
    got = {}
    for name, make in MAKERS.items():
        # a fresh process's state: a default loop set, none running (an
        # earlier asyncio.run() in this process left none set)
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            ch = make(address)
            got[name] = [type(ch).__name__ != "", callable(ch.unary_unary(f"/{SERVICE}/Echo"))]
        except Exception as err:
            got[name] = [type(err).__name__]
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    assert got == {"grpcio": [True, True], "pyxds": [True, True]}


def test_channels_on_many_ephemeral_loops_like_grpc_aio(address):
    """outside_init_test.py test_multi_ephemeral_loops (client part): a new
    event loop each round, a new channel on it, one call, close; no round
    hangs or fails (10 rounds here, 50 there)."""
    for name, make in MAKERS.items():
        results = []
        for i in range(10):
            loop = asyncio.new_event_loop()
            try:

                async def ping(i: int = i, make: Any = make) -> Any:
                    async with make(address) as ch:
                        return await ch.unary_unary(f"/{SERVICE}/Echo")(b"%d" % i, timeout=5)

                results.append(loop.run_until_complete(asyncio.wait_for(ping(), 10)))
            finally:
                loop.close()
        assert results == [b"%d" % i for i in range(10)], name
