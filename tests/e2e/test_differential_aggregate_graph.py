"""Differential: aggregate cluster graphs whose clusters are also named
directly by routes, through pyxds and through grpcio's C-core ``xds:///``
channel (a subprocess, CoreXdsClient) against the same pyxds.server.

A75 (and A74 latest's cluster map): an aggregate's leaf list is every leaf
cluster below it, deduplicated.  The question these tests settle is what a
cluster that a route names *and* that sits under an aggregate does to the
aggregate's leaf list (test_conformance_dependency_manager.py
test_cluster_named_by_a_route_and_under_an_aggregate_is_a_leaf_of_both)."""

from __future__ import annotations

import pytest
from channel_fixtures import (
    SERVICE,
    TARGET,
    Backend,
    CoreXdsClient,
    pyxds_calls,
    route,
    snapshot,
    wait_until,
)

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NODE = "differential-aggregate-graph"
WHO = f"/{SERVICE}/Who"
SLEEP = f"/{SERVICE}/Sleep"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def backend(request):
    """A backend of its own per case, so that an answer from it proves the
    client applied this case's snapshot (not the previous case's)."""
    started = Backend(f"leaf-{request.node.callspec.id}").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=NODE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server):
    ch = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=NODE))
    yield ch
    ch.close()


def graph(backend: Backend, sleep_cluster: str, other_cluster: str, **aggregates: str) -> Snapshot:
    """Route 1 (the Sleep method) names ``sleep_cluster``, route 2 (every
    other method) ``other_cluster``; ``aggregates`` maps each aggregate
    cluster to its only child; the EDS cluster ``leaf`` holds the backend."""
    base = snapshot(
        [route(path=SLEEP, cluster=sleep_cluster), route(prefix="", cluster=other_cluster)],
        {"leaf": [[backend.address]]},
    )
    listener_t, route_t, cluster_t, eds_t = list(base._by_type)
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=[
            *base.resources(cluster_t).values(),
            *(b.cluster(name, aggregate_children=[child]) for name, child in aggregates.items()),
        ],
        endpoints=list(base.resources(eds_t).values()),
    )


NO_LEAVES = "error:UNAVAILABLE: aggregate cluster dependency graph for {} has no leaf clusters"


@pytest.mark.parametrize(
    ("sleep_cluster", "other_cluster", "aggregates", "c_core_fails"),
    [
        # C-core expands route clusters in sorted order; "a-agg" < "leaf".
        ("leaf", "a-agg", {"a-agg": "leaf"}, None),
        # "leaf" < "z-agg": the leaf is expanded first, and C-core's
        # PopulateClusterConfigMap then adds nothing to z-agg's leaf list.
        ("leaf", "z-agg", {"z-agg": "leaf"}, "z-agg"),
        # Two aggregates sharing their leaf: the second one expanded loses it.
        ("agg1", "agg2", {"agg1": "leaf", "agg2": "leaf"}, "agg2"),
    ],
    ids=["aggregate-sorts-first", "leaf-sorts-first", "two-aggregates-share-a-leaf"],
)
def test_aggregate_over_a_cluster_that_is_expanded_elsewhere_too(
    server, backend, core, channel, sleep_cluster, other_cluster, aggregates, c_core_fails
):
    """pyxds: every route reaches the leaf (A75: an aggregate's leaves are all
    the leaves below it).  C-core 1.85 fails the aggregate that is expanded
    after the leaf was already expanded elsewhere, depending on the clusters'
    names (docs/differences-from-c-core.md); the test accepts either C-core
    answer so that a fixed C-core still passes, and asserts pyxds exactly."""
    served = {backend.name: 3}
    server.set_snapshot(graph(backend, sleep_cluster, other_cluster, **aggregates))
    for method in (WHO, SLEEP):
        assert wait_until(lambda m=method: pyxds_calls(channel, 3, method=m) == served, 10)
    theirs = {}

    def core_settled() -> bool:
        nonlocal theirs
        theirs = core.call(3, details=True, wait_for_ready=False)
        return theirs == served or (
            c_core_fails is not None and theirs == {NO_LEAVES.format(c_core_fails): 3}
        )

    assert wait_until(core_settled, 10), theirs
    if c_core_fails is None:
        assert theirs == served
    for method in (WHO, SLEEP):
        assert pyxds_calls(channel, 3, method=method) == served
