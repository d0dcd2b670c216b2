"""Differential, gRFC A75 "Aggregate Cluster Changes" with A50: outlier
detection runs once per cluster, above the priority policy, so its
``max_ejection_percent`` counts the endpoints of every priority.

One EDS cluster, two priorities of three real backends each.  Priority 0
holds two backends failing every RPC and a good one; priority 1 three good
ones (never used while priority 0 is READY, but outlier detection's
endpoints all the same).  ``max_ejection_percent`` 30: over the cluster's
six endpoints both failing ones are ejected (1/6, then 2/6 >= 30 % stops),
so every RPC afterwards reaches priority 0's good backend.  (Counted per
priority, three endpoints, the second ejection was refused: 1/3 >= 30 %.)
pyxds's channel and grpcio's C-core ``xds:///`` channel (a subprocess, its
own bootstrap; C-core's cds.cc builds outlier_detection -> xds_cluster_impl
-> xds_override_host -> priority) run the same loop against the same
pyxds.server and must end answering the same way."""

from __future__ import annotations

import pytest
from channel_fixtures import TARGET
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2
from test_differential_outlier_detection import (
    RUN_SECONDS,
    TAIL,
    WHO,
    _Backend,
    od_snapshot,
    run_core,
)

import pyxds._api as pyxds
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NODE = "differential-outlier-detection-a75"
CLUSTER = "cod-a75"

# The loop, run in-process for pyxds and in a subprocess for C-core (C-core
# reads its bootstrap once per process): outcomes counted by backend name
# or status code, during the run and in the tail.
_OUTCOMES = r"""
import collections, json, sys, time
import grpc

def outcomes(channel, method, run_seconds, tail):
    call = channel.unary_unary(method)

    def one(**kwargs):
        try:
            return call(b"", timeout=2, **kwargs).decode()
        except grpc.RpcError as err:
            return err.code().name

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # configured and connected: a backend answered
        if one(wait_for_ready=True) not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            break
    run = collections.Counter()
    start = time.monotonic()
    while time.monotonic() - start < run_seconds:
        run[one()] += 1
    return {"run": dict(run), "tail": dict(collections.Counter(one() for _ in range(tail)))}

if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    ch = grpc.insecure_channel(cfg["target"])
    print(json.dumps(outcomes(ch, cfg["method"], cfg["run_seconds"], cfg["tail"])), flush=True)
"""
_namespace: dict = {}
exec(compile(_OUTCOMES, "outcomes", "exec"), _namespace)
outcomes = _namespace["outcomes"]


@pytest.fixture(scope="module")
def backends():
    started = [
        _Backend("bad1", failing=True),
        _Backend("bad2", failing=True),
        _Backend("good", failing=False),
        *(_Backend(f"p1-{i}", failing=False) for i in range(3)),
    ]
    yield started
    for backend in started:
        backend.server.stop(None).wait(5)


def a75_snapshot(
    priorities: list[list[str]], max_percent: int, minimum_hosts: int, pick_first: bool = False
) -> Snapshot:
    """The cluster of ``priorities`` with failure-percentage outlier
    detection (threshold 50 %, 10 calls), round_robin or pick_first (A62)."""
    return od_snapshot(
        (),
        cluster_name=CLUSTER,
        priorities=priorities,
        max_percent=max_percent,
        minimum_hosts=minimum_hosts,
        threshold=50,
        cluster_proto=b.cluster(CLUSTER, load_balancing_policy=[pick_first_pb2.PickFirst()])
        if pick_first
        else None,
    )


def both(server, node: str) -> tuple[dict, dict]:
    """The loop's outcomes in pyxds and in C-core, on the server's snapshot."""
    bootstrap = server.bootstrap(node_id=node)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    try:
        ours = outcomes(channel, WHO, RUN_SECONDS, TAIL)
    finally:
        channel.close()
    return ours, run_core(bootstrap, script=_OUTCOMES)


def test_max_ejection_percent_counts_both_priorities_as_c_core_does(xds_server, backends):
    addresses = [backend.address for backend in backends]
    xds_server.set_snapshot(a75_snapshot([addresses[:3], addresses[3:]], 30, 3), node_id=NODE)
    ours, theirs = both(xds_server, NODE)
    print(f"\nA75 outlier detection: pyxds {ours}\n                       C-core {theirs}")
    for result in (ours, theirs):
        # before the ejections: priority 0's three backends, two failing
        assert set(result["run"]) == {"good", "INTERNAL"}
        assert result["run"]["INTERNAL"] > 0
    # after: both failing endpoints ejected, in both clients
    assert theirs["tail"] == {"good": TAIL}
    assert ours["tail"] == theirs["tail"]


def test_a_pick_first_cluster_keeps_its_ejected_endpoint_as_c_core_does(xds_server, backends):
    """A62 pick_first as the cluster's policy, under A75's priority,
    xds_override_host and xds_cluster_impl: outlier detection ejects the
    endpoint pick_first is on (every RPC fails there), and C-core's
    pick_first, which reads the health watch only under a petiole policy
    (grpc#32967, A61), stays on it; so does pyxds's (no ejection reaches a
    pick_first cluster).  Every RPC of both keeps failing."""
    node = NODE + "-pick-first"
    bad, good = backends[0].address, backends[2].address
    xds_server.set_snapshot(a75_snapshot([[bad, good]], 100, 1, pick_first=True), node_id=node)
    ours, theirs = both(xds_server, node)
    print(f"\nA75 pick_first cluster: pyxds {ours}\n                        C-core {theirs}")
    assert theirs["run"] == {"INTERNAL": theirs["run"]["INTERNAL"]}
    assert theirs["tail"] == {"INTERNAL": TAIL}
    assert ours["run"] == {"INTERNAL": ours["run"]["INTERNAL"]}
    assert ours["tail"] == theirs["tail"]
