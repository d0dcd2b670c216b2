"""Differential load reporting and circuit breaking for a LOGICAL_DNS cluster
(gRFC A27 "Load Reporting", A37 "Logical DNS"; grpc-go
``clusterimpl/tests/balancer_test.go`` TestLRSLogicalDNS and
TestCircuitBreakingLogicalDNS): pyxds and grpcio's C-core (``xds:///``
channel in a subprocess) call the same LOGICAL_DNS cluster with
``lrs_server: self`` on the same pyxds.server and must send the same
reports: the cluster name, no EDS service name, one locality with every
field empty (the ``locality`` message present, as C-core writes it), the
same counts; and with ``max_requests`` 0 the same "circuit breaker drop"
for every call, reported as uncategorized drops.
"""

from __future__ import annotations

import pytest
from channel_fixtures import SERVICE, TARGET, Backend, CoreXdsClient, pyxds_calls
from channel_fixtures import wait_until as wait_for
from lrs_fixtures import idle, one_cluster_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

DNS = "lrs-dns"
NO_LOCALITY = ("", "", "")
WHO = f"/{SERVICE}/Who"
FAIL = f"/{SERVICE}/Fail"


@pytest.fixture(scope="module")
def backend():
    started = Backend("d0").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer(lrs_interval=1.0).start()
    yield srv
    srv.stop()


def dns_snapshot(backend: Backend, max_requests: int | None = None) -> Snapshot:
    host, port = backend.address.rsplit(":", 1)
    cluster = b.cluster(
        DNS,
        kind="LOGICAL_DNS",
        dns_host=host,
        dns_port=int(port),
        lrs_server=True,
        max_requests=max_requests,
    )
    return one_cluster_snapshot(cluster)


def drive(call) -> dict[str, int]:
    counts: dict[str, int] = {}
    for method, n in ((WHO, 20), (FAIL, 6)):
        for outcome, count in call(n, method=method, details=True, request="INTERNAL").items():
            counts[outcome] = counts.get(outcome, 0) + count
    return counts


def shape(server: ManagementServer, node_id: str) -> set[tuple[str, str, bool, tuple]]:
    """(cluster, EDS service name, locality present, locality) of every
    locality entry the node reported."""
    return {
        (
            r.stats.cluster_name,
            r.stats.cluster_service_name,
            s.HasField("locality"),
            (s.locality.region, s.locality.zone, s.locality.sub_zone),
        )
        for r in server.lrs.reports(DNS, node_id)
        for s in r.stats.upstream_locality_stats
    }


def test_logical_dns_load_reports_agree_with_c_core(server, backend):
    server.set_snapshot(dns_snapshot(backend))
    py_node, core_node = "lrs-dns-pyxds", "lrs-dns-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        ours = drive(lambda n, **kw: pyxds_calls(channel, n, **kw))
        theirs = drive(lambda n, **kw: core.call(n, **kw))
        assert ours == theirs
        assert ours["d0"] == 20 and sum(ours.values()) == 26, ours
        want = {
            "issued": {NO_LOCALITY: 26},
            "succeeded": {NO_LOCALITY: 20},
            "errors": {NO_LOCALITY: 6},
            "dropped": {},
            "total_dropped": 0,
        }
        for node_id in (core_node, py_node):
            got = lambda n=node_id: server.lrs.totals(DNS, n).counts()  # noqa: E731
            assert wait_for(lambda g=got: g() == want, 20), (node_id, got())
        assert shape(server, py_node) == shape(server, core_node) == {(DNS, "", True, NO_LOCALITY)}
    finally:
        channel.close()
        core.close()


def test_logical_dns_circuit_breaker_drops_as_c_core_does(server, backend):
    """max_requests 0: C-core's picker drops when the calls in flight are at
    or above the limit, so every call is a "circuit breaker drop"."""
    server.set_snapshot(dns_snapshot(backend, max_requests=0))
    py_node, core_node = "lrs-dns-cb-pyxds", "lrs-dns-cb-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        ours = pyxds_calls(channel, 9, details=True)
        theirs = core.call(9, details=True)
        assert ours == theirs == {"error:UNAVAILABLE: circuit breaker drop": 9}
        want = {"issued": {}, "succeeded": {}, "errors": {}, "dropped": {}, "total_dropped": 9}
        for node_id in (core_node, py_node):
            got = lambda n=node_id: server.lrs.totals(DNS, n).counts()  # noqa: E731
            assert wait_for(lambda g=got: g() == want, 20), (node_id, got())
    finally:
        channel.close()
        core.close()


def test_only_the_clusters_the_lrs_server_asks_for_are_reported_as_c_core_does(server, backend):
    """C-core ClientLoadReportingTest.HonorsClustersRequestedByLrsServer and
    lrs_client.cc BuildLoadReportSnapshotLocked: while the LRS server asks
    for another cluster, nothing is reported for this one and its counts are
    cleared at each report, so once the server asks for it, the reports
    carry only the calls made after that.

    When: the clients' first report interval is a minute, so the calls are
    made before any report; the interval then set to 1 s restarts both
    report timers (A27; C-core ``LrsCall::OnRecvMessage``), and the first
    report after it (sent even when empty: both skip an all-zero report
    only after another) is the one that cleared the calls."""
    server.set_snapshot(dns_snapshot(backend))
    server.lrs.configure(interval=60.0, clusters=["bogus"])
    py_node, core_node = "lrs-dns-asked-pyxds", "lrs-dns-asked-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        before = (pyxds_calls(channel, 7), core.call(7))
        assert before[0] == before[1] == {"d0": 7}
        nodes = lambda: {r.node.id for r in server.lrs.initial_requests()}  # noqa: E731
        assert wait_for(lambda: {py_node, core_node} <= nodes(), 10)
        assert server.lrs.report_count(py_node) == server.lrs.report_count(core_node) == 0
        server.lrs.configure(interval=1.0)
        for node_id in (py_node, core_node):
            assert wait_for(lambda n=node_id: server.lrs.report_count(n) == 1, 20), node_id
            assert server.lrs.reports(DNS, node_id) == [], node_id
        server.lrs.configure(clusters=[DNS])
        after = (pyxds_calls(channel, 4), core.call(4))
        assert after[0] == after[1] == {"d0": 4}
        want = {NO_LOCALITY: 4}
        for node_id in (core_node, py_node):
            got = lambda n=node_id: server.lrs.totals(DNS, n).counts()["succeeded"]  # noqa: E731
            assert wait_for(lambda g=got: g() == want, 20), (node_id, got())
            # one more interval: its all-zero report (sent: the last was not)
            assert wait_for(lambda n=node_id: idle(server.lrs.last_report(DNS, n)), 20), node_id
            assert server.lrs.totals(DNS, node_id).counts()["issued"] == want, node_id
    finally:
        server.lrs.configure(interval=1.0, clusters=None)
        channel.close()
        core.close()
