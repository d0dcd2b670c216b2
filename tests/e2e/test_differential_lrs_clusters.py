"""Differential load reporting across a cluster switch (C-core
``xds_cluster_end2end_test.cc`` ClientLoadReportingTest.ChangeClusters, gRFC
A27 "Load Reporting"): the route moves from cluster ``lrs-a`` (EDS service
``lrs-a-eds``, backend a0) to ``lrs-b`` (``lrs-b-eds``, backend b0), both
with ``lrs_server: self``.  pyxds and grpcio's C-core (``xds:///`` channel in
a subprocess) each report, per cluster, exactly the calls that cluster
served for that client, under its own EDS service name.  Both keep the
removed cluster's child in xds_cluster_manager for 15 minutes (A28 "When a
child policy is removed, it will be cached for 15 minutes"), so both go on
reporting the old cluster, every count zero.

Also: counts across an LRS stream restart (C-core BalancerRestart) and the
leaves of an aggregate cluster, each reported under its own name (A37).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from channel_fixtures import (
    LISTENER,
    SERVICE,
    TARGET,
    Backend,
    CoreXdsClient,
    pyxds_calls,
    running_backends,
)
from channel_fixtures import wait_until as wait_for
from lrs_fixtures import idle

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

A, B = "lrs-a", "lrs-b"
WHO = f"/{SERVICE}/Who"


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0")


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer(lrs_interval=1.0).start()
    yield srv
    srv.stop()


def routed_to(cluster: str, backends: dict[str, Backend], *more: Any) -> Snapshot:
    """Every call to ``cluster``; ``more``: Cluster protos besides A and B."""
    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route",
                [b.virtual_host("vh", routes=[b.route(prefix="", cluster=cluster)])],
            )
        ],
        clusters=[
            b.cluster(A, eds_service_name=f"{A}-eds", lrs_server=True),
            b.cluster(B, eds_service_name=f"{B}-eds", lrs_server=True),
            *more,
        ],
        endpoints=[
            b.endpoints(
                f"{A}-eds", [b.locality(region="r", zone="za", endpoints=[backends["a0"].address])]
            ),
            b.endpoints(
                f"{B}-eds", [b.locality(region="r", zone="zb", endpoints=[backends["b0"].address])]
            ),
        ],
    )


def succeeded(server: ManagementServer, cluster: str, node_id: str) -> int:
    return sum(server.lrs.totals(cluster, node_id).counts()["succeeded"].values())


def test_load_reports_follow_a_cluster_switch_as_c_core_s_do(server, backends):
    server.set_snapshot(routed_to(A, backends))
    py_node, core_node = "lrs-switch-pyxds", "lrs-switch-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        served = {
            py_node: pyxds_calls(channel, 12),
            core_node: core.call(12),
        }
        assert served[py_node] == served[core_node] == {"a0": 12}
        server.set_snapshot(routed_to(B, backends))
        # calls until each client is on the new cluster, then 8 more
        deadline = time.monotonic() + 20
        for node_id, call in (
            (py_node, lambda: pyxds_calls(channel, 1)),
            (core_node, lambda: core.call(1)),
        ):
            while time.monotonic() < deadline:
                got = call()
                served[node_id].update(got)
                if "b0" in got:
                    break
        served[py_node].update(pyxds_calls(channel, 8))
        served[core_node].update(core.call(8))
        for node_id, counts in served.items():
            assert set(counts) == {"a0", "b0"}, (node_id, counts)
            for cluster, backend in ((A, "a0"), (B, "b0")):
                want = counts[backend]
                ok = wait_for(lambda n=node_id, c=cluster, w=want: succeeded(server, c, n) == w, 20)
                assert ok, (node_id, cluster, succeeded(server, cluster, node_id), want)
        for cluster in (A, B):
            names = {
                n: {r.eds_service_name for r in server.lrs.reports(cluster, n)}
                for n in (py_node, core_node)
            }
            assert names[py_node] == names[core_node] == {f"{cluster}-eds"}
        # with traffic only on the new cluster, both clients still report the
        # old one (its child is retained 15 minutes, A28), every count zero
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            assert pyxds_calls(channel, 1) == core.call(1) == {"b0": 1}
            time.sleep(0.05)
        since = time.monotonic() - 1.8
        for node_id in (py_node, core_node):
            last_b = server.lrs.last_report(B, node_id)
            assert last_b is not None and last_b.received_at >= since, node_id
            recent = [r for r in server.lrs.reports(A, node_id) if r.received_at >= since]
            assert recent, f"{node_id} stopped reporting the removed cluster"
            for record in recent:
                assert record.stats.total_dropped_requests == 0
                for s in record.stats.upstream_locality_stats:
                    counts = (
                        s.total_issued_requests,
                        s.total_successful_requests,
                        s.total_error_requests,
                        s.total_requests_in_progress,
                    )
                    assert counts == (0, 0, 0, 0), (node_id, record)
    finally:
        channel.close()
        core.close()


def test_counts_survive_an_lrs_stream_restart_as_in_c_core(server, backends):
    """C-core ClientLoadReportingTest.BalancerRestart (the LRS half): the LRS
    server ends every stream; each client opens a new one (a new first
    request with its node) and its reports over both streams add up to every
    call it made, none lost, none counted twice."""
    server.set_snapshot(routed_to(A, backends))
    py_node, core_node = "lrs-restart-pyxds", "lrs-restart-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))

    def streams(node_id: str) -> int:
        return sum(1 for r in server.lrs.initial_requests() if r.node.id == node_id)

    try:
        assert pyxds_calls(channel, 10) == core.call(10) == {"a0": 10}
        for node_id in (py_node, core_node):
            assert wait_for(lambda n=node_id: succeeded(server, A, n) == 10, 20), node_id
        assert streams(py_node) == streams(core_node) == 1
        # 6 calls not yet reported when the streams end, 4 more after
        assert pyxds_calls(channel, 6) == core.call(6) == {"a0": 6}
        assert server.lrs.close_streams() >= 2
        assert pyxds_calls(channel, 4) == core.call(4) == {"a0": 4}
        for node_id in (py_node, core_node):
            assert wait_for(lambda n=node_id: streams(n) == 2, 20), node_id
            assert wait_for(lambda n=node_id: succeeded(server, A, n) == 20, 20), node_id
        for node_id in (py_node, core_node):  # one more interval: nothing counted twice
            last = lambda n=node_id: server.lrs.last_report(A, n)  # noqa: E731
            assert wait_for(lambda f=last: idle(f()), 20), (node_id, last())
        assert succeeded(server, A, py_node) == succeeded(server, A, core_node) == 20
    finally:
        channel.close()
        core.close()


def test_an_aggregate_cluster_s_leaves_report_under_their_own_names_as_in_c_core(server, backends):
    """A37 (aggregate clusters: each leaf has its own xds_cluster_impl) and
    A27: the aggregate ``lrs-agg`` of ``lrs-a`` then ``lrs-b`` is never
    reported itself; calls served by each leaf (``lrs-b`` once a0 is down)
    are reported under that leaf and its EDS service name, in pyxds as in
    C-core."""
    aggregate = b.cluster("lrs-agg", aggregate_children=[A, B])
    server.set_snapshot(routed_to("lrs-agg", backends, aggregate))
    py_node, core_node = "lrs-agg-pyxds", "lrs-agg-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        assert pyxds_calls(channel, 5) == core.call(5) == {"a0": 5}
        backends["a0"].stop()
        try:
            assert wait_for(lambda: pyxds_calls(channel, 1) == {"b0": 1}, 10)
            assert wait_for(lambda: core.call(1) == {"b0": 1}, 10)
            assert pyxds_calls(channel, 3) == core.call(3) == {"b0": 3}
        finally:
            backends["a0"].start()
        for node_id in (py_node, core_node):
            assert wait_for(lambda n=node_id: succeeded(server, A, n) == 5, 20), node_id
            assert wait_for(lambda n=node_id: succeeded(server, B, n) == 4, 20), node_id
        for cluster in (A, B):
            names = {
                n: {r.eds_service_name for r in server.lrs.reports(cluster, n)}
                for n in (py_node, core_node)
            }
            assert names[py_node] == names[core_node] == {f"{cluster}-eds"}
        assert server.lrs.reports("lrs-agg", py_node) == []
        assert server.lrs.reports("lrs-agg", core_node) == []
    finally:
        channel.close()
        core.close()
