"""Differential circuit breaking across two channels (C-core
``xds_cluster_end2end_test.cc`` CdsTest.CircuitBreakingMultipleChannelsShareCallCounter;
gRFC A32 via A37 "Use Global Circuit Breaking Atomic"; TRAPS.md, grpc-go#4560):
the in-flight count of a cluster is one per process, shared by every channel.

The same scenario runs in pyxds (this process, two pyxds channels) and in
grpcio's C-core (a subprocess, two ``xds:///`` channels): ``max_requests`` 3,
three long calls held alternately on the two channels, then calls on both
channels until the first "circuit breaker drop" (bounded), then five more
alternating between the channels, all of which must drop, whichever channel
they use; once the long calls end, each channel gets through again.

Streams (grpc-go TestCircuitBreaking): three bidi streams held open take
the three slots until they end, unary calls meanwhile drop, and the load
report (``lrs_server: self``) shows the three streams in progress, in
pyxds as in C-core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from channel_fixtures import SERVICE, TARGET, Backend
from channel_fixtures import wait_until as wait_for
from lrs_fixtures import one_cluster_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b

CLUSTER = "shared-cb"
ZONE = ("r", "zc", "")
LIMIT = 3
AFTER = 5

_SCENARIO = r"""
import json, sys, time
import grpc


def scenario(channels, service, limit, after):
    def unary(channel, method, body=b"", **kw):
        try:
            reply = channel.unary_unary("/" + service + "/" + method)(body, **kw)
            return reply.decode()
        except grpc.RpcError as e:
            return "error:" + e.code().name + ": " + (e.details() or "")

    out = {"warm": [unary(c, "Who", timeout=10, wait_for_ready=True) for c in channels]}
    held = [
        channels[i % 2].unary_unary("/" + service + "/Sleep").future(b"3", timeout=20)
        for i in range(limit)
    ]
    deadline = time.monotonic() + 10
    i = 0
    while time.monotonic() < deadline:
        i += 1
        if unary(channels[i % 2], "Who", timeout=5).endswith("circuit breaker drop"):
            break
        time.sleep(0.01)
    out["over"] = [unary(channels[i % 2], "Who", timeout=5) for i in range(after)]
    out["held"] = [f.result().decode() for f in held]
    out["again"] = [unary(c, "Who", timeout=5) for c in channels]
    return out


def streams(channel, service, limit, after, paused):
    # limit bidi streams held open (each answered once, so it is under way),
    # then unary calls; paused(outcomes) returns when the streams may end
    import queue

    def who():
        try:
            return channel.unary_unary("/" + service + "/Who")(b"", timeout=5).decode()
        except grpc.RpcError as e:
            return "error:" + e.code().name + ": " + (e.details() or "")

    warm = who()
    held = []
    for i in range(limit):
        requests = queue.Queue()
        requests.put(str(i).encode())
        call = channel.stream_stream("/" + service + "/Chat")(
            iter(requests.get, None), timeout=30
        )
        first = next(call).decode()
        held.append((requests, call, first))
    over = [who() for _ in range(after)]
    paused({"warm": warm, "over": over})
    ends = []
    for requests, call, first in held:
        requests.put(None)
        ends.append([first] + [m.decode() for m in call])
    return {"warm": warm, "over": over, "streams": ends, "again": who()}


if __name__ == "__main__":
    if sys.argv[5] == "streams":
        def paused(partial):
            print(json.dumps(partial), flush=True)
            sys.stdin.readline()

        channel = grpc.insecure_channel(sys.argv[1])
        out = streams(channel, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), paused)
    else:
        made = [grpc.insecure_channel(sys.argv[1]) for _ in range(2)]
        out = scenario(made, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def backend():
    started = Backend("cb0").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def server(backend):
    srv = ManagementServer(lrs_interval=1.0).start()
    cluster = b.cluster(CLUSTER, lrs_server=True, max_requests=LIMIT)
    srv.set_snapshot(one_cluster_snapshot(cluster, "zc", backend.address))
    yield srv
    srv.stop()


def start_core(server, tmp_path, node_id: str, scenario: str) -> subprocess.Popen:
    script = tmp_path / "scenario.py"
    script.write_text(_SCENARIO)
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(server.bootstrap(node_id=node_id))
    return subprocess.Popen(
        [sys.executable, str(script), TARGET, SERVICE, str(LIMIT), str(AFTER), scenario],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def scenarios() -> dict:
    namespace: dict = {}
    exec(compile(_SCENARIO, "scenario", "exec"), namespace)
    return namespace


def stop(core: subprocess.Popen) -> None:
    if core.poll() is None:
        core.kill()
        core.wait(10)


def test_two_channels_share_one_circuit_breaker_as_in_c_core(server, tmp_path):
    core = start_core(server, tmp_path, "cb-core", "shared")
    namespace = scenarios()
    bootstrap = server.bootstrap(node_id="cb-pyxds")
    channels = [pyxds.insecure_channel(TARGET, bootstrap=bootstrap) for _ in range(2)]
    try:
        ours = namespace["scenario"](channels, SERVICE, LIMIT, AFTER)
        out, _ = core.communicate(timeout=60)
        theirs = json.loads(out)
    finally:
        for channel in channels:
            channel.close()
        stop(core)
    want = {
        "warm": ["cb0", "cb0"],
        "over": ["error:UNAVAILABLE: circuit breaker drop"] * AFTER,
        "held": ["cb0"] * LIMIT,
        "again": ["cb0", "cb0"],
    }
    assert theirs == want, theirs
    assert ours == want, ours


def test_open_streams_hold_their_slots_and_are_in_progress_as_in_c_core(server, tmp_path):
    """grpc-go TestCircuitBreaking: streams count against max_requests until
    they end, and the load report shows them in progress."""
    core = start_core(server, tmp_path, "cb-streams-core", "streams")
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id="cb-streams-pyxds"))
    release = threading.Event()
    paused_at: dict = {}
    ours: dict = {}

    def paused(partial: dict) -> None:
        paused_at.update(partial)
        release.wait(30)

    def run() -> None:
        ours.update(scenarios()["streams"](channel, SERVICE, LIMIT, AFTER, paused))

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert core.stdout is not None and core.stdin is not None
        theirs_paused = json.loads(core.stdout.readline())
        assert wait_for(lambda: bool(paused_at), 20)
        want_paused = {"warm": "cb0", "over": ["error:UNAVAILABLE: circuit breaker drop"] * AFTER}
        assert theirs_paused == want_paused
        assert paused_at == want_paused
        for node_id in ("cb-streams-core", "cb-streams-pyxds"):
            in_progress = lambda n=node_id: server.lrs.totals(CLUSTER, n).last_in_progress  # noqa: E731
            assert wait_for(lambda f=in_progress: f() == {ZONE: LIMIT}, 10), (
                node_id,
                in_progress(),
            )
        release.set()
        core.stdin.write("go\n")
        core.stdin.flush()
        theirs = json.loads(core.stdout.readline())
        runner.join(30)
    finally:
        release.set()
        channel.close()
        stop(core)
    want = {**want_paused, "streams": [[f"cb0:{i}"] for i in range(LIMIT)], "again": "cb0"}
    assert theirs == want, theirs
    assert ours == want, ours
