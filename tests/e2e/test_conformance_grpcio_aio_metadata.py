"""grpcio's asyncio metadata tests replayed through a pyxds.aio channel.

Source: grpc/grpc ``src/python/grpcio_tests/tests_aio/unit/metadata_test.py``
(TestMetadata).  The unary-unary cases (client to server, server to client,
trailing, invalid metadata) are replayed in
``test_conformance_aio_unary_lean.py``; here the streaming ones
(test_unary_stream, test_stream_unary, test_stream_stream), the forms the
application's metadata may take (``aio.Metadata``, tuple, list:
test_from_client_to_server_with_list), metadata a generic handler routes on
(test_generic_handler), the invalid metadata cases on streaming calls, and a
non-OK status with trailing metadata (test_inspect_context).  Each runs
through ``grpc.aio.insecure_channel`` and ``pyxds.aio.insecure_channel``
against the same grpcio server; what the application sees must be equal,
including the type of the metadata objects."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from test_conformance_grpcio_aio_calls import outcome, serve

import pyxds.aio as pyxds_aio

SERVICE = "pyxds.test.AioMetadata"
TO_SERVER = (("client-to-server", "question"), ("client-to-server-bin", b"\x07\x07\x07"))
TO_CLIENT = (("server-to-client", "answer"), ("server-to-client-bin", b"\x06\x06\x06"))
TRAILING = (("a-trailing-metadata", "stack-trace"), ("a-trailing-metadata-bin", b"\x05\x05\x05"))
MUST_HAVE = ("a-must-have-key", "secret")


def _seen(context: grpc.ServicerContext) -> bytes:
    """The application metadata the server got, as a response."""
    got = [(k, v) for k, v in context.invocation_metadata() if k in dict(TO_SERVER)]
    return repr(sorted(got)).encode()


def _unary_stream(request: bytes, context: grpc.ServicerContext):
    context.send_initial_metadata(TO_CLIENT)
    yield _seen(context)
    context.set_trailing_metadata(TRAILING)


def _stream_unary(requests, context: grpc.ServicerContext) -> bytes:
    context.send_initial_metadata(TO_CLIENT)
    count = sum(1 for _ in requests)
    context.set_trailing_metadata(TRAILING)
    return _seen(context) + b" %d" % count


def _stream_stream(requests, context: grpc.ServicerContext):
    context.send_initial_metadata(TO_CLIENT)
    for _ in requests:
        pass
    yield _seen(context)
    context.set_trailing_metadata(TRAILING)


def _inspect(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.set_code(grpc.StatusCode.NOT_FOUND)
    context.set_details("Test details!")
    context.set_trailing_metadata(TRAILING)
    return b"\x01"


class _NeedsKey(grpc.GenericRpcHandler):
    """metadata_test.py _TestGenericHandlerItself: serves only calls with the key."""

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        if MUST_HAVE in tuple(details.invocation_metadata):
            return grpc.unary_unary_rpc_method_handler(lambda r, c: b"served")
        return None


@pytest.fixture(scope="module")
def address():
    handlers = {
        "UnaryStream": grpc.unary_stream_rpc_method_handler(_unary_stream),
        "StreamUnary": grpc.stream_unary_rpc_method_handler(_stream_unary),
        "StreamStream": grpc.stream_stream_rpc_method_handler(_stream_stream),
        "Inspect": grpc.unary_unary_rpc_method_handler(_inspect),
    }
    server, address = serve(SERVICE, handlers, _NeedsKey())
    yield address
    server.stop(None)


def run_both(address: str, scenario) -> dict[str, Any]:
    makes = {
        "grpcio": lambda: grpc.aio.insecure_channel(address),
        "pyxds": lambda: pyxds_aio.insecure_channel(f"static:///{address}"),
    }

    async def one(make) -> Any:
        async with make() as ch:
            return await asyncio.wait_for(scenario(ch), 10)

    return {name: asyncio.run(one(make)) for name, make in makes.items()}


def _md(metadata: Any) -> tuple:
    return (type(metadata).__name__, tuple(metadata))


FORMS = {
    "aio.Metadata": lambda: grpc.aio.Metadata(*TO_SERVER),
    "tuple": lambda: TO_SERVER,
    "list": lambda: list(TO_SERVER),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_streaming_calls_carry_metadata_both_ways_like_grpc_aio(address, form):
    """metadata_test.py test_unary_stream, test_stream_unary, test_stream_stream
    (and test_from_client_to_server_with_list for the forms): the server sees
    the client's metadata (binary too); the client reads the server's initial
    metadata before the responses and its trailing metadata after."""

    async def scenario(ch):
        out = []
        call = ch.unary_stream(f"/{SERVICE}/UnaryStream")(b"", metadata=FORMS[form]())
        out.append(_md(await call.initial_metadata()))
        out.append([r async for r in call])
        out += [_md(await call.trailing_metadata()), await call.code()]
        call = ch.stream_unary(f"/{SERVICE}/StreamUnary")(metadata=FORMS[form]())
        await call.write(b"\0")
        await call.done_writing()
        out += [_md(await call.initial_metadata()), await call]
        out += [_md(await call.trailing_metadata()), await call.code()]
        call = ch.stream_stream(f"/{SERVICE}/StreamStream")(metadata=FORMS[form]())
        await call.write(b"\0")
        await call.done_writing()
        out += [_md(await call.initial_metadata()), [r async for r in call]]
        out += [_md(await call.trailing_metadata()), await call.code()]
        return out

    got = run_both(address, scenario)
    assert got["grpcio"][0] == ("Metadata", TO_CLIENT)
    assert got["grpcio"][1] == [repr(sorted(TO_SERVER)).encode()]
    assert got["grpcio"][2] == ("Metadata", TRAILING)
    assert got["pyxds"] == got["grpcio"]


def test_metadata_a_generic_handler_routes_on_like_grpc_aio(address):
    """metadata_test.py test_generic_handler: the handler serves only calls
    carrying its key; without it, UNIMPLEMENTED."""

    async def scenario(ch):
        method = ch.unary_unary("/any.Service/Any")
        return [
            await outcome(lambda: method(b"", metadata=(MUST_HAVE,))),
            await outcome(lambda: method(b"")),
        ]

    got = run_both(address, scenario)
    assert got["grpcio"][0] == ("value", b"served")
    assert got["grpcio"][1][1] is grpc.StatusCode.UNIMPLEMENTED
    assert got["pyxds"] == got["grpcio"]


def test_non_ok_status_with_trailing_metadata_like_grpc_aio(address):
    """metadata_test.py test_inspect_context: NOT_FOUND with its details and
    trailing metadata (on the error and on the call)."""

    async def scenario(ch):
        call = ch.unary_unary(f"/{SERVICE}/Inspect")(b"")
        try:
            await call
        except grpc.RpcError as err:
            raised = (type(err).__name__, err.code(), err.details(), _md(err.trailing_metadata()))
        return [raised, _md(await call.trailing_metadata()), await call.details()]

    got = run_both(address, scenario)
    assert got["grpcio"][0][1:3] == (grpc.StatusCode.NOT_FOUND, "Test details!")
    assert got["pyxds"] == got["grpcio"]


INVALID = [((42, 42),), (({}, {}),), ((None, {}),), (("normal", object()),)]


@pytest.mark.parametrize("kind", ["unary_stream", "stream_unary", "stream_stream"])
@pytest.mark.parametrize("metadata", INVALID, ids=["int", "dict", "none", "object"])
def test_invalid_metadata_on_streaming_calls_raises_like_grpc_aio(address, kind, metadata):
    """metadata_test.py test_invalid_metadata (_INVALID_METADATA_TEST_CASES:
    TypeError), on each streaming kind: where it is raised (at the call or
    at the first use) and what."""

    async def scenario(ch):
        mc = getattr(ch, kind)(f"/{SERVICE}/{''.join(p.title() for p in kind.split('_'))}")
        try:
            call = mc(b"", metadata=metadata) if kind == "unary_stream" else mc(metadata=metadata)
        except Exception as err:
            return ("at call", type(err).__name__)
        if kind == "stream_unary":
            got = await outcome(lambda: call)
        else:
            got = await outcome(call.read)
        call.cancel()
        return ("at use", got[0])

    got = run_both(address, scenario)
    assert got["grpcio"][1] == "TypeError"
    if metadata == INVALID[1]:  # an unhashable key: grpc.aio's aio.Metadata raises
        assert got["grpcio"] == ("at call", "TypeError")
    assert got["pyxds"] == got["grpcio"]
