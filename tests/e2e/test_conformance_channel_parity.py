"""API parity with grpcio's own channels (grpcio 1.85.1 is the reference, run
side by side on the same backend): each test runs one scenario through
``grpc.insecure_channel`` / ``grpc.aio.insecure_channel`` and through pyxds
(a static target) and asserts both answer the same."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import grpc.aio
import pytest
from channel_fixtures import SERVICE, Backend

import pyxds._api as pyxds
import pyxds.aio as pyxds_aio


@pytest.fixture(scope="module")
def backend():
    b = Backend("parity").start()
    yield b
    b.stop()


def both(address: str):
    return [
        ("grpcio", lambda: grpc.insecure_channel(address)),
        ("pyxds", lambda: pyxds.insecure_channel(f"static:///{address}")),
    ]


def both_aio(address: str):
    return [
        ("grpcio", lambda: grpc.aio.insecure_channel(address)),
        ("pyxds", lambda: pyxds_aio.insecure_channel(f"static:///{address}")),
    ]


def _raises(fn):
    try:
        fn()
    except grpc.RpcError as err:
        return ("RpcError", err.code(), err.details())
    except Exception as err:
        return (type(err).__name__,)
    return ("ok",)


def test_future_and_response_stream_objects_are_rpc_errors_like_grpcio(backend):
    got = {}
    for name, make in both(backend.address):
        with make() as ch:
            future = ch.unary_unary(f"/{SERVICE}/Who").future(b"", timeout=5)
            stream = ch.unary_stream(f"/{SERVICE}/Stream")(b"1", timeout=5)
            future.result(5)
            list(stream)
            got[name] = [isinstance(c, (grpc.RpcError)) for c in (future, stream)]
    assert got["pyxds"] == got["grpcio"] == [True, True]


@pytest.mark.parametrize("connected", [True, False])
def test_cancelled_future_is_done_at_once_and_has_no_outcome_like_grpcio(backend, connected):
    got = {}
    for name, make in both(backend.address):
        with make() as ch:
            if connected:  # the call starts at once; else pyxds still picks
                ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5)
            future = ch.unary_unary(f"/{SERVICE}/Sleep").future(b"2", timeout=5)
            cancelled = future.cancel()
            now = (future.done(), future.running(), future.is_active(), future.cancelled())
            outcome = [
                _raises(lambda f=future: f.result(5)),
                _raises(lambda f=future: f.exception(5)),
                _raises(lambda f=future: f.traceback(5)),
            ]
            got[name] = (cancelled, now, outcome, future.code(), future.details(), future.cancel())
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][1] == (True, False, False, True)
    assert got["grpcio"][2] == [("FutureCancelledError",)] * 3


def test_request_the_serializer_rejects_fails_when_the_call_is_made_like_grpcio(backend):
    def bad(_request):
        raise ValueError("no")

    got = {}
    for name, make in both(backend.address):
        with make() as ch:
            who = ch.unary_unary(f"/{SERVICE}/Who", bad)
            stream = ch.unary_stream(f"/{SERVICE}/Stream", bad)
            got[name] = [
                _raises(lambda who=who: who.future(b"", timeout=5)),
                _raises(lambda stream=stream: stream(b"", timeout=5)),
                _raises(lambda who=who: who(b"", timeout=5)),
            ]
    expected = ("RpcError", grpc.StatusCode.INTERNAL, "Exception serializing request!")
    assert got["pyxds"] == got["grpcio"] == [expected] * 3


def test_deadline_of_unary_calls_says_deadline_exceeded_like_grpcio(backend):
    """pyxds's subchannels run without C-core's retry filter, which words a
    unary call's deadline "Stream removed (Deadline Exceeded)" (racily)."""
    got = {}
    for name, make in both(backend.address):
        with make() as ch:
            sleep = ch.unary_unary(f"/{SERVICE}/Sleep")
            sleep(b"0", timeout=5)
            seen = set()
            for _ in range(3):
                seen.add(_raises(lambda sleep=sleep: sleep(b"1", timeout=0.1)))
                seen.add(_raises(lambda sleep=sleep: sleep.with_call(b"1", timeout=0.1)))
                future = sleep.future(b"1", timeout=0.1)
                seen.add(_raises(lambda f=future: f.result(5)))
                seen.add(("details", future.details(), future.time_remaining()))
                assert future.traceback(5) is not None
            got[name] = seen
    assert (
        got["pyxds"]
        == got["grpcio"]
        == {
            ("RpcError", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
            ("details", "Deadline Exceeded", 0),
        }
    )


def test_callback_subscribed_twice_needs_two_unsubscribes_like_grpcio():
    got = {}
    ready = grpc.ChannelConnectivity.READY
    for name in ("grpcio", "pyxds"):
        backend = Backend(f"sub-{name}").start()
        ch = (
            grpc.insecure_channel(backend.address)
            if name == "grpcio"
            else pyxds.insecure_channel(f"static:///{backend.address}")
        )
        seen: list[grpc.ChannelConnectivity] = []
        cond = threading.Condition()

        def cb(state, seen=seen, cond=cond):
            with cond:
                seen.append(state)
                cond.notify_all()

        ch.subscribe(cb)
        ch.subscribe(cb, try_to_connect=True)
        with cond:
            assert cond.wait_for(lambda seen=seen: seen.count(ready) == 2, 5), (name, seen)
        ch.unsubscribe(cb)
        ch.unsubscribe(cb)
        mark = len(seen)
        left = threading.Event()
        ch.subscribe(lambda s, left=left: s is not ready and left.set())
        backend.stop()
        assert left.wait(5), name
        time.sleep(0.3)  # nothing to wait for: the unsubscribed callback stays silent
        got[name] = seen[mark:]
        ch.close()
    assert got["pyxds"] == got["grpcio"] == []


# -- asyncio ------------------------------------------------------------------


def _run_aio(address: str, scenario):
    async def one(make):
        ch = make()
        try:
            return await asyncio.wait_for(scenario(ch), 15)
        finally:
            await ch.close()

    return {name: asyncio.run(one(make)) for name, make in both_aio(address)}


async def _outcome(awaitable_fn):
    try:
        return ("ok", await asyncio.wait_for(awaitable_fn(), 5))
    except grpc.aio.AioRpcError as err:
        return ("AioRpcError", err.code(), err.details())
    except asyncio.CancelledError:
        return ("CancelledError",)
    except Exception as err:
        return (type(err).__name__, str(err))


def test_aio_call_cancelled_before_it_starts_reports_cancelled_like_grpcio(backend):
    async def scenario(ch):
        call = ch.unary_unary(f"/{SERVICE}/Sleep")(b"2", timeout=5)
        cancelled = call.cancel()
        return (
            cancelled,
            await _outcome(lambda: call),
            await _outcome(call.code),
            await _outcome(call.details),
            await _outcome(lambda: _tuple(call.initial_metadata())),
            await _outcome(lambda: _tuple(call.trailing_metadata())),
            call.done(),
            call.cancelled(),
        )

    got = _run_aio(backend.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][2] == ("ok", grpc.StatusCode.CANCELLED)


async def _tuple(aw):
    return tuple(await aw)


def test_aio_unary_deadline_says_deadline_exceeded_like_grpcio(backend):
    async def scenario(ch):
        sleep = ch.unary_unary(f"/{SERVICE}/Sleep")
        await sleep(b"0", timeout=5)
        seen = set()
        for _ in range(3):
            call = sleep(b"1", timeout=0.1)
            seen.add(await _outcome(lambda call=call: call))
            seen.add(("details", await call.details(), call.time_remaining()))
        return seen

    got = _run_aio(backend.address, scenario)
    assert (
        got["pyxds"]
        == got["grpcio"]
        == {
            ("AioRpcError", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
            ("details", "Deadline Exceeded", 0),
        }
    )


def test_aio_mixing_async_for_and_read_raises_usage_error_like_grpcio(backend):
    async def scenario(ch):
        stream = ch.unary_stream(f"/{SERVICE}/Stream")
        first = stream(b"3", timeout=5)
        iterator = first.__aiter__()
        one = await iterator.__anext__()
        mixed = await _outcome(first.read)
        same = first.__aiter__() is iterator
        second = stream(b"3", timeout=5)
        read = await second.read()

        async def rest():
            return [r async for r in second]

        first.cancel()
        return one, mixed, same, read, await _outcome(rest)

    got = _run_aio(backend.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][1] == (
        "UsageError",
        "The iterator and read/write APIs may not be mixed on a single RPC.",
    )


def test_aio_channel_ready_on_a_closed_channel_raises_usage_error_like_grpcio(backend):
    async def scenario(ch):
        await ch.channel_ready()
        await ch.close()
        return (
            ch.get_state(),
            await _outcome(ch.channel_ready),
            await _outcome(lambda: ch.wait_for_state_change(grpc.ChannelConnectivity.READY)),
        )

    got = _run_aio(backend.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][1] == ("UsageError", "Channel is closed.")


BAD_ARGUMENTS = [
    {"metadata": ["not-a-pair"]},  # ValueError from grpcio
    {"metadata": [("k", 5)]},  # TypeError from grpcio
    {"timeout": "soon"},  # TypeError from grpcio
]


def _bounded(fn, seconds: float = 5.0):
    """``_raises(fn)`` on a daemon thread; "hang" if it has not returned
    within ``seconds`` (a start that raised used to be re-picked forever)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(_raises(fn)), daemon=True)
    thread.start()
    thread.join(seconds)
    return out[0] if out else ("hang",)


@pytest.mark.parametrize(
    "kwargs", BAD_ARGUMENTS, ids=["metadata-not-pairs", "metadata-int", "timeout-str"]
)
def test_blocking_call_with_malformed_arguments_raises_what_grpcio_raises(backend, kwargs):
    got = {}
    for name, make in both(backend.address):
        with make() as ch:
            mc = ch.unary_unary(f"/{SERVICE}/Who")
            mc(b"", timeout=5, wait_for_ready=True)  # connected: the pick completes at once
            got[name] = [
                _bounded(lambda mc=mc: mc(b"", **kwargs)),
                _bounded(lambda mc=mc: mc.with_call(b"", **kwargs)),
            ]
            assert mc(b"", timeout=5) == b"parity"  # the channel still serves
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0][0] in ("ValueError", "TypeError")


@pytest.mark.parametrize(
    "kwargs", BAD_ARGUMENTS, ids=["metadata-not-pairs", "metadata-int", "timeout-str"]
)
def test_future_and_stream_with_malformed_arguments_end_with_an_error_never_hang(backend, kwargs):
    with pyxds.insecure_channel(f"static:///{backend.address}") as ch:
        unary = ch.unary_unary(f"/{SERVICE}/Who")
        unary(b"", timeout=5, wait_for_ready=True)
        future = _bounded(lambda: unary.future(b"", **kwargs).result(5))
        stream = _bounded(lambda: list(ch.unary_stream(f"/{SERVICE}/Stream")(b"1", **kwargs)))
        assert unary(b"", timeout=5) == b"parity"
    for outcome in (future, stream):
        assert outcome[0] != "hang" and outcome[0] != "ok"
        if outcome[0] == "RpcError":  # pyxds picks these asynchronously
            assert outcome[1] is grpc.StatusCode.INTERNAL
            assert "failed to start call" in outcome[2]


@pytest.mark.parametrize(
    "kwargs", BAD_ARGUMENTS, ids=["metadata-not-pairs", "metadata-int", "timeout-str"]
)
def test_aio_call_with_malformed_arguments_raises_what_grpc_aio_raises(backend, kwargs):
    async def outcome(ch):
        mc = ch.unary_unary(f"/{SERVICE}/Who")
        await mc(b"", timeout=5, wait_for_ready=True)
        try:
            await asyncio.wait_for(mc(b"", **kwargs), 5)
        except TimeoutError:
            result = ("hang",)
        except grpc.RpcError as err:
            result = ("RpcError", err.code())
        except Exception as err:
            result = (type(err).__name__,)
        else:
            result = ("ok",)
        assert await mc(b"", timeout=5) == b"parity"  # the loop and channel still serve
        await ch.close()
        return result

    async def run():
        return {name: await outcome(make()) for name, make in both_aio(backend.address)}

    # on a thread: a start re-picked forever blocks the event loop itself,
    # where no asyncio timeout can fire
    out: list = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(run())), daemon=True)
    thread.start()
    thread.join(20)
    assert out, "the aio call never ended (the event loop was blocked)"
    got = out[0]
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0] in ("ValueError", "TypeError")


INVALID_LITERAL_TARGETS = [
    "ipv4:127.0.0.1",  # no port
    "ipv4:1.2.3.4:99999",  # port out of range
    "ipv4:localhost:80",  # not an IPv4 literal
    "ipv6:[zz]:80",  # not an IPv6 literal
    "ipv6:::1",  # not bracketed
]


@pytest.mark.parametrize("target", INVALID_LITERAL_TARGETS)
def test_invalid_ip_literal_target_fails_rpcs_as_grpcio_does(target):
    got = {}
    for name, make in (("grpcio", grpc.insecure_channel), ("pyxds", pyxds.insecure_channel)):
        with make(target) as ch:
            got[name] = _raises(lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=2))
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][1] is grpc.StatusCode.UNKNOWN


@pytest.mark.parametrize("port", ["abc", "8O"])
def test_dns_target_with_a_bad_port_fails_rpcs_naming_it_as_grpcio_does(port):
    got = {}
    for name, make in (("grpcio", grpc.insecure_channel), ("pyxds", pyxds.insecure_channel)):
        with make(f"dns:///localhost:{port}") as ch:
            got[name] = _raises(lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=2))
    assert got["pyxds"][1] is got["grpcio"][1] is grpc.StatusCode.UNAVAILABLE
    for outcome in got.values():
        assert f"Failed to parse port in name: localhost:{port}" in outcome[2]
