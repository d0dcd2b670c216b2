"""gRFC A81 xDS authority rewriting, sans-IO: the bootstrap's
``trusted_xds_server`` feature, ``RouteAction.auto_host_rewrite`` read only
from such a server (RDS and a listener's inline route config, each with a
decode memo of its own), the ConfigSelector passing the route's value to the
pick, and xds_cluster_impl's picker setting the attempt's ``:authority`` to
the picked endpoint's host name.  No environment variable gates it: grpcio
1.85's C-core has none left (live: tests/e2e/test_differential_authority_rewrite.py)."""

from __future__ import annotations

import itertools

from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from test_cds_support import attributes, build, connect_all, eds_cluster, eds_entry, loc, locality
from test_cds_support import xds_config as make_xds_config

from pyxds.channel.grpc_authority import authority_options
from pyxds.lb import Endpoint, PickComplete, ResolverUpdate
from pyxds.lb.api import AUTHORITY_HEADER, AUTO_HOST_REWRITE_KEY
from pyxds.resolver.config_selector import ClusterRef, XdsConfigSelector
from pyxds.server import builders as b
from pyxds.testing import FakeHelper
from pyxds.xds.bootstrap import parse_bootstrap
from pyxds.xds.client import trusted_resource_types
from pyxds.xds.resources import (
    LISTENER_TYPE_URL,
    RESOURCE_TYPES,
    ROUTE_CONFIG,
    ROUTE_CONFIG_TYPE_URL,
    RouteAction,
)

_names = itertools.count()


def bootstrap_with(features: list[str]):
    return parse_bootstrap(
        {
            "xds_servers": [
                {
                    "server_uri": "localhost:1",
                    "channel_creds": [{"type": "insecure"}],
                    "server_features": features,
                }
            ],
            "node": {"id": "n"},
        }
    )


def test_trusted_xds_server_is_a_feature_of_one_server():
    assert bootstrap_with(["xds_v3", "trusted_xds_server"]).xds_servers[0].trusted_xds_server
    assert not bootstrap_with(["xds_v3"]).xds_servers[0].trusted_xds_server


def rewriting_routes(n: int = 1) -> route_pb2.RouteConfiguration:
    """A route config whose routes ask for auto_host_rewrite (``n`` of them:
    enough make its bytes big enough for the decode memo)."""
    rc = route_pb2.RouteConfiguration(name="rc")
    vh = rc.virtual_hosts.add(name="vh", domains=["*"])
    for i in range(n):
        r = vh.routes.add()
        r.match.path = f"/svc{i:05d}.with.a.long.enough.name/Method"
        r.route.cluster = "c1"
        r.route.auto_host_rewrite.value = True
    return rc


def action_of(resource) -> RouteAction:
    action = resource.virtual_hosts[0].routes[0].action
    assert isinstance(action, RouteAction)
    return action


def test_auto_host_rewrite_is_read_only_from_a_trusted_server():
    data = rewriting_routes().SerializeToString()
    trusted = trusted_resource_types(RESOURCE_TYPES)[ROUTE_CONFIG_TYPE_URL]
    assert action_of(trusted.decode(data).resource).auto_host_rewrite is True
    assert action_of(ROUTE_CONFIG.decode(data).resource).auto_host_rewrite is False


def test_auto_host_rewrite_false_and_unset_leave_the_action_plain():
    rc = rewriting_routes()
    rc.virtual_hosts[0].routes[0].route.auto_host_rewrite.value = False
    trusted = trusted_resource_types(RESOURCE_TYPES)[ROUTE_CONFIG_TYPE_URL]
    assert action_of(trusted.decode(rc.SerializeToString()).resource) == RouteAction(cluster="c1")


def test_trusted_and_untrusted_decodes_of_the_same_big_bytes_do_not_share_a_memo():
    rc = rewriting_routes(400)
    data = rc.SerializeToString()
    assert len(data) >= 16 * 1024  # the memo's threshold
    trusted = trusted_resource_types(RESOURCE_TYPES)[ROUTE_CONFIG_TYPE_URL]
    ROUTE_CONFIG.clear_memo()
    assert action_of(ROUTE_CONFIG.decode(data).resource).auto_host_rewrite is False
    assert action_of(trusted.decode(data).resource).auto_host_rewrite is True
    assert action_of(ROUTE_CONFIG.decode(data).resource).auto_host_rewrite is False


def test_a_listeners_inline_route_config_is_read_as_its_server_is_trusted():
    route = b.route(prefix="", cluster="c1", auto_host_rewrite=True)
    listener = b.listener(
        "l", route_config=b.route_config("rc", [b.virtual_host("vh", routes=[route])])
    )
    data = listener.SerializeToString()
    trusted = trusted_resource_types(RESOURCE_TYPES)[LISTENER_TYPE_URL]
    assert action_of(trusted.decode(data).resource.route_config).auto_host_rewrite is True
    plain = RESOURCE_TYPES[LISTENER_TYPE_URL]
    assert action_of(plain.decode(data).resource.route_config).auto_host_rewrite is False


def selector_for(*routes: rc_pb2.Route) -> XdsConfigSelector:
    rc = route_pb2.RouteConfiguration(name="rc")
    rc.virtual_hosts.add(name="vh", domains=["*"]).routes.extend(routes)
    trusted = trusted_resource_types(RESOURCE_TYPES)[ROUTE_CONFIG_TYPE_URL]
    resource = trusted.decode(rc.SerializeToString()).resource
    refs = {n: ClusterRef(n, lambda: None) for n in ("a", "b")}
    return XdsConfigSelector(resource.virtual_hosts[0], refs)


def test_the_selector_passes_the_routes_auto_host_rewrite_to_the_pick():
    rewriting = b.route(path="/s/Rewrite", cluster="a", auto_host_rewrite=True)
    weighted = b.route(
        path="/s/Weighted", weighted_clusters={"a": 1, "b": 1}, auto_host_rewrite=True
    )
    hashed = b.route(
        path="/s/Hashed",
        cluster="a",
        hash_policies=[b.hash_policy(header="k")],
        auto_host_rewrite=True,
    )
    selector = selector_for(rewriting, weighted, hashed, b.route(prefix="", cluster="a"))
    for path in ("/s/Rewrite", "/s/Weighted", "/s/Hashed"):
        config = selector.select(path, [("k", "v")])
        assert config.call_attributes[AUTO_HOST_REWRITE_KEY] is True, path
    plain = selector.select("/s/Other", ())
    # a route without it shares its cluster's attributes, untouched
    assert AUTO_HOST_REWRITE_KEY not in plain.call_attributes
    assert plain.call_attributes == {"cluster": "cluster:a"}


def impl_started(hostnames: dict[str, str]):
    """An xds_cluster_impl over round_robin on 10.0.0.1:80 and 10.0.0.2:80,
    endpoints with the given host names (the cds policy's ``address_name``);
    ``helper.rename(hostnames)`` sends the same endpoints with new ones."""
    name = f"a81-{next(_names)}"
    helper = FakeHelper()
    cluster = eds_cluster(name)
    lo = locality(loc("a"), ["10.0.0.1:80", "10.0.0.2:80"])
    xds = make_xds_config({name: eds_entry(cluster, [lo])})
    impl = {"clusterName": name, "childPolicy": [{"round_robin": {}}]}
    _, policy, config = build([{"xds_cluster_impl_experimental": impl}], helper)

    def update(names: dict[str, str]) -> None:
        endpoints = []
        for address in lo.endpoints:
            attrs = {"locality": lo.name, "locality_weight": lo.weight}
            host = names.get(address.addresses[0])
            if host:
                attrs["address_name"] = host
            endpoints.append(Endpoint(address.addresses, attrs))
        assert policy.update(ResolverUpdate(endpoints, config, attributes(xds))) is None
        connect_all(helper)

    update(hostnames)
    helper.rename = update
    return helper


def authority_of(result: PickComplete) -> str | None:
    found = [v for k, v in result.metadata or () if k == AUTHORITY_HEADER]
    return found[-1] if found else None


def test_picker_sets_the_picked_endpoints_host_name_as_authority_when_the_route_asks():
    helper = impl_started({"10.0.0.1:80": "one.example", "10.0.0.2:80": "two.example"})
    seen = {}
    for _ in range(4):
        result = helper.pick(**{"cluster": "x", AUTO_HOST_REWRITE_KEY: True})
        seen[result.subchannel.address] = authority_of(result)
    assert seen == {"10.0.0.1:80": "one.example", "10.0.0.2:80": "two.example"}
    for _ in range(4):
        result = helper.pick(cluster="x")
        assert result.metadata is None  # no rewrite asked: the channel's authority


def test_an_endpoint_without_host_name_keeps_the_channels_authority():
    helper = impl_started({"10.0.0.1:80": "one.example"})
    seen = {}
    for _ in range(4):
        result = helper.pick(**{AUTO_HOST_REWRITE_KEY: True})
        seen[result.subchannel.address] = authority_of(result)
    assert seen == {"10.0.0.1:80": "one.example", "10.0.0.2:80": None}


def test_a_rewritten_pick_is_still_counted_and_reused():
    helper = impl_started({"10.0.0.1:80": "one.example", "10.0.0.2:80": "two.example"})
    first = [helper.pick(**{AUTO_HOST_REWRITE_KEY: True}) for _ in range(2)]
    again = [helper.pick(**{AUTO_HOST_REWRITE_KEY: True}) for _ in range(2)]
    # the same endpoint's rewritten result is the same object (no allocation per pick)
    assert [id(r) for r in first] == [id(r) for r in again]
    assert all(r.on_call_done is not None for r in first)


def test_the_authority_channels_options_name_the_host_and_pin_no_tls_name():
    options = (
        ("grpc.default_authority", "svc"),
        ("grpc.ssl_target_name_override", "svc"),
        ("grpc.max_receive_message_length", 10),
    )
    assert authority_options(options, "host.example") == (
        ("grpc.max_receive_message_length", 10),
        ("grpc.default_authority", "host.example"),
    )


def test_inspect_shows_a_routes_auto_host_rewrite():
    from google.protobuf import json_format

    from pyxds.cli.inspect_model import _action

    raw = json_format.MessageToDict(
        b.route(prefix="", cluster="a", auto_host_rewrite=True), preserving_proto_field_name=True
    )
    assert _action(raw) == "cluster a, auto_host_rewrite"
    assert _action({"route": {"cluster": "a"}}) == "cluster a"


def test_the_xds_client_reads_auto_host_rewrite_from_a_trusted_server_only():
    """End to end through a real XdsClient (fake transport): the same RDS
    response from a server with and without ``trusted_xds_server``."""
    from envoy.service.discovery.v3 import discovery_pb2
    from test_xds_client_client import FakeTransport, ThreadWatcher

    from pyxds.testing.fake_clock import FakeClock
    from pyxds.xds.client import XdsClient

    rc = rewriting_routes()
    for features, want in ((["xds_v3", "trusted_xds_server"], True), (["xds_v3"], False)):
        transports: list[FakeTransport] = []

        def factory(channel, transports=transports):
            transports.append(FakeTransport(channel))
            return transports[-1]

        client = XdsClient(bootstrap_with(features), clock=FakeClock(), transport_factory=factory)
        try:
            watcher = ThreadWatcher()
            client.watch(ROUTE_CONFIG_TYPE_URL, "rc", watcher)
            msg = discovery_pb2.DiscoveryResponse(
                type_url=ROUTE_CONFIG_TYPE_URL, version_info="1", nonce="n"
            )
            msg.resources.add(type_url=ROUTE_CONFIG_TYPE_URL, value=rc.SerializeToString())
            transports[0].connected()
            transports[0].respond(msg)
            ((kind, resource),) = watcher.wait()
            assert kind == "changed"
            assert action_of(resource).auto_host_rewrite is want, features
        finally:
            client.close()


def test_an_endpoints_new_host_name_is_the_authority_of_later_picks():
    """An EDS update that renames an endpoint at the same address: C-core's
    child policies make their subchannels (and xds_cluster_impl's wrapper
    holding the name) anew on every update; pyxds's keep theirs, so the
    update renames the wrapper."""
    helper = impl_started({"10.0.0.1:80": "one.example", "10.0.0.2:80": "two.example"})
    helper.rename({"10.0.0.1:80": "uno.example"})
    seen = {}
    for _ in range(4):
        result = helper.pick(**{AUTO_HOST_REWRITE_KEY: True})
        seen[result.subchannel.address] = authority_of(result)
    assert seen == {"10.0.0.1:80": "uno.example", "10.0.0.2:80": None}
