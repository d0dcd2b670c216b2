"""The lean grpc.aio unary call (pyxds/channel/grpc_aio_unary.py) against
grpc.aio.

Every outcome of an awaited unary-unary call runs three ways on the same
backend: a plain ``grpc.aio.insecure_channel``, a pyxds.aio channel whose
subchannels call the lean way, and a pyxds.aio channel whose subchannels use
grpc.aio's own multicallables (the lean path switched off).  What the
application can see (the response, or the exception's class, code, details,
metadata, debug string and text; then the call's code, details, metadata,
``done()``, ``cancelled()``, its done callbacks) must be identical between
the two pyxds channels, and the same as grpc.aio's own channel.  Outcomes:
OK (with metadata, repeated keys, no deadline), every status a server can
send (with initial and trailing metadata), server-side failures, the
deadline, serializer and deserializer failures, malformed arguments, call
credentials and compression (grpc.aio's own call), the application
cancelling the call (in flight, or before it ever ran), the awaiting task
cancelled (``asyncio.wait_for``), a call in flight when the channel closes,
a call never awaited (it still runs to its end), concurrent calls, a call
awaited by two tasks and ``wait_for_connection()`` at once, an awaiter
closed before the answer."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import grpc
import grpc.aio
import pytest
import test_conformance_unary_lean as sync_lean
from test_conformance_unary_lean import CODES, OPTIONS, SERVICE

import pyxds.aio
from pyxds.channel import grpc_aio_unary

CHECKED = grpc_aio_unary.available()
#: the backend of the sync lean call's conformance tests (same handlers)
address = sync_lean.address


@pytest.fixture
def lean_off(monkeypatch):
    """pyxds.aio with the lean path off (grpc.aio's own multicallables)."""
    return lambda: monkeypatch.setattr(grpc_aio_unary, "ENABLED", False)


def _channels(address: str, lean_off) -> dict[str, Any]:
    def pyxds_grpcio_multicallables():
        lean_off()
        return pyxds.aio.insecure_channel(f"static:///{address}", options=OPTIONS)

    return {
        "grpcio": lambda: grpc.aio.insecure_channel(address, options=OPTIONS),
        "pyxds": lambda: pyxds.aio.insecure_channel(f"static:///{address}", options=OPTIONS),
        "pyxds-grpcio-multicallables": pyxds_grpcio_multicallables,
    }


_CREATED = re.compile(r'created_time:"[^"]*"')
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _normal(text: Any) -> Any:
    """Without what differs from one run to the next (times, object addresses)."""
    if not isinstance(text, str):
        return text
    return _ADDRESS.sub(" at 0x", _CREATED.sub('created_time:"T"', text))


def _error_view(err: BaseException) -> tuple:
    if isinstance(err, grpc.aio.AioRpcError):
        return (
            "raised",
            type(err).__qualname__,
            err.code(),
            err.details(),
            err.initial_metadata(),
            err.trailing_metadata(),
            _normal(err.debug_error_string()),
            _normal(str(err)),
        )
    return ("raised", type(err).__qualname__, _normal(str(err)))


async def _call_view(call: Any) -> tuple:
    """What the application can read from a finished call object."""
    return (
        await call.code(),
        await call.details(),
        tuple(await call.initial_metadata()),
        tuple(await call.trailing_metadata()),
        call.done(),
        call.cancelled(),
    )


async def outcome(make, view: bool = True) -> tuple:
    """The response (or what was raised, at the call or at its await), then
    the finished call's view and what its done callbacks saw (``view``:
    grpc.aio's call never ends when its batch could not start, e.g. on
    malformed metadata: then only what was raised)."""
    try:
        call = make()
    except Exception as err:
        return ("at call", _error_view(err))
    seen: list[bool] = []
    call.add_done_callback(lambda c: seen.append(c is call))
    try:
        result: tuple = ("returned", await call)
    except asyncio.CancelledError:
        result = ("cancelled",)
    except Exception as err:
        result = _error_view(err)
    if not view:
        return result
    seen_view = await _call_view(call)
    for _ in range(100):  # done callbacks run soon after the end
        if seen:
            break
        await asyncio.sleep(0.01)
    return result, seen_view, seen


async def _connected(channel: Any) -> None:
    await channel.unary_unary(f"/{SERVICE}/Echo")(b"", timeout=5, wait_for_ready=True)


def run_everywhere(address: str, lean_off, scenario) -> dict[str, Any]:
    """``scenario(channel)`` on each channel, connected first; its outcomes."""

    async def one(make) -> Any:
        channel = make()
        try:
            await _connected(channel)
            return await scenario(channel)
        finally:
            await channel.close()

    return {
        name: asyncio.run(asyncio.wait_for(one(make), 60))
        for name, make in _channels(address, lean_off).items()
    }


def assert_same(got: dict[str, Any]) -> None:
    assert got["pyxds"] == got["pyxds-grpcio-multicallables"]
    assert got["pyxds"] == got["grpcio"]


def test_the_lean_path_serves_pyxds_aio_unary_calls_on_this_grpcio(address, monkeypatch):
    if f"grpcio {grpc.__version__}" not in grpc_aio_unary.VERIFIED.values():
        pytest.skip(f"grpcio {grpc.__version__} is not one the lean path was checked against")
    assert CHECKED, f"grpcio {grpc.__version__}: {grpc_aio_unary.fingerprint()}"
    made: list[str] = []
    real = grpc_aio_unary.LeanAioUnaryUnary.call

    def spy(self, *args, **kwargs):
        call = real(self, *args, **kwargs)
        made.append(type(call).__name__)
        return call

    monkeypatch.setattr(grpc_aio_unary.LeanAioUnaryUnary, "call", spy)

    async def main():
        async with pyxds.aio.insecure_channel(f"static:///{address}") as channel:
            mc = channel.unary_unary(f"/{SERVICE}/Echo")
            assert (await mc(b"a", timeout=5, wait_for_ready=True)).startswith(b"a|")

    asyncio.run(main())
    assert made == ["LeanUnaryUnaryCall"]


def test_ok_response_and_metadata_like_grpc_aio(address, lean_off):
    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        md = (("k-text", "v"), ("k-bin", b"\x00\xff"), ("k-text", "second"))
        return [
            await outcome(lambda: mc(b"req", timeout=5)),
            await outcome(lambda: mc(b"req", timeout=5, metadata=md)),
            await outcome(lambda: mc(b"req", metadata=grpc.aio.Metadata(*md))),  # no deadline
            await outcome(lambda: mc(b"", timeout=5, metadata=())),
            # no metadata: the lean call's empty tuple instead of grpcio's
            # empty Metadata, the same call on the wire
            await outcome(lambda: mc(b"req", timeout=5, metadata=None)),
            await outcome(lambda: mc(b"req", timeout=5, metadata=grpc.aio.Metadata())),
        ]

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][0][0][0] == "returned"
    assert got["pyxds"][0][2] == [True]


@pytest.mark.parametrize("mode", ["", "headers", "set"])
def test_every_status_with_its_metadata_raises_what_grpc_aio_raises(address, lean_off, mode):
    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Fail")
        return [
            await outcome(lambda code=code: mc(f"{code.name}:{mode}".encode(), timeout=5))
            for code in CODES
        ]

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert {o[1][0] for o in got["pyxds"]} == set(CODES)


@pytest.mark.parametrize("method", ["Boom", "Cancel", "Nope", "Big", "None"])
def test_server_side_failures_raise_what_grpc_aio_raises(address, lean_off, method):
    async def scenario(channel):
        return await outcome(lambda: channel.unary_unary(f"/{SERVICE}/{method}")(b"", timeout=5))

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][0][0] == "raised"


def test_deadline_raises_what_grpc_aio_raises(address, lean_off):
    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Sleep")
        out = set()
        for timeout in (0.05, 0.0, -1.0):
            result, view, seen = await outcome(lambda t=timeout: mc(b"0.5", timeout=t))
            out.add((result[2:4], view[:2], view[4:], tuple(seen)))  # C-core words the rest
        return out

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    deadline = (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert got["grpcio"] == {(deadline, deadline, (True, False), (True,))}


def test_serializer_and_deserializer_failures_raise_what_grpc_aio_raises(address, lean_off):
    calls: dict[str, int] = {}

    def bad_serializer(request):
        raise ValueError("cannot serialize")

    def bad_deserializer(response):
        calls["bad"] = calls.get("bad", 0) + 1
        raise ValueError("cannot deserialize")

    def none_deserializer(response):
        calls["none"] = calls.get("none", 0) + 1

    async def scenario(channel):
        calls.clear()
        echo = f"/{SERVICE}/Echo"
        out = [
            await outcome(lambda: channel.unary_unary(echo, bad_serializer)(b"", timeout=5)),
            await outcome(
                lambda: channel.unary_unary(echo, None, bad_deserializer)(b"", timeout=5)
            ),
            await outcome(
                lambda: channel.unary_unary(echo, None, none_deserializer)(b"", timeout=5)
            ),
            await outcome(
                lambda: channel.unary_unary(f"/{SERVICE}/Fail", None, bad_deserializer)(
                    b"NOT_FOUND:", timeout=5
                )
            ),
        ]
        return out, dict(calls)

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][1] == {"bad": 1, "none": 1}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"metadata": (("Upper-Case", "v"),)},
        {"metadata": (("k", 5),)},
        {"metadata": (("k-bin", "text"),)},
        {"metadata": (("k", "bad\nvalue"),)},
        {"timeout": "5"},
        {"metadata": (("grpc-status", "0"),)},
    ],
    ids=["upper", "int-value", "bin-str", "newline", "timeout-str", "reserved"],
)
def test_malformed_arguments_raise_what_grpc_aio_raises(address, lean_off, kwargs):
    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        args = {"timeout": 5, **kwargs}
        first = await outcome(lambda: mc(b"", **args), view=False)
        after = await outcome(lambda: mc(b"after", timeout=5))  # the channel still serves
        return first, after[0][0], after[0][1][:6]

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)


def test_credentials_and_compression_go_through_grpc_aios_own_call(address, lean_off):
    token = grpc.access_token_call_credentials("t")

    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        return [
            await outcome(lambda: mc(b"z", timeout=5, compression=grpc.Compression.Gzip)),
            await outcome(lambda: mc(b"z", timeout=5, credentials=token)),
        ]

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)


def test_application_cancels_the_call_like_grpc_aio(address, lean_off):
    """Cancelled in flight, and cancelled before the loop ever ran it."""

    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Sleep")
        out = []
        before = sync_lean.SLEEPS_STARTED["Sleep"]
        call = mc(b"1", timeout=5)
        await in_flight(before)
        out.append(call.cancel())
        out.append(await outcome(lambda: call))
        out.append(call.cancel())  # a second time: already done
        early = mc(b"1", timeout=5)
        out.append(early.cancel())
        out.append(await outcome(lambda: early))
        out.append(await outcome(lambda: mc(b"0", timeout=5)))  # the channel still serves
        return out

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["grpcio"][1][0] == ("cancelled",)
    assert got["grpcio"][1][1][:2] == (
        grpc.StatusCode.CANCELLED,
        "Locally cancelled by application!",
    )


def test_awaiting_task_cancelled_cancels_the_call_like_grpc_aio(address, lean_off):
    async def scenario(channel):
        call = channel.unary_unary(f"/{SERVICE}/Sleep")(b"1", timeout=5)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.sleep(0)), 1)
            await asyncio.wait_for(_await(call), 0.2)
            timed_out = False
        except TimeoutError:
            timed_out = True
        return timed_out, await _call_view(call)

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["grpcio"][0] is True
    assert got["grpcio"][1][0] is grpc.StatusCode.CANCELLED


async def in_flight(before: int) -> None:
    """Until the backend runs a Sleep started after it had run ``before``
    (bounded at 5 s): a fixed sleep could end before the call was picked."""
    for _ in range(500):
        if sync_lean.SLEEPS_STARTED["Sleep"] > before:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the Sleep call never reached the backend")


async def _await(call: Any) -> Any:
    return await call


def test_call_in_flight_when_the_channel_closes_like_grpc_aio(address, lean_off):
    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Sleep")
        before = sync_lean.SLEEPS_STARTED["Sleep"]
        call = mc(b"3", timeout=5)
        await in_flight(before)
        await channel.close()
        result, view, seen = await outcome(lambda: call)
        after = await outcome(lambda: mc(b"0", timeout=5))
        return result[:4], view[:2], view[4:], seen, after[:1]

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["grpcio"][1][0] is grpc.StatusCode.CANCELLED


def test_a_call_never_awaited_still_runs_to_its_end(address, lean_off):
    async def scenario(channel):
        call = channel.unary_unary(f"/{SERVICE}/Echo")(b"fire", timeout=5)
        for _ in range(500):
            if call.done():
                break
            await asyncio.sleep(0.01)
        return call.done(), await call.code(), tuple(await call.trailing_metadata())

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][:2] == (True, grpc.StatusCode.OK)


def test_concurrent_calls_each_get_their_own_answer(address, lean_off):
    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        answers = await asyncio.gather(*(mc(str(i).encode(), timeout=5) for i in range(50)))
        return [a.split(b"|")[0] for a in answers]

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"] == [str(i).encode() for i in range(50)]


def test_a_call_awaited_by_two_tasks_and_wait_for_connection_answers_all_like_grpc_aio(
    address, lean_off
):
    """The lean call's awaiter takes the call's next step itself; a second
    awaiter of the same call (and ``wait_for_connection()``) find no step to
    take and only wait: every one gets the answer, as on grpc.aio."""

    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Sleep")
        call = mc(b"0.2", timeout=5)
        first = asyncio.ensure_future(_await(call))
        await asyncio.sleep(0)  # the first awaiter waits before the others
        second = asyncio.ensure_future(_await(call))
        connected = asyncio.ensure_future(call.wait_for_connection())
        answers = await asyncio.gather(first, second, connected)
        failing = mc(b"x", timeout=5)  # and a failure, to both awaiters
        both = await asyncio.gather(
            outcome(lambda: failing, view=False), outcome(lambda: failing, view=False)
        )
        return answers, await _call_view(call), both

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][0] == [b"slept", b"slept", None]


def test_an_awaiter_closed_before_the_answer_leaves_the_call_to_end_like_grpc_aio(
    address, lean_off
):
    """An awaiter that leaves while the call is in flight without being
    cancelled (its coroutine closed, e.g. garbage-collected): the call still
    runs to its end, and a later await gets its answer."""

    async def scenario(channel):
        call = channel.unary_unary(f"/{SERVICE}/Sleep")(b"0.2", timeout=5)
        waiter = call.__await__()
        next(waiter)  # waits on the call's future
        waiter.close()
        for _ in range(500):
            if call.done():
                break
            await asyncio.sleep(0.01)
        return call.done(), await call, await _call_view(call)

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][:2] == (True, b"slept")


def test_a_call_is_in_its_grpc_channels_active_calls_from_its_start_until_freed(
    address, lean_off, monkeypatch
):
    """What grpc.aio's ``Channel.close()`` cancels: the calls in its
    ``_active_calls``, where grpc.aio keeps a call while it runs.  A
    subchannel's channel keeps it there until it is freed
    (pyxds.channel.aio_live_calls: whether a closed channel can still reach
    SHUTDOWN), the lean call (its inline WeakSet add, and WeakSet's own
    when removals are pending) as grpcio's multicallables."""
    assert grpc_aio_unary._WEAKSET_INLINE  # CPython's WeakSet (3.11)
    made: list[Any] = []
    real = grpc.aio.insecure_channel

    def recording(*args: Any, **kwargs: Any) -> Any:
        channel = real(*args, **kwargs)
        made.append(channel)
        return channel

    monkeypatch.setattr(grpc.aio, "insecure_channel", recording)

    def active() -> int:
        live = (ref() for channel in made for ref in channel._active_calls.data)
        return sum(call is not None for call in live)

    async def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Sleep")
        seen = []
        monkeypatch.setattr(grpc_aio_unary, "_WEAKSET_INLINE", True)  # each channel's run
        for way in ("inline", "removal pending", "not CPython's WeakSet"):
            if way == "removal pending":  # a dead reference waits: WeakSet's own way
                for grpc_channel in made:
                    grpc_channel._active_calls._pending_removals.append(lambda: None)
            if way == "not CPython's WeakSet":
                monkeypatch.setattr(grpc_aio_unary, "_WEAKSET_INLINE", False)
            call = mc(b"0.2", timeout=5)
            await asyncio.sleep(0.05)
            seen.append(active())
            seen.append(await call)
            await asyncio.sleep(0)
            seen.append(active())  # ended, still referred to
            del call
            seen.append(active())
        return seen

    got = run_everywhere(address, lean_off, scenario)
    assert got["grpcio"] == [1, b"slept", 0, 0] * 3
    assert got["pyxds"] == got["pyxds-grpcio-multicallables"] == [1, b"slept", 1, 0] * 3


def test_an_awaited_lean_call_schedules_no_callback_of_its_own_to_end(address):
    """Issue 18 item 2: the completion of an awaited lean call schedules one
    callback (the awaiter's wake-up, which takes the call's last step), not
    a second one for the step; a call nobody awaits still gets its step
    scheduled (it runs to its end, see above)."""
    if not CHECKED:
        pytest.skip(f"grpcio {grpc.__version__} is not one the lean path was checked against")

    async def main() -> tuple[int, int]:
        async with pyxds.aio.insecure_channel(f"static:///{address}") as channel:
            mc = channel.unary_unary(f"/{SERVICE}/Echo")
            await mc(b"a", timeout=5, wait_for_ready=True)
            loop = asyncio.get_running_loop()
            steps = []
            real = loop.call_soon

            def spy(callback, *args, **kwargs):
                if getattr(callback, "__name__", "") == "_step":
                    steps.append(callback)
                return real(callback, *args, **kwargs)

            loop.call_soon = spy  # type: ignore[method-assign]
            try:
                for _ in range(5):
                    assert (await mc(b"b", timeout=5)).startswith(b"b|")
                awaited = len(steps)
                call = mc(b"c", timeout=5)
                for _ in range(500):
                    if call.done():
                        break
                    await asyncio.sleep(0.01)
                assert (await call).startswith(b"c|")
            finally:
                del loop.call_soon
            return awaited, len(steps)

    awaited, with_unawaited = asyncio.run(main())
    assert awaited == 0
    assert with_unawaited == 1


def test_a_lean_call_ends_as_grpcio_invoke_would_without_running_it(address, monkeypatch):
    """Issue 18 item 2: the lean call steps the Cython call's coroutine
    itself and does what grpcio's ``_invoke`` does around it (serialize,
    deserialize, EOF for a status that is not OK), so ``_invoke``'s own
    coroutine is never made; answers and errors stay grpcio's (the tests
    above compare every end with grpc.aio's)."""
    if not CHECKED:
        pytest.skip(f"grpcio {grpc.__version__} is not one the lean path was checked against")
    invoked: list[object] = []
    real = grpc.aio._call.UnaryUnaryCall._invoke

    def spy(self):
        invoked.append(self)
        return real(self)

    monkeypatch.setattr(grpc.aio._call.UnaryUnaryCall, "_invoke", spy)

    async def main() -> tuple[bytes, bytes, grpc.StatusCode]:
        async with pyxds.aio.insecure_channel(f"static:///{address}") as channel:
            echo = channel.unary_unary(f"/{SERVICE}/Echo")
            plain = await echo(b"a", timeout=5, wait_for_ready=True)
            typed = channel.unary_unary(f"/{SERVICE}/Echo", bytes.upper, bytes.lower)
            converted = await typed(b"b", timeout=5)
            try:
                await channel.unary_unary(f"/{SERVICE}/Fail")(b"NOT_FOUND:", timeout=5)
            except grpc.aio.AioRpcError as err:
                return plain, converted, err.code()
            raise AssertionError("the failing method answered")

    plain, converted, code = asyncio.run(main())
    assert plain.startswith(b"a|")
    assert converted.startswith(b"b|")  # sent as B, read back lowered
    assert code is grpc.StatusCode.NOT_FOUND
    assert invoked == []


def test_the_direct_lean_start_is_taken_only_for_a_plain_attempt(address, monkeypatch):
    """pyxds.aio starts an attempt on the transport's cached lean
    multicallable directly (``LeanAioUnaryUnary.call``, its done callback
    added there) only when nothing changes the attempt's call: no call
    credentials, no compression, no A66 metrics (their counting serializers)
    and no pick headers, the transport's first call too (the multicallable
    made and cached by it); every other attempt goes the full way
    (``GrpcMethod.start``), and each way the RPC ends once with its answer."""
    if not CHECKED:
        pytest.skip(f"grpcio {grpc.__version__} is not one the lean path was checked against")
    from pyxds import metrics
    from pyxds.channel.grpc_calls import GrpcMethod

    ways: list[str] = []
    real_call = grpc_aio_unary.LeanAioUnaryUnary.call
    real_start = GrpcMethod.start

    def spy_call(self, *args, **kwargs):
        if len(args) == 5:  # with its done callback: pyxds's direct start
            ways.append("direct")  # (the full way's lean call has none)
        return real_call(self, *args, **kwargs)

    def spy_start(self, *args, **kwargs):
        ways.append("full")
        return real_start(self, *args, **kwargs)

    monkeypatch.setattr(grpc_aio_unary.LeanAioUnaryUnary, "call", spy_call)
    monkeypatch.setattr(GrpcMethod, "start", spy_start)
    token = grpc.access_token_call_credentials("t")

    async def main() -> list[tuple[str, list[str], object]]:
        seen = []
        async with pyxds.aio.insecure_channel(f"static:///{address}") as channel:
            mc = channel.unary_unary(f"/{SERVICE}/Echo")
            ways.clear()
            first = await mc(b"a", timeout=5, wait_for_ready=True)  # connects; cached by it
            seen.append(("first on a new transport", list(ways), first.startswith(b"a|")))
            cases = {
                "plain": lambda: mc(b"a", timeout=5),
                "metadata": lambda: mc(b"a", timeout=5, metadata=(("k", "v"),)),
                "credentials": lambda: mc(b"a", timeout=5, credentials=token),
                "compression": lambda: mc(b"a", timeout=5, compression=grpc.Compression.Gzip),
            }
            for name, make in cases.items():
                ways.clear()
                try:
                    call = make()
                    answer: object = (await call).startswith(b"a|") and call.done()
                except Exception as err:  # call credentials on an insecure channel
                    answer = type(err).__name__
                seen.append((name, list(ways), answer))
            from opentelemetry.sdk.metrics import MeterProvider

            metrics.enable(MeterProvider())
            try:
                ways.clear()
                call = mc(b"a", timeout=5)
                response = await call
                seen.append(("metrics", list(ways), response.startswith(b"a|") and call.done()))
            finally:
                metrics.disable()
        return seen

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [
        ("first on a new transport", ["direct"], True),
        ("plain", ["direct"], True),
        ("metadata", ["direct"], True),
        ("credentials", ["full"], "UsageError"),  # as grpc.aio raises it
        ("compression", ["full"], True),
        ("metrics", ["full"], True),
    ]
