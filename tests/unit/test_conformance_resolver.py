"""Conformance: XdsDependencyManager and xds resolver (gRFC A74 latest, A31,
A37, A75).  Scenarios from C-core xds_cluster_type_end2end_test.cc
(AggregateClusterTest), xds_core_end2end_test / LdsDeletionTest,
grpc-go internal/xds/resolver and xdsdepmgr tests, grpc-java XdsNameResolverTest."""

from __future__ import annotations

import json
import random

import grpc
import pytest

from pyxds.lb import registry
from pyxds.lb.api import PolicyFactory, Status
from pyxds.resolver.api import ResolverArgs, ResolverResult
from pyxds.resolver.dependency_manager import MAX_AGGREGATE_DEPTH, DependencyManager
from pyxds.resolver.dns import FakeDnsResolver
from pyxds.resolver.xds_config import (
    XDS_CONFIG_ATTRIBUTE,
    AggregateConfig,
    ClusterConfig,
    EndpointConfig,
    XdsConfig,
)
from pyxds.resolver.xds_resolver import XdsResolver
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock
from pyxds.testing.fake_xds_client import (
    CLUSTER_TYPE_URL,
    ENDPOINTS_TYPE_URL,
    LISTENER_TYPE_URL,
    ROUTE_CONFIG_TYPE_URL,
    FakeXdsClient,
    aggregate_cluster,
    dns_cluster,
    eds_cluster,
    make_cla,
    make_listener,
    make_route,
    make_route_config,
)

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class DM:
    """A dependency manager over a fake XdsClient, recording deliveries."""

    def __init__(self, authority: str = "svc", serializer_run=None) -> None:
        self.client = FakeXdsClient()
        self.dns = FakeDnsResolver()
        self.updates: list[XdsConfig | Status] = []
        self.dm = DependencyManager(
            self.client,
            "lds",
            authority,
            serializer_run or WorkSerializer().run,
            self.updates.append,
            dns_resolver=self.dns,
            clock=FakeClock(),
        )

    def push(self, *resources) -> None:
        self.client.push(*resources)

    @property
    def last(self):
        assert self.updates, "nothing delivered"
        return self.updates[-1]


def routes_to(*clusters):
    return [make_route(f"/{c}/", cluster=c) for c in clusters]


def with_routes(h, *clusters):
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to(*clusters)))


def leaf(h, name, address="10.0.0.1:80"):
    h.push(eds_cluster(name), make_cla(name, address))


# ----------------------------------------------------------------- aggregate graphs


def test_aggregate_listing_itself_and_a_leaf_routes_to_the_leaf():
    """C-core AggregateClusterTest.DependencyLoopWithLeafClusters: RPCs work."""
    h = DM()
    with_routes(h, "agg")
    h.push(aggregate_cluster("agg", "c1", "agg"))
    leaf(h, "c1")
    config = h.last
    assert isinstance(config, XdsConfig)
    assert config.clusters["agg"].children == AggregateConfig(("c1",))


def test_aggregate_loop_without_leaves_fails_saying_no_leaf_clusters():
    """C-core AggregateClusterTest.DependencyLoopWithNoLeafClusters: the RPC
    error is "aggregate cluster dependency graph for X has no leaf clusters"."""
    h = DM()
    with_routes(h, "cluster_name")
    h.push(aggregate_cluster("cluster_name", "new_cluster_1"))
    h.push(aggregate_cluster("new_cluster_1", "cluster_name"))
    entry = h.last.clusters["cluster_name"]
    assert entry == Status(
        UNAVAILABLE, "aggregate cluster dependency graph for cluster_name has no leaf clusters"
    )


def test_diamond_dependency_lists_each_leaf_once_at_its_first_position():
    """C-core AggregateClusterTest.DiamondDependency; A37: first position wins."""
    h = DM()
    with_routes(h, "top")
    h.push(aggregate_cluster("top", "c1", "mid"), aggregate_cluster("mid", "c1", "c2"))
    leaf(h, "c1")
    leaf(h, "c2", "10.0.0.2:80")
    config = h.last
    assert config.clusters["top"].children == AggregateConfig(("c1", "c2"))
    assert config.clusters["mid"].children == AggregateConfig(("c1", "c2"))
    assert h.client.watched(ENDPOINTS_TYPE_URL) == {"c1", "c2"}


def chain(h, aggregates):
    """Root aggregate "c0" -> c1 -> ... -> c{aggregates} (an EDS leaf)."""
    with_routes(h, "c0")
    for i in range(aggregates):
        h.push(aggregate_cluster(f"c{i}", f"c{i + 1}"))
    leaf(h, f"c{aggregates}")


def test_aggregate_chain_just_below_max_depth_works():
    """C-core AggregateClusterTest.RecursionDepthJustBelowMax: 15 aggregates."""
    h = DM()
    chain(h, MAX_AGGREGATE_DEPTH - 1)
    assert h.last.clusters["c0"].children == AggregateConfig((f"c{MAX_AGGREGATE_DEPTH - 1}",))


def test_aggregate_chain_at_max_depth_fails_with_exceeds_max_depth():
    """C-core AggregateClusterTest.RecursionMaxDepth: 16 aggregates ->
    "aggregate cluster graph exceeds max depth"."""
    h = DM()
    chain(h, MAX_AGGREGATE_DEPTH)
    entry = h.last.clusters["c0"]
    assert isinstance(entry, Status) and entry.code == UNAVAILABLE
    assert "aggregate cluster graph exceeds max depth" in entry.details


def test_aggregate_skips_children_that_do_not_exist():
    """A74 latest: a missing underlying cluster is skipped, not fatal."""
    h = DM()
    with_routes(h, "agg")
    h.push(aggregate_cluster("agg", "gone", "c1"))
    leaf(h, "c1")
    h.client.does_not_exist(CLUSTER_TYPE_URL, "gone")
    config = h.last
    assert config.clusters["agg"].children == AggregateConfig(("c1",))
    assert isinstance(config.clusters["gone"], Status)
    assert "gone" in config.clusters["gone"].details


def test_aggregate_waits_for_every_child_before_delivering():
    """A74: no config with a half-resolved aggregate graph."""
    h = DM()
    with_routes(h, "agg")
    h.push(aggregate_cluster("agg", "c1", "c2"))
    leaf(h, "c1")
    assert h.updates == []
    h.push(eds_cluster("c2"))
    assert h.updates == []
    h.push(make_cla("c2", "10.0.0.2:80"))
    assert h.last.clusters["agg"].children == AggregateConfig(("c1", "c2"))


def test_cluster_type_change_eds_to_aggregate_and_back():
    """grpc-go cdsbalancer cluster type change; TRAPS: type may change in any update."""
    h = DM()
    with_routes(h, "a")
    leaf(h, "a")
    h.push(aggregate_cluster("a", "b"))
    leaf(h, "b", "10.0.0.2:80")
    assert h.last.clusters["a"].children == AggregateConfig(("b",))
    assert h.client.watched(ENDPOINTS_TYPE_URL) == {"b"}
    h.push(eds_cluster("a"))
    assert h.client.watched(ENDPOINTS_TYPE_URL) == {"a"}
    h.push(make_cla("a", "10.0.0.1:80"))  # the server sends the re-subscribed EDS
    config = h.last
    assert isinstance(config.clusters["a"].children, EndpointConfig)
    assert "b" not in config.clusters
    assert h.client.watched(CLUSTER_TYPE_URL) == {"a"}


# ----------------------------------------------------------------- A74 rules


def test_cluster_error_before_data_stays_local_to_that_cluster():
    """A74 latest: cluster problems do not affect other clusters."""
    h = DM()
    with_routes(h, "good", "bad")
    leaf(h, "good")
    h.client.error(CLUSTER_TYPE_URL, "bad", "NACK: bad cluster")
    config = h.last
    assert isinstance(config, XdsConfig)
    assert isinstance(config.clusters["good"], ClusterConfig)
    assert config.clusters["bad"] == Status(UNAVAILABLE, "CDS resource bad: NACK: bad cluster")


def test_eds_does_not_exist_gives_null_endpoints_and_a_note_naming_it():
    """A74 latest: EDS problems go in the cluster's resolution_note."""
    h = DM()
    with_routes(h, "a")
    h.push(eds_cluster("a", eds_service_name="a-eds"))
    h.client.does_not_exist(ENDPOINTS_TYPE_URL, "a-eds")
    children = h.last.clusters["a"].children
    assert children.endpoints is None
    assert "EDS resource a-eds" in children.resolution_note
    assert "does not exist" in children.resolution_note


def test_rds_name_change_keeps_the_old_config_until_the_new_one_is_complete():
    """A74: the old route configuration stays in force until the new one
    (and its clusters) arrived."""
    h = DM()
    with_routes(h, "a")
    leaf(h, "a")
    count = len(h.updates)
    h.push(make_listener("lds", rds="rds2"))
    assert len(h.updates) == count
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"rds2"}
    h.push(make_route_config("rds2", routes_to("b")))
    assert len(h.updates) == count, "delivered before cluster b arrived"
    leaf(h, "b", "10.0.0.2:80")
    config = h.last
    assert config.route_config.name == "rds2"
    assert set(config.clusters) == {"b"}
    assert h.client.watched(CLUSTER_TYPE_URL) == {"b"}


def test_new_rds_name_failing_before_data_is_reported():
    """A74 latest: OnError before any OnResourceChanged reaches the resolver."""
    h = DM()
    with_routes(h, "a")
    leaf(h, "a")
    h.push(make_listener("lds", rds="rds2"))
    h.client.error(ROUTE_CONFIG_TYPE_URL, "rds2", "NACK: bad routes")
    assert h.last == Status(UNAVAILABLE, "RDS resource rds2: NACK: bad routes")


def test_listener_ambient_error_after_data_is_not_reported_as_an_error():
    """A74 latest: OnError after OnResourceChanged is ignored (a note only)."""
    h = DM()
    with_routes(h, "a")
    leaf(h, "a")
    h.client.error(LISTENER_TYPE_URL, "lds", "NACK: bad listener")
    assert all(isinstance(u, XdsConfig) for u in h.updates)


def test_route_config_without_matching_virtual_host_is_reported():
    """A74 latest: no virtual host for the authority is an error (C-core text)."""
    h = DM(authority="svc")
    h.push(make_listener("lds", rds="rds"))
    h.push(make_route_config("rds", routes_to("a"), domains=["other"]))
    assert h.last == Status(
        UNAVAILABLE, "RDS resource rds: could not find VirtualHost for svc in RouteConfiguration"
    )
    assert h.client.watched(CLUSTER_TYPE_URL) == set()


def test_dynamic_subscription_adds_a_cluster_not_in_the_routes_until_released():
    """A74 latest: subscriptions for clusters not named by the routes."""
    h = DM()
    with_routes(h, "a")
    leaf(h, "a")
    sub = h.dm.subscribe_cluster("dyn")
    h.dm._update()  # the scheduled update (run inline by the serializer already)
    assert "dyn" in h.client.watched(CLUSTER_TYPE_URL)
    leaf(h, "dyn", "10.0.0.3:80")
    assert isinstance(h.last.clusters["dyn"], ClusterConfig)
    sub.release()
    assert "dyn" not in h.last.clusters
    assert "dyn" not in h.client.watched(CLUSTER_TYPE_URL)


def test_reresolution_request_reruns_dns_for_every_logical_dns_cluster():
    """A74 latest: re-resolution triggers every LOGICAL_DNS cluster's DNS."""
    h = DM()
    with_routes(h, "d1", "d2")
    h.push(dns_cluster("d1", "one.example", 1), dns_cluster("d2", "two.example", 2))
    h.dns.complete("one.example", ["10.0.0.1:1"])
    h.dns.complete("two.example", ["10.0.0.2:2"])
    before = list(h.dns.requests)
    h.dm.request_reresolution()
    assert sorted(h.dns.requests[len(before) :]) == [("one.example", 1), ("two.example", 2)]


# ----------------------------------------------------------------- the resolver


class _Frozen:
    def __init__(self, text):
        self.text = text

    def __eq__(self, other):
        return isinstance(other, _Frozen) and other.text == self.text

    def __hash__(self):
        return hash(self.text)


class _StandIn(PolicyFactory):
    def __init__(self, name):
        self.name = name

    def parse_config(self, json_config):
        return _Frozen(json.dumps(json_config, sort_keys=True))

    def build(self, helper):  # pragma: no cover
        raise NotImplementedError


@pytest.fixture
def stand_in_policies():
    names = ("xds_cluster_manager_experimental", "cds_experimental")
    registry._load_builtins()
    saved = {n: registry._factories.get(n) for n in names}
    for n in names:
        registry.register(_StandIn(n))
    yield
    for n, factory in saved.items():
        if factory is None:
            registry.unregister(n)
        else:
            registry.register(factory)


class Resolver:
    def __init__(self):
        self.client = FakeXdsClient()
        self.results: list[ResolverResult] = []
        args = ResolverArgs(
            target="xds:///svc",
            authority="svc",
            serializer=WorkSerializer(),
            clock=FakeClock(),
            random=random.Random(5),
            on_result=self.results.append,
        )
        self.resolver = XdsResolver(
            args, xds_client=self.client, listener_name="lds", dns_resolver=FakeDnsResolver()
        )
        self.resolver.start()

    def push(self, *resources):
        self.client.push(*resources)

    def select(self, path="/a/m", metadata=()):
        return self.results[-1].config_selector.select(path, metadata)

    def lb_clusters(self):
        return set(json.loads(self.results[-1].lb_policy.config.text)["children"])


def good(r, *clusters):
    r.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to(*clusters)))
    for c in clusters:
        r.push(eds_cluster(c), make_cla(c, "10.0.0.1:80"))


@pytest.mark.usefixtures("stand_in_policies")
def test_socket_listener_after_a_good_config_stops_using_the_config():
    """A74 latest: "the received listener resource is a socket listener"
    makes the resolver stop using the previous resources."""
    r = Resolver()
    good(r, "a")
    call = r.select()
    assert call.status is None
    call.on_committed()
    r.push(make_listener("lds", rds="rds", api_listener=False))
    status = r.select().status
    assert status is not None and status.code == UNAVAILABLE
    assert "not an API listener" in status.details
    assert r.lb_clusters() == set()


@pytest.mark.usefixtures("stand_in_policies")
def test_missing_virtual_host_after_a_good_config_fails_rpcs_and_recovers():
    """A74 latest: no virtual host for the authority -> stop using the
    config; a fixed route config restores routing."""
    r = Resolver()
    good(r, "a")
    r.push(make_route_config("rds", routes_to("a"), domains=["elsewhere"]))
    status = r.select().status
    assert status is not None and "could not find VirtualHost for svc" in status.details
    r.push(make_route_config("rds", routes_to("a")))
    r.push(eds_cluster("a"), make_cla("a", "10.0.0.1:80"))
    call = r.select()
    assert call.status is None and call.call_attributes["cluster"] == "cluster:a"


@pytest.mark.usefixtures("stand_in_policies")
def test_listener_deleted_after_a_good_config_fails_rpcs_unavailable():
    """C-core LdsDeletionTest.ListenerDeleted: RPCs fail UNAVAILABLE naming the listener."""
    r = Resolver()
    good(r, "a")
    r.client.does_not_exist(LISTENER_TYPE_URL, "lds")
    status = r.select().status
    assert status.code == UNAVAILABLE and "lds" in status.details


@pytest.mark.usefixtures("stand_in_policies")
def test_rpc_cluster_ref_keeps_cluster_in_lb_config_and_xds_config():
    """A31 + A74 latest: a cluster an RPC holds stays in the LB config and
    keeps its subscription (TRAPS grpc-java#12152) until the RPC commits."""
    r = Resolver()
    good(r, "a", "b")
    call = r.select("/b/m")
    r.push(make_route_config("rds", routes_to("a")))
    assert r.lb_clusters() == {"cluster:a", "cluster:b"}
    assert "b" in r.results[-1].attributes[XDS_CONFIG_ATTRIBUTE].clusters
    assert "b" in r.client.watched(CLUSTER_TYPE_URL)
    call.on_committed()
    assert r.lb_clusters() == {"cluster:a"}
    assert "b" not in r.client.watched(CLUSTER_TYPE_URL)


@pytest.mark.usefixtures("stand_in_policies")
def test_cluster_re_added_to_routes_while_an_rpc_holds_it_is_kept():
    """A31: a cluster removed and re-added before its last RPC ends never
    leaves the LB config (grpc-go resolver cluster refs test)."""
    r = Resolver()
    good(r, "a", "b")
    call = r.select("/b/m")
    r.push(make_route_config("rds", routes_to("a")))
    r.push(make_route_config("rds", routes_to("a", "b")))
    call.on_committed()
    assert r.lb_clusters() == {"cluster:a", "cluster:b"}
    assert r.select("/b/m").call_attributes["cluster"] == "cluster:b"


@pytest.mark.usefixtures("stand_in_policies")
def test_identical_config_twice_publishes_nothing_new():
    """TRAPS configs and equality: the same config twice is a no-op."""
    r = Resolver()
    good(r, "a")
    count = len(r.results)
    r.push(make_route_config("rds", routes_to("a"), domains=["*"]))
    r.push(make_cla("a", "10.0.0.1:80"))
    assert len(r.results) == count


def test_logical_dns_failure_before_data_says_dns_resolution_failed_for_host_port():
    """C-core XdsDependencyManager::PopulateDnsUpdate words, as seen in
    AggregateClusterTest.ReconfigEdsWhileLogicalDnsChildFails."""
    h = DM()
    with_routes(h, "d")
    h.push(dns_cluster("d", "server.example.com", 443))
    h.dns.complete("server.example.com", "injected error")
    children = h.last.clusters["d"].children
    assert children.endpoints is None
    assert (
        children.resolution_note
        == "DNS resolution failed for server.example.com:443: injected error"
    )


def test_logical_dns_cluster_in_aggregate_waits_for_the_first_dns_answer():
    """A74: an aggregate including a LOGICAL_DNS cluster is delivered only
    once DNS answered (C-core AggregateClusterTest.EdsToLogicalDns)."""
    h = DM()
    with_routes(h, "agg")
    h.push(aggregate_cluster("agg", "eds", "dns"))
    leaf(h, "eds")
    h.push(dns_cluster("dns", "server.example.com", 443))
    assert h.updates == []
    h.dns.complete("server.example.com", ["10.0.0.9:443"])
    assert h.last.clusters["agg"].children == AggregateConfig(("eds", "dns"))


@pytest.mark.parametrize("target", ["xds:///", "xds://auth/", "xds:///svc/", "xds://auth"])
def test_target_without_a_service_name_or_ending_in_slash_is_rejected(target):
    """C-core XdsResolverFactory::IsValidUri: empty path or trailing "/" is invalid."""
    from pyxds.resolver.xds_resolver import parse_xds_target

    with pytest.raises(ValueError):
        parse_xds_target(target)


def test_endpoint_updates_keep_flowing_while_a_new_rds_name_is_pending():
    """C-core XdsDependencyManager keeps its current route config while the
    new RDS resource is outstanding; EDS changes are still delivered."""
    h = DM()
    with_routes(h, "a")
    leaf(h, "a")
    h.push(make_listener("lds", rds="rds2"))
    h.push(make_cla("a", "10.0.0.7:80"))
    config = h.last
    assert config.route_config.name == "rds"
    endpoints = config.clusters["a"].children.endpoints
    assert endpoints.priorities[0][0].endpoints[0].addresses == ("10.0.0.7:80",)
    h.push(make_route_config("rds2", routes_to("a")))
    assert h.last.route_config.name == "rds2"
    assert h.last.listener.route_config_name == "rds2"
