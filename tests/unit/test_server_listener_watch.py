"""The Listener watch of one listening address (A36) and the per-RPC gate
(A36 routing, A41 RBAC), sans-IO over FakeXdsClient."""

from __future__ import annotations

import ipaddress

import grpc

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.serving.gate import DENIED, NO_CHAIN, Gate, split_peer
from pyxds.serving.listener_watch import ListenerWatch, ServingConfig, listener_resource_name
from pyxds.status import Status
from pyxds.testing import FakeXdsClient
from pyxds.testing.fake_xds_client import LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL
from pyxds.xds.resources import LISTENER, ROUTE_CONFIG

ADDRESS = "127.0.0.1:8080"
NAME = f"grpc/server?xds.resource.listening_address={ADDRESS}"


def decoded(proto, kind=LISTENER):
    result = kind.decode(proto.SerializeToString(), use_memo=False)
    assert result.error is None, result.error
    return result.resource


def lis(*chains, address=ADDRESS, default=None):
    return decoded(ib.server_listener(NAME, address, chains, default))


class Harness:
    def __init__(self):
        self.client = FakeXdsClient()
        self.updates: list[ServingConfig | Status] = []
        self.watch = ListenerWatch(
            self.client, NAME, ADDRESS, ipaddress.ip_address("127.0.0.1"), self.updates.append
        )
        self.watch.start()

    @property
    def last(self):
        return self.updates[-1]


def test_resource_name_is_the_template_with_the_listening_address():
    assert listener_resource_name("a/%s/b/%s", "[::]:80") == "a/[::]:80/b/[::]:80"
    assert (
        listener_resource_name("xdstp://auth/envoy.config.listener.v3.Listener/s/%s", "1.2.3.4:5")
        == "xdstp://auth/envoy.config.listener.v3.Listener/s/1.2.3.4:5"
    )


def test_nothing_is_served_before_the_listener_arrives():
    h = Harness()
    assert h.client.watched(LISTENER_TYPE_URL) == {NAME}
    assert h.updates == [] and h.watch.current is None


def test_a_listener_with_inline_routes_is_served_at_once():
    h = Harness()
    h.client.push(lis(ib.filter_chain()))
    assert isinstance(h.last, ServingConfig) and h.last.security.tls is None


def test_a_listener_waits_for_its_rds_resource_then_serves():
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="routes")))
    assert h.updates == [] and h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"routes"}
    h.client.push(decoded(ib.inbound_route_config("routes"), ROUTE_CONFIG))
    assert isinstance(h.last, ServingConfig)


def test_an_rds_error_still_serves_and_fails_rpcs_unavailable():
    """A36: the update applies once RDS was attempted; RPCs routed to the
    missing RouteConfiguration fail UNAVAILABLE."""
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="routes")))
    h.client.does_not_exist(ROUTE_CONFIG_TYPE_URL, "routes")
    config = h.last
    assert isinstance(config, ServingConfig)
    gate = Gate(8080, ipaddress.ip_address("127.0.0.1"))
    gate.set_config(config)
    status = gate.check("ipv4:127.0.0.1:5000", "a", "/s/m", (), dict)
    assert status.code is grpc.StatusCode.UNAVAILABLE
    assert status.details == "UNAVAILABLE:RDS resource routes: RDS resource routes does not exist"
    assert config.config_errors() == [status.details.removeprefix("UNAVAILABLE:")]


def test_rds_updates_apply_in_place_without_a_new_listener():
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="routes")))
    h.client.push(decoded(ib.inbound_route_config("routes"), ROUTE_CONFIG))
    first = h.last
    h.client.push(
        decoded(
            ib.inbound_route_config("routes", [b.route(prefix="/a.", cluster="c")]), ROUTE_CONFIG
        )
    )
    second = h.last
    assert second.listener is first.listener and second.version == first.version + 1


def test_the_same_listener_again_changes_nothing():
    h = Harness()
    h.client.push(lis(ib.filter_chain()))
    h.client.push(lis(ib.filter_chain(name="other")))
    n = len(h.updates)
    h.watch.on_resource_changed(lis(ib.filter_chain(name="other")))
    assert len(h.updates) == n


def test_a_listener_for_another_address_is_not_served():
    h = Harness()
    h.client.push(lis(ib.filter_chain(), address="0.0.0.0:8080"))
    assert h.last.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "Address in LDS update does not match listening address" in h.last.details


def test_an_api_listener_is_not_a_tcp_listener():
    h = Harness()
    h.client.push(decoded(b.listener(NAME)))
    assert h.last == Status(
        grpc.StatusCode.FAILED_PRECONDITION, "LDS resource is not a TCP listener"
    )


def test_deletion_stops_serving_and_a_new_listener_serves_again():
    h = Harness()
    h.client.push(lis(ib.filter_chain()))
    h.client.does_not_exist(LISTENER_TYPE_URL, NAME)
    assert h.last.code is grpc.StatusCode.NOT_FOUND
    assert h.last.details == f"LDS resource {NAME} does not exist"
    assert h.watch.current is None
    h.client.push(lis(ib.filter_chain(name="back")))
    assert isinstance(h.last, ServingConfig)


def test_an_ambient_error_keeps_serving():
    h = Harness()
    h.client.push(lis(ib.filter_chain()))
    n = len(h.updates)
    h.client.error(LISTENER_TYPE_URL, NAME, "NACKed: bad")
    assert len(h.updates) == n and h.watch.current is not None


def test_a_pending_listener_does_not_replace_the_current_one_until_its_rds_arrives():
    h = Harness()
    h.client.push(lis(ib.filter_chain()))
    current = h.watch.current
    h.client.push(lis(ib.filter_chain(rds="new-routes")))
    assert h.watch.current is current
    h.client.push(decoded(ib.inbound_route_config("new-routes"), ROUTE_CONFIG))
    assert h.watch.current is not current


def test_rds_names_no_longer_used_are_unwatched():
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="old")))
    h.client.push(decoded(ib.inbound_route_config("old"), ROUTE_CONFIG))
    h.client.push(lis(ib.filter_chain()))
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == set()


def test_rds_names_of_an_abandoned_pending_listener_are_unwatched():
    """A pending Listener whose RDS never came is dropped when the current
    Listener comes back, or replaced by another pending one: its RDS
    subscriptions go with it (C-core drops the pending filter chain manager
    and its RDS watchers), not at the next promotion."""
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="current")))
    h.client.push(decoded(ib.inbound_route_config("current"), ROUTE_CONFIG))
    h.client.push(lis(ib.filter_chain(rds="pending-1")))
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"current", "pending-1"}
    h.client.push(lis(ib.filter_chain(rds="pending-2")))
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"current", "pending-2"}
    h.client.push(lis(ib.filter_chain(rds="current")))
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"current"}
    assert isinstance(h.last, ServingConfig) and h.watch.current is not None


def test_stop_cancels_every_watch():
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="r")))
    h.watch.stop()
    assert h.client.watched(LISTENER_TYPE_URL) == set()
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == set()


# ------------------------------------------------------------------------ the gate


def gate_for(*chains, local="127.0.0.1", lookup=None, default=None):
    h = Harness()
    h.client.push(lis(*chains, default=default))
    gate = Gate(8080, ipaddress.ip_address(local) if local else None, lookup)
    gate.set_config(h.last)
    return gate


def check(
    gate, peer="ipv4:127.0.0.1:5000", authority="svc", path="/pkg.S/M", metadata=(), auth=None
):
    return gate.check(peer, authority, path, (), lambda: auth or {})


def test_split_peer_reads_grpcio_peer_strings():
    assert split_peer("ipv4:10.0.0.1:443").port == 443
    assert str(split_peer("ipv6:[::1]:80").ip) == "::1"
    assert split_peer("unix:/tmp/s").ip is None


def test_split_peer_reads_the_percent_encoded_ipv6_peers_grpcio_gives():
    """grpcio 1.85's ``context.peer()`` of an IPv6 client is a URI with the
    brackets (and a zone's ``%``) percent-encoded: ``ipv6:%5B::1%5D:43168``."""
    peer = split_peer("ipv6:%5B::1%5D:43168")
    assert (str(peer.ip), peer.port) == ("::1", 43168)
    peer = split_peer("ipv6:%5Bfe80::1%25eth0%5D:7")
    assert (str(peer.ip), peer.port) == ("fe80::1", 7)


def test_non_forwarding_route_lets_the_rpc_through():
    assert check(gate_for(ib.filter_chain())) is None


def test_unsupported_action_and_no_route_fail_unavailable_in_c_core_words():
    routes = [b.route(prefix="/a.S/", cluster="c"), b.route(path="/b.S/M")]
    gate = gate_for(ib.filter_chain(ib.inbound_hcm(ib.inbound_route_config("rc", routes))))
    assert check(gate, path="/a.S/M") == Status(
        grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE:matching route has unsupported action"
    )
    no_route = Status(grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE:no route matched")
    assert check(gate, path="/c.S/M") == no_route
    assert check(gate, path="/b.S/M") is None


def test_virtual_host_by_authority_and_unknown_authority_uses_the_star_host():
    rc = b.route_config(
        "rc",
        [
            b.virtual_host("exact", ["svc"], [b.route(prefix="/", cluster="c")]),
            b.virtual_host("star", ["*"], [b.route(prefix="/")]),
        ],
    )
    gate = gate_for(ib.filter_chain(ib.inbound_hcm(rc)))
    assert check(gate, authority="svc").details.endswith("matching route has unsupported action")
    assert check(gate, authority="other") is None
    assert check(gate, authority=None) is None
    only = b.route_config("rc", [b.virtual_host("exact", ["svc"], [b.route(prefix="/")])])
    gate = gate_for(ib.filter_chain(ib.inbound_hcm(only)))
    assert (
        "could not find VirtualHost for x in RouteConfiguration"
        in check(gate, authority="x").details
    )
    assert "not visible to grpc.aio" in check(gate, authority=None).details


def test_no_matching_chain_fails_every_rpc_of_the_connection():
    gate = gate_for(ib.filter_chain(source_prefix_ranges=["10.0.0.0/8"]))
    assert check(gate) == NO_CHAIN
    assert check(gate, peer="ipv4:10.1.1.1:5000") is None


def test_an_unreachable_default_chain_is_not_served_to_a_peer_that_is_not_an_ip():
    """A catch-all mTLS chain makes the plaintext default chain unreachable
    over TCP, so the port is mTLS; a peer that is not an IP would get the
    default chain: its RPCs fail instead of running under a chain whose TLS
    the port does not have."""
    gate = gate_for(
        ib.filter_chain(name="mesh", tls=ib.downstream_tls()),
        default=ib.filter_chain(name="plain-default"),
    )
    assert gate.config is not None and gate.config.security.tls is not None
    assert check(gate) is None
    assert check(gate, peer="unix:/tmp/s") == NO_CHAIN


def test_rbac_filters_run_in_order_and_deny_with_c_core_words():
    deny = ib.rbac_filter(
        "deny", "DENY", {"d": ib.rbac_policy(permissions=[ib.path_rule(exact="/pkg.S/Bad")])}
    )
    allow = ib.rbac_filter(
        "allow", "ALLOW", {"a": ib.rbac_policy(principals=[ib.principal_name(exact="spiffe://ok")])}
    )
    gate = gate_for(ib.filter_chain(http_filters=[deny, allow]))
    mtls = {"transport_security_type": [b"ssl"], "peer_uri": [b"spiffe://ok"]}
    assert check(gate, auth=mtls) is None
    assert check(gate, path="/pkg.S/Bad", auth=mtls) == DENIED
    assert DENIED.code is grpc.StatusCode.PERMISSION_DENIED
    assert DENIED.details == "Unauthorized RPC rejected"
    assert check(gate, auth={"transport_security_type": [b"insecure"]}) == DENIED


def test_per_route_override_beats_virtual_host_beats_listener():
    """A39 precedence for RBACPerRoute: route, then virtual host, then the filter."""
    allow_none = ib.rbac_filter("rbac", "ALLOW", {})
    off = ib.rbac_per_route()
    deny_all = ib.rbac_per_route("DENY", {"all": ib.rbac_policy()})
    vh = b.virtual_host(
        "vh",
        ["*"],
        [
            b.route(prefix="/open.S/", typed_per_filter_config={"rbac": off}),
            b.route(prefix="/"),
        ],
        typed_per_filter_config={"rbac": deny_all},
    )
    gate = gate_for(
        ib.filter_chain(ib.inbound_hcm(b.route_config("rc", [vh]), http_filters=[allow_none]))
    )
    assert check(gate, path="/open.S/M") is None  # route override: RBAC off
    assert check(gate, path="/other.S/M") == DENIED  # virtual host override: deny all
    plain = gate_for(ib.filter_chain(http_filters=[allow_none]))
    assert check(plain) == DENIED  # the filter's own config: ALLOW nothing


def test_an_override_of_another_filters_type_is_no_rbac_override():
    """C-core 1.85 (checked against grpcio): a ``typed_per_filter_config``
    entry named for the RBAC filter but of another filter's type (here the
    fault filter's) is passed over, at that level only: the virtual host's
    override, else the filter's own config, applies."""
    deny_all = ib.rbac_filter("rbac", "DENY", {"all": ib.rbac_policy()})
    fault = {"rbac": b.fault_config(abort_grpc_status=14)}
    alone = b.virtual_host("vh", ["*"], [b.route(prefix="/", typed_per_filter_config=fault)])
    gate = gate_for(
        ib.filter_chain(ib.inbound_hcm(b.route_config("rc", [alone]), http_filters=[deny_all]))
    )
    assert check(gate) == DENIED
    under_off = b.virtual_host(
        "vh",
        ["*"],
        [b.route(prefix="/", typed_per_filter_config=fault)],
        typed_per_filter_config={"rbac": ib.rbac_per_route()},
    )
    gate = gate_for(
        ib.filter_chain(ib.inbound_hcm(b.route_config("rc", [under_off]), http_filters=[deny_all]))
    )
    assert check(gate) is None


def test_wildcard_port_looks_up_the_local_address_only_when_it_matters():
    looked = []

    def lookup(peer):
        looked.append(peer)
        return ipaddress.ip_address("10.0.0.1")

    gate = gate_for(ib.filter_chain(), local=None, lookup=lookup)
    assert check(gate) is None and looked == []
    gate = gate_for(ib.filter_chain(prefix_ranges=["10.0.0.1/32"]), local=None, lookup=lookup)
    assert check(gate) is None and looked == ["ipv4:127.0.0.1:5000"]
    check(gate)
    assert looked == ["ipv4:127.0.0.1:5000"]  # cached per peer


def test_an_unknown_local_address_never_picks_a_chain_that_depends_on_it():
    gate = gate_for(
        ib.filter_chain(prefix_ranges=["10.0.0.1/32"]),
        local=None,
        lookup=lambda peer: None,
        default=ib.filter_chain(name="default"),
    )
    assert check(gate) == NO_CHAIN
