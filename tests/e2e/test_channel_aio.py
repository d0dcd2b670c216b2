"""pyxds.aio: the asyncio channel with generated async stubs, pyxds.server as
control plane (split, failover, streaming, errors, close)."""

from __future__ import annotations

import asyncio
import collections
import time

import grpc
import pytest
from backends import EchoBackend
from channel_fixtures import SERVICE, TARGET, Backend, route, snapshot
from protos import echo_pb2, echo_pb2_grpc

import pyxds.aio
from pyxds.server import ManagementServer

FAST_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 300)]


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def echo():
    started = [EchoBackend(f"e{i}").start() for i in range(3)]
    yield started
    for b in started:
        b.stop()


async def echo_counts(stub, n, **kwargs):
    counts = collections.Counter()
    for _ in range(n):
        try:
            reply = await stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5, **kwargs)
            counts[reply.backend] += 1
        except grpc.aio.AioRpcError as err:
            counts["error:" + err.code().name] += 1
    return counts


async def until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.02)
    return False


def test_aio_weighted_split_75_25(server, echo):
    server.set_snapshot(
        snapshot(
            [route(prefix="", weighted_clusters={"ca": 75, "cb": 25})],
            {"ca": [[echo[0].address]], "cb": [[echo[1].address]]},
        )
    )

    async def main():
        async with pyxds.aio.insecure_channel(TARGET, bootstrap=server.bootstrap()) as channel:
            assert isinstance(channel, grpc.aio.Channel)
            stub = echo_pb2_grpc.EchoStub(channel)

            async def both():
                return set(await echo_counts(stub, 30, wait_for_ready=True)) == {"e0", "e1"}

            assert await until(both, 10)
            return await echo_counts(stub, 4000)

    counts = asyncio.run(main())
    assert set(counts) == {"e0", "e1"}
    # 5 standard deviations of the share, sqrt(0.75 * 0.25 / 4000) = 0.0068
    # (3 % of 2000 RPCs, 3.1 sd, failed about one run in 500)
    assert abs(counts["e0"] / 4000 - 0.75) < 5 * (0.75 * 0.25 / 4000) ** 0.5


def test_aio_priority_failover_and_back(server, echo):
    p0 = Backend("ap0").start()
    try:
        server.set_snapshot(
            snapshot([route(prefix="", cluster="cap")], {"cap": [[p0.address], [echo[2].address]]})
        )

        async def main():
            channel = pyxds.aio.insecure_channel(
                TARGET, bootstrap=server.bootstrap(), options=FAST_BACKOFF
            )
            who = channel.unary_unary(f"/{SERVICE}/Who")

            async def answer():
                try:
                    return (await who(b"", timeout=2)).decode()
                except grpc.aio.AioRpcError:
                    return None

            async def is_(name):
                return await answer() == name

            stub = echo_pb2_grpc.EchoStub(channel)
            assert await until(lambda: is_("ap0"), 10)
            p0.stop()
            assert await until(
                lambda: _eq(echo_counts(stub, 1), collections.Counter({"e2": 1})), 10
            )
            p0.start()
            assert await until(lambda: is_("ap0"), 10)
            await channel.close()

        asyncio.run(main())
    finally:
        p0.stop()


async def _eq(coro, expected):
    return await coro == expected


def test_aio_streaming_and_channel_errors(server, echo):
    server.set_snapshot(snapshot([route(path="/x.Y/Z", cluster="ca")], {"ca": [[echo[0].address]]}))

    async def main():
        channel = pyxds.aio.insecure_channel(TARGET, bootstrap=server.bootstrap())
        stub = echo_pb2_grpc.EchoStub(channel)

        async def no_route():
            try:
                await stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5)
            except grpc.aio.AioRpcError as err:
                return "No matching route" in (err.details() or "")
            return False

        assert await until(no_route, 10)
        call = stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert await call.code() is grpc.StatusCode.UNAVAILABLE
        server.set_snapshot(snapshot([route(prefix="", cluster="ca")], {"ca": [[echo[0].address]]}))
        replies = []

        async def streamed():
            replies.clear()
            try:
                async for reply in stub.EchoStream(
                    echo_pb2.EchoRequest(message="s", count=4), timeout=5
                ):
                    replies.append(reply.backend)
            except grpc.aio.AioRpcError:
                return False
            return replies == ["e0"] * 4

        assert await until(streamed, 10)
        await channel.close()

    asyncio.run(main())


def test_aio_queued_wait_for_ready_rpc_completes_when_config_arrives(echo):
    srv = ManagementServer().start()
    try:

        async def main():
            channel = pyxds.aio.insecure_channel(
                TARGET, bootstrap=srv.bootstrap(node_id="aio-queued")
            )
            stub = echo_pb2_grpc.EchoStub(channel)
            task = asyncio.ensure_future(
                stub.Echo(echo_pb2.EchoRequest(message="q"), timeout=10, wait_for_ready=True)
            )
            await asyncio.sleep(0.5)
            assert not task.done()
            srv.set_snapshot(
                snapshot([route(prefix="", cluster="ca")], {"ca": [[echo[1].address]]})
            )
            reply = await asyncio.wait_for(task, 10)
            await channel.close()
            return reply.backend

        assert asyncio.run(main()) == "e1"
    finally:
        srv.stop()


def test_aio_readers_awaited_while_the_pick_queues_answer_when_the_call_ends(echo):
    # The call's readers wait on Events made only when something waits
    # (most calls are only awaited for their response): code(), details(),
    # the metadata and wait_for_connection() awaited while the pick still
    # queues all answer once the config arrives; done callbacks added before
    # the end run once, one added after runs at once.
    srv = ManagementServer().start()
    try:

        async def main():
            channel = pyxds.aio.insecure_channel(
                TARGET, bootstrap=srv.bootstrap(node_id="aio-readers")
            )
            echo_call = channel.unary_unary(
                f"/{SERVICE}/Echo",
                request_serializer=echo_pb2.EchoRequest.SerializeToString,
                response_deserializer=echo_pb2.EchoReply.FromString,
            )
            call = echo_call(echo_pb2.EchoRequest(message="r"), timeout=10, wait_for_ready=True)
            ended = []
            call.add_done_callback(lambda c: ended.append(c.done()))
            readers = asyncio.gather(
                call.code(),
                call.details(),
                call.initial_metadata(),
                call.trailing_metadata(),
                call.wait_for_connection(),
            )
            await asyncio.sleep(0.3)
            assert not call.done() and not readers.done() and ended == []
            srv.set_snapshot(
                snapshot([route(prefix="", cluster="ca")], {"ca": [[echo[2].address]]})
            )
            code, details, _initial, _trailing, _ = await asyncio.wait_for(readers, 10)
            reply = await call
            after = []
            call.add_done_callback(lambda c: after.append(c.code))
            await channel.close()
            return code, details, reply.backend, ended, len(after)

        code, details, backend, ended, after = asyncio.run(main())
        assert (code, details, backend) == (grpc.StatusCode.OK, "", "e2")
        assert ended == [True]
        assert after == 1
    finally:
        srv.stop()


def test_aio_completion_reaches_the_lb_policy_for_every_call_kind(server, echo):
    # A circuit breaker of 1 only lets sequential RPCs through if every end
    # (awaited, fire-and-forget, streams, failures) releases its slot.
    server.set_snapshot(
        snapshot(
            [route(prefix="", cluster="caio")],
            {"caio": [[echo[0].address]]},
            max_requests={"caio": 1},
        )
    )

    async def main():
        channel = pyxds.aio.insecure_channel(TARGET, bootstrap=server.bootstrap())
        stub = echo_pb2_grpc.EchoStub(channel)

        async def ok():
            return set(await echo_counts(stub, 1, wait_for_ready=True)) == {"e0"}

        assert await until(ok, 10)
        for _ in range(20):
            call = stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5)
            assert (await call).backend == "e0"
            assert await call.code() is grpc.StatusCode.OK
        fire = stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5)
        await asyncio.sleep(0.2)  # never awaited; it still ends
        assert fire.done()
        async for _ in stub.EchoStream(echo_pb2.EchoRequest(message="s", count=2), timeout=5):
            pass
        await asyncio.sleep(0.05)
        assert (await stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5)).backend == "e0"
        cancelled = stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await asyncio.sleep(0.05)
        assert (await stub.Echo(echo_pb2.EchoRequest(message="m"), timeout=5)).backend == "e0"
        await channel.close()

    asyncio.run(main())


def test_aio_static_target_errors_deadline_and_generic_calls():
    backend = Backend("aio-gen").start()

    async def main():
        channel = pyxds.aio.insecure_channel(f"static:///{backend.address}")
        assert channel.get_state() is grpc.ChannelConnectivity.IDLE
        await asyncio.wait_for(channel.channel_ready(), 5)
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        who = channel.unary_unary(f"/{SERVICE}/Who")
        assert await who(b"", timeout=5, wait_for_ready=True) == b"aio-gen"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary(f"/{SERVICE}/Sleep")(b"1", timeout=0.2)
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary(f"/{SERVICE}/Fail")(b"PERMISSION_DENIED", timeout=5)
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert info.value.details() == "aio-gen says no"
        collect = channel.stream_unary(f"/{SERVICE}/Collect")
        assert await collect(iter([b"a", b"b"]), timeout=5) == b"aio-gen:2"
        chat = channel.stream_stream(f"/{SERVICE}/Chat")
        assert [r async for r in chat(iter([b"x"]), timeout=5)] == [b"aio-gen:x"]
        await channel.close()

    try:
        asyncio.run(main())
    finally:
        backend.stop()


def test_aio_close_with_rpcs_in_flight_cancels_them():
    backend = Backend("aio-close").start()

    async def main():
        channel = pyxds.aio.insecure_channel(f"static:///{backend.address}")
        sleep = channel.unary_unary(f"/{SERVICE}/Sleep")
        assert await sleep(b"0", timeout=5, wait_for_ready=True) == b"aio-close"
        before = backend.served[backend.name]
        calls = [sleep(b"3", timeout=10) for _ in range(3)]
        deadline = time.monotonic() + 5
        while backend.served[backend.name] < before + 3:  # all three in flight
            assert time.monotonic() < deadline, backend.served
            await asyncio.sleep(0.01)
        await channel.close()
        # over when close() returns (not when the 3 s sleeps end)
        assert [call.done() for call in calls] == [True] * 3
        for call in calls:
            with pytest.raises((grpc.aio.AioRpcError, asyncio.CancelledError)) as info:
                await asyncio.wait_for(call, 5)
            if isinstance(info.value, grpc.aio.AioRpcError):
                assert info.value.code() is grpc.StatusCode.CANCELLED
        # a call on a closed channel raises UsageError, as grpc.aio's own
        with pytest.raises(grpc.aio.UsageError, match=r"Channel is closed\."):
            await sleep(b"0", timeout=5)

    try:
        asyncio.run(main())
    finally:
        backend.stop()
