"""The xds resolver driving the real xDS LB policy tree (sans-IO).

FakeXdsClient -> XdsResolver -> ResolverResult -> xds_cluster_manager ->
cds -> ... -> subchannels; RPCs go through the ConfigSelector then the
picker, as the channel does them.
"""

from __future__ import annotations

import random

from pyxds.lb.api import ConnectivityState, PickArgs, PickComplete, ResolverUpdate
from pyxds.resolver.api import ResolverArgs, ResolverResult
from pyxds.resolver.dns import FakeDnsResolver
from pyxds.resolver.xds_resolver import XdsResolver
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock, FakeHelper
from pyxds.testing.fake_xds_client import (
    FakeXdsClient,
    aggregate_cluster,
    dns_cluster,
    eds_cluster,
    make_cla,
    make_listener,
    make_route,
    make_route_config,
)


class Channel:
    """The channel's part: apply each result to the LB tree, route RPCs."""

    def __init__(self) -> None:
        self.client = FakeXdsClient()
        self.dns = FakeDnsResolver()
        self.helper = FakeHelper()
        self.serializer = WorkSerializer()
        self.lb = None
        self.result: ResolverResult | None = None
        args = ResolverArgs(
            target="xds:///svc",
            authority="svc",
            serializer=self.serializer,
            clock=FakeClock(),
            random=random.Random(3),
            on_result=self.on_result,
        )
        self.resolver = XdsResolver(
            args, xds_client=self.client, listener_name="lds", dns_resolver=self.dns
        )
        self.resolver.start()

    def on_result(self, result: ResolverResult) -> None:
        self.result = result
        if result.lb_policy is None:
            return
        if self.lb is None:
            self.lb = result.lb_policy.factory.build(self.helper)
        rejected = self.lb.update(
            ResolverUpdate(result.endpoints, result.lb_policy.config, result.attributes)
        )
        assert rejected is None, rejected

    def ready_all(self) -> None:
        for subchannel in self.helper.live_subchannels():
            if subchannel.state is not ConnectivityState.READY:
                subchannel.set_state(ConnectivityState.READY)

    def rpc(self, path: str, metadata=()):
        call = self.result.config_selector.select(path, metadata)
        if call.status is not None:
            return call.status
        try:
            result = self.helper.last.picker.pick(PickArgs(path, metadata, call.call_attributes))
        finally:
            call.on_committed()
        if isinstance(result, PickComplete):
            return result.subchannel.address
        return result


def test_rpcs_reach_the_backend_of_the_cluster_their_route_names():
    ch = Channel()
    ch.client.push(make_listener("lds", rds="rds"))
    ch.client.push(
        make_route_config("rds", [make_route("/a.A/", cluster="ca"), make_route("", cluster="cb")])
    )
    ch.client.push(eds_cluster("ca"), make_cla("ca", "10.0.0.1:80"))
    ch.client.push(eds_cluster("cb"), make_cla("cb", "10.0.0.2:80"))
    ch.ready_all()
    assert ch.rpc("/a.A/Get") == "10.0.0.1:80"
    assert ch.rpc("/b.B/Get") == "10.0.0.2:80"


def test_route_switch_to_a_new_cluster_never_routes_to_a_cluster_the_tree_lacks():
    ch = Channel()
    ch.client.push(make_listener("lds", rds="rds"))
    ch.client.push(make_route_config("rds", [make_route("", cluster="old")]))
    ch.client.push(eds_cluster("old"), make_cla("old", "10.0.0.1:80"))
    ch.ready_all()
    assert ch.rpc("/s/m") == "10.0.0.1:80"
    ch.client.push(make_route_config("rds", [make_route("", cluster="new")]))
    assert ch.rpc("/s/m") == "10.0.0.1:80", "switched before the new cluster was resolved"
    ch.client.push(eds_cluster("new"), make_cla("new", "10.0.0.9:80"))
    ch.ready_all()
    assert ch.rpc("/s/m") == "10.0.0.9:80"


def test_aggregate_of_eds_and_logical_dns_routes_to_the_first_leaf():
    ch = Channel()
    ch.client.push(make_listener("lds", rds="rds"))
    ch.client.push(make_route_config("rds", [make_route("", cluster="agg")]))
    ch.client.push(aggregate_cluster("agg", "eds", "dns"))
    ch.client.push(eds_cluster("eds"), make_cla("eds", "10.0.0.1:80"))
    ch.client.push(dns_cluster("dns", "dns.example", 443))
    ch.dns.complete("dns.example", ["10.0.1.1:443"])
    ch.ready_all()
    assert ch.rpc("/s/m") == "10.0.0.1:80"
