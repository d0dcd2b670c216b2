"""Differential load reporting (gRFC A27 "Load Reporting"): pyxds and
grpcio's C-core (``xds:///`` channel in a subprocess) send the same traffic
through the same pyxds.server config with ``lrs_server: self``; each one's
reports must add up to what its RPCs did, and the two must agree field by
field wherever the traffic is deterministic.

Where the two may differ by design (both are random): which locality a call
goes to (weighted_target draws) and which calls an EDS drop category below
100 % drops; there only the sums are compared, and each client against what
its own calls did.
"""

from __future__ import annotations

import time

import pytest
from channel_fixtures import (
    TARGET,
    CoreXdsClient,
    pyxds_calls,
    running_backends,
    wait_until,
)
from lrs_fixtures import DROP, FAIL, MAIN, MAIN_EDS, PLAIN, WHO, Observed, lrs_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.xds.lrs_state import LRS_CLIENT_FEATURE

PYXDS_NODE = "lrs-diff-pyxds"
CORE_NODE = "lrs-diff-core"
#: the report interval the server asks for (seconds), and how long a quiet
#: client is watched after its all-zero report: one interval and a half, so
#: a client reporting every interval would send another within it
INTERVAL = 1.0
QUIET = 1.5 * INTERVAL


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0")


@pytest.fixture(scope="module")
def server(backends):
    srv = ManagementServer(lrs_interval=INTERVAL).start()
    yield srv
    srv.stop()


TRAFFIC = (
    (MAIN, WHO, 120, None),
    (MAIN, FAIL, 40, None),
    (DROP, WHO, 25, [("x-cluster", "drop")]),
    (PLAIN, WHO, 15, [("x-cluster", "plain")]),
)


def drive(call) -> dict[str, Observed]:
    observed = {MAIN: Observed(), DROP: Observed(), PLAIN: Observed()}
    for cluster, method, n, md in TRAFFIC:
        counts = call(n, method=method, metadata=md, details=True, request="INTERNAL")
        for outcome, count in counts.items():
            observed[cluster].add(outcome, count)
    return observed


def totals(server, cluster: str, node_id: str) -> dict:
    return server.lrs.totals(cluster, node_id).counts()


def reported_equals(server, node_id: str, observed: dict[str, Observed]) -> bool:
    return all(
        totals(server, cluster, node_id) == observed[cluster].expected() for cluster in (MAIN, DROP)
    )


def sums(counts: dict) -> dict:
    return {
        "issued": sum(counts["issued"].values()),
        "succeeded": sum(counts["succeeded"].values()),
        "errors": sum(counts["errors"].values()),
        "total_dropped": counts["total_dropped"],
    }


def localities(server, cluster: str, node_id: str) -> set[tuple[str, str, str]]:
    return {
        (s.locality.region, s.locality.zone, s.locality.sub_zone)
        for r in server.lrs.reports(cluster, node_id)
        for s in r.stats.upstream_locality_stats
    }


def _counts_nothing(stats) -> bool:
    return not stats.total_dropped_requests and not any(
        s.total_issued_requests
        or s.total_successful_requests
        or s.total_error_requests
        or s.total_requests_in_progress
        for s in stats.upstream_locality_stats
    )


def _requests(server, node_id: str) -> list[list]:
    """The node's reports with cluster stats, oldest first, each as the
    ClusterStats it carried (one request's records share their arrival)."""
    by_request: dict[tuple[int, float], list] = {}
    for r in server.lrs.reports(None, node_id):
        by_request.setdefault((r.stream, r.received_at), []).append(r.stats)
    return list(by_request.values())


def _zero_report_last(server, node_id: str) -> bool:
    """Exactly one report after the last that counted something, and it
    counts nothing (gRFC A27 with C-core's rule: an all-zero report is sent
    once, the next all-zero ones are skipped)."""
    sent = _requests(server, node_id)
    counted = [i for i, stats in enumerate(sent) if not all(map(_counts_nothing, stats))]
    return bool(counted) and len(sent) == counted[-1] + 2


@pytest.mark.parametrize("main_drop_ppm", [0, 250_000])
def test_load_reports_agree_with_c_core(server, backends, main_drop_ppm):
    server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=main_drop_ppm))
    server.lrs.clear()
    suffix = f"-{main_drop_ppm}"
    py_node, core_node = PYXDS_NODE + suffix, CORE_NODE + suffix
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        ours = drive(lambda n, **kw: pyxds_calls(channel, n, **kw))
        theirs = drive(lambda n, **kw: core.call(n, **kw))
        for observed in (ours, theirs):
            assert not any(o.other for o in observed.values()), observed
        # 1. each client's reports add up to what its calls did
        ok_ours = wait_until(lambda: reported_equals(server, py_node, ours), 20)
        ok_theirs = wait_until(lambda: reported_equals(server, core_node, theirs), 20)
        assert ok_theirs, ({c: totals(server, c, core_node) for c in (MAIN, DROP)}, theirs)
        assert ok_ours, ({c: totals(server, c, py_node) for c in (MAIN, DROP)}, ours)
        # 2. deterministic totals agree field by field
        main_ours, main_theirs = totals(server, MAIN, py_node), totals(server, MAIN, core_node)
        if main_drop_ppm == 0:
            assert sums(main_ours) == sums(main_theirs)
        else:
            assert (
                sums(main_ours)["issued"] + main_ours["total_dropped"]
                == sums(main_theirs)["issued"] + main_theirs["total_dropped"]
            )
            assert set(main_ours["dropped"]) == set(main_theirs["dropped"]) == {"lb"}
        assert totals(server, DROP, py_node) == totals(server, DROP, core_node)
        assert totals(server, DROP, py_node)["dropped"] == {"throttle": 25}
        # 3. the same shape: clusters, EDS service names, localities, no report
        #    for the cluster without lrs_server, nothing left in progress
        for cluster, service in ((MAIN, MAIN_EDS), (DROP, "")):
            names_ours = {r.eds_service_name for r in server.lrs.reports(cluster, py_node)}
            names_theirs = {r.eds_service_name for r in server.lrs.reports(cluster, core_node)}
            assert names_ours == names_theirs == {service}
        assert localities(server, MAIN, py_node) == localities(server, MAIN, core_node)
        assert localities(server, DROP, py_node) == localities(server, DROP, core_node)
        assert server.lrs.reports(PLAIN, py_node) == server.lrs.reports(PLAIN, core_node) == []
        for node_id in (py_node, core_node):
            last = server.lrs.last_report(MAIN, node_id)
            assert all(
                s.total_requests_in_progress == 0 for s in last.stats.upstream_locality_stats
            )
        # 4. the first request: node with the send-all-clusters feature
        first = {r.node.id: r for r in server.lrs.initial_requests()}
        for node_id in (py_node, core_node):
            assert LRS_CLIENT_FEATURE in first[node_id].node.client_features
            assert not first[node_id].cluster_stats
        features = [list(first[n].node.client_features) for n in (py_node, core_node)]
        assert features[0] == features[1]
        # 5. quiet: after the last report that counted something, one
        #    all-zero report, then none while nothing is counted
        sent = {}
        for node_id in (py_node, core_node):
            assert wait_until(lambda n=node_id: _zero_report_last(server, n), 5), (
                node_id,
                _requests(server, node_id)[-2:],
            )
            sent[node_id] = server.lrs.report_count(node_id)
        time.sleep(QUIET)
        for node_id in (py_node, core_node):
            assert server.lrs.report_count(node_id) == sent[node_id], _requests(server, node_id)
            assert _zero_report_last(server, node_id)
    finally:
        channel.close()
        core.close()


# The circuit-breaker scenario, run the same way by both clients: a warm-up
# call, one long call holding the cluster's only slot (max_requests 1), calls
# until the first circuit-breaker drop (bounded), then AFTER more calls, all
# of which must drop; then the long call's answer.
AFTER = 7
_BREAKER = r"""
import json, sys, time
import grpc

def run(channel, service, after):
    who = channel.unary_unary("/" + service + "/Who")
    sleep = channel.unary_unary("/" + service + "/Sleep")

    def call():
        try:
            return who(b"", timeout=5).decode()
        except grpc.RpcError as e:
            return "error:" + e.code().name + ": " + (e.details() or "")

    outcomes = [who(b"", timeout=10, wait_for_ready=True).decode()]
    held = sleep.future(b"3", timeout=20)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        outcomes.append(call())
        if outcomes[-1].endswith("circuit breaker drop"):
            break
        time.sleep(0.01)
    outcomes.extend(call() for _ in range(after))
    outcomes.append(held.result().decode())
    return outcomes

if __name__ == "__main__":
    channel = grpc.insecure_channel(sys.argv[1])
    print(json.dumps(run(channel, sys.argv[2], int(sys.argv[3]))), flush=True)
    sys.stdin.read()  # stay up (and reporting) until the test is done
"""


def test_circuit_breaker_drops_are_reported_as_c_core_reports_them(server, backends, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from channel_fixtures import SERVICE

    server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0, main_max_requests=1))
    py_node, core_node = PYXDS_NODE + "-cb", CORE_NODE + "-cb"
    script = tmp_path / "breaker.py"
    script.write_text(_BREAKER)
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(server.bootstrap(node_id=core_node))
    core = subprocess.Popen(
        [sys.executable, str(script), TARGET, SERVICE, str(AFTER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    namespace: dict = {}
    exec(compile(_BREAKER, "breaker", "exec"), namespace)
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        ours_list = namespace["run"](channel, SERVICE, AFTER)
        assert core.stdout is not None
        theirs_list = json.loads(core.stdout.readline())
        observed = {}
        for node_id, outcomes in ((py_node, ours_list), (core_node, theirs_list)):
            seen = Observed()
            for outcome in outcomes:
                seen.add(outcome)
            assert not seen.other, (node_id, seen.other)
            assert seen.circuit_breaker == AFTER + 1, (node_id, outcomes)
            observed[node_id] = seen
        for node_id, seen in observed.items():
            want = seen.expected()
            ok = wait_until(lambda n=node_id, w=want: totals(server, MAIN, n) == w, 20)
            assert ok, (node_id, totals(server, MAIN, node_id), want)
        ours, theirs = totals(server, MAIN, py_node), totals(server, MAIN, core_node)
        # uncategorized: in the total, under no category, in both
        assert ours["total_dropped"] == theirs["total_dropped"] == AFTER + 1
        assert ours["dropped"] == theirs["dropped"] == {}
    finally:
        channel.close()
        try:
            core.communicate(timeout=10)  # closes its stdin: it exits
        except subprocess.TimeoutExpired:
            core.kill()
            core.wait(10)
