"""The lean blocking unary call (pyxds/channel/grpc_unary.py) against grpcio.

Every outcome of a blocking unary-unary ``__call__`` / ``with_call`` runs
three ways on the same backend: a plain ``grpc.insecure_channel``, a pyxds
channel whose subchannels call the lean way, and a pyxds channel whose
subchannels use grpcio's own multicallables (the lean path switched off).
What the application can see (the response, or the exception's class,
code, details, metadata, debug string and text; ``with_call``'s call
object) must be identical between the two pyxds channels, and the same as
grpcio's own channel.  Outcomes: OK (with metadata both ways), every
status a server can send (with initial and trailing metadata, text and
binary, non-ASCII details), an exception in the handler, a server-side
cancel, an unknown method, a response over the receive limit, the
deadline, a request the serializer rejects, a response the deserializer
rejects (or turns into None), malformed metadata and timeout, call
credentials and compression (handed to grpcio's own multicallable), a call
in flight when the channel closes, a call on a closed channel."""

from __future__ import annotations

import collections
import re
import threading
import time
from concurrent import futures
from typing import Any

import grpc
import pytest
from channel_fixtures import connections_to, wait_until
from ports import EXCLUSIVE

import pyxds._api as pyxds
from pyxds.channel import grpc_unary

SERVICE = "pyxds.test.Lean"
CODES = [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]
INITIAL = (("i-text", "hello"), ("i-bin", b"\x00\x01"))
TRAILING = (("t-text", "bye"), ("t-bin", b"\xff\x00"))
#: Sleep calls the backends have started (a test waits for its call to run)
SLEEPS_STARTED: collections.Counter[str] = collections.Counter()


def _handlers() -> grpc.GenericRpcHandler:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.send_initial_metadata(INITIAL)
        context.set_trailing_metadata(TRAILING)
        md = ";".join(f"{k}={v!r}" for k, v in context.invocation_metadata())
        return request + b"|" + md.encode()

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        code_name, _, mode = request.decode().partition(":")
        if mode == "headers":
            context.send_initial_metadata(INITIAL)
        context.set_trailing_metadata(TRAILING)
        if mode == "set":  # a status set without abort
            context.set_code(getattr(grpc.StatusCode, code_name))
            context.set_details(f"set {code_name} ü")
            return b""
        context.abort(getattr(grpc.StatusCode, code_name), f"says no: {code_name} ü")
        raise AssertionError("abort returned")

    def boom(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise RuntimeError("boom")

    def cancel(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.cancel()
        return b""

    def sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
        SLEEPS_STARTED["Sleep"] += 1
        time.sleep(float(request))
        return b"slept"

    def big(request: bytes, context: grpc.ServicerContext) -> bytes:
        return b"x" * 4096

    def none(request: bytes, context: grpc.ServicerContext) -> Any:
        return None  # the server cannot serialize it

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(fn)
            for name, fn in {
                "Echo": echo,
                "Fail": fail,
                "Boom": boom,
                "Cancel": cancel,
                "Sleep": sleep,
                "Big": big,
                "None": none,
            }.items()
        },
    )


@pytest.fixture(scope="module")
def address():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[EXCLUSIVE])
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None).wait(5)
    # A call whose metadata grpcio rejects (a value not str: TypeError) keeps
    # grpcio's own channel's connection open after close() (grpcio 1.85.3,
    # docs/traps.md; pyxds refuses it before any grpcio call): the
    # malformed-argument tests' grpcio leg leaves some here, and the
    # server's GOAWAY reaches them now.  Wait (bounded) until their
    # clients have read it and closed, so C-core's INFO "Got goaway" lines
    # land in this teardown's captured output, not between two tests.
    wait_until(lambda: connections_to(f"127.0.0.1:{port}", closing=True) == 0, 5)


@pytest.fixture
def lean_off(monkeypatch):
    """pyxds with the lean path off (its subchannels' multicallables are
    grpcio's own)."""

    def off():
        monkeypatch.setattr(grpc_unary.available, "answer", False)

    return off


OPTIONS = [("grpc.max_receive_message_length", 1024)]


def _channels(address: str, lean_off) -> dict[str, Any]:
    """{name: factory} of the three channels (module docstring)."""

    def pyxds_channel():
        return pyxds.insecure_channel(f"static:///{address}", options=OPTIONS)

    def pyxds_plain_multicallables():
        lean_off()
        return pyxds.insecure_channel(f"static:///{address}", options=OPTIONS)

    return {
        "grpcio": lambda: grpc.insecure_channel(address, options=OPTIONS),
        "pyxds": pyxds_channel,
        "pyxds-grpcio-multicallables": pyxds_plain_multicallables,
    }


_CREATED = re.compile(r'created_time:"[^"]*"')


def _normal(text: Any) -> Any:
    return _CREATED.sub('created_time:"T"', text) if isinstance(text, str) else text


def _call_view(call: Any) -> tuple:
    """What the application can read from a finished call object."""
    return (
        type(call).__qualname__ if call is not None else None,
        call.code(),
        call.details(),
        call.initial_metadata(),
        call.trailing_metadata(),
        _normal(call.debug_error_string()) if hasattr(call, "debug_error_string") else None,
        call.is_active(),
        call.done(),
        call.cancelled(),
        call.running(),
        call.cancel(),
    )


def outcome(fn) -> tuple:
    """The response, or everything the raised exception shows."""
    try:
        result = fn()
    except grpc.RpcError as err:
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
    except Exception as err:
        return ("raised", type(err).__qualname__, str(err))
    if isinstance(result, tuple):  # with_call
        response, call = result
        return ("with_call", response, _call_view(call))
    return ("returned", result)


def run_everywhere(address: str, lean_off, scenario) -> dict[str, Any]:
    """``scenario(channel)`` on each channel, connected first; its outcomes."""
    got = {}
    for name, make in _channels(address, lean_off).items():
        channel = make()
        try:
            channel.unary_unary(f"/{SERVICE}/Echo")(b"", timeout=5, wait_for_ready=True)
            got[name] = scenario(channel)
        finally:
            channel.close()
    return got


def assert_same(got: dict[str, Any]) -> None:
    assert got["pyxds"] == got["pyxds-grpcio-multicallables"]
    assert got["pyxds"] == got["grpcio"]


def both_verbs(mc, *args, **kwargs) -> list:
    return [outcome(lambda: mc(*args, **kwargs)), outcome(lambda: mc.with_call(*args, **kwargs))]


def test_the_lean_path_serves_pyxds_blocking_unary_calls_on_this_grpcio(address, monkeypatch):
    checked = f"grpcio {grpc.__version__}" in grpc_unary.VERIFIED.values()
    if not checked:  # a newer grpcio: pyxds falls back to its multicallables
        pytest.skip(f"grpcio {grpc.__version__} is not one the lean path was checked against")
    assert grpc_unary.available(), f"grpcio {grpc.__version__}: {grpc_unary.fingerprint()}"
    seen = []
    real = grpc_unary.LeanUnaryUnary._blocking

    def spy(self, *args):
        seen.append(args[-1])
        return real(self, *args)

    monkeypatch.setattr(grpc_unary.LeanUnaryUnary, "_blocking", spy)
    with pyxds.insecure_channel(f"static:///{address}") as channel:
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        assert mc(b"a", timeout=5, wait_for_ready=True).startswith(b"a|")
        assert mc.with_call(b"b", timeout=5)[0].startswith(b"b|")
    assert seen == [False, True]


def test_ok_response_and_metadata_both_ways_like_grpcio(address, lean_off):
    def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        md = (("k-text", "v"), ("k-bin", b"\x00\xff"), ("k-text", "second"))
        return [
            *both_verbs(mc, b"req", timeout=5),
            *both_verbs(mc, b"req", timeout=5, metadata=md),
            *both_verbs(mc, b"req", metadata=list(md)),  # no deadline
            *both_verbs(mc, b"", timeout=5, metadata=()),
        ]

    got = run_everywhere(address, lean_off, scenario)
    # the backend sees the same request metadata, grpcio's user agent aside
    # (a pyxds subchannel is a grpcio channel: same agent)
    assert_same(got)
    assert got["pyxds"][0][0] == "returned"


@pytest.mark.parametrize("mode", ["", "headers", "set"])
def test_every_status_with_its_metadata_raises_what_grpcio_raises(address, lean_off, mode):
    def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Fail")
        out = []
        for code in CODES:
            out.extend(both_verbs(mc, f"{code.name}:{mode}".encode(), timeout=5))
        return out

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert {o[2] for o in got["pyxds"]} == set(CODES)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("Boom", grpc.StatusCode.UNKNOWN),
        ("Cancel", grpc.StatusCode.CANCELLED),
        ("Nope", grpc.StatusCode.UNIMPLEMENTED),
        ("Big", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("None", grpc.StatusCode.INTERNAL),
    ],
)
def test_server_side_failures_raise_what_grpcio_raises(address, lean_off, method, expected):
    def scenario(channel):
        return both_verbs(channel.unary_unary(f"/{SERVICE}/{method}"), b"", timeout=5)

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][0][2] is expected


def test_deadline_raises_what_grpcio_raises(address, lean_off):
    def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Sleep")
        out = set()
        for timeout in (0.05, 0.0, -1.0):
            for verb in both_verbs(mc, b"0.5", timeout=timeout):
                out.add(verb[2:4])  # code, details (C-core words the rest as it races)
        return out

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["grpcio"] == {(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")}


def test_serializer_and_deserializer_failures_raise_what_grpcio_raises(address, lean_off):
    calls: dict[str, int] = {}

    def bad_serializer(request):
        raise ValueError("cannot serialize")

    def bad_deserializer(response):
        calls["bad"] = calls.get("bad", 0) + 1
        raise ValueError("cannot deserialize")

    def none_deserializer(response):
        calls["none"] = calls.get("none", 0) + 1

    def scenario(channel):
        calls.clear()
        out = [
            *both_verbs(channel.unary_unary(f"/{SERVICE}/Echo", bad_serializer), b"", timeout=5),
            *both_verbs(
                channel.unary_unary(f"/{SERVICE}/Echo", None, bad_deserializer), b"", timeout=5
            ),
            *both_verbs(
                channel.unary_unary(f"/{SERVICE}/Echo", None, none_deserializer), b"", timeout=5
            ),
            # a failed call's deserializer sees its message (if any) as grpcio's would
            *both_verbs(
                channel.unary_unary(f"/{SERVICE}/Fail", None, bad_deserializer),
                b"NOT_FOUND:",
                timeout=5,
            ),
        ]
        return out, dict(calls)  # each response deserialized once, as grpcio

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["pyxds"][1] == {"bad": 2, "none": 2}
    assert got["pyxds"][0][0][3] == "Exception serializing request!"
    assert got["pyxds"][0][2][3] == "Exception deserializing response!"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"metadata": (("Upper-Case", "v"),)},
        {"metadata": (("k", 5),)},
        {"metadata": (("k-bin", "text"),)},
        {"metadata": (("k", "bad\nvalue"),)},
        {"metadata": ("not pairs",)},
        {"metadata": 5},
        {"timeout": "5"},
        {"metadata": (("grpc-status", "0"),)},
    ],
    ids=["upper", "int-value", "bin-str", "newline", "not-pairs", "int", "timeout-str", "reserved"],
)
def test_malformed_arguments_raise_what_grpcio_raises(address, lean_off, kwargs):
    def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        args = {"timeout": 5, **kwargs}
        out = both_verbs(mc, b"", **args)
        out.append(outcome(lambda: mc(b"after", timeout=5)[:6]))  # the channel still serves
        return out

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)


def test_credentials_and_compression_go_through_grpcios_multicallable(address, lean_off):
    token = grpc.access_token_call_credentials("t")

    def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        return [
            *both_verbs(mc, b"z", timeout=5, compression=grpc.Compression.Gzip),
            *both_verbs(mc, b"z", timeout=5, credentials=token),
        ]

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)


def test_a_registered_observability_plugin_gets_grpcios_own_call(address, monkeypatch):
    used = []
    real = grpc_unary.LeanUnaryUnary._blocking
    monkeypatch.setattr(grpc_unary, "_plugin_registered", lambda: True)
    monkeypatch.setattr(
        grpc_unary.LeanUnaryUnary, "_blocking", lambda self, *a: used.append(1) or real(self, *a)
    )
    with pyxds.insecure_channel(f"static:///{address}") as channel:
        mc = channel.unary_unary(f"/{SERVICE}/Echo")
        assert mc(b"p", timeout=5, wait_for_ready=True).startswith(b"p|")
        assert mc.with_call(b"p", timeout=5)[0].startswith(b"p|")
    assert used == []


def test_a_call_in_flight_when_the_channel_closes_raises_what_grpcio_raises(address, lean_off):
    def scenario(channel):
        mc = channel.unary_unary(f"/{SERVICE}/Sleep")
        out: list = []
        before = SLEEPS_STARTED["Sleep"]
        thread = threading.Thread(target=lambda: out.append(outcome(lambda: mc(b"3", timeout=5))))
        thread.start()
        assert wait_until(lambda: SLEEPS_STARTED["Sleep"] > before, 5)  # in flight
        channel.close()
        thread.join(5)
        assert not thread.is_alive()
        out.append(outcome(lambda: mc(b"0", timeout=5)))
        return [o[2:4] for o in out]  # code, details

    got = run_everywhere(address, lean_off, scenario)
    assert_same(got)
    assert got["grpcio"] == [
        (grpc.StatusCode.CANCELLED, "Channel closed!"),
        ("Cannot invoke RPC on closed channel!",),
    ]
