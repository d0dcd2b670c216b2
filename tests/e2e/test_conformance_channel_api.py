"""The channel's API behaves as grpcio's own channels do (grpcio 1.85.1 is
the reference, run side by side here): close() semantics, connectivity
reported to subscribe(), the Call objects of with_call / future, and
errors raised before any RPC exists."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import grpc
import pytest
from channel_fixtures import SERVICE, Backend, connections_to, wait_until

import pyxds._api as pyxds
import pyxds.aio as pyxds_aio
from pyxds.channel import lifecycle

FAST = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 200)]


@pytest.fixture(scope="module")
def backend():
    b = Backend("api").start()
    yield b
    b.stop()


def channels(address: str):
    """(name, make) for grpcio's channel and pyxds's, to the same address."""
    return [
        ("grpcio", lambda: grpc.insecure_channel(address, options=FAST)),
        ("pyxds", lambda: pyxds.insecure_channel(f"static:///{address}", options=FAST)),
    ]


def _outcome(fn):
    try:
        fn()
    except grpc.RpcError as err:
        return ("RpcError", err.code(), err.details())
    except Exception as err:
        return (type(err).__name__, str(err))
    return ("ok",)


def test_rpc_invoked_after_close_raises_like_grpcio(backend):
    """grpcio: ValueError('Cannot invoke RPC on closed channel!') for every call kind."""
    seen = {}
    for name, make in channels(backend.address):
        ch = make()
        assert ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5) == b"api"
        ch.close()
        seen[name] = [
            _outcome(lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5)),
            _outcome(lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Who").future(b"", timeout=5)),
            _outcome(lambda ch=ch: ch.unary_stream(f"/{SERVICE}/Stream")(b"1", timeout=5)),
            _outcome(lambda ch=ch: ch.stream_unary(f"/{SERVICE}/Collect")(iter([b""]), timeout=5)),
        ]
    assert seen["pyxds"] == seen["grpcio"]
    assert seen["grpcio"][0] == ("ValueError", "Cannot invoke RPC on closed channel!")


def test_rpc_in_flight_at_close_is_cancelled_like_grpcio(backend):
    codes = {}
    for name, make in channels(backend.address):
        ch = make()
        assert ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5)
        before = backend.served[backend.name]
        future = ch.unary_unary(f"/{SERVICE}/Sleep").future(b"2", timeout=5)
        assert wait_until(lambda b=before: backend.served[backend.name] > b, 5)  # in flight
        ch.close()
        with pytest.raises(grpc.RpcError) as info:
            future.result(3)
        codes[name] = info.value.code()
        assert "Channel closed!" in info.value.details()
    assert codes["pyxds"] is codes["grpcio"] is grpc.StatusCode.CANCELLED


def test_client_stream_future_closed_before_its_response_headers_is_cancelled_like_grpcio(lone):
    """close() while a stream_unary future's requests are still open (the
    backend has sent no headers yet): CANCELLED "Channel closed!", as
    grpcio.  Hung on d94bad1: the end's callback, on grpcio's only
    callback thread, waited there for headers that thread would deliver."""
    outcomes = {}
    for name, make in channels(lone.address):
        go = threading.Event()
        ch = make()
        before = lone.served[lone.name]
        future = ch.stream_unary(f"/{SERVICE}/Collect").future(_requests(go), timeout=5)
        assert wait_until(lambda b=before: lone.served[lone.name] > b, 5)  # in flight
        ch.close()
        outcomes[name] = _outcome(lambda f=future: f.result(5))
        go.set()
    assert outcomes["pyxds"] == outcomes["grpcio"]
    assert outcomes["grpcio"] == ("RpcError", grpc.StatusCode.CANCELLED, "Channel closed!")


def test_a_stub_of_a_channel_the_program_dropped_keeps_working_like_grpcio(backend):
    """``stub = EchoStub(grpc.insecure_channel(...))`` drops the channel at
    once; grpcio leaves it open while its multicallables live (its
    ``Channel.__del__`` does not close, for that idiom).  pyxds closes a
    dropped channel (channel/lifecycle.py), so its multicallables hold it:
    alive after a collection, answering, and closed once the last
    multicallable went.  Fails on 322888d: the channel was collected with
    its multicallables alive, and under load a ``.future()`` right after
    ``unary_unary()`` raised "Channel closed!" (test_exit_without_close)."""
    for name, make in channels(backend.address):
        channel = make()
        dropped = weakref.ref(channel)
        core = getattr(channel, "_core", None)
        who = channel.unary_unary(f"/{SERVICE}/Who")
        del channel
        gc.collect()
        if name == "pyxds":
            assert dropped() is not None, "collected while its multicallable lives"
        assert who(b"", timeout=5) == b"api", name
        assert who.future(b"", timeout=5).result() == b"api", name
        del who
        gc.collect()
        if name == "pyxds":
            assert dropped() is None
            assert wait_until(lambda c=core: c.closed, 5)  # the reaper closed it


def _reaped() -> None:
    """The lifecycle reaper handled every channel dropped so far: it closes
    them in the order they went, so a marker queued now comes after them."""
    reached = threading.Event()

    class Marker:
        closed = False

        def close(self) -> None:
            reached.set()

    lifecycle.release(Marker())
    assert reached.wait(5), "the reaper did not run"


def _requests(go: threading.Event):
    """A client stream still open when its channel is dropped: its second
    request only once ``go`` is set."""
    yield b"a"
    go.wait(5)
    yield b"b"


#: kind -> (start the call on a channel, read its whole answer)
OUTLIVING_CALLS = {
    "future": (
        lambda ch, go: ch.unary_unary(f"/{SERVICE}/Sleep").future(b"0.3", timeout=5),
        lambda call: [call.result()],
    ),
    "stream_unary_future": (
        lambda ch, go: ch.stream_unary(f"/{SERVICE}/Collect").future(_requests(go), timeout=5),
        lambda call: [call.result()],
    ),
    "unary_stream": (
        lambda ch, go: ch.unary_stream(f"/{SERVICE}/Stream")(b"3", timeout=5),
        list,
    ),
    "stream_stream": (
        lambda ch, go: ch.stream_stream(f"/{SERVICE}/Chat")(_requests(go), timeout=5),
        list,
    ),
}
OUTLIVING_ANSWERS = {
    "future": [b"lone"],
    "stream_unary_future": [b"lone:2"],
    "unary_stream": [b"lone"] * 3,
    "stream_stream": [b"lone:a", b"lone:b"],
}


@pytest.fixture(scope="module")
def lone():
    """A backend only the outliving-call tests connect to (they count its
    connections)."""
    b = Backend("lone").start()
    yield b
    b.stop()


@pytest.mark.parametrize("kind", OUTLIVING_CALLS)
def test_a_call_outliving_its_dropped_channel_gets_its_whole_answer_like_grpcio(kind, lone):
    """``f = grpc.insecure_channel(t).unary_unary(m).future(req)``: grpcio's
    call holds its channel until it ends (the channel's call state, which
    closes the core channel when it goes, lives while a call runs), then the
    channel closes even though the call object is kept.  pyxds's call holds
    its ``XdsChannel`` until it ends: the whole answer after channel and
    multicallable were dropped and the reaper ran, and the channel closed
    (its connection gone) once the call ended.  Fails on d94bad1: the
    reaper closed the dropped channel, which cancelled the call."""
    start, read = OUTLIVING_CALLS[kind]
    answers = {}
    for name, make in channels(lone.address):
        assert wait_until(lambda: connections_to(lone.address) == 0, 5)
        go = threading.Event()
        channel = make()
        core = getattr(channel, "_core", None)
        call = start(channel, go)
        del channel
        gc.collect()
        if core is not None:
            _reaped()
        go.set()
        try:
            answers[name] = read(call)
        except grpc.RpcError as err:
            answers[name] = [err.code(), err.details()]
        gc.collect()
        # over (the call still kept): the channel closes, its connection goes
        assert wait_until(lambda: connections_to(lone.address) == 0, 5), name
        if core is not None:
            assert core.closed
        del call
    assert answers["pyxds"] == answers["grpcio"] == OUTLIVING_ANSWERS[kind]


def _states(make, seconds: float, until: str | None = None) -> list[str]:
    """The states a subscriber saw in ``seconds`` (or until it saw ``until``)."""
    ch = make()
    seen: list[str] = []
    lock = threading.Lock()

    def on_state(state):
        with lock:
            seen.append(state.name)

    ch.subscribe(on_state, try_to_connect=True)
    if until is None:
        time.sleep(seconds)
    else:
        wait_until(lambda: until in seen, seconds)
    ch.close()
    time.sleep(0.2)
    with lock:
        return list(seen)


def test_subscribe_reports_the_same_states_as_grpcio_and_nothing_after_close(backend):
    """Ready backend: IDLE, CONNECTING, READY; no SHUTDOWN callback after close
    (grpcio ends subscriptions at close)."""
    got = {name: _states(make, 5.0, "READY") for name, make in channels(backend.address)}
    assert got["pyxds"] == ["IDLE", "CONNECTING", "READY"]
    # grpcio's subscribe polls: with a subchannel already connected in its
    # global pool it may skip CONNECTING; it never reports SHUTDOWN
    assert got["grpcio"][0] == "IDLE" and got["grpcio"][-1] == "READY"
    assert "SHUTDOWN" not in got["grpcio"]


def test_subscribe_reports_transient_failure_for_a_dead_address_as_soon_as_grpcio(ports):
    """grpcio reports TRANSIENT_FAILURE within milliseconds of a refused
    connection; pyxds too (closing the failed grpcio channel, which joins
    grpcio's connectivity poller, no longer stalls the serializer 200 ms)."""
    dead = ports.dead_address()
    # until each saw TRANSIENT_FAILURE (a fixed 0.15 s was not always enough
    # beside two busy loops); how soon, test_many_dead_backends_... bounds
    got = {name: _states(make, 5.0, "TRANSIENT_FAILURE") for name, make in channels(dead)}
    assert got["pyxds"][:3] == ["IDLE", "CONNECTING", "TRANSIENT_FAILURE"]
    # grpcio's subscribe polls: it may skip the short CONNECTING
    assert got["grpcio"][0] == "IDLE" and "TRANSIENT_FAILURE" in got["grpcio"][1:3]


def test_many_dead_backends_report_transient_failure_without_serial_delays(ports):
    dead = ",".join(ports.dead_address() for _ in range(6))
    ch = pyxds.insecure_channel(
        f"static:///{dead}", options=[("grpc.lb_policy_name", "round_robin")]
    )
    try:
        failed = threading.Event()
        ch.subscribe(
            lambda s: failed.set() if s is grpc.ChannelConnectivity.TRANSIENT_FAILURE else None,
            try_to_connect=True,
        )
        start = time.monotonic()
        assert failed.wait(3)
        assert time.monotonic() - start < 0.5  # was 6 x 200 ms on the serializer
    finally:
        ch.close()


def test_with_call_and_future_call_objects_answer_like_grpcio(backend):
    results = {}
    md = (("x-test", "1"),)
    for name, make in channels(backend.address):
        with make() as ch:
            response, call = ch.unary_unary(f"/{SERVICE}/Who").with_call(
                b"", timeout=5, metadata=md
            )
            future = ch.unary_unary(f"/{SERVICE}/Who").future(b"", timeout=5)
            future.result(5)
            failed = ch.unary_unary(f"/{SERVICE}/Fail").future(b"NOT_FOUND", timeout=5)
            err = failed.exception(5)
            results[name] = (
                response,
                call.code(),
                call.details(),
                type(call.initial_metadata()).__name__,
                future.code(),
                future.done(),
                future.running(),
                future.cancelled(),
                future.cancel(),  # done: False
                err.code(),
                err.details(),
                failed.code(),
            )
    assert results["pyxds"] == results["grpcio"]


def test_unknown_method_and_bad_request_types_fail_like_grpcio(backend):
    results = {}
    for name, make in channels(backend.address):
        with make() as ch:
            results[name] = [
                _outcome(lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Nope")(b"", timeout=5)),
                _outcome(lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Who")("not bytes", timeout=5)),
            ]
    assert [r[:2] for r in results["pyxds"]] == [r[:2] for r in results["grpcio"]]


def test_aio_call_on_a_closed_channel_raises_usage_error_like_grpcio(backend):
    async def run(make):
        ch = make()
        assert await ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5) == b"api"
        await ch.close()
        state = ch.get_state()
        try:
            await ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5)
        except Exception as err:
            return type(err).__name__, str(err), state
        return ("ok",)

    ours = asyncio.run(run(lambda: pyxds_aio.insecure_channel(f"static:///{backend.address}")))
    theirs = asyncio.run(run(lambda: grpc.aio.insecure_channel(backend.address)))
    assert ours == theirs == ("UsageError", "Channel is closed.", grpc.ChannelConnectivity.SHUTDOWN)


def test_wait_for_ready_rpc_waits_for_a_backend_that_starts_later_like_grpcio():
    late = Backend("late").hold()
    outcomes = {}
    threads = []
    chans = []
    for name, make in channels(late.address):
        ch = make()
        chans.append(ch)

        def go(name=name, ch=ch):
            outcomes[name] = _outcome(
                lambda: ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5, wait_for_ready=True)
            )

        threads.append(threading.Thread(target=go))
        threads[-1].start()
    try:
        time.sleep(0.4)
        assert outcomes == {}  # both still waiting, not failed
        late.start()
        for t in threads:
            t.join(6)
        assert wait_until(lambda: len(outcomes) == 2, 1)
        assert outcomes["pyxds"] == outcomes["grpcio"] == ("ok",)
    finally:
        late.release()
        for ch in chans:
            ch.close()


def test_deadline_of_a_fail_fast_rpc_to_a_dead_address_is_unavailable_like_grpcio(ports):
    dead = ports.dead_address()
    codes = {}
    for name, make in channels(dead):
        with make() as ch:
            codes[name] = _outcome(lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Who")(b"", timeout=2))[
                1
            ]
            wfr = _outcome(
                lambda ch=ch: ch.unary_unary(f"/{SERVICE}/Who")(
                    b"", timeout=0.3, wait_for_ready=True
                )
            )
            assert wfr[:2] == ("RpcError", grpc.StatusCode.DEADLINE_EXCEEDED), name
    assert codes["pyxds"] is codes["grpcio"] is grpc.StatusCode.UNAVAILABLE
