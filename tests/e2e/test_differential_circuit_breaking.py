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
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from channel_fixtures import SERVICE, TARGET, Backend, route, snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer

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


if __name__ == "__main__":
    made = [grpc.insecure_channel(sys.argv[1]) for _ in range(2)]
    print(json.dumps(scenario(made, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))), flush=True)
"""


@pytest.fixture(scope="module")
def backend():
    started = Backend("cb0").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def server(backend):
    srv = ManagementServer().start()
    srv.set_snapshot(
        snapshot(
            [route(prefix="", cluster="shared-cb")],
            {"shared-cb": [[backend.address]]},
            max_requests={"shared-cb": LIMIT},
        )
    )
    yield srv
    srv.stop()


def test_two_channels_share_one_circuit_breaker_as_in_c_core(server, tmp_path):
    script = tmp_path / "scenario.py"
    script.write_text(_SCENARIO)
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(server.bootstrap(node_id="cb-core"))
    core = subprocess.Popen(
        [sys.executable, str(script), TARGET, SERVICE, str(LIMIT), str(AFTER)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    namespace: dict = {}
    exec(compile(_SCENARIO, "scenario", "exec"), namespace)
    bootstrap = server.bootstrap(node_id="cb-pyxds")
    channels = [pyxds.insecure_channel(TARGET, bootstrap=bootstrap) for _ in range(2)]
    try:
        ours = namespace["scenario"](channels, SERVICE, LIMIT, AFTER)
        out, _ = core.communicate(timeout=60)
        theirs = json.loads(out)
    finally:
        for channel in channels:
            channel.close()
        if core.poll() is None:
            core.kill()
            core.wait(10)
    want = {
        "warm": ["cb0", "cb0"],
        "over": ["error:UNAVAILABLE: circuit breaker drop"] * AFTER,
        "held": ["cb0"] * LIMIT,
        "again": ["cb0", "cb0"],
    }
    assert theirs == want, theirs
    assert ours == want, ours
