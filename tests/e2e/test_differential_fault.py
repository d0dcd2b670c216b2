"""Differential: xDS fault injection (gRFC A33) through the A39 filter chain,
pyxds (sync and asyncio) against grpcio's C-core ``xds:///`` channel, same
pyxds.server and backend: abort percentages, fixed delays, header-driven
faults, HTTP status mapping, per-route overrides (A39 precedence), a delay
that outlasts the deadline; and the cases of C-core's
``test/cpp/end2end/xds/xds_fault_injection_end2end_test.cc`` (at the end,
with a C-core client of their own that makes concurrent RPCs and bidi
streams).  Where grpcio 1.85.3's C-core departs from
A33's text (an OK abort, ``http_status`` 200, the abort headers) pyxds
follows A33 and the tests assert both measured results
(docs/differences-from-c-core.md)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from concurrent import futures
from types import SimpleNamespace

import grpc
import pytest
from channel_fixtures import (
    SERVICE,
    Backend,
    CoreXdsClient,
    at_once,
    pyxds_calls,
    wait_until,
)

import pyxds._api as pyxds
import pyxds.aio
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

N = 200
WHO = f"/{SERVICE}/Who"
CHAT = f"/{SERVICE}/Chat"
META = f"/{SERVICE}/Meta"


# One command per line on stdin, one JSON answer per line on stdout.
_CORE_STREAMS = r"""
import collections, json, sys, time
from concurrent import futures
import grpc

channels = {}

def channel(target):
    if target not in channels:
        channels[target] = grpc.insecure_channel(target)
    return channels[target]

def outcome(err):
    return "error:" + err.code().name

for line in sys.stdin:
    cmd = json.loads(line)
    ch = channel(cmd["target"])
    if cmd["op"] == "unary":
        counts = collections.Counter()
        mc = ch.unary_unary(cmd["method"])
        calls = [mc.future(b"", timeout=cmd["timeout"], wait_for_ready=True)
                 for _ in range(cmd["n"])]
        for call in calls:
            try:
                counts[call.result().decode()] += 1
            except grpc.RpcError as err:
                counts[outcome(err)] += 1
        print(json.dumps(counts), flush=True)
    elif cmd["op"] == "chat":
        start = time.monotonic()
        try:
            replies = [r.decode() for r in ch.stream_stream(cmd["method"])(
                iter([b"x"] * cmd["n"]), timeout=cmd["timeout"], wait_for_ready=True)]
            got = ["OK", "", replies]
        except grpc.RpcError as err:
            got = [err.code().name, err.details() or "", []]
        print(json.dumps(got + [time.monotonic() - start]), flush=True)
"""


class CoreStreams:
    """grpcio's C-core ``xds:///`` channel in a process of its own, for
    what CoreXdsClient does not do: concurrent unary RPCs and bidi streams."""

    def __init__(self, bootstrap: dict) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CORE_STREAMS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._pool = futures.ThreadPoolExecutor(1)

    def _ask(self, cmd: dict, timeout: float):
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        line = self._pool.submit(self._proc.stdout.readline).result(timeout=timeout)
        assert line, "C-core client exited"
        return json.loads(line)

    def unary(self, target: str, n: int, timeout: float, method: str = WHO) -> dict:
        """n concurrent unary RPCs; their outcomes counted."""
        cmd = {"op": "unary", "target": target, "method": method, "n": n, "timeout": timeout}
        return self._ask(cmd, timeout + 30)

    def chat(self, target: str, n: int, timeout: float) -> tuple[str, str, list, float]:
        """One bidi stream sending n requests: (code name, details, replies,
        seconds)."""
        cmd = {"op": "chat", "target": target, "method": CHAT, "n": n, "timeout": timeout}
        code, details, replies, took = self._ask(cmd, timeout + 30)
        return code, details, replies, took

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._pool.shutdown(wait=False)


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backend():
    started = Backend("a0").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id="fault-differential"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def core_streams(server):
    client = CoreStreams(server.bootstrap(node_id="fault-differential"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channels(server):
    opened: dict[str, grpc.Channel] = {}

    def channel(target: str) -> grpc.Channel:
        if target not in opened:
            opened[target] = pyxds.insecure_channel(
                target, bootstrap=server.bootstrap(node_id="fault-differential")
            )
        return opened[target]

    yield channel
    for ch in opened.values():
        ch.close()


def configure(server, backend, fault, name, routes=(), vh_overrides=None) -> str:
    """A listener ``name`` with ``fault`` (an HTTPFault; None: no fault
    filter) before the router, ``routes`` then a catch-all route to cluster
    c; returns its target.

    Every configuration is a new listener (and target, so new channels on
    both sides): C-core (grpcio 1.85) keeps the filter configs of a
    channel's first listener when only the listener's filter changes, so a
    changed fault on one listener would compare pyxds with a stale C-core.
    """
    routes = [*routes, b.route(prefix="", cluster="c")]
    filters = [] if fault is None else [b.fault_filter(config=fault)]
    server.set_snapshot(
        Snapshot(
            listeners=[b.listener(name, http_filters=filters)],
            routes=[
                b.route_config(
                    f"{name}-route",
                    [b.virtual_host("vh", routes=routes, typed_per_filter_config=vh_overrides)],
                )
            ],
            clusters=[b.cluster("c")],
            endpoints=[
                b.endpoints("c", [b.locality(zone="z", priority=0, endpoints=[backend.address])])
            ],
            version=name,
        )
    )
    return f"xds:///{name}"


def run(client, target: str, n: int, **kwargs):
    """n RPCs on the C-core client or a pyxds channel, as Counters."""
    if isinstance(client, CoreXdsClient):
        return client.call(n, target=target, **kwargs)
    return pyxds_calls(client(target), n, **kwargs)


def applied(client, target, predicate, **kwargs) -> None:
    """Wait until ``predicate(counts of 10 RPCs)`` holds on that client."""
    assert wait_until(lambda: predicate(run(client, target, 10, details=True, **kwargs)), 15.0)


def applied_both(core, channels, target, predicate, **kwargs) -> None:
    """:func:`applied` on the C-core client and the pyxds channels at once
    (a delay fault makes each check's RPCs wait on real timers)."""
    at_once(
        lambda: applied(channels, target, predicate, **kwargs),
        lambda: applied(core, target, predicate, **kwargs),
    )


def fault_details(counts) -> set[str]:
    return {k for k in counts if k.startswith("error:")}


def test_abort_half_fails_about_half_like_c_core(server, backend, core, channels):
    t = configure(server, backend, b.fault_config(abort_grpc_status=14, abort_percent=50), "half")
    applied_both(core, channels, t, lambda c: sum(c.values()) == 10)
    ours = run(channels, t, N, details=True)
    theirs = run(core, t, N, details=True)
    assert fault_details(ours) == fault_details(theirs) == {"error:UNAVAILABLE: Fault injected"}
    for counts in (ours, theirs):
        failed = counts["error:UNAVAILABLE: Fault injected"]
        assert 0.35 * N <= failed <= 0.65 * N, counts


@pytest.mark.parametrize(
    ("percent", "expect_all"),
    [((1, 100), False), ((10_000, 10_000), True), ((1_000_000, 1_000_000), True)],
)
def test_every_denominator_like_c_core(server, backend, core, channels, percent, expect_all):
    t = configure(
        server,
        backend,
        b.fault_config(abort_grpc_status=7, abort_percent=percent),
        f"den-{percent[1]}-{percent[0]}",
    )
    if expect_all:
        want = "error:PERMISSION_DENIED: Fault injected"
        applied_both(core, channels, t, lambda c: c[want] == 10)
        return
    applied_both(core, channels, t, lambda c: c["a0"] >= 9)
    assert run(channels, t, N)["a0"] >= 0.95 * N
    assert run(core, t, N)["a0"] >= 0.95 * N


@pytest.mark.parametrize(
    ("http", "want"),
    [
        (404, "error:UNIMPLEMENTED: Fault injected"),
        (503, "error:UNAVAILABLE: Fault injected"),
    ],
)
def test_http_status_maps_to_grpc_like_c_core(server, backend, core, channels, http, want):
    fault = b.fault_config(abort_http_status=http, abort_percent=100)
    t = configure(server, backend, fault, f"http-{http}")
    applied_both(core, channels, t, lambda c: c[want] == 10)


def test_http_status_200_is_unknown_per_a33_where_c_core_injects_nothing(
    server, backend, core, channels
):
    """A33 "200/OK Error Injection": ``http_status`` 200 aborts with UNKNOWN
    (grpc-go and grpc-java do); grpcio 1.85's C-core maps it to OK and
    injects nothing (xds_http_fault_filter.cc skips 200): a documented
    difference (docs/differences-from-c-core.md)."""
    fault = b.fault_config(abort_http_status=200, abort_percent=100)
    t = configure(server, backend, fault, "http-200")
    applied(channels, t, lambda c: c["error:UNKNOWN: Fault injected"] == 10)
    applied(core, t, lambda c: c["a0"] == 10)


def test_grpc_status_ok_ends_every_kind_of_call_with_ok_per_a33(server, backend, core, channels):
    """A33 "200/OK Error Injection": ``grpc_status`` OK ends the RPC "as if
    it has immediately received trailing metadata from the server with the
    status OK" (grpc-go, grpc-java): no call reaches the backend, a unary
    call answers None with OK (what grpcio answers for a server's OK without
    a message), a stream ends with nothing; sync and asyncio.  grpcio 1.85's
    C-core injects nothing (the backend answers): a documented difference."""
    fault = b.fault_config(abort_grpc_status=0, abort_percent=100)
    t = configure(server, backend, fault, "ok")
    applied(core, t, lambda c: c["a0"] == 10)
    channel = channels(t)
    who = channel.unary_unary(WHO)
    assert wait_until(lambda: who(b"", timeout=5) is None, 15)
    served = sum(backend.served.values())
    response, call = who.with_call(b"", timeout=5)
    assert (response, call.code(), call.details()) == (None, grpc.StatusCode.OK, "")
    assert who.future(b"", timeout=5).result() is None
    stream = channel.unary_stream(f"/{SERVICE}/Stream")(b"3", timeout=5)
    assert list(stream) == [] and stream.code() is grpc.StatusCode.OK
    chat = channel.stream_stream(f"/{SERVICE}/Chat")(iter([b"x"]), timeout=5)
    assert list(chat) == [] and chat.code() is grpc.StatusCode.OK
    assert channel.stream_unary(f"/{SERVICE}/Collect")(iter([b"x"]), timeout=5) is None

    async def aio() -> tuple:
        async with pyxds.aio.insecure_channel(
            t, bootstrap=server.bootstrap(node_id="fault-aio-ok")
        ) as ch:
            deadline = time.monotonic() + 15
            unary = ch.unary_unary(WHO)
            while time.monotonic() < deadline:
                try:
                    if await unary(b"", timeout=5, wait_for_ready=True) is None:
                        break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.05)
            call = unary(b"", timeout=5)
            got = await call
            streamed = ch.unary_stream(f"/{SERVICE}/Stream")(b"3", timeout=5)
            items = [r async for r in streamed]
            collected = await ch.stream_unary(f"/{SERVICE}/Collect")(iter([b"x"]), timeout=5)
            chat = ch.stream_stream(f"/{SERVICE}/Chat")(iter([b"x"]), timeout=5)
            chatted = [r async for r in chat]
            writer = ch.stream_stream(f"/{SERVICE}/Chat")(timeout=5)
            try:  # kept for a retry before the pick ended the call, or refused after
                await writer.write(b"x")
            except asyncio.InvalidStateError:  # grpc.aio's, for a finished call
                pass
            await writer.done_writing()
            read = await writer.read()
            return (
                (got, await call.code(), items, await streamed.code()),
                (collected, chatted, await chat.code(), read is grpc.aio.EOF),
                (tuple(await call.trailing_metadata()), await writer.details()),
                await writer.code(),
            )

    assert asyncio.run(aio()) == (
        (None, grpc.StatusCode.OK, [], grpc.StatusCode.OK),
        (None, [], grpc.StatusCode.OK, True),
        ((), ""),
        grpc.StatusCode.OK,
    )
    assert sum(backend.served.values()) == served  # nothing reached the backend


def test_abort_comes_before_the_pick_with_no_reachable_endpoint_like_c_core(server, core, channels):
    """C-core XdsFaultInjectionAlwaysAbort: the cluster's only endpoint does
    not exist (nothing listens there) and the RPCs wait for ready: every one
    fails ABORTED "Fault injected" all the same (A33: the abort happens
    "before sending any traffic", so before the pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nowhere = SimpleNamespace(address=f"127.0.0.1:{sock.getsockname()[1]}")
    fault = b.fault_config(abort_grpc_status=10, abort_percent=100)
    t = configure(server, nowhere, fault, "abort-nowhere")
    want = "error:ABORTED: Fault injected"
    applied_both(core, channels, t, lambda c: c[want] == 10)


def test_an_injected_abort_is_not_retried_like_c_core(server, backend, core, channels):
    """The fault filter sits above the retry logic (C-core: the xDS HTTP
    filters are dynamic filters above its retry filter; grpc-go and grpc-java
    wrap the retrying call in the fault interceptor): an injected UNAVAILABLE
    is not retried although the route's A44 policy retries UNAVAILABLE.  With
    50 % aborts and 4 retries, retried aborts would fail ~3 % of the RPCs;
    both fail ~50 %."""
    policy = b.retry_policy("unavailable", num_retries=4)
    routes = [b.route(prefix="", cluster="c", retry_policy=policy)]
    fault = b.fault_config(abort_grpc_status=14, abort_percent=50)
    t = configure(server, backend, fault, "no-retry", routes=routes)
    applied_both(core, channels, t, lambda c: sum(c.values()) == 10 and c["a0"] > 0)
    for client in (channels, core):
        counts = run(client, t, N, details=True)
        failed = counts["error:UNAVAILABLE: Fault injected"]
        assert 0.35 * N <= failed <= 0.65 * N, (client, counts)
        assert failed + counts["a0"] == N


def test_fixed_delay_shows_in_latency_like_c_core(server, backend, core, channels):
    t = configure(server, backend, b.fault_config(delay=0.2, delay_percent=100), "delay")

    def per_rpc(client) -> float:
        start = time.monotonic()
        assert run(client, t, 5) == {"a0": 5}
        return (time.monotonic() - start) / 5

    applied_both(core, channels, t, lambda c: c["a0"] == 10)
    assert 0.2 <= per_rpc(channels) < 0.4
    assert 0.2 <= per_rpc(core) < 0.4


def test_delay_past_the_deadline_is_deadline_exceeded_like_c_core(server, backend, core, channels):
    t = configure(server, backend, b.fault_config(delay=2, delay_percent=100), "long-delay")
    want = "error:DEADLINE_EXCEEDED: Deadline Exceeded"
    # the delay is in force (short RPCs: ten 2 s delays per check took 40 s)
    applied_both(core, channels, t, lambda c: c[want] == 10, timeout=0.1)
    start = time.monotonic()
    assert run(channels, t, 5, timeout=0.1, details=True) == {want: 5}
    # the deadline ends each RPC, not the 2 s delay: five of them in well
    # under the delay's 10 s (a bound the machine's load cannot reach)
    assert time.monotonic() - start < 5 * 1.0
    assert run(core, t, 5, timeout=0.1, details=True) == {want: 5}


def test_header_driven_abort_and_delay_like_c_core(server, backend, core, channels):
    t = configure(
        server,
        backend,
        b.fault_config(header_abort=True, abort_percent=100, header_delay=True, delay_percent=100),
        "headers",
    )
    md = [("x-envoy-fault-abort-grpc-request", "5")]
    want = "error:NOT_FOUND: Fault injected"
    applied_both(core, channels, t, lambda c: c[want] == 10, metadata=md)
    # without the headers: no fault
    assert run(channels, t, 10) == run(core, t, 10) == {"a0": 10}
    # a gRPC code header that is a number but no code: UNKNOWN on both (as
    # grpc-go, grpc-java); one that is no number: ignored by pyxds (A33: "the
    # invalid headers will be ignored"; grpc-go "invalid header results in no
    # abort", grpc-java), grpcio 1.85's C-core aborts with UNKNOWN
    for bad in ("17", "-1"):
        mdb = [("x-envoy-fault-abort-grpc-request", bad)]
        assert run(channels, t, 10, metadata=mdb) == {"error:UNKNOWN": 10}, bad
        assert run(core, t, 10, metadata=mdb) == {"error:UNKNOWN": 10}, bad
    mdx = [("x-envoy-fault-abort-grpc-request", "abc")]
    assert run(channels, t, 10, metadata=mdx) == {"a0": 10}
    assert run(core, t, 10, metadata=mdx) == {"error:UNKNOWN": 10}
    # a code of 0: A33's OK end on pyxds (None, OK), nothing on C-core
    md0 = [("x-envoy-fault-abort-grpc-request", "0")]
    response, call = channels(t).unary_unary(WHO).with_call(b"", timeout=5, metadata=md0)
    assert (response, call.code()) == (None, grpc.StatusCode.OK)
    assert run(core, t, 10, metadata=md0) == {"a0": 10}
    # the HTTP-status abort header (A33 "Header matching"; grpc-go, grpc-java)
    # aborts on pyxds and wins over the gRPC one; C-core 1.85 ignores it
    mdh = [("x-envoy-fault-abort-request", "503"), *md]
    assert run(channels, t, 10, metadata=mdh) == {"error:UNAVAILABLE": 10}
    assert run(core, t, 10, metadata=mdh) == {"error:NOT_FOUND": 10}
    # the percentage headers set the numerator (over the config's
    # denominator): pyxds reads A33's abort one, C-core its own name
    for extra, ours, theirs in [
        (("x-envoy-fault-abort-request-percentage", "0"), {"a0": 10}, {"error:NOT_FOUND": 10}),
        (("x-envoy-fault-abort-percentage", "0"), {"error:NOT_FOUND": 10}, {"a0": 10}),
        (
            ("x-envoy-fault-abort-request-percentage", "1000000"),
            {"error:NOT_FOUND": 10},
            {"error:NOT_FOUND": 10},
        ),
        (
            ("x-envoy-fault-abort-request-percentage", "junk"),
            {"error:NOT_FOUND": 10},
            {"error:NOT_FOUND": 10},
        ),
    ]:
        mdp = [*md, extra]
        assert run(channels, t, 10, metadata=mdp) == ours, extra
        assert run(core, t, 10, metadata=mdp) == theirs, extra
    # delay from the header, and its percentage header
    for extra, slow in [
        ((), True),
        (("x-envoy-fault-delay-request-percentage", "0"), False),
        (("x-envoy-fault-delay-percentage", "0"), True),
    ]:
        mdd = [("x-envoy-fault-delay-request", "150"), *([extra] if extra else [])]
        for client in (channels, core):
            start = time.monotonic()
            assert run(client, t, 4, metadata=mdd) == {"a0": 4}
            took = (time.monotonic() - start) / 4
            assert took >= 0.15 if slow else took < 0.1, (extra, client, took)


def test_route_override_wins_over_virtual_host_and_listener_like_c_core(
    server, backend, core, channels
):
    """A39: the route's typed_per_filter_config replaces the virtual host's,
    which replaces the listener's config."""
    routes = [
        b.route(path=META, cluster="c", typed_per_filter_config={"fault": b.fault_config()}),
    ]
    t = configure(
        server,
        backend,
        b.fault_config(abort_grpc_status=7, abort_percent=100),
        "override",
        routes=routes,
        vh_overrides={"fault": b.fault_config(abort_grpc_status=8, abort_percent=100)},
    )
    want = "error:RESOURCE_EXHAUSTED: Fault injected"  # the virtual host's
    applied_both(core, channels, t, lambda c: c[want] == 10)
    ours = run(channels, t, 10, method=META, details=True)
    theirs = run(core, t, 10, method=META, details=True)
    assert fault_details(ours) == fault_details(theirs) == set()


def test_weighted_cluster_override_like_c_core(server, backend, core, channels):
    """A39: a weighted cluster's override replaces the route's and the
    listener's config for RPCs sent to that cluster."""
    r = b.route(
        prefix="",
        weighted_clusters={"c": 1},
        typed_per_filter_config={"fault": b.fault_config()},
    )
    r.route.weighted_clusters.clusters[0].typed_per_filter_config["fault"].CopyFrom(
        b.pack(b.fault_config(abort_grpc_status=9, abort_percent=100))
    )
    t = configure(
        server,
        backend,
        b.fault_config(abort_grpc_status=7, abort_percent=100),
        "wc",
        routes=[r],
    )
    want = "error:FAILED_PRECONDITION: Fault injected"
    applied_both(core, channels, t, lambda c: c[want] == 10)


def test_aio_calls_get_faults(server, backend):
    fault = b.fault_config(abort_grpc_status=14, abort_percent=100, delay=0.1, delay_percent=100)
    t = configure(server, backend, fault, "aio")

    async def main() -> tuple[str, float]:
        async with pyxds.aio.insecure_channel(
            t, bootstrap=server.bootstrap(node_id="fault-aio")
        ) as ch:
            who = ch.unary_unary(WHO)
            stream = ch.unary_stream(f"/{SERVICE}/Stream")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                start = time.monotonic()
                try:
                    await who(b"", timeout=5, wait_for_ready=True)
                except grpc.aio.AioRpcError as err:
                    took = time.monotonic() - start
                    try:
                        async for _ in stream(b"", timeout=5):
                            pass
                    except grpc.aio.AioRpcError as serr:
                        assert serr.details() == "Fault injected"
                    return f"{err.code().name}: {err.details()}", took
            return "never", 0.0

    text, took = asyncio.run(main())
    assert text == "UNAVAILABLE: Fault injected"
    assert took >= 0.1


def test_streams_and_futures_get_faults(server, backend, channels):
    t = configure(server, backend, b.fault_config(abort_grpc_status=14, abort_percent=100), "st")
    applied(channels, t, lambda c: c["error:UNAVAILABLE: Fault injected"] == 10)
    channel = channels(t)
    with pytest.raises(grpc.RpcError) as info:
        list(channel.unary_stream(f"/{SERVICE}/Stream")(b"2", timeout=5))
    assert info.value.details() == "Fault injected"
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(WHO).future(b"", timeout=5).result()
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


# -- C-core's xds_fault_injection_end2end_test.cc cases not above


def pyxds_concurrent(channel, n: int, timeout: float) -> dict:
    """n concurrent unary RPCs on a pyxds channel, counted as CoreClient.unary."""
    mc = channel.unary_unary(WHO)
    calls = [mc.future(b"", timeout=timeout, wait_for_ready=True) for _ in range(n)]
    counts: dict[str, int] = {}
    for call in calls:
        try:
            key = call.result().decode()
        except grpc.RpcError as err:
            key = "error:" + err.code().name
        counts[key] = counts.get(key, 0) + 1
    return counts


def pyxds_chat(channel, n: int, timeout: float) -> tuple[str, str, list, float]:
    start = time.monotonic()
    try:
        replies = [
            r.decode()
            for r in channel.stream_stream(CHAT)(
                iter([b"x"] * n), timeout=timeout, wait_for_ready=True
            )
        ]
        return "OK", "", replies, time.monotonic() - start
    except grpc.RpcError as err:
        return err.code().name, err.details() or "", [], time.monotonic() - start


def test_route_override_without_a_listener_fault_filter_injects_nothing_like_c_core(
    server, backend, core_streams, channels
):
    """C-core XdsFaultInjectionWithoutListenerFilter: an abort-always
    override on the route, no fault filter in the listener: every RPC
    succeeds."""
    abort = {"fault": b.fault_config(abort_grpc_status=10, abort_percent=100)}
    routes = [b.route(prefix="", cluster="c", typed_per_filter_config=abort)]
    t = configure(server, backend, None, "no-listener-filter", routes=routes)
    assert wait_until(lambda: pyxds_calls(channels(t), 5, timeout=5) == {"a0": 5}, 15)
    assert core_streams.unary(t, 5, 10) == {"a0": 5}


def test_route_override_over_an_empty_listener_config_aborts_like_c_core(
    server, backend, core_streams, channels
):
    """C-core FaultInjectionTest, kHttpFilterConfigInRoute variant of
    XdsFaultInjectionAlwaysAbort: the listener's fault filter has an empty
    config, the route's override aborts every RPC with ABORTED."""
    abort = {"fault": b.fault_config(abort_grpc_status=10, abort_percent=100)}
    routes = [b.route(prefix="", cluster="c", typed_per_filter_config=abort)]
    t = configure(server, backend, b.fault_config(), "in-route", routes=routes)
    assert wait_until(lambda: pyxds_calls(channels(t), 5, timeout=5) == {"error:ABORTED": 5}, 15)
    assert core_streams.unary(t, 5, 10) == {"error:ABORTED": 5}


def test_max_active_faults_over_concurrent_rpcs_like_c_core(
    server, backend, core_streams, channels
):
    """C-core XdsFaultInjectionMaxFault (smaller): 8 concurrent RPCs, a
    delay far past their deadline, ``max_active_faults`` 3: exactly 3 end
    DEADLINE_EXCEEDED, 5 succeed; a second round gives the same (the
    deadline gave the active-fault slots back)."""
    fault = b.fault_config(delay=30, delay_percent=100, max_active_faults=3)
    t = configure(server, backend, fault, "max-faults")

    def settled(counts) -> bool:
        return counts == {"a0": 5, "error:DEADLINE_EXCEEDED": 3}

    # the first rounds also connect (C-core's test connects first)
    assert wait_until(lambda: settled(pyxds_concurrent(channels(t), 8, 1.0)), 20)
    assert wait_until(lambda: settled(core_streams.unary(t, 8, 1.0)), 20)
    assert settled(pyxds_concurrent(channels(t), 8, 1.0))
    assert settled(core_streams.unary(t, 8, 1.0))


def test_bidi_stream_under_a_delay_completes_like_c_core(server, backend, core_streams, channels):
    """C-core XdsFaultInjectionBidiStreamDelayOk: a 0.3 s delay on a bidi
    stream delays it and it ends OK with every reply."""
    t = configure(server, backend, b.fault_config(delay=0.3, delay_percent=100), "bidi-delay")
    assert wait_until(lambda: pyxds_chat(channels(t), 2, 5)[0] == "OK", 15)
    for code, _, replies, took in (pyxds_chat(channels(t), 2, 5), core_streams.chat(t, 2, 5)):
        assert (code, replies) == ("OK", ["a0:x", "a0:x"])
        assert took >= 0.3


def test_bidi_stream_delay_past_the_deadline_is_deadline_exceeded_like_c_core(
    server, backend, core_streams, channels
):
    """C-core XdsFaultInjectionBidiStreamDelayError (grpc/grpc#27217): a
    delay longer than the stream's deadline ends it DEADLINE_EXCEEDED at the
    deadline."""
    t = configure(server, backend, b.fault_config(delay=30, delay_percent=100), "bidi-late")
    assert wait_until(lambda: pyxds_chat(channels(t), 1, 0.3)[0] == "DEADLINE_EXCEEDED", 15)
    for code, _, replies, took in (pyxds_chat(channels(t), 1, 0.3), core_streams.chat(t, 1, 0.3)):
        assert (code, replies) == ("DEADLINE_EXCEEDED", [])
        assert took < 5  # the deadline, not the 30 s delay


def test_bidi_stream_abort_after_a_delay_like_c_core(server, backend, core_streams, channels):
    """C-core XdsFaultInjectionAbortAfterDelayForStreamCall: delay then abort
    on a bidi stream: ABORTED "Fault injected", after the delay."""
    fault = b.fault_config(abort_grpc_status=10, abort_percent=100, delay=0.3, delay_percent=100)
    t = configure(server, backend, fault, "bidi-abort")
    assert wait_until(lambda: pyxds_chat(channels(t), 1, 5)[0] == "ABORTED", 15)
    for code, details, replies, took in (pyxds_chat(channels(t), 1, 5), core_streams.chat(t, 1, 5)):
        assert (code, details, replies) == ("ABORTED", "Fault injected", [])
        assert took >= 0.3
