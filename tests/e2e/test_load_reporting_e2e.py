"""Load reporting end to end (gRFC A27 "Load Reporting"): pyxds channels to
real backends, the XdsClient on a real ADS stream and a real LRS stream to
pyxds.server; the reports the server records add up to what the RPCs did."""

from __future__ import annotations

import asyncio
import itertools
import time

import grpc
import pytest
from channel_fixtures import TARGET, pyxds_calls, running_backends, until_answered, wait_until
from lrs_fixtures import (
    DROP,
    FAIL,
    MAIN,
    MAIN_EDS,
    PLAIN,
    WHO,
    ZONE_OF,
    Observed,
    idle,
    lrs_snapshot,
)

import pyxds._api as pyxds
import pyxds.aio
from pyxds.server import ManagementServer
from pyxds.xds.lrs_state import LRS_CLIENT_FEATURE

_nodes = itertools.count()


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0")


@pytest.fixture(scope="module")
def server(backends):
    srv = ManagementServer(lrs_interval=1.0).start()
    srv.set_snapshot(lrs_snapshot(backends))
    yield srv
    srv.stop()


def node() -> str:
    """Every test reports as its own node (its own XdsClient, its own totals)."""
    return f"lrs-e2e-{next(_nodes)}"


def run_traffic(channel, who: int, fail: int, drop: int = 0, plain: int = 0) -> dict[str, Observed]:
    """The traffic; what each cluster's calls did."""
    observed = {MAIN: Observed(), DROP: Observed(), PLAIN: Observed()}
    for cluster, method, n, md in (
        (MAIN, WHO, who, None),
        (MAIN, FAIL, fail, None),
        (DROP, WHO, drop, [("x-cluster", "drop")]),
        (PLAIN, WHO, plain, [("x-cluster", "plain")]),
    ):
        if not n:
            continue
        counts = pyxds_calls(
            channel, n, method=method, metadata=md, details=True, request="INTERNAL"
        )
        for outcome, count in counts.items():
            observed[cluster].add(outcome, count)
    return observed


def reported(server, cluster: str, node_id: str) -> dict:
    return server.lrs.totals(cluster, node_id).counts()


def settle(server, node_id: str, expected: dict[str, dict], timeout: float = 15.0) -> None:
    """Wait until every cluster's reported totals are the expected ones, then
    one more interval (the all-zero report that follows, not a fixed 1.3 s):
    they must not change (nothing counted twice)."""
    for cluster, want in expected.items():
        ok = wait_until(lambda c=cluster, w=want: reported(server, c, node_id) == w, timeout)
        assert ok, (cluster, reported(server, cluster, node_id), want)
    for cluster in expected:
        last = lambda c=cluster: server.lrs.last_report(c, node_id)  # noqa: E731
        assert wait_until(lambda f=last: idle(f()), timeout), (cluster, last())
    for cluster, want in expected.items():
        assert reported(server, cluster, node_id) == want


def test_reports_add_up_to_what_the_rpcs_did(server, backends):
    node_id = node()
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=node_id))
    try:
        observed = run_traffic(channel, who=200, fail=60, drop=30, plain=20)
        assert not any(o.other for o in observed.values())
        assert observed[MAIN].dropped["lb"] > 0  # 20 %
        assert observed[DROP].dropped == {"throttle": 30}
        settle(server, node_id, {MAIN: observed[MAIN].expected(), DROP: observed[DROP].expected()})
        assert server.lrs.reports(PLAIN, node_id) == []  # no lrs_server: no report
        last = server.lrs.last_report(MAIN, node_id)
        assert last.eds_service_name == MAIN_EDS
        assert all(s.total_requests_in_progress == 0 for s in last.stats.upstream_locality_stats)
        interval = last.stats.load_report_interval
        assert 0.9 <= interval.seconds + interval.nanos / 1e9 <= 3.0
        (first,) = [r for r in server.lrs.initial_requests() if r.node.id == node_id]
        assert LRS_CLIENT_FEATURE in first.node.client_features
        dumped = {r["cluster_name"] for r in channel.config_dump()["load_reports"]}
        assert {MAIN, DROP} <= dumped
    finally:
        channel.close()


def test_every_call_is_reported_exactly_once_per_locality(server, backends):
    server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0), node_id="exact-node")
    node_id = "exact-node"
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=node_id))
    try:
        observed = run_traffic(channel, who=150, fail=50)[MAIN]
        # calls on until both localities served (counted too): weighted_target
        # picks READY localities only, and one may connect after the traffic
        for outcome in until_answered(lambda: pyxds_calls(channel, 1), {"a0", "b0"}):
            observed.add(outcome)
        assert not observed.other and not observed.dropped
        settle(server, node_id, {MAIN: observed.expected()})
        # both localities served and both are reported
        assert set(observed.succeeded) == {"za", "zb"}
    finally:
        channel.close()
        server.clear_snapshot(node_id)


def test_circuit_breaker_drops_are_reported_in_the_total_without_a_category(server, backends):
    from channel_fixtures import SERVICE

    node_id = node()
    server.set_snapshot(
        lrs_snapshot(backends, main_drop_ppm=0, main_max_requests=1), node_id=node_id
    )
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=node_id))
    try:
        observed = run_traffic(channel, who=5, fail=0)[MAIN]  # config in place

        def served() -> int:
            return sum(sum(b.served.values()) for b in backends.values())

        before = served()
        sleeping = channel.unary_unary(f"/{SERVICE}/Sleep").future(b"1.5", timeout=10)
        # the Sleep call reached its backend: one call in flight = max_requests
        assert wait_until(lambda: served() > before, 5)
        more = run_traffic(channel, who=6, fail=0)[MAIN]
        assert more.circuit_breaker == 6, more
        name = sleeping.result(timeout=10).decode()
        observed.succeeded[ZONE_OF[name]] += 1
        observed.circuit_breaker += more.circuit_breaker
        want = observed.expected()
        assert want["total_dropped"] == 6 and want["dropped"] == {}
        settle(server, node_id, {MAIN: want})
    finally:
        channel.close()
        server.clear_snapshot(node_id)


def test_nothing_is_lost_or_counted_twice_across_an_lrs_reconnect(server, backends):
    server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0), node_id="reconnect-node")
    node_id = "reconnect-node"
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=node_id))
    try:
        observed = run_traffic(channel, who=80, fail=20)[MAIN]
        assert wait_until(lambda: server.lrs.reports(MAIN, node_id), 10)
        streams = server.lrs.total_streams
        assert server.lrs.close_streams() >= 1
        more = run_traffic(channel, who=70, fail=10)[MAIN]
        for name in ("succeeded", "errors"):
            getattr(observed, name).update(getattr(more, name))
        settle(server, node_id, {MAIN: observed.expected()})
        assert server.lrs.total_streams > streams
    finally:
        channel.close()
        server.clear_snapshot(node_id)


def test_channels_of_one_bootstrap_share_one_lrs_stream(server, backends):
    node_id = node()
    bootstrap = server.bootstrap(node_id=node_id)
    first = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    second = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    try:
        server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0), node_id=node_id)
        a = pyxds_calls(first, 20)
        b = pyxds_calls(second, 30)
        assert sum(a.values()) == 20 and sum(b.values()) == 30
        ok = wait_until(
            lambda: sum(reported(server, MAIN, node_id)["succeeded"].values()) == 50, 15
        )
        assert ok, reported(server, MAIN, node_id)
        initial = [r for r in server.lrs.initial_requests() if r.node.id == node_id]
        assert len(initial) == 1
    finally:
        first.close()
        second.close()
        server.clear_snapshot(node_id)


def test_lrs_stream_runs_only_while_a_cluster_reports_and_flushes_the_last_counts(server, backends):
    node_id = node()
    server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0), node_id=node_id)
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=node_id))
    try:
        counts = pyxds_calls(channel, 40)
        assert counts and not any(k.startswith("error") for k in counts)
        assert wait_until(lambda: server.lrs.stream_count(node_id) == 1, 10)
        # the cluster stops reporting: its last counts are flushed, then the
        # stream ends while the channel stays up
        server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0, lrs=False), node_id=node_id)
        assert wait_until(lambda: server.lrs.stream_count(node_id) == 0, 15)
        assert sum(reported(server, MAIN, node_id)["succeeded"].values()) == 40
        reports = len(server.lrs.reports(MAIN, node_id))
        more = pyxds_calls(channel, 10)
        assert sum(more.values()) == 10
        time.sleep(1.3)
        assert len(server.lrs.reports(MAIN, node_id)) == reports
        assert server.lrs.stream_count(node_id) == 0
        # reporting again: a new stream
        server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0), node_id=node_id)
        assert wait_until(lambda: server.lrs.stream_count(node_id) == 1, 10)
    finally:
        channel.close()
        server.clear_snapshot(node_id)


def test_aio_channel_reports_what_its_rpcs_did(server, backends):
    node_id = node()
    server.set_snapshot(lrs_snapshot(backends, main_drop_ppm=0), node_id=node_id)

    async def main() -> Observed:
        observed = Observed()
        async with pyxds.aio.insecure_channel(
            TARGET, bootstrap=server.bootstrap(node_id=node_id)
        ) as channel:
            for method, n in ((WHO, 60), (FAIL, 20)):
                call = channel.unary_unary(method)
                for _ in range(n):
                    try:
                        reply = await call(b"INTERNAL", timeout=5)
                        observed.add(reply.decode())
                    except grpc.aio.AioRpcError as err:
                        observed.add(f"error:{err.code().name}: {err.details()}")
            assert not observed.other
            # the channel (and its XdsClient) stays open until reported
            await asyncio.to_thread(settle, server, node_id, {MAIN: observed.expected()})
        return observed

    try:
        observed = asyncio.run(main())
        assert sum(observed.succeeded.values()) == 60
    finally:
        server.clear_snapshot(node_id)


# --------------------------------------------------------------------------- the LRS service


def lrs_stub(address: str):
    from envoy.service.load_stats.v3 import lrs_pb2_grpc

    channel = grpc.insecure_channel(address)
    return channel, lrs_pb2_grpc.LoadReportingServiceStub(channel)


def test_lrs_service_asks_for_its_settings_and_records_each_cluster_stats():
    import queue

    from envoy.config.endpoint.v3 import load_report_pb2
    from envoy.service.load_stats.v3 import lrs_pb2

    with ManagementServer(lrs_interval=2.5, lrs_clusters=["c1"]) as srv:
        channel, stub = lrs_stub(srv.address)
        requests: queue.SimpleQueue = queue.SimpleQueue()
        first = lrs_pb2.LoadStatsRequest()
        first.node.id = "raw-node"
        requests.put(first)
        call = stub.StreamLoadStats(iter(requests.get, None), timeout=10)
        try:
            response = next(call)
            assert list(response.clusters) == ["c1"] and not response.send_all_clusters
            assert response.load_reporting_interval.seconds == 2
            assert response.load_reporting_interval.nanos == 500_000_000
            srv.lrs.configure(interval=1.0, clusters=None)  # pushed to the open stream
            response = next(call)
            assert response.send_all_clusters and response.load_reporting_interval.seconds == 1
            report = lrs_pb2.LoadStatsRequest()
            report.cluster_stats.append(
                load_report_pb2.ClusterStats(cluster_name="c1", total_dropped_requests=3)
            )
            requests.put(report)
            srv.lrs.wait_until(lambda: srv.lrs.reports("c1"), 5)
            (record,) = srv.lrs.reports("c1", "raw-node")
            assert record.stats.total_dropped_requests == 3
            assert record.to_json()["cluster_stats"]["total_dropped_requests"] == "3"
        finally:
            requests.put(None)
            call.cancel()
            channel.close()


def test_module_entry_prints_load_reports_as_json_lines(tmp_path):
    import json
    import os
    import queue
    import subprocess
    import sys

    from envoy.config.endpoint.v3 import load_report_pb2
    from envoy.service.load_stats.v3 import lrs_pb2

    path = tmp_path / "empty.yaml"
    path.write_text("resources: []\n")
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyxds.server", "--file", str(path), "--print-load-reports"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "serving" in banner, proc.stderr.read() if proc.poll() is not None else banner
        address = json.loads(proc.stdout.readline())["xds_servers"][0]["server_uri"]
        channel, stub = lrs_stub(address)
        requests: queue.SimpleQueue = queue.SimpleQueue()
        first = lrs_pb2.LoadStatsRequest()
        first.node.id = "cli-node"
        requests.put(first)
        call = stub.StreamLoadStats(iter(requests.get, None), timeout=10)
        response = next(call)
        assert response.load_reporting_interval.seconds == 10  # the CLI's default
        report = lrs_pb2.LoadStatsRequest()
        report.cluster_stats.append(
            load_report_pb2.ClusterStats(cluster_name="from-cli", total_dropped_requests=1)
        )
        requests.put(report)
        line = json.loads(proc.stdout.readline())
        assert line["node_id"] == "cli-node"
        assert line["cluster_stats"]["cluster_name"] == "from-cli"
        requests.put(None)
        call.cancel()
        channel.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
