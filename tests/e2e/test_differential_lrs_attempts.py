"""Differential: load reports count RPC attempts, not RPCs (gRFC A27 "Load
Reporting" with A44 retries; C-core counts in xds_cluster_impl's picker, once
per attempt, as pyxds does).  A route retries UNAVAILABLE twice (A44
``retry_on: unavailable``, ``num_retries: 2``); through pyxds and through
grpcio's C-core (``xds:///`` channel in a subprocess) the same calls give
the same reports: an RPC failing UNAVAILABLE three times is three issued and
three failed requests, an INTERNAL failure (not retried) one, a success one;
an RPC past its deadline is one failed request; a dropped RPC is not
retried (A6) and is one drop.
"""

from __future__ import annotations

from typing import Any

import pytest
from channel_fixtures import SERVICE, TARGET, Backend, CoreXdsClient, pyxds_calls
from channel_fixtures import wait_until as wait_for
from lrs_fixtures import one_cluster_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b

CLUSTER = "lrs-retried"
ZONE = ("r", "zr", "")


@pytest.fixture(scope="module")
def backend():
    started = Backend("r0").start()
    yield started
    started.stop()


def retried(backend: Backend, **cluster: Any) -> Any:
    """The scenario's snapshot; ``cluster``: more builders.cluster arguments,
    ``drops``: EDS drop categories."""
    drops = cluster.pop("drops", None)
    retries = b.retry_policy("unavailable", num_retries=2, base_interval=0.01, max_interval=0.02)
    return one_cluster_snapshot(
        b.cluster(CLUSTER, lrs_server=True, **cluster),
        "zr",
        backend.address,
        drops=drops,
        retry_policy=retries,
    )


@pytest.fixture(scope="module")
def server(backend):
    srv = ManagementServer(lrs_interval=1.0).start()
    srv.set_snapshot(retried(backend))
    yield srv
    srv.stop()


def drive(call) -> dict[str, int]:
    counts: dict[str, int] = {}
    for method, n, request in (("Who", 4, ""), ("Fail", 5, "UNAVAILABLE"), ("Fail", 3, "INTERNAL")):
        got = call(n, method=f"/{SERVICE}/{method}", request=request)
        for outcome, count in got.items():
            counts[outcome] = counts.get(outcome, 0) + count
    return counts


def test_each_attempt_is_one_issued_request_as_in_c_core(server):
    py_node, core_node = "lrs-attempts-pyxds", "lrs-attempts-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        ours = drive(lambda n, **kw: pyxds_calls(channel, n, **kw))
        theirs = drive(lambda n, **kw: core.call(n, **kw))
        assert ours == theirs == {"r0": 4, "error:UNAVAILABLE": 5, "error:INTERNAL": 3}
        want = {
            "issued": {ZONE: 4 + 5 * 3 + 3},
            "succeeded": {ZONE: 4},
            "errors": {ZONE: 5 * 3 + 3},
            "dropped": {},
            "total_dropped": 0,
        }
        for node_id in (core_node, py_node):
            got = lambda n=node_id: server.lrs.totals(CLUSTER, n).counts()  # noqa: E731
            assert wait_for(lambda g=got: g() == want, 20), (node_id, got())
    finally:
        channel.close()
        core.close()


def test_a_call_past_its_deadline_is_one_error_request_as_in_c_core(server):
    """C-core AddCallFinished(fail = status not OK): an RPC that runs out of
    deadline while the backend sleeps is one issued request and one error,
    none left in progress."""
    py_node, core_node = "lrs-deadline-pyxds", "lrs-deadline-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    sleep = {"method": f"/{SERVICE}/Sleep", "request": "1.0", "timeout": 0.2}
    try:
        assert pyxds_calls(channel, 2) == core.call(2) == {"r0": 2}
        ours, theirs = pyxds_calls(channel, 3, **sleep), core.call(3, **sleep)
        assert ours == theirs == {"error:DEADLINE_EXCEEDED": 3}
        want = {
            "issued": {ZONE: 5},
            "succeeded": {ZONE: 2},
            "errors": {ZONE: 3},
            "dropped": {},
            "total_dropped": 0,
        }
        for node_id in (core_node, py_node):
            totals = lambda n=node_id: server.lrs.totals(CLUSTER, n)  # noqa: E731
            assert wait_for(lambda t=totals: t().counts() == want, 20), (node_id, totals())
            assert wait_for(lambda t=totals: t().last_in_progress == {ZONE: 0}, 20), node_id
    finally:
        channel.close()
        core.close()


@pytest.mark.parametrize(
    "kind,cluster,words",
    [
        ("eds", {"drops": {"x": 1_000_000}}, "EDS-configured drop: x"),
        ("breaker", {"max_requests": 0}, "circuit breaker drop"),
    ],
)
def test_a_dropped_rpc_is_not_retried_and_is_one_drop_as_in_c_core(
    server, backend, kind, cluster, words
):
    """A6 "Retry Policy Capabilities": a pick that drops fails the RPC at once,
    without retries, even under a policy retrying UNAVAILABLE; so each RPC is
    one drop in the load report (categorized for EDS drops, uncategorized for
    the circuit breaker), in pyxds as in C-core."""
    server.set_snapshot(retried(backend, **cluster))
    py_node, core_node = f"lrs-drop-{kind}-pyxds", f"lrs-drop-{kind}-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        ours, theirs = pyxds_calls(channel, 4, details=True), core.call(4, details=True)
        assert ours == theirs == {f"error:UNAVAILABLE: {words}": 4}
        categories = cluster.get("drops", {})
        want = {
            "issued": {},
            "succeeded": {},
            "errors": {},
            "dropped": {name: 4 for name in categories},
            "total_dropped": 4,
        }
        for node_id in (core_node, py_node):
            got = lambda n=node_id: server.lrs.totals(CLUSTER, n).counts()  # noqa: E731
            assert wait_for(lambda g=got: g() == want, 20), (node_id, got())
    finally:
        server.set_snapshot(retried(backend))
        channel.close()
        core.close()
