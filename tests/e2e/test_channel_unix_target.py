"""``unix:`` and ``unix-abstract:`` targets (gRPC's naming doc), as a plain
grpcio channel serves them: the same reply, the same ``:authority`` at the
server, the same status for a socket nobody listens on and for a target
that names none.  pyxds once had no resolver for these schemes, so every
RPC failed UNAVAILABLE ("no resolver for target").
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

import pyxds
import pyxds.aio

METHOD = "/unix.Echo/Authority"


@pytest.fixture()
def unix_server() -> Iterator[tuple[str, str]]:
    """A grpcio server on a Unix socket path and on an abstract socket;
    each RPC answers with the ``:authority`` it came with (grpcio's call
    details)."""

    def authority(request: bytes, context: grpc.ServicerContext) -> bytes:
        return bytes(context._rpc_event.call_details.host or b"")  # type: ignore[attr-defined]

    directory = tempfile.mkdtemp(prefix="pyxds-unix-", dir="/tmp")
    path = os.path.join(directory, "sock")
    abstract = f"pyxds-test-{os.getpid()}-{id(directory)}"
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "unix.Echo", {"Authority": grpc.unary_unary_rpc_method_handler(authority)}
            )
        ]
    )
    server.add_insecure_port(f"unix:{path}")
    server.add_insecure_port(f"unix-abstract:{abstract}")
    server.start()
    try:
        yield path, abstract
    finally:
        server.stop(None)
        shutil.rmtree(directory, ignore_errors=True)


def _outcome(channel: grpc.Channel) -> str:
    try:
        return "ok:" + channel.unary_unary(METHOD)(b"", timeout=5).decode()
    except grpc.RpcError as err:
        return f"{err.code().name}"


def _targets(path: str, abstract: str) -> list[str]:
    return [f"unix:{path}", f"unix://{path}", f"unix-abstract:{abstract}"]


def test_unix_targets_reach_the_socket_with_grpcios_authority(unix_server) -> None:
    path, abstract = unix_server
    for target in _targets(path, abstract):
        with grpc.insecure_channel(target) as plain:
            expected = _outcome(plain)
        assert expected.startswith("ok:"), (target, expected)
        channel = pyxds.insecure_channel(target)
        try:
            assert _outcome(channel) == expected, target
        finally:
            channel.close()


def test_unix_targets_on_the_asyncio_channel(unix_server) -> None:
    path, abstract = unix_server

    async def run(target: str, make) -> str:
        async with make(target) as channel:
            try:
                reply = await channel.unary_unary(METHOD)(b"", timeout=5)
                return "ok:" + reply.decode()
            except grpc.RpcError as err:
                return err.code().name

    for target in _targets(path, abstract):
        expected = asyncio.run(run(target, grpc.aio.insecure_channel))
        assert expected.startswith("ok:"), (target, expected)
        assert asyncio.run(run(target, pyxds.aio.insecure_channel)) == expected, target


def test_a_unix_target_without_a_listener_or_a_path_fails_as_grpcio_does(tmp_path) -> None:
    for target, details in ((f"unix:{tmp_path}/nobody", None), ("unix:", "empty address list")):
        channel = pyxds.insecure_channel(target)
        try:
            with pytest.raises(grpc.RpcError) as ours:
                channel.unary_unary(METHOD)(b"", timeout=5)
        finally:
            channel.close()
        with grpc.insecure_channel(target) as plain, pytest.raises(grpc.RpcError) as theirs:
            plain.unary_unary(METHOD)(b"", timeout=5)
        assert ours.value.code() == theirs.value.code() == grpc.StatusCode.UNAVAILABLE, target
        if details is not None:
            assert ours.value.details() == theirs.value.details() == details
