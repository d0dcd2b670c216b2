"""Metadata grpcio refuses leaves nothing behind a closed pyxds channel.

grpcio 1.85 converts a call's metadata after creating its C-core call, and
when the conversion raises (a value of the wrong type, a ``-bin`` key with
a str, a pair that does not unpack) it never releases that call: the
channel's connection outlives ``close()`` (docs/traps.md).  pyxds finds
such metadata before any grpcio call (pyxds/channel/metadata_check.py) and
raises what grpcio raises: same type and text, from the same place (the
sync call itself; grpc.aio's awaited call).  Each input kind runs on every
call kind, compared with grpcio's own channel (one to a port nobody
listens on: a call that raises is never started, so it never connects),
and after ``close()`` the backend has no connection left from pyxds.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest
from channel_fixtures import connections_to, wait_until
from ports import EXCLUSIVE

import pyxds._api as pyxds
import pyxds.aio as pyxds_aio
from pyxds.channel.metadata_check import grpcio_error, well_formed

SERVICE = "pyxds.test.Md"


class Bytes(bytes):
    pass


class Text(str):
    pass


#: metadata grpcio refuses with a Python exception (its C-core call kept)
REFUSED: dict[str, Any] = {
    "int-value": (("k", 5),),
    "float-key": ((1.5, "v"),),
    "str-on-bin-key": (("k-bin", "text"),),
    "none-on-bin-key": (("k-bin", None),),
    "bytearray-on-bin-key": (("k-bin", bytearray(b"x")),),
    "bytes-subclass-value": (("k", Bytes(b"v")),),
    "one-element-pair": (("k",),),
    "empty-pair": ((),),
    "three-element-pair": (("k", "v", "w"),),
    "string-pair-of-three": ("abc",),
    "int-pair": (5,),
    "second-pair-bad": (("a", "ok"), ("b", 5)),
    "surrogate-value": (("k", "\ud800"),),
    "dict": {"key": "v"},
    "list-value": (("k", ["v"]),),
}
#: odd metadata grpcio converts (C-core then judges the headers)
CONVERTED: dict[str, Any] = {
    "none-value": (("k", None),),
    "bytes-key": ((b"k", "v"),),
    "bytes-on-text-key": (("k", b"v"),),
    "str-subclass": ((Text("k"), Text("v")),),
    "bytes-subclass-key": ((Bytes(b"k"), "v"),),
    "two-char-string-pair": ("ab",),
    "list-pair": (["k", "v"],),
    "non-ascii-value": (("k", "é"),),
    "upper-case-key": (("Upper", "v"),),
    "ok": (("k", "v"), ("k-bin", b"\x00")),
}


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def _keys(request: bytes, context: grpc.ServicerContext) -> bytes:
    return repr([(k, v) for k, v in context.invocation_metadata() if k.startswith("k")]).encode()


def _echo_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    return b"".join(requests)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE])
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Stream": grpc.stream_unary_rpc_method_handler(_echo_stream),
        "Keys": grpc.unary_unary_rpc_method_handler(_keys),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None).wait(5)


@pytest.fixture(scope="module")
def nowhere() -> str:
    """An address nobody listens on (grpcio's reference channels: their
    refused calls never start, so never connect)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def outcome(run: Callable[[], Any]) -> tuple[str, str]:
    try:
        run()
    except grpc.RpcError as err:
        return ("RpcError", str(err.code()))
    except Exception as err:
        return (type(err).__name__, str(err))
    return ("ok", "")


@pytest.mark.parametrize("kind", [*REFUSED, *CONVERTED])
def test_grpcio_error_is_what_grpcio_raises_converting_the_metadata(nowhere, kind):
    metadata = {**REFUSED, **CONVERTED}[kind]
    with grpc.insecure_channel(nowhere) as channel:
        got = outcome(lambda: channel.unary_unary(f"/{SERVICE}/Echo")(b"", 0.2, metadata))
    error = grpcio_error(tuple(metadata))
    if kind in CONVERTED:  # grpcio started the call: UNAVAILABLE, DEADLINE or INTERNAL
        assert error is None and got[0] == "RpcError"
    else:
        assert error is not None and (type(error).__name__, str(error)) == got


def test_the_good_path_check_vouches_only_for_metadata_grpcio_converts():
    vouched = {kind for kind, md in {**REFUSED, **CONVERTED}.items() if well_formed(tuple(md))}
    assert vouched == {"bytes-on-text-key", "upper-case-key", "ok"}  # C-core refuses upper case
    ok = CONVERTED["ok"]
    assert well_formed(ok) and well_formed(ok)  # the second: the one vouched for last
    assert not well_formed(REFUSED["str-on-bin-key"])


SYNC_VERBS: dict[str, Callable[[Any, Any], Any]] = {
    "call": lambda ch, md: ch.unary_unary(f"/{SERVICE}/Echo")(b"", 5, md),
    "with_call": lambda ch, md: ch.unary_unary(f"/{SERVICE}/Echo").with_call(b"", 5, md),
    "future": lambda ch, md: ch.unary_unary(f"/{SERVICE}/Echo").future(b"", 5, md).result(),
    "unary_stream": lambda ch, md: list(ch.unary_stream(f"/{SERVICE}/Echo")(b"", 5, md)),
    "stream_unary": lambda ch, md: ch.stream_unary(f"/{SERVICE}/Stream")(iter([b""]), 5, md),
    "stream_stream": lambda ch, md: list(
        ch.stream_stream(f"/{SERVICE}/Stream")(iter([b""]), 5, md)
    ),
}


@pytest.mark.parametrize("verb", list(SYNC_VERBS))
def test_refused_metadata_raises_what_grpcio_raises_and_no_connection_outlives_close(
    address, nowhere, verb
):
    run = SYNC_VERBS[verb]
    with grpc.insecure_channel(nowhere) as reference:
        want = [outcome(lambda md=md: run(reference, md)) for md in REFUSED.values()]
    channel = pyxds.insecure_channel(f"static:///{address}")
    try:
        assert channel.unary_unary(f"/{SERVICE}/Echo")(b"up", timeout=5) == b"up"
        got = [outcome(lambda md=md: run(channel, md)) for md in REFUSED.values()]
        assert channel.unary_unary(f"/{SERVICE}/Echo")(b"still", timeout=5) == b"still"
    finally:
        channel.close()
    assert got == want
    assert wait_until(lambda: connections_to(address) == 0, 5)


AIO_KINDS: dict[str, Callable[[Any, Any], Any]] = {
    "unary_unary": lambda ch, md: ch.unary_unary(f"/{SERVICE}/Echo")(b"", timeout=5, metadata=md),
    "unary_stream": lambda ch, md: ch.unary_stream(f"/{SERVICE}/Echo")(b"", timeout=5, metadata=md),
    "stream_unary": lambda ch, md: ch.stream_unary(f"/{SERVICE}/Stream")(
        iter([b""]), timeout=5, metadata=md
    ),
    "stream_stream": lambda ch, md: ch.stream_stream(f"/{SERVICE}/Stream")(
        iter([b""]), timeout=5, metadata=md
    ),
}


async def _aio_outcomes(channel: Any, kind: str) -> list[tuple[str, str, str]]:
    """(where, type, text) of each refused metadata's raise: from making
    the call, or from awaiting (reading) it."""
    out = []
    for md in REFUSED.values():
        where = "at call"
        try:
            call = AIO_KINDS[kind](channel, md)
            where = "awaited"
            if kind.endswith("_unary"):
                await call
            else:
                _ = [response async for response in call]
            out.append((where, "ok", ""))
        except grpc.RpcError as err:
            out.append((where, "RpcError", str(err.code())))
        except Exception as err:
            out.append((where, type(err).__name__, str(err)))
    return out


@pytest.mark.parametrize("kind", list(AIO_KINDS))
def test_refused_metadata_raises_what_grpc_aio_raises_and_no_connection_outlives_close(
    address, nowhere, kind
):
    async def main() -> tuple[list[Any], list[Any]]:
        async with grpc.aio.insecure_channel(nowhere) as reference:
            want = await _aio_outcomes(reference, kind)
        channel = pyxds_aio.insecure_channel(f"static:///{address}")
        try:
            assert await channel.unary_unary(f"/{SERVICE}/Echo")(b"up", timeout=5) == b"up"
            got = await _aio_outcomes(channel, kind)
            assert await channel.unary_unary(f"/{SERVICE}/Echo")(b"ok", timeout=5) == b"ok"
        finally:
            await channel.close()
        return want, got

    want, got = asyncio.run(asyncio.wait_for(main(), 30))
    assert got == want
    assert wait_until(lambda: connections_to(address) == 0, 5)


def test_metadata_given_as_an_iterator_is_sent_as_grpcio_sends_it(address):
    def pairs() -> Iterator[tuple[str, str]]:
        yield from (("k1", "a"), ("k2", "b"))

    got = {}
    for name, channel in {
        "grpcio": grpc.insecure_channel(address),
        "pyxds": pyxds.insecure_channel(f"static:///{address}"),
    }.items():
        with channel:
            got[name] = channel.unary_unary(f"/{SERVICE}/Keys")(b"", 5, pairs())
    assert got["pyxds"] == got["grpcio"] == repr([("k1", "a"), ("k2", "b")]).encode()
