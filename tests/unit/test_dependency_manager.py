"""XdsDependencyManager (gRFC A74 latest, A37, A75): sans-IO with FakeXdsClient."""

from __future__ import annotations

import threading

import grpc
import pytest

from pyxds.lb.api import Status
from pyxds.resolver.dependency_manager import (
    DNS_RETRY_INITIAL,
    MAX_AGGREGATE_DEPTH,
    DependencyManager,
)
from pyxds.resolver.dns import FakeDnsResolver, ThreadedDnsResolver
from pyxds.resolver.xds_config import AggregateConfig, ClusterConfig, EndpointConfig, XdsConfig
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
from pyxds.xds.resources.types import RouteConfiguration, VirtualHost


class Harness:
    def __init__(self, authority: str = "svc", dns=None) -> None:
        self.client = FakeXdsClient()
        self.dns = dns if dns is not None else FakeDnsResolver()
        self.clock = FakeClock()
        self.serializer = WorkSerializer()
        self.updates: list[XdsConfig | Status] = []
        self.dm = DependencyManager(
            self.client,
            "lds",
            authority,
            self.serializer.run,
            self.updates.append,
            dns_resolver=self.dns,
            clock=self.clock,
        )

    def push(self, *resources) -> None:
        self.client.push(*resources)

    @property
    def last(self):
        assert self.updates, "no update delivered"
        return self.updates[-1]

    def watched(self, type_url: str) -> set[str]:
        return self.client.watched(type_url)


def routes_to(*clusters: str):
    return [make_route(f"/{c}/", cluster=c) for c in clusters]


def setup_basic(h: Harness, *clusters: str) -> None:
    h.push(make_listener("lds", rds="rds"))
    h.push(make_route_config("rds", routes_to(*clusters)))
    for c in clusters:
        h.push(eds_cluster(c))
        h.push(make_cla(c, f"10.0.0.1:{len(c)}"))


def test_config_delivered_only_when_listener_routes_clusters_and_endpoints_all_arrived():
    h = Harness()
    assert h.watched(LISTENER_TYPE_URL) == {"lds"}
    h.push(make_listener("lds", rds="rds"))
    assert h.watched(ROUTE_CONFIG_TYPE_URL) == {"rds"}
    h.push(make_route_config("rds", routes_to("a")))
    assert h.watched(CLUSTER_TYPE_URL) == {"a"}
    h.push(eds_cluster("a"))
    assert h.watched(ENDPOINTS_TYPE_URL) == {"a"}
    assert h.updates == []
    h.push(make_cla("a", "10.0.0.1:80"))
    assert len(h.updates) == 1
    config = h.last
    assert isinstance(config, XdsConfig)
    assert config.route_config.name == "rds"
    assert config.virtual_host.name == "rds-vh"
    entry = config.clusters["a"]
    assert isinstance(entry, ClusterConfig)
    assert isinstance(entry.children, EndpointConfig)
    assert entry.children.endpoints.endpoint_count == 1


def test_inline_route_config_needs_no_rds_watch():
    h = Harness()
    h.push(make_listener("lds", inline=make_route_config("inline", routes_to("a"))))
    assert h.watched(ROUTE_CONFIG_TYPE_URL) == set()
    h.push(eds_cluster("a"), make_cla("a", "10.0.0.1:80"))
    assert h.last.route_config.name == "inline"


def test_route_update_naming_new_cluster_is_not_applied_until_its_cds_and_eds_arrived():
    h = Harness()
    setup_basic(h, "a")
    assert len(h.updates) == 1
    h.push(make_route_config("rds", routes_to("a", "b")))
    assert "b" in h.watched(CLUSTER_TYPE_URL)
    assert len(h.updates) == 1, "applied a route config before cluster b arrived (tear)"
    h.push(eds_cluster("b"))
    assert len(h.updates) == 1, "applied before b's endpoints arrived (tear)"
    h.push(make_cla("b", "10.0.0.2:80"))
    assert len(h.updates) == 2
    assert set(h.last.clusters) == {"a", "b"}
    assert len(h.last.virtual_host.routes) == 2


def test_eds_service_name_is_the_endpoint_resource_watched():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("a")))
    h.push(eds_cluster("a", eds_service_name="a-eds"))
    assert h.watched(ENDPOINTS_TYPE_URL) == {"a-eds"}
    h.push(make_cla("a-eds", "10.0.0.1:80"))
    assert h.last.clusters["a"].children.endpoints.cluster_name == "a-eds"


def test_aggregate_cluster_resolves_to_eds_and_logical_dns_leaves_in_order():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("agg")))
    h.push(aggregate_cluster("agg", "eds", "dns"))
    h.push(eds_cluster("eds"), dns_cluster("dns", "backend.example", 8080))
    assert h.dns.requests == [("backend.example", 8080)]
    h.push(make_cla("eds", "10.0.0.1:80"))
    assert h.updates == [], "delivered before DNS answered"
    h.dns.complete("backend.example", ["10.1.0.1:8080", "10.1.0.2:8080"])
    config = h.last
    assert config.clusters["agg"].children == AggregateConfig(("eds", "dns"))
    dns_entry = config.clusters["dns"].children
    (priority,) = dns_entry.endpoints.priorities
    (locality,) = priority
    # A61: all DNS addresses form one endpoint.
    assert [e.addresses for e in locality.endpoints] == [("10.1.0.1:8080", "10.1.0.2:8080")]


def test_aggregate_cycle_contributes_no_leaves_and_is_not_an_error():
    """C-core semantics (xds_cluster_type_end2end_test DependencyLoopWith*):
    a cluster already being expanded adds nothing; the rest of the graph works."""
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("a", "z")))
    h.push(aggregate_cluster("a", "b"), aggregate_cluster("b", "a", "leaf"))
    h.push(eds_cluster("leaf"), make_cla("leaf", "10.0.0.1:80"))
    h.push(eds_cluster("z"), make_cla("z", "10.0.0.9:80"))
    config = h.last
    assert isinstance(config, XdsConfig)
    assert config.clusters["a"].children == AggregateConfig(("leaf",))
    assert config.clusters["b"].children == AggregateConfig(("leaf",))
    assert isinstance(config.clusters["z"], ClusterConfig)


def test_aggregate_graph_of_16_levels_works_and_17_levels_is_an_error():
    def chain(levels: int) -> Harness:
        h = Harness()
        h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("c0")))
        for i in range(levels - 1):
            h.push(aggregate_cluster(f"c{i}", f"c{i + 1}"))
        h.push(eds_cluster(f"c{levels - 1}"), make_cla(f"c{levels - 1}", "10.0.0.1:80"))
        return h

    ok = chain(MAX_AGGREGATE_DEPTH).last
    assert ok.clusters["c0"].children == AggregateConfig((f"c{MAX_AGGREGATE_DEPTH - 1}",))
    h = chain(MAX_AGGREGATE_DEPTH + 1)
    bad = h.last
    assert isinstance(bad.clusters["c0"], Status)
    assert "exceeds max depth of 16" in bad.clusters["c0"].details
    assert "c16" not in h.watched(CLUSTER_TYPE_URL), "watched beyond the depth limit"
    assert "c15" in h.watched(CLUSTER_TYPE_URL)


def test_aggregate_missing_child_is_skipped_and_duplicates_keep_first_position():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("agg")))
    h.push(aggregate_cluster("agg", "sub1", "gone", "sub2"))
    h.push(aggregate_cluster("sub1", "x", "y"), aggregate_cluster("sub2", "y", "x", "w"))
    for leaf in ("x", "y", "w"):
        h.push(eds_cluster(leaf), make_cla(leaf, "10.0.0.1:80"))
    assert h.updates == []
    h.client.does_not_exist(CLUSTER_TYPE_URL, "gone")
    config = h.last
    assert config.clusters["agg"].children == AggregateConfig(("x", "y", "w"))
    assert config.clusters["gone"] == Status(
        grpc.StatusCode.UNAVAILABLE, "CDS resource gone does not exist"
    )


def test_aggregate_whose_children_all_missing_is_an_error_naming_them():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("agg")))
    h.push(aggregate_cluster("agg", "m1", "m2"))
    h.client.does_not_exist(CLUSTER_TYPE_URL, "m1")
    h.client.error(CLUSTER_TYPE_URL, "m2", "connection refused")
    entry = h.last.clusters["agg"]
    assert isinstance(entry, Status)
    assert "aggregate cluster dependency graph for agg has no leaf clusters" in entry.details
    assert "CDS resource m1 does not exist" in entry.details
    assert "CDS resource m2: connection refused" in entry.details


def test_listener_does_not_exist_reports_not_found_naming_the_resource():
    h = Harness()
    h.client.does_not_exist(LISTENER_TYPE_URL, "lds")
    assert h.last == Status(grpc.StatusCode.NOT_FOUND, "LDS resource lds does not exist")


def test_route_config_does_not_exist_after_good_config_is_reported():
    h = Harness()
    setup_basic(h, "a")
    h.client.does_not_exist(ROUTE_CONFIG_TYPE_URL, "rds")
    assert h.last == Status(grpc.StatusCode.NOT_FOUND, "RDS resource rds does not exist")


def test_route_config_error_before_data_is_reported_but_after_data_is_ignored():
    h = Harness()
    h.push(make_listener("lds", rds="rds"))
    h.client.error(ROUTE_CONFIG_TYPE_URL, "rds", "xDS server unreachable")
    assert h.last == Status(grpc.StatusCode.UNAVAILABLE, "RDS resource rds: xDS server unreachable")
    h2 = Harness()
    setup_basic(h2, "a")
    h2.client.error(ROUTE_CONFIG_TYPE_URL, "rds", "NACK: bad route")
    assert all(isinstance(u, XdsConfig) for u in h2.updates), "ambient error reported as failure"
    assert h2.last.route_config.name == "rds"
    assert h2.last.clusters["a"].children.resolution_note == "RDS resource rds: NACK: bad route"


def test_socket_listener_is_reported_as_not_an_api_listener():
    h = Harness()
    h.push(make_listener("lds", api_listener=False))
    assert h.last == Status(grpc.StatusCode.UNAVAILABLE, "LDS resource lds: not an API listener")


def test_no_matching_virtual_host_names_the_authority_and_route_config():
    h = Harness(authority="other.example")
    h.push(make_listener("lds", rds="rds"))
    h.push(make_route_config("rds", routes_to("a"), domains=["svc"]))
    assert h.last == Status(
        grpc.StatusCode.UNAVAILABLE,
        "RDS resource rds: could not find VirtualHost for other.example in RouteConfiguration",
    )


def test_virtual_host_chosen_by_authority():
    h = Harness(authority="Foo.Example.com")
    routes = routes_to("a")
    rc = RouteConfiguration(
        "rds",
        (
            VirtualHost("any", ("*",), tuple(routes_to("wild"))),
            VirtualHost("foo", ("*.example.com",), tuple(routes)),
        ),
    )
    h.push(make_listener("lds", inline=rc))
    assert h.watched(CLUSTER_TYPE_URL) == {"a"}


def test_cluster_that_does_not_exist_stays_local_to_that_cluster():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("a", "b")))
    h.push(eds_cluster("a"), make_cla("a", "10.0.0.1:80"))
    h.client.does_not_exist(CLUSTER_TYPE_URL, "b")
    config = h.last
    assert isinstance(config, XdsConfig)
    assert isinstance(config.clusters["a"], ClusterConfig)
    assert config.clusters["b"] == Status(
        grpc.StatusCode.UNAVAILABLE, "CDS resource b does not exist"
    )


def test_eds_with_only_unhealthy_endpoints_says_all_endpoints_unhealthy():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("a")))
    h.push(eds_cluster("a", eds_service_name="a-eds"), make_cla("a-eds", unhealthy=3))
    # C-core's words, then the cluster and the cause.
    assert h.last.clusters["a"].children.resolution_note == (
        'EDS resource a-eds: contains empty localities: [{region="r", zone="z", sub_zone="s"}] '
        "(cluster a: no endpoints: all endpoints unhealthy)"
    )


def test_eds_error_before_data_gives_no_endpoints_and_a_note_naming_the_resource():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("a")))
    h.push(eds_cluster("a"))
    h.client.error(ENDPOINTS_TYPE_URL, "a", "timeout")
    assert h.last.clusters["a"].children == EndpointConfig(
        None, "EDS resource a: timeout (cluster a: no endpoints)"
    )


def test_subscriptions_are_refcounted_and_the_last_release_stops_the_watch():
    h = Harness()
    setup_basic(h, "a")
    first = h.dm.subscribe_cluster("dyn")
    second = h.dm.subscribe_cluster("dyn")
    assert "dyn" in h.watched(CLUSTER_TYPE_URL)
    h.push(eds_cluster("dyn"), make_cla("dyn", "10.0.0.3:80"))
    assert "dyn" in h.last.clusters
    first.release()
    first.release()  # idempotent
    assert "dyn" in h.watched(CLUSTER_TYPE_URL)
    second.release()
    assert "dyn" not in h.watched(CLUSTER_TYPE_URL)
    assert "dyn" not in h.watched(ENDPOINTS_TYPE_URL)
    assert "dyn" not in h.last.clusters


def test_cluster_removed_from_routes_is_unwatched():
    h = Harness()
    setup_basic(h, "a", "b")
    h.push(make_route_config("rds", routes_to("a")))
    assert h.watched(CLUSTER_TYPE_URL) == {"a"}
    assert h.watched(ENDPOINTS_TYPE_URL) == {"a"}
    assert set(h.last.clusters) == {"a"}


def test_route_config_name_change_switches_the_rds_watch():
    h = Harness()
    setup_basic(h, "a")
    h.push(make_listener("lds", rds="rds2"))
    assert h.watched(ROUTE_CONFIG_TYPE_URL) == {"rds2"}
    h.push(make_route_config("rds2", routes_to("a")))
    assert h.last.route_config.name == "rds2"


def test_same_resources_twice_deliver_nothing_new():
    h = Harness()
    setup_basic(h, "a")
    h.client._cache.clear()  # force re-delivery of equal values
    h.push(make_route_config("rds", routes_to("a")), eds_cluster("a"), make_cla("a", "10.0.0.1:1"))
    assert len(h.updates) == 1


def test_request_reresolution_reruns_every_logical_dns_cluster():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("d1", "d2")))
    h.push(dns_cluster("d1", "one.example", 1), dns_cluster("d2", "two.example", 2))
    h.dns.complete("one.example", ["10.0.0.1:1"])
    h.dns.complete("two.example", ["10.0.0.2:2"])
    assert len(h.dns.requests) == 2
    h.dm.request_reresolution()
    assert sorted(h.dns.requests[2:]) == [("one.example", 1), ("two.example", 2)]
    h.dns.complete("one.example", ["10.0.0.7:1"])
    h.dns.complete("two.example", ["10.0.0.2:2"])
    leaf = h.last.clusters["d1"].children.endpoints.priorities[0][0].endpoints[0]
    assert leaf.addresses == ("10.0.0.7:1",)


def test_dns_failure_before_data_gives_a_note_and_retries_with_backoff():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("d")))
    h.push(dns_cluster("d", "nx.example", 443))
    h.dns.complete("nx.example", "DNS resolution failed for nx.example:443: NXDOMAIN")
    note = h.last.clusters["d"].children
    assert note.endpoints is None and "nx.example:443" in note.resolution_note
    assert len(h.dns.requests) == 1
    h.clock.advance(DNS_RETRY_INITIAL)
    assert len(h.dns.requests) == 2


def test_dns_lookup_never_runs_on_the_serializer():
    seen: dict[str, object] = {}
    done = threading.Event()
    serializer_holder: list[WorkSerializer] = []

    def fake_getaddrinfo(host, port, **kwargs):
        seen["thread"] = threading.get_ident()
        seen["in_serializer"] = serializer_holder[0].in_serializer
        return [(2, 1, 6, "", ("10.9.9.9", port))]

    resolver = ThreadedDnsResolver(getaddrinfo=fake_getaddrinfo, max_workers=1)
    try:
        h = Harness(dns=resolver)
        serializer_holder.append(h.serializer)
        original = h.updates.append

        def on_update(value):
            original(value)
            done.set()

        h.dm._on_update = on_update
        h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("d")))
        h.push(dns_cluster("d", "host.example", 9000))
        assert done.wait(5.0), "DNS answer never arrived"
    finally:
        resolver.shutdown()
    assert seen["thread"] != threading.get_ident()
    assert seen["in_serializer"] is False
    endpoints = h.last.clusters["d"].children.endpoints
    assert endpoints.priorities[0][0].endpoints[0].addresses == ("10.9.9.9:9000",)


def test_shutdown_cancels_every_watch():
    h = Harness()
    setup_basic(h, "a")
    h.dm.shutdown()
    for type_url in (LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL, CLUSTER_TYPE_URL):
        assert h.watched(type_url) == set()
    h.push(make_route_config("rds", routes_to("b")))
    assert len(h.updates) == 1


@pytest.mark.parametrize("kind", ["does_not_exist", "error"])
def test_listener_failure_before_data_is_reported(kind):
    h = Harness()
    if kind == "does_not_exist":
        h.client.does_not_exist(LISTENER_TYPE_URL, "lds")
    else:
        h.client.error(LISTENER_TYPE_URL, "lds", "connection refused")
    assert isinstance(h.last, Status)
    assert "LDS resource lds" in h.last.details


def test_cluster_changing_type_between_eds_and_aggregate_rewires_its_watches():
    h = Harness()
    setup_basic(h, "a")
    h.push(aggregate_cluster("a", "leaf"))
    assert h.watched(ENDPOINTS_TYPE_URL) == set(), "EDS watch of the old EDS cluster kept"
    h.push(eds_cluster("leaf"), make_cla("leaf", "10.0.0.8:80"))
    assert h.last.clusters["a"].children == AggregateConfig(("leaf",))
    h.push(eds_cluster("a"))
    assert h.watched(CLUSTER_TYPE_URL) == {"a"}
    h.push(make_cla("a", "10.0.0.1:80"))
    assert isinstance(h.last.clusters["a"].children, EndpointConfig)
    assert "leaf" not in h.last.clusters


def test_logical_dns_target_change_restarts_resolution():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("d")))
    h.push(dns_cluster("d", "old.example", 1))
    h.dns.complete("old.example", ["10.0.0.1:1"])
    h.push(dns_cluster("d", "new.example", 2))
    assert h.dns.requests[-1] == ("new.example", 2)
    h.dns.complete("new.example", ["10.0.0.2:2"])
    endpoint = h.last.clusters["d"].children.endpoints.priorities[0][0].endpoints[0]
    assert endpoint.addresses == ("10.0.0.2:2",)


def test_ambient_errors_keep_the_data_and_become_resolution_notes():
    h = Harness()
    setup_basic(h, "a")
    h.client.error(CLUSTER_TYPE_URL, "a", "NACK: invalid lb_policy")
    entry = h.last.clusters["a"]
    assert isinstance(entry, ClusterConfig), "ambient error replaced the cluster"
    assert entry.children.resolution_note == "CDS resource a: NACK: invalid lb_policy"
    assert entry.children.endpoints is not None
    h.push(eds_cluster("a"))  # the same resource again: the error cleared
    assert h.last.clusters["a"].children.resolution_note == ""


def test_eds_without_localities_or_with_empty_ones_says_so():
    from pyxds.xds.resources.types import (
        ClusterLoadAssignment,
        EndpointAddress,
        Locality,
        LocalityName,
    )

    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("a")))
    h.push(eds_cluster("a"), make_cla("a"))
    assert h.last.clusters["a"].children.resolution_note == (
        "EDS resource a: contains no localities (cluster a: no endpoints: no localities)"
    )
    empty = Locality(LocalityName("r", "z", "s"), 1, ())
    h.push(ClusterLoadAssignment("a", ((empty,),)))
    assert h.last.clusters["a"].children.resolution_note == (
        'EDS resource a: contains empty localities: [{region="r", zone="z", sub_zone="s"}] '
        "(cluster a: no endpoints: locality without endpoints)"
    )
    # A locality ignored for its weight (A27) is the cause the user needs.
    ignored = (LocalityName("us", "a", ""),)
    h.push(ClusterLoadAssignment("a", (), ignored_localities=ignored))
    assert h.last.clusters["a"].children.resolution_note == (
        "EDS resource a: contains no localities "
        "(cluster a: no endpoints: locality without weight ignored)"
    )
    # One usable endpoint anywhere: C-core's note alone, the cluster serves.
    used = Locality(LocalityName("r", "z", "t"), 1, (EndpointAddress(("10.0.0.1:1",)),))
    h.push(ClusterLoadAssignment("a", ((empty, used),), ignored_localities=ignored))
    assert h.last.clusters["a"].children.resolution_note == (
        'EDS resource a: contains empty localities: [{region="r", zone="z", sub_zone="s"}]'
    )


def test_lattice_shaped_aggregate_graph_with_a_cycle_resolves_in_linear_time():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("l0a")))
    levels = 14
    for i in range(levels):
        for side in "ab":
            h.push(aggregate_cluster(f"l{i}{side}", f"l{i + 1}a", f"l{i + 1}b"))
    h.push(aggregate_cluster(f"l{levels}a", "l0a"), aggregate_cluster(f"l{levels}b", "l0b"))
    calls = 0
    resolve = h.dm._resolve

    def counting(*args):
        nonlocal calls
        calls += 1
        return resolve(*args)

    h.dm._resolve = counting
    h.dm._update()
    clusters = 2 * (levels + 1)
    assert calls <= 4 * clusters, f"{calls} visits for {clusters} clusters: exponential walk"
    entry = h.last.clusters["l0a"]
    # No leaves anywhere; the walk back round the cycle runs into the depth limit.
    assert isinstance(entry, Status) and "exceeds max depth" in entry.details


def test_depth_error_found_deep_does_not_taint_a_shallower_path():
    h = Harness()
    # r1 reaches "mid" at depth 14 (too deep for mid's 3 levels); r2 at depth 1.
    chain = [f"c{i}" for i in range(14)]
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", routes_to("c0", "r2")))
    for parent, child in zip(chain, [*chain[1:], "mid"], strict=True):
        h.push(aggregate_cluster(parent, child))
    h.push(aggregate_cluster("r2", "mid"), aggregate_cluster("mid", "sub"))
    h.push(aggregate_cluster("sub", "leaf"), eds_cluster("leaf"), make_cla("leaf", "10.0.0.1:1"))
    config = h.last
    assert isinstance(config.clusters["c0"], Status)
    assert "exceeds max depth" in config.clusters["c0"].details
    assert config.clusters["r2"].children == AggregateConfig(("leaf",))


def test_listener_update_with_the_same_rds_name_delivers_the_new_listener():
    """C-core re-reports on every listener update (e.g. a new
    max_stream_duration) without restarting the RDS watch."""
    h = Harness()
    setup_basic(h, "a")
    watches = len(h.client.watch_log)
    h.push(make_listener("lds", rds="rds", max_stream_duration=5.0))
    assert h.last.listener.max_stream_duration == 5.0
    assert h.last.route_config.name == "rds"
    assert len(h.client.watch_log) == watches, "re-watched something"


def test_clusters_sharing_one_eds_resource_share_one_watch():
    h = Harness()
    h.push(make_listener("lds", rds="rds"))
    h.push(make_route_config("rds", routes_to("a", "b")))
    h.push(eds_cluster("a", "shared"), eds_cluster("b", "shared"))
    assert h.watched(ENDPOINTS_TYPE_URL) == {"shared"}
    h.push(make_cla("shared", "10.0.0.1:80"))
    assert set(h.last.clusters) == {"a", "b"}
    h.push(make_route_config("rds", routes_to("a")))
    assert set(h.last.clusters) == {"a"}
    assert h.watched(ENDPOINTS_TYPE_URL) == {"shared"}


@pytest.mark.parametrize("failure", ["listener_deleted", "socket_listener", "rds_deleted"])
def test_listener_or_route_failure_keeps_every_watch_so_recovery_is_immediate(failure):
    """C-core keeps the RDS, CDS and EDS watches while the listener or route
    configuration is missing (it only stops reporting), so the same resources
    coming back deliver a config at once, with nothing fetched again."""
    h = Harness()
    setup_basic(h, "a")
    if failure == "listener_deleted":
        h.client.does_not_exist(LISTENER_TYPE_URL, "lds")
    elif failure == "socket_listener":
        h.push(make_listener("lds", rds="rds", api_listener=False))
    else:
        h.client.does_not_exist(ROUTE_CONFIG_TYPE_URL, "rds")
    assert isinstance(h.last, Status)
    assert h.watched(CLUSTER_TYPE_URL) == {"a"}
    assert h.watched(ENDPOINTS_TYPE_URL) == {"a"}
    if failure == "rds_deleted":
        h.push(make_route_config("rds", routes_to("a")))
    else:
        assert h.watched(ROUTE_CONFIG_TYPE_URL) == {"rds"}
        h.push(make_listener("lds", rds="rds"))
    assert isinstance(h.last, XdsConfig)
    assert set(h.last.clusters) == {"a"}


def test_failed_dns_re_resolution_keeps_the_last_addresses_with_no_note():
    """Deliberate: a failed re-resolution does not empty a LOGICAL_DNS
    cluster that has addresses (grpc-go and grpc-java keep them; C-core's
    dependency manager empties it)."""
    h = Harness()
    h.push(make_listener("lds", rds="rds"))
    h.push(make_route_config("rds", routes_to("d")))
    h.push(dns_cluster("d", "host", 443))
    h.dns.complete("host", ["1.2.3.4:443"])
    h.dm.request_reresolution()
    h.dns.complete("host", "lookup failed")
    children = h.last.clusters["d"].children
    assert children.endpoints.endpoint_count == 1
