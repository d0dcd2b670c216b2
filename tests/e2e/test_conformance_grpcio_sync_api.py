"""grpcio's own sync test suite replayed through pyxds (grpcio 1.85 is the
reference, run side by side): each test runs one scenario from
``grpc/grpc src/python/grpcio_tests/tests/unit/`` through
``grpc.insecure_channel`` and through ``pyxds.insecure_channel`` (a static
target) against the same grpcio server on 127.0.0.1 and asserts both give
the same answer (value, code, details, metadata, state, exception type).

Cases the earlier parity files already hold are not repeated here
(``test_conformance_channel_api.py``, ``test_conformance_channel_parity.py``,
``test_conformance_channel_streams.py``, ``test_channel_static.py``,
``test_conformance_unary_lean.py``)."""

from __future__ import annotations

import collections
import contextvars
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from channel_fixtures import SERVICE, Backend
from ports import EXCLUSIVE

import pyxds._api as pyxds

S = "pyxds.test.GrpcioSync"


def _behave(mode: str, ctx: grpc.ServicerContext) -> None:
    """What the server does before it answers, the same for every arity
    (``_metadata_code_details_test.py``, ``_abort_test.py``)."""
    if mode == "meta":
        ctx.send_initial_metadata((("sik", "siv"), ("sik-bin", b"\x01\x02")))
        ctx.set_trailing_metadata((("stk", "stv"),))
    elif mode == "abort":
        ctx.send_initial_metadata((("sik", "siv"),))
        ctx.set_trailing_metadata((("stk", "stv"),))
        ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "abort details \u2713")
    elif mode == "code":
        ctx.set_trailing_metadata((("stk", "stv"),))
        ctx.set_code(grpc.StatusCode.ABORTED)
        ctx.set_details("custom details")
    elif mode == "code_raise":
        ctx.set_code(grpc.StatusCode.OUT_OF_RANGE)
        ctx.set_details("set then raised")
        raise ValueError("handler defect")
    elif mode == "raise":
        raise ValueError("handler defect")
    elif mode == "status":

        class _Status(grpc.Status):
            code = grpc.StatusCode.UNAUTHENTICATED
            details = "with status"
            trailing_metadata = (("stk", "stv"),)

        ctx.abort_with_status(_Status())
    elif mode == "abort_ok":
        ctx.abort(grpc.StatusCode.OK, "aborted with OK")
    elif mode == "code_only":
        ctx.set_code(grpc.StatusCode.NOT_FOUND)
    elif mode == "details_only":
        ctx.set_details("just details")
    elif mode == "bad_code":
        ctx.set_code("not a status code")


def _uu(request: bytes, ctx: grpc.ServicerContext) -> bytes:
    _behave(request.decode(), ctx)
    return b"resp:" + request


def _us(request: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
    yield b"r1"
    _behave(request.decode(), ctx)
    yield b"r2"


def _su(requests: Iterator[bytes], ctx: grpc.ServicerContext) -> bytes:
    got = list(requests)
    _behave(got[0].decode() if got else "", ctx)
    return b"|".join(got)


def _ss(requests: Iterator[bytes], ctx: grpc.ServicerContext) -> Iterator[bytes]:
    last = b""
    for last in requests:
        yield last * 2
    _behave(last.decode(), ctx)


def _details(request: bytes, ctx: grpc.ServicerContext) -> bytes:
    ctx.abort(grpc.StatusCode.UNKNOWN, request.decode())


def _seen(ctx: grpc.ServicerContext) -> bytes:
    """The invocation metadata the server got, but the user agent (each
    stack names itself: test_differential_channel_options.py compares it)."""
    pairs = [f"{k}={v!r}" for k, v in ctx.invocation_metadata() if k != "user-agent"]
    return ";".join(pairs).encode()


def _endless(request: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
    while ctx.is_active():
        yield b"more"
        time.sleep(0.01)


def _sleep(request: bytes, ctx: grpc.ServicerContext) -> bytes:
    time.sleep(float(request))
    return b"slept"


def _late_stream(request: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
    """Sleeps ``request`` seconds before its one response; with headers
    first when the request starts with "h"."""
    if request.startswith(b"h"):
        ctx.send_initial_metadata((("k", "v"),))
        request = request[1:]
    time.sleep(float(request))
    yield b"late"


class _Server:
    def __init__(self) -> None:
        handlers = grpc.method_handlers_generic_handler(
            S,
            {
                "UU": grpc.unary_unary_rpc_method_handler(_uu),
                "US": grpc.unary_stream_rpc_method_handler(_us),
                "SU": grpc.stream_unary_rpc_method_handler(_su),
                "SS": grpc.stream_stream_rpc_method_handler(_ss),
                "Details": grpc.unary_unary_rpc_method_handler(_details),
                "Sleep": grpc.unary_unary_rpc_method_handler(_sleep),
                "Endless": grpc.unary_stream_rpc_method_handler(_endless),
                "Late": grpc.unary_stream_rpc_method_handler(_late_stream),
                "SeenUU": grpc.unary_unary_rpc_method_handler(lambda r, c: _seen(c)),
                "SeenUS": grpc.unary_stream_rpc_method_handler(lambda r, c: iter([_seen(c)])),
                "SeenSU": grpc.stream_unary_rpc_method_handler(
                    lambda rs, c: (list(rs), _seen(c))[1]
                ),
                "SeenSS": grpc.stream_stream_rpc_method_handler(
                    lambda rs, c: (list(rs), iter([_seen(c)]))[1]
                ),
            },
        )
        self._pool = futures.ThreadPoolExecutor(16)
        self.server = grpc.server(self._pool, handlers=(handlers,), options=[EXCLUSIVE])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(0).wait(5)
        self._pool.shutdown(wait=False)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.stop()


def _make(kind: str, address: str, **kwargs: Any) -> grpc.Channel:
    if kind == "grpcio":
        return grpc.insecure_channel(address, **kwargs)
    return pyxds.insecure_channel(f"static:///{address}", **kwargs)


KINDS = ("grpcio", "pyxds")


def _each(address: str, scenario: Callable[[grpc.Channel], Any], **kwargs: Any) -> dict[str, Any]:
    got = {}
    for kind in KINDS:
        with _make(kind, address, **kwargs) as ch:
            got[kind] = scenario(ch)
    return got


def _outcome(fn: Callable[[], Any]) -> tuple:
    try:
        value = fn()
    except grpc.RpcError as err:
        return ("RpcError", err.code(), err.details(), err.trailing_metadata())
    except Exception as err:
        return (type(err).__name__,)
    return ("ok", value)


def _drain(it: Any) -> tuple:
    got: list[Any] = []
    try:
        for response in it:
            got.append(response)
    except grpc.RpcError as err:
        got.append(("RpcError", err.code(), err.details()))
    return tuple(got), it.initial_metadata(), it.trailing_metadata(), it.code(), it.details()


def _every_arity(ch: grpc.Channel, request: bytes) -> list[tuple]:
    """The seven ways to call the four arities, each with what the caller
    can read afterwards."""
    md = (("cm", "cv"), ("cm-bin", b"\x00\xff"))
    uu = ch.unary_unary(f"/{S}/UU")
    su = ch.stream_unary(f"/{S}/SU")

    def with_call(mc: Any, req: Any) -> tuple:
        response, call = mc.with_call(req, metadata=md, timeout=5)
        return (response, call.initial_metadata(), call.trailing_metadata(), call.code())

    def future() -> tuple:
        f = uu.future(request, metadata=md, timeout=5)
        err = f.exception(5)
        return (f.initial_metadata(), f.trailing_metadata(), f.code(), f.details(), err is None)

    return [
        _outcome(lambda: uu(request, metadata=md, timeout=5)),
        _outcome(lambda: with_call(uu, request)),
        _outcome(future),
        _outcome(lambda: _drain(ch.unary_stream(f"/{S}/US")(request, metadata=md, timeout=5))),
        _outcome(lambda: su(iter([request, request]), metadata=md, timeout=5)),
        _outcome(lambda: with_call(su, iter([request, request]))),
        _outcome(
            lambda: _drain(
                ch.stream_stream(f"/{S}/SS")(iter([request, request]), metadata=md, timeout=5)
            )
        ),
    ]


@pytest.mark.parametrize(
    "mode",
    [
        "meta",
        "abort",
        "code",
        "code_raise",
        "raise",
        "status",
        "abort_ok",
        "code_only",
        "details_only",
        "bad_code",
    ],
)
def test_code_details_and_metadata_of_every_arity_read_like_grpcio(server, mode):
    """grpc/grpc tests/unit/_metadata_code_details_test.py (custom code and
    details, set then raised, invalid code), _metadata_test.py (metadata
    both ways), _abort_test.py (abort, abort_with_status, abort with OK):
    the client's view of each, for every arity and call form."""
    got = _each(server.address, lambda ch: _every_arity(ch, mode.encode()))
    assert got["pyxds"] == got["grpcio"]


def test_empty_messages_travel_in_every_arity_like_grpcio(server):
    """grpc/grpc tests/unit/_empty_message_test.py: b"" requests and
    responses, and empty request streams."""

    def scenario(ch: grpc.Channel) -> tuple:
        return (
            ch.unary_unary(f"/{S}/UU")(b"", timeout=5),
            _drain(ch.unary_stream(f"/{S}/US")(b"", timeout=5))[0],
            ch.stream_unary(f"/{S}/SU")(iter([]), timeout=5),
            ch.stream_unary(f"/{S}/SU")(iter([b"", b""]), timeout=5),
            _drain(ch.stream_stream(f"/{S}/SS")(iter([]), timeout=5))[0],
        )

    got = _each(server.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0] == b"resp:"


def test_error_details_in_any_script_reach_the_caller_like_grpcio(server):
    """grpc/grpc tests/unit/_error_message_encoding_test.py: non-ASCII,
    astral, NUL, newline and percent-looking details."""
    texts = ["\u0101", "\u4e2d\u6587", "\U0001f600", "\x00", "a\nb", "%", "%41", "e\u0301"]

    def scenario(ch: grpc.Channel) -> list:
        return [_outcome(lambda t=t: ch.unary_unary(f"/{S}/Details")(t.encode())) for t in texts]

    got = _each(server.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][1][2] == "\u4e2d\u6587"


def test_request_iterator_defects_fail_the_call_unknown_like_grpcio(server):
    """grpc/grpc tests/unit/_invocation_defects_test.py: a request
    "iterator" that is not iterable (blocking, future and stream-stream
    calls) and an iterator that raises part way fail the call UNKNOWN
    "Exception iterating requests!"."""

    def scenario(ch: grpc.Channel) -> list:
        su = ch.stream_unary(f"/{S}/SU")
        ss = ch.stream_stream(f"/{S}/SS")
        answered = threading.Event()

        def breaks_after_an_answer() -> Iterator[bytes]:
            yield b"meta"
            answered.wait(5)
            raise ZeroDivisionError("request defect")

        def stream_breaking() -> tuple:
            it = ss(breaks_after_an_answer(), timeout=5)
            first = next(it)
            answered.set()
            return first, _outcome(lambda: next(it)), it.code(), it.details()

        future = su.future(object(), timeout=5)
        return [
            _outcome(lambda: su(object(), timeout=5)),
            _outcome(lambda: future.result(5)),
            (future.code(), future.details()),
            _outcome(lambda: next(ss(object(), timeout=5))),
            stream_breaking(),
        ]

    got = _each(server.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0][:3] == (
        "RpcError",
        grpc.StatusCode.UNKNOWN,
        "Exception iterating requests!",
    )


def test_invalid_metadata_fails_each_call_form_like_grpcio(server):
    """grpc/grpc tests/unit/_invalid_metadata_test.py: an upper-case key
    (grpcio 1.85: the call fails INTERNAL "Invalid metadata", the
    future/stream holding that status), a non-sequence (TypeError), a str
    value under a -bin key and a non-str value (TypeError), bad value
    characters."""
    bad_key = (("InVaLiD", "x"),)

    def scenario(ch: grpc.Channel) -> list:
        uu = ch.unary_unary(f"/{S}/UU")
        su = ch.stream_unary(f"/{S}/SU")

        def status_of(call: Any) -> tuple:
            return (call.code(), call.details())

        return [
            _outcome(lambda: uu(b"", metadata=bad_key, timeout=5)),
            _outcome(lambda: uu.with_call(b"", metadata=bad_key, timeout=5)),
            _outcome(lambda: status_of(uu.future(b"", metadata=bad_key, timeout=5))),
            _outcome(
                lambda: status_of(ch.unary_stream(f"/{S}/US")(b"", metadata=bad_key, timeout=5))
            ),
            _outcome(lambda: su(iter([]), metadata=bad_key, timeout=5)),
            _outcome(lambda: status_of(su.future(iter([]), metadata=bad_key, timeout=5))),
            _outcome(
                lambda: status_of(
                    ch.stream_stream(f"/{S}/SS")(iter([]), metadata=bad_key, timeout=5)
                )
            ),
            _outcome(lambda: uu(b"", metadata=42, timeout=5)),
            _outcome(lambda: uu(b"", metadata=(("k", 42),), timeout=5)),
            _outcome(lambda: uu(b"", metadata=(("k-bin", "str"),), timeout=5)),
            _outcome(lambda: uu(b"", metadata=(("k", "a\nb"),), timeout=5)),
            _outcome(lambda: uu(b"", metadata=[("k", "v")], timeout=5)),
        ]

    got = _each(server.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0][:3] == ("RpcError", grpc.StatusCode.INTERNAL, "Invalid metadata")
    assert got["grpcio"][7] == ("TypeError",)


def test_channel_options_grpcio_rejects_are_rejected_and_the_rest_accepted(server):
    """grpc/grpc tests/unit/_channel_args_test.py: bytes/str/int values, a
    bytes key and an object with ``__int__`` are accepted; a dict, a
    one-element pair and a plain string as ``options`` raise ValueError."""

    class _PointerLike:
        def __int__(self) -> int:
            return 123456

    good = (
        ("arg1", b"bytes_val"),
        ("arg2", "str_val"),
        ("arg3", 1),
        (b"arg4", "str_val"),
        ("arg6", _PointerLike()),
    )
    got = {}
    for kind in KINDS:

        def made(options: Any, kind: str = kind) -> tuple:
            def make() -> str:
                _make(kind, server.address, options=options).close()
                return "made"

            return _outcome(make)

        got[kind] = [made(good)] + [made(bad) for bad in ({"foo": "bar"}, (("key",),), "str")]
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"] == [("ok", "made")] + [("ValueError",)] * 3


def test_close_cancels_streams_just_started_or_many_active_like_grpcio(server):
    """grpc/grpc tests/unit/_channel_close_test.py:
    test_close_immediately_after_call_invocation,
    test_context_manager_close_while_many_calls_active,
    test_exception_in_callback (a raising done callback deadlocks nothing)."""

    def pipe() -> tuple[queue.Queue, Iterator[bytes]]:
        q: queue.Queue = queue.Queue()

        def requests() -> Iterator[bytes]:
            while (item := q.get()) is not None:
                yield item

        return q, requests()

    def just_started(kind: str) -> tuple:
        ch = _make(kind, server.address)
        q, requests = pipe()
        it = ch.stream_stream(f"/{S}/SS")(requests)
        ch.close()
        q.put(None)
        return it.code(), it.details()

    def many(kind: str) -> list:
        pipes = []
        with _make(kind, server.address) as ch:
            calls = []
            for _ in range(8):
                q, requests = pipe()
                q.put(b"abc")
                pipes.append(q)
                it = ch.stream_stream(f"/{S}/SS")(requests)
                assert next(it) == b"abcabc"
                calls.append(it)
        for q in pipes:
            q.put(None)
        return [(it.code(), it.details()) for it in calls]

    def raising_callback(kind: str) -> bytes:
        with _make(kind, server.address) as ch:
            # the call cannot end before its requests do, so the callback is
            # added to a call in flight, run by the channel when it ends
            # (added to an ended one, grpcio runs it at once in the caller,
            # which then gets its exception: a unary call that ended first
            # failed this test so on a loaded machine)
            q, requests = pipe()
            f = ch.stream_unary(f"/{S}/SU").future(requests, timeout=5)

            def on_done(_: Any) -> None:
                raise RuntimeError("a raising done callback")

            f.add_done_callback(on_done)
            q.put(b"meta")
            q.put(None)
            return f.result(5)

    got = {kind: (just_started(kind), many(kind), raising_callback(kind)) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0] == (grpc.StatusCode.CANCELLED, "Channel closed!")


def test_every_call_form_fails_fast_on_a_dead_address_unless_wait_for_ready(ports):
    """grpc/grpc tests/unit/_metadata_flags_test.py
    test_call_wait_for_ready_default / _disabled: all eight call forms fail
    UNAVAILABLE at once on a refused address."""
    dead = ports.dead_address()

    def scenario(ch: grpc.Channel) -> list:
        uu = ch.unary_unary(f"/{S}/UU")
        su = ch.stream_unary(f"/{S}/SU")
        out = []
        for wfr in (None, False):
            kw = {"timeout": 5, "wait_for_ready": wfr}
            calls = [
                lambda kw=kw: uu(b"", **kw),
                lambda kw=kw: uu.with_call(b"", **kw),
                lambda kw=kw: uu.future(b"", **kw).result(5),
                lambda kw=kw: list(ch.unary_stream(f"/{S}/US")(b"", **kw)),
                lambda kw=kw: su(iter([b""] * 3), **kw),
                lambda kw=kw: su.with_call(iter([b""] * 3), **kw),
                lambda kw=kw: su.future(iter([b""] * 3), **kw).result(5),
                lambda kw=kw: list(ch.stream_stream(f"/{S}/SS")(iter([b""] * 3), **kw)),
            ]
            out += [_outcome(call)[:2] for call in calls]
        return out

    start = time.monotonic()
    got = _each(dead, scenario)
    assert got["pyxds"] == got["grpcio"] == [("RpcError", grpc.StatusCode.UNAVAILABLE)] * 16
    assert time.monotonic() - start < 3


def test_channel_ready_future_over_a_pyxds_channel_answers_like_grpcio(server, ports):
    """grpc/grpc tests/unit/_channel_ready_future_test.py: not ready in
    time (FutureTimeoutError), cancelled, and ready (result None, done
    callback called with the future)."""
    dead = ports.dead_address()

    def scenario(kind: str) -> tuple:
        with _make(kind, dead) as ch:
            f = grpc.channel_ready_future(ch)
            timed_out = _outcome(lambda: f.result(timeout=0.2))
            before = (f.done(), f.running(), f.cancelled())
            cancelled = f.cancel()
            after = (f.done(), f.cancelled(), _outcome(lambda: f.result(0.1)))
        with _make(kind, server.address) as ch:
            f = grpc.channel_ready_future(ch)
            ready = _outcome(lambda: f.result(timeout=5))
            seen: list[bool] = []
            f.add_done_callback(lambda g: seen.append(g is f))
            state = (f.done(), f.running(), f.cancelled(), f.exception(), f.traceback())
        return timed_out, before, cancelled, after, ready, state, seen

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0] == ("FutureTimeoutError",)
    assert got["grpcio"][4] == ("ok", None)


def test_lonely_channel_reports_idle_first_and_never_ready_like_grpcio(ports):
    """grpc/grpc tests/unit/_channel_connectivity_test.py
    test_lonely_channel_connectivity: IDLE alone before try_to_connect;
    never READY after; nothing after the (double) unsubscribe."""
    dead = ports.dead_address()

    def scenario(kind: str) -> tuple:
        with _make(kind, dead) as ch:
            states: list[grpc.ChannelConnectivity] = []
            first = threading.Event()

            def on_state(state: grpc.ChannelConnectivity) -> None:
                states.append(state)
                first.set()

            ch.subscribe(on_state)
            assert first.wait(2)
            first_states = list(states)
            ch.subscribe(on_state, try_to_connect=True)
            deadline = time.monotonic() + 2
            while grpc.ChannelConnectivity.TRANSIENT_FAILURE not in states:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            ch.unsubscribe(on_state)
            ch.unsubscribe(on_state)
            count = len(states)
            time.sleep(0.1)
            return first_states, grpc.ChannelConnectivity.READY in states, len(states) == count

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"] == ([grpc.ChannelConnectivity.IDLE], False, True)


def test_reachable_then_unreachable_channel_leaves_ready_like_grpcio():
    """grpc/grpc tests/unit/_channel_connectivity_test.py
    test_reachable_then_unreachable_channel_connectivity: READY, then after
    the server stops the last state reported is not READY (IDLE: GOAWAY)."""

    def scenario(kind: str) -> list:
        backend = Backend("conn").start()
        try:
            with _make(kind, backend.address) as ch:
                states: list[grpc.ChannelConnectivity] = []
                ready, left = threading.Event(), threading.Event()

                def on_state(state: grpc.ChannelConnectivity) -> None:
                    states.append(state)
                    if state is grpc.ChannelConnectivity.READY:
                        ready.set()
                    elif ready.is_set():
                        left.set()

                ch.subscribe(on_state, try_to_connect=True)
                assert ready.wait(5)
                backend.stop(None)
                assert left.wait(5)
                ch.unsubscribe(on_state)
                return states[states.index(grpc.ChannelConnectivity.READY) :]
        finally:
            backend.release()

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][-1] is not grpc.ChannelConnectivity.READY


def test_the_next_rpc_reaches_a_server_restarted_on_the_same_port_like_grpcio():
    """grpc/grpc tests/unit/_reconnect_test.py: the server goes away and
    comes back on the same port; the next (fail-fast) RPC is served."""

    def scenario(kind: str) -> tuple:
        backend = Backend("again").start()
        try:
            with _make(kind, backend.address) as ch:
                who = ch.unary_unary(f"/{SERVICE}/Who")
                first = who(b"", timeout=5)
                backend.stop(None)
                backend.start()
                return first, who(b"", timeout=5)
        finally:
            backend.stop(None)
            backend.release()

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"] == (b"again", b"again")


def test_a_full_server_answers_resource_exhausted_like_grpcio():
    """grpc/grpc tests/unit/_resource_exhausted_test.py: a server at its
    ``maximum_concurrent_rpcs`` answers RESOURCE_EXHAUSTED "Concurrent RPC
    limit exceeded!" for unary and streaming calls; the held call ends OK."""
    release, entered = threading.Event(), threading.Event()

    def hold(request: bytes, ctx: grpc.ServicerContext) -> bytes:
        entered.set()
        release.wait(5)
        return b"held"

    handlers = grpc.method_handlers_generic_handler(
        S,
        {
            "Hold": grpc.unary_unary_rpc_method_handler(hold),
            "HoldStream": grpc.unary_stream_rpc_method_handler(lambda r, c: iter([hold(r, c)])),
        },
    )
    pool = futures.ThreadPoolExecutor(4)
    srv = grpc.server(pool, handlers=(handlers,), maximum_concurrent_rpcs=1, options=[EXCLUSIVE])
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:

        def scenario(kind: str) -> tuple:
            release.clear()
            entered.clear()
            with _make(kind, f"127.0.0.1:{port}") as ch:
                held = ch.unary_unary(f"/{S}/Hold").future(b"", timeout=5)
                assert entered.wait(5)  # the held call occupies the server
                refused = _outcome(lambda: ch.unary_unary(f"/{S}/Hold")(b"", timeout=5))
                stream = _outcome(lambda: list(ch.unary_stream(f"/{S}/HoldStream")(b"", timeout=5)))
                release.set()
                return refused, stream, held.result(5)

        got = {kind: scenario(kind) for kind in KINDS}
    finally:
        release.set()
        srv.stop(0).wait(5)
        pool.shutdown(wait=False)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0][1:3] == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Concurrent RPC limit exceeded!",
    )


_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="unset")


@pytest.mark.parametrize("plugin_does", ["answer", "fail", "raise"])
def test_call_credentials_plugin_sees_the_callers_context_like_grpcio(server, plugin_does):
    """grpc/grpc tests/unit/_contextvars_propagation_test.py: a metadata
    plugin runs with the calling thread's context variables; its metadata
    reaches the server; a plugin that reports an error or raises fails the
    call as grpcio fails it."""
    seen: dict[str, list] = collections.defaultdict(list)

    def scenario(kind: str) -> tuple:
        class Plugin(grpc.AuthMetadataPlugin):
            def __call__(self, context: Any, callback: Any) -> None:
                seen[kind].append((_VAR.get(), context.service_url, context.method_name))
                if plugin_does == "raise":
                    raise RuntimeError("plugin blew up")
                if plugin_does == "fail":
                    callback(None, ValueError("no token"))
                    return
                callback((("token", _VAR.get()),), None)

        # as the grpcio test: the variable is set before the channel is made
        token = _VAR.set(f"set by the caller of {kind}")
        creds = grpc.composite_channel_credentials(
            grpc.local_channel_credentials(), grpc.metadata_call_credentials(Plugin())
        )
        if kind == "grpcio":
            ch = grpc.secure_channel(server.address, creds)
        else:
            ch = pyxds.secure_channel(f"static:///{server.address}", creds)
        try:
            with ch:
                return _outcome(lambda: ch.unary_unary(f"/{S}/UU")(b"meta", timeout=5))
        finally:
            _VAR.reset(token)

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert [(v.replace("pyxds", "grpcio"), *rest) for v, *rest in seen["pyxds"]] == seen["grpcio"]
    assert seen["grpcio"][0][0] == "set by the caller of grpcio"


class _Tagging(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds its tag to the metadata and logs what it saw."""

    Details = collections.namedtuple(
        "Details", "method timeout metadata credentials wait_for_ready compression"
    )

    def __init__(self, log: list, tag: str) -> None:
        self.log, self.tag = log, tag

    def _details(self, d: Any) -> Any:
        metadata = [*(d.metadata or ()), ("itag", self.tag)]
        return self.Details(
            d.method, d.timeout, metadata, d.credentials, d.wait_for_ready, d.compression
        )

    def _go(self, arity: str, go: Any, d: Any, request: Any) -> Any:
        self.log.append((arity, self.tag, d.method, d.timeout is not None))
        return go(self._details(d), request)

    def intercept_unary_unary(self, go: Any, d: Any, request: Any) -> Any:
        call = self._go("uu", go, d, request)
        self.log.append(("uu-done", self.tag, call.code()))
        return call

    def intercept_unary_stream(self, go: Any, d: Any, request: Any) -> Any:
        return self._go("us", go, d, request)

    def intercept_stream_unary(self, go: Any, d: Any, requests: Any) -> Any:
        return self._go("su", go, d, requests)

    def intercept_stream_stream(self, go: Any, d: Any, requests: Any) -> Any:
        return self._go("ss", go, d, requests)


def test_stacked_interceptors_over_a_pyxds_channel_act_like_grpcio(server):
    """grpc/grpc tests/unit/_interceptor_test.py: two interceptors of every
    arity around the channel (order, details they see, the call they get
    back), a good and an aborting server; a defective interceptor."""

    class _Defective(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        def intercept_unary_unary(self, go: Any, d: Any, request: Any) -> Any:
            raise ZeroDivisionError("defective interceptor")

        def intercept_stream_stream(self, go: Any, d: Any, requests: Any) -> Any:
            raise ZeroDivisionError("defective interceptor")

    def scenario(ch: grpc.Channel) -> tuple:
        log: list = []
        stacked = grpc.intercept_channel(ch, _Tagging(log, "a"), _Tagging(log, "b"))
        answers = _every_arity(stacked, b"meta") + _every_arity(stacked, b"abort")
        broken = grpc.intercept_channel(ch, _Defective())
        defects = (
            _outcome(lambda: broken.unary_unary(f"/{S}/UU")(b"meta")),
            _outcome(lambda: broken.unary_unary(f"/{S}/UU").future(b"meta").result()),
            _outcome(lambda: list(broken.stream_stream(f"/{S}/SS")(iter([b"meta"])))),
        )
        return answers, log, defects

    got = _each(server.address, scenario)
    assert got["pyxds"] == got["grpcio"]


def test_response_stream_read_past_its_end_and_odd_method_names_like_grpcio(server):
    """grpc/grpc tests/unit/_rpc_part_2_test.py
    testConsumingTooManyStreamResponsesStreamRequest (StopIteration again
    and again), testUnrecognizedMethod ('NoSuchMethod', no slash:
    UNIMPLEMENTED), testSuccessfulUnaryRequestBlockingUnaryResponseWithCall
    (OK call's debug_error_string is '')."""

    def scenario(ch: grpc.Channel) -> tuple:
        it = ch.stream_stream(f"/{S}/SS")(iter([b"x"]), timeout=5)
        reads = [next(it)]
        for _ in range(2):
            reads.append(_outcome(lambda: next(it)))
        _, call = ch.unary_unary(f"/{S}/UU").with_call(b"meta", timeout=5)
        return (
            reads,
            it.code(),
            _outcome(lambda: ch.unary_unary("NoSuchMethod")(b"abc", timeout=5)),
            _outcome(lambda: list(ch.unary_stream("/no.Such/Method")(b"abc", timeout=5))),
            call.debug_error_string(),
        )

    got = _each(server.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0][1:] == [("StopIteration",), ("StopIteration",)]


def test_a_failed_future_or_response_stream_raises_itself_like_grpcio(server, ports):
    """grpcio's ``_MultiThreadedRendezvous``: ``future.result()`` raises the
    future itself and ``future.exception()`` is the future; a failed
    response stream raises the iterator itself (grpc/grpc
    tests/unit/_rpc_part_1_test.py testFailedUnaryRequestFutureUnaryResponse,
    _rpc_part_2_test.py testCancelledStreamRequestUnaryResponse read the
    outcome off the future).  Each case: a server error, a deadline while
    the pick waits, a refused address (fail fast), a close in flight."""
    dead = ports.dead_address()

    def identity(call: Any, read: Callable[[], Any]) -> tuple:
        try:
            read()
        except grpc.RpcError as err:
            own = call.exception(5) is call if hasattr(call, "exception") else None
            return (err is call, own, err.code(), str(err).split("\n")[0])
        return ("ok",)

    def scenario(kind: str) -> list:
        out = []
        with _make(kind, server.address) as ch:
            f = ch.unary_unary(f"/{S}/UU").future(b"abort", timeout=5)
            out.append(identity(f, lambda: f.result(5)))
            it = ch.unary_stream(f"/{S}/US")(b"abort", timeout=5)
            out.append(identity(it, lambda: list(it)))
            f = ch.unary_unary(f"/{S}/Sleep").future(b"2", timeout=5)
            time.sleep(0.05)
        out.append(identity(f, lambda: f.result(5)))  # closed in flight
        with _make(kind, dead) as ch:
            f = ch.unary_unary(f"/{S}/UU").future(b"", timeout=0.1, wait_for_ready=True)
            out.append(identity(f, lambda: f.result(5)))
            f = ch.unary_unary(f"/{S}/UU").future(b"", timeout=5)
            out.append(identity(f, lambda: f.result(5)))
            it = ch.unary_stream(f"/{S}/US")(b"", timeout=5)
            out.append(identity(it, lambda: next(it)))
        return out

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0][:2] == (True, True)


def test_errors_the_channel_makes_print_and_debug_like_grpcios(server, ports):
    """grpc/grpc tests/unit/_rpc_part_1_test.py
    testFailedUnaryRequestBlockingUnaryResponse reads
    ``debug_error_string()``: grpcio 1.85 gives ``CODE:details`` for a call
    its channel failed (a deadline while the pick waits, a close in
    flight, a refused address), and ``str()`` of the error (blocking:
    ``_InactiveRpcError``; future/stream: ``_MultiThreadedRendezvous``)
    ends with that debug_error_string line."""
    dead = ports.dead_address()

    def view(read: Callable[[], Any]) -> tuple:
        try:
            read()
        except grpc.RpcError as err:
            debug = err.debug_error_string()
            text = str(err)
            # the refused address's details are the channel's own wording
            # (pyxds names the address its way); the form is what is compared
            text = text.replace(err.details(), "<details>")
            return (debug == f"{err.code().name}:{err.details()}", text)
        return ("ok",)

    def scenario(kind: str) -> list:
        out = []
        with _make(kind, dead) as ch:
            uu = ch.unary_unary(f"/{S}/UU")
            out.append(view(lambda: uu(b"", timeout=0.1, wait_for_ready=True)))
            out.append(view(lambda: uu.future(b"", timeout=0.1, wait_for_ready=True).result(5)))
            out.append(view(lambda: uu(b"", timeout=5)))
            out.append(view(lambda: list(ch.unary_stream(f"/{S}/US")(b"", timeout=5))))
        with _make(kind, server.address) as ch:
            f = ch.unary_unary(f"/{S}/Sleep").future(b"2", timeout=5)
            time.sleep(0.05)
        out.append(view(lambda: f.result(5)))
        return out

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][0] == (
        True,
        "<_InactiveRpcError of RPC that terminated with:\n"
        "\tstatus = StatusCode.DEADLINE_EXCEEDED\n"
        '\tdetails = "<details>"\n'
        '\tdebug_error_string = "DEADLINE_EXCEEDED:<details>"\n>',
    )


_BLOCKED_CHILD = r"""
import itertools, signal, sys
# Ctrl-C raises KeyboardInterrupt, as in a terminal, even when the test
# runner was started in the background (a shell without job control starts
# it with SIGINT ignored, every child inherits that, and Python then
# installs no handler: the program slept through the signal)
signal.signal(signal.SIGINT, signal.default_int_handler)
import grpc
kind, scenario, target = sys.argv[1:4]
if kind == "grpcio":
    ch = grpc.insecure_channel(target)
else:
    import pyxds
    ch = pyxds.insecure_channel("static:///" + target)
S = "/pyxds.test.Hang/"
if scenario == "unary_unary":
    pending = ch.unary_unary(S + "Hang").future(b"r")
    ch.unary_unary(S + "Hang").with_call(b"r")
elif scenario == "partial_unary_stream":
    for _ in ch.unary_stream(S + "PartialStream")(b"r"):
        pass
elif scenario == "stream_unary":
    pending = ch.stream_unary(S + "HangStream").future(itertools.repeat(b"r"))
    ch.stream_unary(S + "HangStream").with_call(iter([b"r"] * 10))
elif scenario == "partial_stream_stream":
    for _ in ch.stream_stream(S + "PartialChat")(itertools.repeat(b"r")):
        pass
"""


def test_ctrl_c_ends_a_program_blocked_in_any_call_kind(tmp_path):
    """grpc/grpc tests/unit/_exit_test.py with _exit_scenarios.py
    (in_flight_unary_unary_call, in_flight_partial_unary_stream_call,
    in_flight_stream_unary_call, in_flight_partial_stream_stream_call): a
    program blocked in a call to a server that never answers ends on SIGINT
    with KeyboardInterrupt, at once.  grpcio 1.85 runs the unary-unary case
    alongside as the reference (it hangs on the full, never-answered
    stream-stream case with an endless request iterator, which pyxds ends:
    not replayed, a case grpcio fails)."""
    import os
    import signal
    import subprocess
    import sys

    release = threading.Event()
    arrived: queue.Queue = queue.Queue()

    def hang(request: Any, ctx: grpc.ServicerContext) -> bytes:
        arrived.put(1)
        release.wait(10)
        return b""

    def hang_stream(requests: Iterator[bytes], ctx: grpc.ServicerContext) -> bytes:
        next(requests)
        return hang(None, ctx)

    def partial_stream(request: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
        yield b"x"
        yield b"x"
        hang(None, ctx)

    def partial_chat(requests: Iterator[bytes], ctx: grpc.ServicerContext) -> Iterator[bytes]:
        yield next(requests)
        yield next(requests)
        hang(None, ctx)

    handlers = grpc.method_handlers_generic_handler(
        "pyxds.test.Hang",
        {
            "Hang": grpc.unary_unary_rpc_method_handler(hang),
            "HangStream": grpc.stream_unary_rpc_method_handler(hang_stream),
            "PartialStream": grpc.unary_stream_rpc_method_handler(partial_stream),
            "PartialChat": grpc.stream_stream_rpc_method_handler(partial_chat),
        },
    )
    pool = futures.ThreadPoolExecutor(16)
    srv = grpc.server(pool, handlers=(handlers,), options=[EXCLUSIVE])
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    script = tmp_path / "blocked.py"
    script.write_text(_BLOCKED_CHILD)
    runs = [("grpcio", "unary_unary")] + [
        ("pyxds", s)
        for s in ("unary_unary", "partial_unary_stream", "stream_unary", "partial_stream_stream")
    ]
    # the calls each program leaves at the server (a pending future too)
    expected = {"unary_unary": 2, "stream_unary": 2}
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = []
    try:
        for kind, scenario in runs:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), kind, scenario, f"127.0.0.1:{port}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        for _ in range(sum(expected.get(s, 1) for _, s in runs)):
            arrived.get(timeout=15)  # every program is blocked in its call
        time.sleep(0.05)  # from the server's handler back to the blocked read
        start = time.monotonic()
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        ended = []
        for (kind, scenario), proc in zip(runs, procs, strict=True):
            _, err = proc.communicate(timeout=5)
            ended.append((kind, scenario, proc.returncode, err.strip().splitlines()[-1:]))
        took = time.monotonic() - start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        release.set()
        srv.stop(0).wait(5)
        pool.shutdown(wait=False)
    interrupted = (-signal.SIGINT, ["KeyboardInterrupt"])
    assert [(k, s, *interrupted) for k, s in runs] == ended
    assert took < 2


@pytest.mark.timeout(20)
@pytest.mark.parametrize("single_threaded", [False, True], ids=["default", "single_threaded"])
def test_a_cancelled_response_stream_reads_cancelled_at_once_like_grpcio(server, single_threaded):
    """grpc/grpc tests/unit/_rpc_part_2_test.py
    testCancelledUnaryRequestStreamResponse (and grpcio's
    ``grpc.experimental.ChannelOptions.SingleThreadedUnaryStream``, whose
    calls run no callbacks until read): after ``cancel()`` the next read
    raises the stream itself, CANCELLED "Locally cancelled by
    application!", and its code/details/trailing metadata answer at once
    (a hang fails the test by its timeout)."""
    import grpc.experimental

    options = (
        [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)] if single_threaded else []
    )

    def scenario(ch: grpc.Channel) -> tuple:
        it = ch.unary_stream(f"/{S}/Endless")(b"", timeout=5)
        first = next(it)
        cancelled = it.cancel()
        # read on this thread: a single-threaded call refuses other readers
        try:
            next(it)
            answer: tuple = ("not raised",)
        except grpc.RpcError as err:
            answer = (err is it, err.code(), err.details(), err.trailing_metadata())
        return first, cancelled, answer, it.done(), it.cancelled()

    got = {}
    for kind in KINDS:
        with _make(kind, server.address, options=options) as ch:
            got[kind] = scenario(ch)
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][2] == (
        True,
        grpc.StatusCode.CANCELLED,
        "Locally cancelled by application!",
        (),
    )


def test_a_failed_future_is_a_pyxds_class_with_grpcios_interfaces(server):
    """Where pyxds cannot match (docs/differences-from-c-core.md, Channel):
    grpcio's failed future is its private ``_MultiThreadedRendezvous``,
    pyxds's a ``FutureCall``; both are grpc.RpcError, grpc.Call and
    grpc.Future and print the same text."""
    got = {}
    for kind in KINDS:
        with _make(kind, server.address) as ch:
            f = ch.unary_unary(f"/{S}/UU").future(b"abort", timeout=5)
            err = f.exception(5)
            interfaces = [isinstance(err, t) for t in (grpc.RpcError, grpc.Call, grpc.Future)]
            got[kind] = (type(err).__name__, interfaces, str(err))
    assert got["grpcio"][0] == "_MultiThreadedRendezvous"
    assert got["pyxds"][0] == "FutureCall"
    assert got["pyxds"][1:] == got["grpcio"][1:]
    assert got["grpcio"][1] == [True, True, True]


def test_the_server_sees_the_callers_metadata_from_every_arity_like_grpcio(server):
    """grpc/grpc tests/unit/_metadata_test.py: the invocation metadata the
    server receives (repeated keys in order, a binary value, a str value
    with spaces), from each arity and call form."""
    md = (("k", "v1"), ("k", "v2"), ("k2-bin", b"\x00\x01\xff"), ("k3", "a b  c"))

    def scenario(ch: grpc.Channel) -> list:
        uu = ch.unary_unary(f"/{S}/SeenUU")
        su = ch.stream_unary(f"/{S}/SeenSU")
        return [
            uu(b"", metadata=md, timeout=5),
            uu.with_call(b"", metadata=md, timeout=5)[0],
            uu.future(b"", metadata=md, timeout=5).result(5),
            list(ch.unary_stream(f"/{S}/SeenUS")(b"", metadata=md, timeout=5)),
            su(iter([b""]), metadata=md, timeout=5),
            su.future(iter([b""]), metadata=md, timeout=5).result(5),
            list(ch.stream_stream(f"/{S}/SeenSS")(iter([b""]), metadata=md, timeout=5)),
        ]

    got = _each(server.address, scenario)
    assert got["pyxds"] == got["grpcio"]
    assert b"k='v1';k='v2'" in got["grpcio"][0]


def test_many_threads_closing_a_channel_at_once_cancel_its_stream_like_grpcio(server):
    """grpc/grpc tests/unit/_channel_close_test.py
    test_many_concurrent_closes: eight threads close the channel together
    while a stream is active; no close raises, the stream ends CANCELLED."""

    def scenario(kind: str) -> tuple:
        ch = _make(kind, server.address)
        it = ch.unary_stream(f"/{S}/Endless")(b"")
        next(it)
        raised: list[BaseException] = []
        go = threading.Barrier(8)

        def close() -> None:
            go.wait(5)
            try:
                ch.close()
            except BaseException as err:  # any raise is the finding
                raised.append(err)

        closers = []
        while len(closers) < 8:
            closers.append(threading.Thread(target=close))
            closers[-1].start()
        assert all(not (c.join(5) or c.is_alive()) for c in closers)
        return raised, it.code(), it.details()

    got = {kind: scenario(kind) for kind in KINDS}
    assert got["pyxds"] == got["grpcio"]
    assert got["grpcio"][1] is grpc.StatusCode.CANCELLED


def test_stream_deadline_wording_before_and_after_the_headers_like_grpcio(server):
    """grpcio's channel (C-core's retry filter on) ends a response stream
    whose deadline comes before any response header DEADLINE_EXCEEDED
    "Deadline Exceeded" (every run); once headers arrived, mostly "Stream
    removed (Deadline Exceeded)", sometimes "Deadline Exceeded" (grpcio
    1.85, live).  pyxds's subchannel channels run without that filter, so
    pyxds words the first case itself (it said "Stream removed ..."), read
    from the iterator and from the call alike."""

    def scenario(ch: grpc.Channel) -> list[Any]:
        late = ch.unary_stream(f"/{S}/Late")
        silent = late(b"1", timeout=0.2)
        out: list[Any] = [_drain(silent)[0], silent.code(), silent.details()]
        headed = late(b"h1", timeout=0.5)
        out.append(headed.initial_metadata())  # they arrived before the deadline
        out += [headed.code(), headed.details()]
        return out

    got = _each(server.address, scenario)
    expected_silent = (("RpcError", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),)
    assert got["grpcio"][:3] == [
        expected_silent,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "Deadline Exceeded",
    ]
    assert got["pyxds"][:3] == got["grpcio"][:3]
    after_headers = {"Stream removed (Deadline Exceeded)", "Deadline Exceeded"}
    for side in KINDS:
        assert got[side][3] == (("k", "v"),), side
        assert got[side][4] is grpc.StatusCode.DEADLINE_EXCEEDED, side
        assert got[side][5] in after_headers, side
