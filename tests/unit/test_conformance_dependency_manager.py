"""Conformance: the XdsDependencyManager (gRFC A74 latest, A37, A75, A88),
cases not covered by test_dependency_manager.py / test_conformance_resolver.py.

Sources (each test names its own): grpc-java
xds/src/test/java/io/grpc/xds/XdsDependencyManagerTest.java, grpc-go
internal/xds/xdsdepmgr/xds_dependency_manager_test.go, and C-core
src/core/resolver/xds/xds_dependency_manager.cc (MaybeReportUpdate,
PopulateClusterConfigMap) where the spec is silent.  Sans-IO: FakeXdsClient,
FakeDnsResolver, FakeClock; a queueing serializer where the order of events
matters.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from test_conformance_resolver import (  # noqa: F401  (stand_in_policies: a fixture)
    DM,
    Resolver,
    good,
    routes_to,
    stand_in_policies,
    with_routes,
)

from pyxds.lb.api import Status
from pyxds.resolver.xds_config import (
    XDS_CONFIG_ATTRIBUTE,
    AggregateConfig,
    ClusterConfig,
    EndpointConfig,
    XdsConfig,
)
from pyxds.testing.fake_xds_client import (
    CLUSTER_TYPE_URL,
    ENDPOINTS_TYPE_URL,
    LISTENER_TYPE_URL,
    ROUTE_CONFIG_TYPE_URL,
    aggregate_cluster,
    dns_cluster,
    eds_cluster,
    make_cla,
    make_listener,
    make_route_config,
)

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class QueueSerializer:
    """A serializer that runs nothing until ``drain()``: lets a test put
    events in flight and then act before they run."""

    def __init__(self) -> None:
        self.queue: list[Callable[[], None]] = []

    def run(self, fn: Callable[[], None]) -> None:
        self.queue.append(fn)

    def drain(self) -> None:
        for _ in range(1000):
            if not self.queue:
                return
            self.queue.pop(0)()
        raise AssertionError("serializer never drained")


def config_of(h: DM) -> XdsConfig:
    last = h.last
    assert isinstance(last, XdsConfig), last
    return last


def cds_watches(h: DM) -> set[str]:
    return h.client.watched(CLUSTER_TYPE_URL)


def eds_watches(h: DM) -> set[str]:
    return h.client.watched(ENDPOINTS_TYPE_URL)


def leaves(h: DM, *names: str, eds_name: str | None = None) -> None:
    for i, name in enumerate(names):
        h.push(eds_cluster(name, eds_service_name=eds_name))
        h.push(make_cla(eds_name or name, f"10.0.{i}.1:80"))


def multi_parent_tree(h: DM) -> None:
    """grpc-java testMultipleParentsInCdsTree's graph: root -> A, B;
    A -> A1, AB1; B -> B1, AB1; A1 -> A11, AB1; AB1 -> A11, AB11."""
    h.push(aggregate_cluster("root", "A", "B"))
    h.push(aggregate_cluster("A", "A1", "AB1"), aggregate_cluster("B", "B1", "AB1"))
    h.push(aggregate_cluster("A1", "A11", "AB1"), aggregate_cluster("AB1", "A11", "AB11"))
    leaves(h, "A11", "AB11", "B1")


ALL_EIGHT = {"root", "A", "B", "A1", "AB1", "A11", "AB11", "B1"}


# ----------------------------------------------------------------- aggregate graphs


def test_every_cluster_of_an_aggregate_graph_has_its_own_entry_and_leaves_in_dfs_order():
    """grpc-java XdsDependencyManagerTest.testMultipleParentsInCdsTree (the
    config has 8 clusters); A74 latest: the map holds every cluster "referenced
    in an aggregate cluster"; A75: leaves depth first, each once at its first
    position."""
    h = DM()
    with_routes(h, "root")
    multi_parent_tree(h)
    config = config_of(h)
    assert set(config.clusters) == ALL_EIGHT
    assert config.clusters["root"].children == AggregateConfig(("A11", "AB11", "B1"))
    assert config.clusters["A"].children == AggregateConfig(("A11", "AB11"))
    assert config.clusters["B"].children == AggregateConfig(("B1", "A11", "AB11"))
    assert config.clusters["AB1"].children == AggregateConfig(("A11", "AB11"))
    assert isinstance(config.clusters["A11"].children, EndpointConfig)
    assert len(h.updates) == 1, "a partial graph was delivered"


def test_subscribing_to_clusters_already_in_the_graph_changes_nothing():
    """grpc-java testMultipleParentsInCdsTree: subscriptions to the route's
    cluster and to a leaf of its graph, and their release, leave the config
    as it was (no new delivery, no new watch)."""
    h = DM()
    with_routes(h, "root")
    multi_parent_tree(h)
    count, watches = len(h.updates), len(h.client.watch_log)
    root = h.dm.subscribe_cluster("root")
    leaf = h.dm.subscribe_cluster("AB11")
    root.release()
    leaf.release()
    assert len(h.updates) == count
    assert len(h.client.watch_log) == watches
    assert cds_watches(h) == ALL_EIGHT


def test_a_subscription_keeps_the_old_graph_until_released():
    """grpc-java testMultipleParentsInCdsTree: with "root" subscribed, routes
    moving to A11 still deliver all 8 clusters; the release leaves only A11
    (and stops every other watch)."""
    h = DM()
    with_routes(h, "root")
    multi_parent_tree(h)
    root = h.dm.subscribe_cluster("root")
    h.push(make_route_config("rds", routes_to("A11")))
    assert set(config_of(h).clusters) == ALL_EIGHT
    root.release()
    assert set(config_of(h).clusters) == {"A11"}
    assert cds_watches(h) == {"A11"}
    assert eds_watches(h) == {"A11"}


def test_deleted_cluster_becomes_an_error_entry_and_its_eds_watch_stops():
    """grpc-java testCdsDeleteUnsubscribesChild; A88: does-not-exist drops the
    cached resource, so the cluster's EDS watch goes with it."""
    h = DM()
    with_routes(h, "A")
    h.push(eds_cluster("A", eds_service_name="eds_A"), make_cla("eds_A", "10.0.0.1:80"))
    assert isinstance(config_of(h).clusters["A"], ClusterConfig)
    h.client.does_not_exist(CLUSTER_TYPE_URL, "A")
    entry = config_of(h).clusters["A"]
    assert isinstance(entry, Status) and entry.code == UNAVAILABLE
    assert "CDS resource A" in entry.details and "does not exist" in entry.details
    assert eds_watches(h) == set()
    assert cds_watches(h) == {"A"}, "the route still names A: its watch stays"


def test_cycle_without_leaves_fails_both_clusters_and_is_unwatched_when_orphaned():
    """grpc-java testCdsCycleReclaimed (Java keeps clusterB OK; C-core's
    PopulateClusterConfigMap fails every aggregate of the loop with "has no leaf
    clusters", and pyxds follows C-core); moving the route to C stops the
    watches of the loop."""
    h = DM()
    with_routes(h, "A")
    h.push(aggregate_cluster("A", "B"), aggregate_cluster("B", "A"))
    config = config_of(h)
    for name in ("A", "B"):
        entry = config.clusters[name]
        assert isinstance(entry, Status)
        assert f"aggregate cluster dependency graph for {name} has no leaf clusters" in (
            entry.details
        )
    h.push(make_route_config("rds", routes_to("C")))
    leaves(h, "C")
    assert set(config_of(h).clusters) == {"C"}
    assert cds_watches(h) == {"C"}


def test_two_leaves_sharing_one_eds_resource_under_an_aggregate():
    """grpc-java testMultipleCdsReferToSameEds: root -> A, B, both EDS
    clusters of one EDS resource: one EDS watch, both leaves see it."""
    h = DM()
    with_routes(h, "root")
    h.push(aggregate_cluster("root", "A", "B"))
    h.push(eds_cluster("A", "shared"), eds_cluster("B", "shared"))
    assert eds_watches(h) == {"shared"}
    h.push(make_cla("shared", "10.0.0.4:80"))
    config = config_of(h)
    assert set(config.clusters) == {"root", "A", "B"}
    a, b = config.clusters["A"].children, config.clusters["B"].children
    assert a.endpoints is b.endpoints or a.endpoints == b.endpoints
    assert a.endpoints.cluster_name == "shared"
    assert h.client.watcher_count(ENDPOINTS_TYPE_URL, "shared") == 1


def test_aggregate_graph_change_is_delivered_whole_then_the_old_branch_is_unwatched():
    """grpc-java testChangeAggCluster: root -> A -> A1 -> (A11, A12) becomes
    root -> A -> A2 -> (A21, A22); A74: nothing is delivered until the new
    branch is complete, and then the old branch's watches stop."""
    h = DM()
    with_routes(h, "root")
    h.push(aggregate_cluster("root", "A"), aggregate_cluster("A", "A1"))
    h.push(aggregate_cluster("A1", "A11", "A12"))
    leaves(h, "A11", "A12")
    count = len(h.updates)
    h.push(aggregate_cluster("A", "A2"))
    h.push(aggregate_cluster("A2", "A21", "A22"))
    h.push(eds_cluster("A21"), eds_cluster("A22"), make_cla("A21", "10.1.0.1:80"))
    assert len(h.updates) == count, "delivered before A22's endpoints arrived"
    h.push(make_cla("A22", "10.1.0.2:80"))
    config = config_of(h)
    assert set(config.clusters) == {"root", "A", "A2", "A21", "A22"}
    assert config.clusters["root"].children == AggregateConfig(("A21", "A22"))
    assert cds_watches(h) == {"root", "A", "A2", "A21", "A22"}
    assert eds_watches(h) == {"A21", "A22"}


def test_cluster_named_by_a_route_and_under_an_aggregate_is_a_leaf_of_both():
    """A75 (leaf list of the aggregate: every leaf below it, deduplicated) and
    A74 latest: a cluster that is both a route's cluster and an aggregate's
    child is expanded once but still counts as the aggregate's leaf,
    whichever is visited first."""
    for routes in (("x", "agg"), ("agg", "x")):
        h = DM()
        with_routes(h, *routes)
        h.push(aggregate_cluster("agg", "x"))
        leaves(h, "x")
        config = config_of(h)
        assert config.clusters["agg"].children == AggregateConfig(("x",)), routes
        assert isinstance(config.clusters["x"], ClusterConfig)


def test_two_routed_aggregates_sharing_a_leaf_both_list_it():
    """A75 (an aggregate's leaves are all the leaves below it).  C-core 1.85's
    PopulateClusterConfigMap adds a cluster already expanded elsewhere to no
    second leaf list, so the second aggregate fails "has no leaf clusters"
    (tests/e2e/test_differential_aggregate_graph.py shows it;
    docs/differences-from-c-core.md)."""
    h = DM()
    with_routes(h, "agg1", "agg2")
    h.push(aggregate_cluster("agg1", "x"), aggregate_cluster("agg2", "y", "x"))
    leaves(h, "x", "y")
    config = config_of(h)
    assert config.clusters["agg1"].children == AggregateConfig(("x",))
    assert config.clusters["agg2"].children == AggregateConfig(("y", "x"))


def test_aggregate_child_with_an_eds_error_is_still_a_leaf_beside_a_dns_leaf():
    """grpc-go TestAggregateClusterChildError: an EDS child whose endpoints
    failed keeps its place in the leaf list (with a note) next to a working
    LOGICAL_DNS child; the config is delivered."""
    h = DM()
    with_routes(h, "agg")
    h.push(aggregate_cluster("agg", "err-cluster", "good-cluster"))
    h.push(eds_cluster("err-cluster", "eds"), dns_cluster("good-cluster", "localhost", 8081))
    h.client.error(ENDPOINTS_TYPE_URL, "eds", "EDS response contains an endpoint with zero weight")
    h.dns.complete("localhost", ["127.0.0.1:8081", "[::1]:8081"])
    config = config_of(h)
    assert config.clusters["agg"].children == AggregateConfig(("err-cluster", "good-cluster"))
    bad = config.clusters["err-cluster"].children
    assert bad.endpoints is None
    assert "EDS resource eds: EDS response contains an endpoint with zero weight" in (
        bad.resolution_note
    )
    good_dns = config.clusters["good-cluster"].children
    assert good_dns.endpoints is not None and good_dns.resolution_note == ""


def test_leaf_under_an_aggregate_changing_to_logical_dns_is_delivered_after_dns_answers():
    """Changes inside the graph (grpc-go cdsbalancer
    TestAggregateClusterSuccess_ThenUpdateChildClusters, as a
    dependency-manager case): a child switching EDS -> LOGICAL_DNS is applied
    only once DNS answered, and its EDS watch stops."""
    h = DM()
    with_routes(h, "agg")
    h.push(aggregate_cluster("agg", "a", "b"))
    leaves(h, "a", "b")
    count = len(h.updates)
    h.push(dns_cluster("b", "b.example", 443))
    assert len(h.updates) == count, "delivered before DNS answered"
    h.dns.complete("b.example", ["10.2.0.1:443"])
    config = config_of(h)
    assert config.clusters["b"].cluster.kind == "LOGICAL_DNS"
    assert config.clusters["agg"].children == AggregateConfig(("a", "b"))
    assert eds_watches(h) == {"a"}


# ----------------------------------------------------------------- listener / routes


def test_route_config_moving_from_rds_to_inline_stops_the_rds_watch():
    """grpc-go TestRouteResourceChangeToInline; C-core OnListenerUpdate
    (inlined RouteConfig cancels the RDS watch)."""
    h = DM()
    with_routes(h, "a")
    leaves(h, "a")
    h.push(make_listener("lds", inline=make_route_config("inline", routes_to("a"))))
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == set()
    assert config_of(h).route_config.name == "inline"
    h.push(make_route_config("rds", routes_to("zzz")))
    assert config_of(h).route_config.name == "inline", "a stale RDS resource was used"


def test_listener_updates_while_the_route_config_is_missing_deliver_nothing():
    """grpc-go xds_resolver_test TestResolverMultipleLDSUpdates: listener
    updates naming the same absent route configuration (only max stream
    duration differs) deliver nothing; the route configuration's arrival
    delivers the newest listener."""
    h = DM()
    h.push(make_listener("lds", rds="rds"))
    h.push(make_listener("lds", rds="rds", max_stream_duration=1.0))
    assert h.updates == []
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"rds"}
    h.push(make_route_config("rds", routes_to("a")))
    leaves(h, "a")
    assert config_of(h).listener.max_stream_duration == 1.0


def test_listener_ambient_error_becomes_every_clusters_note_and_clears():
    """grpc-go TestAmbientError; C-core OnListenerAmbientError
    (lds_resolution_note_ joins each EDS cluster's notes); A88: the data stays."""
    h = DM()
    with_routes(h, "a")
    leaves(h, "a")
    h.client.error(LISTENER_TYPE_URL, "lds", "NACK: bad listener")
    children = config_of(h).clusters["a"].children
    assert children.endpoints is not None
    assert children.resolution_note == "LDS resource lds: NACK: bad listener"
    h.push(make_listener("lds", rds="rds"))  # the same resource again: cleared
    assert config_of(h).clusters["a"].children.resolution_note == ""


def test_endpoint_ambient_error_keeps_the_endpoints_and_adds_a_note():
    """grpc-go TestEndpointAmbientError; C-core OnEndpointAmbientError; A88."""
    h = DM()
    with_routes(h, "a")
    leaves(h, "a")
    h.client.error(ENDPOINTS_TYPE_URL, "a", "NACK: bad endpoints")
    children = config_of(h).clusters["a"].children
    assert children.endpoints is not None and children.endpoints.endpoint_count == 1
    assert children.resolution_note == "EDS resource a: NACK: bad endpoints"


def test_endpoints_deleted_after_data_drop_the_endpoints_but_keep_the_cluster():
    """A88: does-not-exist is a resource error, so the endpoints go (C-core
    OnEndpointUpdate with a non-OK status resets them) and the cluster stays
    with a note; other clusters are untouched."""
    h = DM()
    with_routes(h, "a", "b")
    leaves(h, "a", "b")
    h.client.does_not_exist(ENDPOINTS_TYPE_URL, "a")
    config = config_of(h)
    children = config.clusters["a"].children
    assert children.endpoints is None
    assert "EDS resource a" in children.resolution_note
    assert "does not exist" in children.resolution_note
    assert config.clusters["b"].children.endpoints is not None


# ----------------------------------------------------------------- subscriptions


def test_dynamic_subscription_to_an_unknown_cluster_is_an_error_entry_once_it_does_not_exist():
    """grpc-java testDelayedSubscription: a subscription to a cluster the
    server does not have ends as an UNAVAILABLE entry naming it; when the
    cluster appears the entry is a config."""
    h = DM()
    with_routes(h, "a")
    leaves(h, "a")
    h.dm.subscribe_cluster("root_c")
    h.client.does_not_exist(CLUSTER_TYPE_URL, "root_c")
    entry = config_of(h).clusters["root_c"]
    assert isinstance(entry, Status) and entry.code == UNAVAILABLE
    assert "root_c" in entry.details
    h.push(aggregate_cluster("root_c", "a"))
    assert config_of(h).clusters["root_c"].children == AggregateConfig(("a",))


def test_unresolved_dynamic_subscription_holds_back_updates_as_in_c_core():
    """C-core XdsDependencyManager::MaybeReportUpdate counts subscribed
    clusters in have_all_resources, so nothing is delivered while one is
    outstanding (A74 says no more; grpc-go
    TestUpdateWithUnresolvedDynamicSubscription delivers without it).  The
    held-back change arrives with the subscribed cluster."""
    h = DM()
    with_routes(h, "a")
    leaves(h, "a")
    count = len(h.updates)
    h.dm.subscribe_cluster("new-cluster")
    h.push(make_cla("a", "10.0.9.9:80"))
    assert len(h.updates) == count
    h.push(eds_cluster("new-cluster"), make_cla("new-cluster", "10.0.8.8:80"))
    config = config_of(h)
    assert set(config.clusters) == {"a", "new-cluster"}
    endpoint = config.clusters["a"].children.endpoints.priorities[0][0].endpoints[0]
    assert endpoint.addresses == ("10.0.9.9:80",)


# ----------------------------------------------------------------- shutdown


@pytest.mark.parametrize(
    "kind", [LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL, CLUSTER_TYPE_URL, ENDPOINTS_TYPE_URL]
)
def test_update_in_flight_at_shutdown_delivers_nothing(kind):
    """grpc-java ldsUpdateAfterShutdown / rdsUpdateAfterShutdown /
    cdsUpdateAfterShutdown / edsUpdateAfterShutdown: an event already queued
    on the serializer when the manager shuts down reports nothing, and every
    watch is cancelled."""
    serializer = QueueSerializer()
    h = DM(serializer_run=serializer.run)
    with_routes(h, "a")
    serializer.drain()
    leaves(h, "a")
    serializer.drain()
    count = len(h.updates)
    assert count == 1
    update = {
        LISTENER_TYPE_URL: make_listener("lds", rds="rds2"),
        ROUTE_CONFIG_TYPE_URL: make_route_config("rds", routes_to("b")),
        CLUSTER_TYPE_URL: eds_cluster("a", "a2"),
        ENDPOINTS_TYPE_URL: make_cla("a", "10.0.0.2:80"),
    }[kind]
    h.push(update)
    assert serializer.queue, "the event did not go through the serializer"
    h.dm.shutdown()
    serializer.drain()
    assert len(h.updates) == count
    for type_url in (LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL, CLUSTER_TYPE_URL):
        assert h.client.watched(type_url) == set(), type_url
    assert eds_watches(h) == set()


def test_subscribe_after_shutdown_delivers_nothing_and_watches_nothing():
    """grpc-java subscribeToClusterAfterShutdown."""
    h = DM()
    with_routes(h, "a")
    leaves(h, "a")
    count, watches = len(h.updates), len(h.client.watch_log)
    h.dm.shutdown()
    subscription = h.dm.subscribe_cluster("CDS")
    subscription.release()
    assert len(h.updates) == count
    assert len(h.client.watch_log) == watches


# ----------------------------------------------------------------- with the resolver


@pytest.mark.usefixtures("stand_in_policies")
def test_cluster_dropped_by_a_route_change_is_watched_until_the_new_config_is_delivered():
    """A74 latest ("These cluster refs will also hold a subscription ... until
    the cluster is removed from the xds_cluster_manager LB policy config");
    A31.  Routes moving from a to b: a stays watched (and in the delivered
    XdsConfig) while b is outstanding, and its watch stops once the config
    without it is delivered and no RPC holds it."""
    r = Resolver()
    good(r, "a")
    count = len(r.results)
    r.push(make_route_config("rds", routes_to("b")))
    assert "a" in r.client.watched(CLUSTER_TYPE_URL), "a unwatched before the new config"
    assert "a" in r.client.watched(ENDPOINTS_TYPE_URL)
    assert len(r.results) == count
    r.push(eds_cluster("b"), make_cla("b", "10.0.0.2:80"))
    assert r.lb_clusters() == {"cluster:b"}
    assert set(r.results[-1].attributes[XDS_CONFIG_ATTRIBUTE].clusters) == {"b"}
    assert r.client.watched(CLUSTER_TYPE_URL) == {"b"}
    assert r.client.watched(ENDPOINTS_TYPE_URL) == {"b"}
