"""The xds resolver (A74 latest, A31, A28): sans-IO with FakeXdsClient."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass

import grpc
import pytest

from pyxds.lb import registry
from pyxds.lb.api import PolicyFactory, Status
from pyxds.resolver import registry as resolver_registry
from pyxds.resolver.api import ResolverArgs, ResolverResult
from pyxds.resolver.config_selector import NO_ROUTE_MESSAGE, NON_FORWARDING_MESSAGE
from pyxds.resolver.dns import FakeDnsResolver
from pyxds.resolver.xds_config import DEPENDENCY_MANAGER_ATTRIBUTE, XDS_CONFIG_ATTRIBUTE
from pyxds.resolver.xds_resolver import XdsResolver, parse_xds_target
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock
from pyxds.testing.fake_xds_client import (
    CLUSTER_TYPE_URL,
    LISTENER_TYPE_URL,
    ROUTE_CONFIG_TYPE_URL,
    FakeXdsClient,
    dns_cluster,
    eds_cluster,
    make_cla,
    make_listener,
    make_route,
    make_route_config,
)

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@dataclass(frozen=True)
class _Frozen:
    text: str


class _StandIn(PolicyFactory):
    """Parses any config into a comparable value (the real policies are
    another helper's; these tests only need the selection)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def parse_config(self, json_config):
        return _Frozen(json.dumps(json_config, sort_keys=True))

    def build(self, helper):  # pragma: no cover - never built here
        raise NotImplementedError


@pytest.fixture(autouse=True)
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


class Harness:
    def __init__(self, target: str = "xds:///svc", seed: int = 7) -> None:
        self.client = FakeXdsClient()
        self.dns = FakeDnsResolver()
        self.serializer = WorkSerializer()
        self.results: list[ResolverResult] = []
        self.args = ResolverArgs(
            target=target,
            authority="svc",
            serializer=self.serializer,
            clock=FakeClock(),
            random=random.Random(seed),
            on_result=self.results.append,
        )
        self.resolver = XdsResolver(
            self.args, xds_client=self.client, listener_name="lds", dns_resolver=self.dns
        )
        self.resolver.start()

    def push(self, *resources) -> None:
        self.client.push(*resources)

    @property
    def last(self) -> ResolverResult:
        assert self.results
        return self.results[-1]

    def clusters_in_lb_config(self, result: ResolverResult | None = None) -> set[str]:
        result = result or self.last
        config = json.loads(result.lb_policy.config.text)
        return set(config["children"])

    def select(self, path: str, metadata=()):
        return self.last.config_selector.select(path, metadata)


def good_setup(h: Harness, *clusters: str, listener_msd: float | None = None) -> None:
    h.push(make_listener("lds", rds="rds", max_stream_duration=listener_msd))
    h.push(make_route_config("rds", [make_route(f"/{c}/", cluster=c) for c in clusters]))
    for c in clusters:
        h.push(eds_cluster(c), make_cla(c, "10.0.0.1:80"))


def test_good_config_publishes_selector_lb_config_and_attributes_in_one_result():
    h = Harness()
    good_setup(h, "a", "b")
    assert len(h.results) == 1
    result = h.last
    assert result.lb_policy.name == "xds_cluster_manager_experimental"
    config = json.loads(result.lb_policy.config.text)
    assert config == {
        "children": {
            "cluster:a": {"childPolicy": [{"cds_experimental": {"cluster": "a"}}]},
            "cluster:b": {"childPolicy": [{"cds_experimental": {"cluster": "b"}}]},
        }
    }
    assert set(result.attributes[XDS_CONFIG_ATTRIBUTE].clusters) == {"a", "b"}
    assert result.attributes[DEPENDENCY_MANAGER_ATTRIBUTE] is h.resolver.dependency_manager
    call = result.config_selector.select("/b/Method", ())
    assert call.status is None
    assert call.call_attributes["cluster"] == "cluster:b"
    call.on_committed()


def test_new_cluster_reaches_neither_selector_nor_lb_config_before_its_cds_and_eds():
    h = Harness()
    good_setup(h, "a")
    h.push(make_route_config("rds", [make_route("/a/", cluster="a"), make_route("", cluster="b")]))
    h.push(eds_cluster("b"))
    assert len(h.results) == 1
    assert h.select("/x/y").status.details == NO_ROUTE_MESSAGE
    h.push(make_cla("b", "10.0.0.2:80"))
    assert len(h.results) == 2
    assert h.clusters_in_lb_config() == {"cluster:a", "cluster:b"}
    assert h.select("/x/y").call_attributes["cluster"] == "cluster:b"


def test_error_before_any_config_fails_rpcs_unavailable_naming_the_resource():
    h = Harness()
    h.client.does_not_exist(LISTENER_TYPE_URL, "lds")
    result = h.last
    assert result.service_config_error == Status(UNAVAILABLE, "LDS resource lds does not exist")
    assert result.config_selector.select("/a/b", ()).status == result.service_config_error


def test_route_config_does_not_exist_after_a_good_config_drops_to_the_error():
    h = Harness()
    good_setup(h, "a")
    h.client.does_not_exist(ROUTE_CONFIG_TYPE_URL, "rds")
    result = h.last
    status = Status(UNAVAILABLE, "RDS resource rds does not exist")
    assert result.resolution_note == status.details
    assert result.config_selector.select("/a/m", ()).status == status
    assert h.clusters_in_lb_config() == set()
    # As in C-core the cluster watches stay while the route configuration is
    # missing, so a good one afterwards restores routing at once.
    assert h.client.watched(CLUSTER_TYPE_URL) == {"a"}
    h.push(make_route_config("rds", [make_route("", cluster="a")]))
    assert h.select("/a/m").call_attributes["cluster"] == "cluster:a"


def test_no_matching_virtual_host_after_a_good_config_drops_the_config():
    """A74 latest: a route configuration without a virtual host for the
    authority is an error the resolver acts on (C-core clears its config)."""
    h = Harness()
    good_setup(h, "a")
    h.push(make_route_config("rds", [make_route("", cluster="a")], domains=["elsewhere"]))
    status = h.select("/a/m").status
    assert status is not None and "could not find VirtualHost" in status.details
    assert h.clusters_in_lb_config() == set()
    assert "could not find VirtualHost" in h.resolver.config_dump()["last_error"]


def test_cluster_removed_from_routes_stays_in_lb_config_while_an_rpc_holds_it():
    h = Harness()
    good_setup(h, "a", "b")
    rpc = h.select("/b/m")
    assert rpc.call_attributes["cluster"] == "cluster:b"
    h.push(make_route_config("rds", [make_route("/a/", cluster="a")]))
    after_route_change = h.last
    assert h.clusters_in_lb_config() == {"cluster:a", "cluster:b"}
    assert "b" in after_route_change.attributes[XDS_CONFIG_ATTRIBUTE].clusters
    assert h.select("/b/m").status.details == NO_ROUTE_MESSAGE
    assert "b" in h.client.watched(CLUSTER_TYPE_URL), "RPC ref must hold the subscription"
    rpc.on_committed()
    assert h.clusters_in_lb_config() == {"cluster:a"}
    assert "b" not in h.client.watched(CLUSTER_TYPE_URL)
    assert "b" not in h.last.attributes[XDS_CONFIG_ATTRIBUTE].clusters


def test_rpc_on_a_superseded_selector_whose_cluster_was_retired_is_rerouted():
    h = Harness()
    good_setup(h, "a", "b")
    old_selector = h.last.config_selector
    h.push(make_route_config("rds", [make_route("", cluster="a")]))
    assert h.clusters_in_lb_config() == {"cluster:a"}
    call = old_selector.select("/b/m", ())
    assert call.call_attributes["cluster"] == "cluster:a"


def test_no_matching_route_and_non_forwarding_action_fail_unavailable():
    h = Harness()
    h.push(make_listener("lds", rds="rds"))
    h.push(
        make_route_config(
            "rds", [make_route("/a/", cluster="a"), make_route("/nf/", non_forwarding=True)]
        )
    )
    h.push(eds_cluster("a"), make_cla("a", "10.0.0.1:80"))
    assert h.select("/zzz/m").status == Status(UNAVAILABLE, NO_ROUTE_MESSAGE)
    assert h.select("/nf/m").status == Status(UNAVAILABLE, NON_FORWARDING_MESSAGE)


def test_timeout_is_route_max_stream_duration_else_listener_and_zero_means_none():
    h = Harness()
    h.push(make_listener("lds", rds="rds", max_stream_duration=30.0))
    routes = [
        make_route("/r/", cluster="a", max_stream_duration=2.5),
        make_route("/zero/", cluster="a", max_stream_duration=0.0),
        make_route("", cluster="a"),
    ]
    h.push(make_route_config("rds", routes), eds_cluster("a"), make_cla("a", "10.0.0.1:80"))
    assert h.select("/r/m").timeout == 2.5
    assert h.select("/zero/m").timeout is None
    assert h.select("/other/m").timeout == 30.0


def test_weighted_clusters_follow_their_weights_not_total_weight():
    h = Harness(seed=12345)
    h.push(make_listener("lds", rds="rds"))
    route = make_route("", weighted=[("a", 75), ("b", 25), ("zero", 0)])
    h.push(make_route_config("rds", [route]))
    for c in ("a", "b", "zero"):
        h.push(eds_cluster(c), make_cla(c, "10.0.0.1:80"))
    counts: Counter[str] = Counter()
    n = 20000
    for _ in range(n):
        call = h.select("/s/m")
        counts[call.call_attributes["cluster"]] += 1
        call.on_committed()
    assert counts["cluster:zero"] == 0
    share = counts["cluster:a"] / n
    assert abs(share - 0.75) < 0.015, counts


def test_request_reresolution_reruns_logical_dns():
    h = Harness()
    h.push(make_listener("lds", rds="rds"), make_route_config("rds", [make_route("", cluster="d")]))
    h.push(dns_cluster("d", "dns.example", 53))
    h.dns.complete("dns.example", ["10.0.0.5:53"])
    assert len(h.dns.requests) == 1
    h.resolver.request_reresolution()
    assert len(h.dns.requests) == 2


def test_identical_resources_publish_nothing_new():
    h = Harness()
    good_setup(h, "a")
    count = len(h.results)
    h.client._cache.clear()
    good_setup(h, "a")
    assert len(h.results) == count


def test_bad_target_is_a_service_config_error_not_an_exception():
    h = Harness(target="xds:///")
    assert h.last.service_config_error is not None
    assert "no service name" in h.last.service_config_error.details


def test_shutdown_cancels_watches():
    h = Harness()
    good_setup(h, "a")
    h.resolver.shutdown()
    assert h.client.watched(CLUSTER_TYPE_URL) == set()
    assert h.client.watched(LISTENER_TYPE_URL) == set()


def test_parse_xds_target_with_and_without_authority():
    assert parse_xds_target("xds:///greeter") == (None, "greeter")
    assert parse_xds_target("xds://auth.example/svc/x") == ("auth.example", "svc/x")


def test_resolver_registry_maps_xds_and_static_schemes():
    assert resolver_registry.get("xds") is not None
    results: list[ResolverResult] = []
    args = ResolverArgs(
        target="ipv4:127.0.0.1:1,127.0.0.1:2",
        authority="x",
        serializer=WorkSerializer(),
        clock=FakeClock(),
        random=random.Random(0),
        on_result=results.append,
    )
    resolver_registry.create(args).start()
    assert [e.addresses for e in results[-1].endpoints] == [("127.0.0.1:1",), ("127.0.0.1:2",)]
    assert resolver_registry.parse_static_addresses("static:///[::1]:5,h:6") == ["[::1]:5", "h:6"]
    with pytest.raises(ValueError):
        resolver_registry.parse_static_addresses("static:///nope")


def test_runtime_fraction_and_header_routes_through_the_selector_with_seeded_random():
    from pyxds.xds.resources.types import FractionalPercent, HeaderMatcher

    h = Harness(seed=99)
    h.push(make_listener("lds", rds="rds"))
    routes = [
        make_route("/s/", cluster="canary", headers=[HeaderMatcher("x-canary", "exact", "yes")]),
        make_route("/s/", cluster="sampled", fraction=FractionalPercent(10, 100)),
        make_route("", cluster="main"),
    ]
    h.push(make_route_config("rds", routes))
    for c in ("canary", "sampled", "main"):
        h.push(eds_cluster(c), make_cla(c, "10.0.0.1:80"))
    assert h.select("/s/m", [("x-canary", "yes")]).call_attributes["cluster"] == "cluster:canary"
    counts: Counter[str] = Counter()
    for _ in range(20000):
        call = h.select("/s/m", [("x-canary", "no")])
        counts[call.call_attributes["cluster"]] += 1
        call.on_committed()
    assert counts["cluster:canary"] == 0
    assert abs(counts["cluster:sampled"] / 20000 - 0.10) < 0.01, counts


def test_trivial_static_resolver_publishes_its_addresses_once():
    results: list[ResolverResult] = []
    args = ResolverArgs(
        target="static:///10.0.0.1:1,[::1]:2",
        authority="x",
        serializer=WorkSerializer(),
        clock=FakeClock(),
        random=random.Random(0),
        on_result=results.append,
    )
    resolver = resolver_registry.StaticResolver(args)
    resolver.start()
    resolver.request_reresolution()
    assert len(results) == 1
    assert [e.addresses for e in results[0].endpoints] == [("10.0.0.1:1",), ("[::1]:2",)]
    bad = resolver_registry.StaticResolver(
        ResolverArgs(
            "static:///", "x", WorkSerializer(), FakeClock(), random.Random(0), results.append
        )
    )
    bad.start()
    assert results[-1].service_config_error is not None
