"""Differential: the fault injection cases of C-core's
``test/cpp/end2end/xds/xds_fault_injection_end2end_test.cc`` that
tests/e2e/test_differential_fault.py does not replay, through pyxds (sync)
and grpcio 1.85's C-core ``xds:///`` channel on the same pyxds.server and
backend: a route override with no fault filter in the listener,
``max_active_faults`` over concurrent RPCs (and the count given back at
their deadline), and bidi streams under a delay, a delay past the deadline
and a delay then an abort.

C-core runs in a subprocess of its own here (it reads its bootstrap once per
process, and these cases need concurrent RPCs and bidi streams, which the
shared C-core client of channel_fixtures does not make).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from channel_fixtures import SERVICE, Backend, pyxds_calls, wait_until

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

WHO = f"/{SERVICE}/Who"
CHAT = f"/{SERVICE}/Chat"
NODE = "fault-suites"

# One command per line on stdin, one JSON answer per line on stdout.
_CORE = r"""
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


class CoreClient:
    """grpcio's C-core ``xds:///`` channel in its own process."""

    def __init__(self, bootstrap: dict) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CORE],
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
    client = CoreClient(server.bootstrap(node_id=NODE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channels(server):
    opened: dict[str, grpc.Channel] = {}

    def channel(target: str) -> grpc.Channel:
        if target not in opened:
            opened[target] = pyxds.insecure_channel(
                target, bootstrap=server.bootstrap(node_id=NODE)
            )
        return opened[target]

    yield channel
    for ch in opened.values():
        ch.close()


def configure(server, backend, name: str, listener_fault=None, route_fault=None) -> str:
    """Listener ``name``: a fault filter ``envoy.fault`` with
    ``listener_fault`` (None: no fault filter at all) before the router; one
    catch-all route to cluster c, with ``route_fault`` as its
    ``typed_per_filter_config`` for ``envoy.fault``.  A new listener (and
    target) per case: C-core keeps a channel's first filter configs
    (test_differential_fault.py)."""
    filters = [] if listener_fault is None else [b.fault_filter("envoy.fault", listener_fault)]
    overrides = None if route_fault is None else {"envoy.fault": route_fault}
    server.set_snapshot(
        Snapshot(
            listeners=[b.listener(name, http_filters=filters)],
            routes=[
                b.route_config(
                    f"{name}-route",
                    [
                        b.virtual_host(
                            "vh",
                            routes=[
                                b.route(prefix="", cluster="c", typed_per_filter_config=overrides)
                            ],
                        )
                    ],
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
    server, backend, core, channels
):
    """C-core XdsFaultInjectionWithoutListenerFilter: an abort-always
    override on the route, no fault filter in the listener: every RPC
    succeeds."""
    abort = b.fault_config(abort_grpc_status=10, abort_percent=100)
    t = configure(server, backend, "no-listener-filter", route_fault=abort)
    assert wait_until(lambda: pyxds_calls(channels(t), 5, timeout=5) == {"a0": 5}, 15)
    assert core.unary(t, 5, 10) == {"a0": 5}


def test_route_override_over_an_empty_listener_config_aborts_like_c_core(
    server, backend, core, channels
):
    """C-core FaultInjectionTest, kHttpFilterConfigInRoute variant of
    XdsFaultInjectionAlwaysAbort: the listener's fault filter has an empty
    config, the route's override aborts every RPC with ABORTED."""
    abort = b.fault_config(abort_grpc_status=10, abort_percent=100)
    t = configure(server, backend, "in-route", listener_fault=b.fault_config(), route_fault=abort)
    assert wait_until(lambda: pyxds_calls(channels(t), 5, timeout=5) == {"error:ABORTED": 5}, 15)
    assert core.unary(t, 5, 10) == {"error:ABORTED": 5}


def test_max_active_faults_over_concurrent_rpcs_like_c_core(server, backend, core, channels):
    """C-core XdsFaultInjectionMaxFault (smaller): 8 concurrent RPCs, a
    delay far past their deadline, ``max_active_faults`` 3: exactly 3 end
    DEADLINE_EXCEEDED, 5 succeed; a second round gives the same (the
    deadline gave the active-fault slots back)."""
    fault = b.fault_config(delay=30, delay_percent=100, max_active_faults=3)
    t = configure(server, backend, "max-faults", listener_fault=fault)

    def settled(counts) -> bool:
        return counts == {"a0": 5, "error:DEADLINE_EXCEEDED": 3}

    # the first rounds also connect (C-core's test connects first)
    assert wait_until(lambda: settled(pyxds_concurrent(channels(t), 8, 1.0)), 20)
    assert wait_until(lambda: settled(core.unary(t, 8, 1.0)), 20)
    assert settled(pyxds_concurrent(channels(t), 8, 1.0))
    assert settled(core.unary(t, 8, 1.0))


def test_bidi_stream_under_a_delay_completes_like_c_core(server, backend, core, channels):
    """C-core XdsFaultInjectionBidiStreamDelayOk: a 0.3 s delay on a bidi
    stream delays it and it ends OK with every reply."""
    t = configure(
        server, backend, "bidi-delay", listener_fault=b.fault_config(delay=0.3, delay_percent=100)
    )
    assert wait_until(lambda: pyxds_chat(channels(t), 2, 5)[0] == "OK", 15)
    for code, _, replies, took in (pyxds_chat(channels(t), 2, 5), core.chat(t, 2, 5)):
        assert (code, replies) == ("OK", ["a0:x", "a0:x"])
        assert took >= 0.3


def test_bidi_stream_delay_past_the_deadline_is_deadline_exceeded_like_c_core(
    server, backend, core, channels
):
    """C-core XdsFaultInjectionBidiStreamDelayError (grpc/grpc#27217): a
    delay longer than the stream's deadline ends it DEADLINE_EXCEEDED at the
    deadline."""
    t = configure(
        server, backend, "bidi-late", listener_fault=b.fault_config(delay=30, delay_percent=100)
    )
    assert wait_until(lambda: pyxds_chat(channels(t), 1, 0.3)[0] == "DEADLINE_EXCEEDED", 15)
    for code, _, replies, took in (pyxds_chat(channels(t), 1, 0.3), core.chat(t, 1, 0.3)):
        assert (code, replies) == ("DEADLINE_EXCEEDED", [])
        assert took < 5  # the deadline, not the 30 s delay


def test_bidi_stream_abort_after_a_delay_like_c_core(server, backend, core, channels):
    """C-core XdsFaultInjectionAbortAfterDelayForStreamCall: delay then abort
    on a bidi stream: ABORTED "Fault injected", after the delay."""
    fault = b.fault_config(abort_grpc_status=10, abort_percent=100, delay=0.3, delay_percent=100)
    t = configure(server, backend, "bidi-abort", listener_fault=fault)
    assert wait_until(lambda: pyxds_chat(channels(t), 1, 5)[0] == "ABORTED", 15)
    for code, details, replies, took in (pyxds_chat(channels(t), 1, 5), core.chat(t, 1, 5)):
        assert (code, details, replies) == ("ABORTED", "Fault injected", [])
        assert took >= 0.3
