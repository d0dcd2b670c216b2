"""pyxds's xDS-enabled servers against grpcio's own ``grpc.server(xds=True)``
(C-core, in a subprocess) on the same Listener from the same control plane:
the same RPC outcomes, the same NACKs (gRFC A36, A29 server side, A41)."""

from __future__ import annotations

import itertools
import time

import grpc
import pytest
from envoy.config.core.v3 import extension_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.type.v3 import range_pb2
from google.protobuf import struct_pb2, wrappers_pb2
from xds.type.v3 import typed_struct_pb2
from xds_server_fixtures import (
    ECHO,
    ECHO_STREAM,
    SPIFFE_A,
    TEMPLATE,
    Client,
    CoreXdsServer,
    PyxdsAioServer,
    PyxdsServer,
    listener_name,
    wait_served,
    wait_until,
)

import pyxds
from pyxds.server import Snapshot
from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.xds.resources.rbac import RBAC_PER_ROUTE_TYPE

OURS = {"sync": PyxdsServer, "aio": PyxdsAioServer}


@pytest.fixture(params=sorted(OURS))
def pair(request, control, pki):
    """(pyxds server, C-core server), each with its own node id, not started."""
    started = []

    def make(with_pki=True, **kwargs):
        extra = {"certificate_providers": pki.providers()} if with_pki else {}
        ours = OURS[request.param](
            control.bootstrap(
                f"ours-{request.param}", server_listener_resource_name_template=TEMPLATE, **extra
            ),
            **kwargs,
        )
        core = CoreXdsServer(
            control.bootstrap("core", server_listener_resource_name_template=TEMPLATE, **extra),
            **kwargs,
        )
        started.extend([ours, core])
        return ours.start(), core.start()

    yield make
    for server in started:
        server.stop()


def publish_both(control, ours, core, make_listener, routes=()):
    """The same Listener (made by ``make_listener(address)``) for each server."""
    control.set_snapshot(
        Snapshot(listeners=[make_listener(ours.address)], routes=list(routes)),
        node_id=ours_node(ours),
    )
    control.set_snapshot(
        Snapshot(listeners=[make_listener(core.address)], routes=list(routes)), node_id="core"
    )


def ours_node(ours):
    return f"ours-{'aio' if ours.kind == 'pyxds-aio' else 'sync'}"


def strict(address, **rbac):
    lis = ib.istio_inbound_listener(address, strict=True, **rbac)
    lis.name = listener_name(address)
    return lis


def plain(address, http_filters=(), rds=None, routes=None):
    hcm = ib.inbound_hcm(
        ib.inbound_route_config("inbound", routes) if routes is not None else None,
        rds=rds,
        http_filters=list(http_filters),
    )
    return ib.server_listener(listener_name(address), address, [ib.filter_chain(hcm)])


def outcome(address, creds=None, **call):
    with Client(address, creds) as client:
        return client.code(**call)


# ------------------------------------------------------------------ serving state


def test_serving_state_before_with_and_after_the_listener_agrees(control, pair):
    ours, core = pair(with_pki=False, secure=False)
    time.sleep(1.0)
    before = {s.kind: outcome(s.address) for s in (ours, core)}
    assert set(before.values()) == {"UNAVAILABLE"}, before
    publish_both(control, ours, core, plain)
    for s in (ours, core):
        assert wait_served(s.address).startswith("OK:"), s.kind
    control.set_snapshot(Snapshot(), node_id=ours_node(ours))
    control.set_snapshot(Snapshot(), node_id="core")
    gone = {}
    for s in (ours, core):
        wait_until(lambda s=s: outcome(s.address) == "UNAVAILABLE", 10)
        gone[s.kind] = outcome(s.address)
    assert set(gone.values()) == {"UNAVAILABLE"}, gone


def test_a_nack_keeps_serving_and_a_listener_for_another_address_stops_it_in_both(control, pair):
    """A36: a NACKed update keeps the last good Listener; a Listener whose
    address is not the listening one means not serving; a good one again
    serves again."""
    ours, core = pair(with_pki=False, secure=False)
    publish_both(control, ours, core, plain)
    for s in (ours, core):
        assert wait_served(s.address).startswith("OK:"), s.kind

    def bad(address):
        lis = plain(address)
        lis.use_original_dst.value = True
        return lis

    publish_both(control, ours, core, bad)
    for node in (ours_node(ours), "core"):
        control.wait_until(
            lambda node=node: control.nacks("LDS", node_id=node), timeout=10, what="a NACK"
        )
    assert {s.kind: outcome(s.address) for s in (ours, core)} == {ours.kind: "OK", "core": "OK"}

    def elsewhere(address):
        lis = plain(address)
        lis.address.socket_address.port_value = 1
        return lis

    publish_both(control, ours, core, elsewhere)
    gone = {}
    for s in (ours, core):
        wait_until(lambda s=s: outcome(s.address) == "UNAVAILABLE", 10)
        gone[s.kind] = outcome(s.address)
    assert gone == {ours.kind: "UNAVAILABLE", "core": "UNAVAILABLE"}
    publish_both(control, ours, core, plain)
    for s in (ours, core):
        assert wait_served(s.address).startswith("OK:"), s.kind


# ------------------------------------------------------------------ STRICT mTLS


def test_strict_mtls_serves_mesh_clients_and_refuses_the_rest_as_c_core(pair, control, pki):
    ours, core = pair()
    publish_both(control, ours, core, strict)
    alice = pki.client_credentials("alice")
    for s in (ours, core):
        assert wait_served(s.address, alice).startswith("OK:"), s.kind
    cases = {
        "mesh client": alice,
        "no client certificate": pki.client_credentials(None),
        "another CA": pki.client_credentials("stranger"),
        "plaintext": None,
    }
    got = {
        name: {s.kind: outcome(s.address, creds) for s in (ours, core)}
        for name, creds in cases.items()
    }
    assert got["mesh client"] == {ours.kind: "OK", "core": "OK"}
    for name in ("no client certificate", "another CA", "plaintext"):
        assert got[name] == {ours.kind: "UNAVAILABLE", "core": "UNAVAILABLE"}, (name, got)


def test_a_catch_all_chain_is_served_whatever_tls_its_unreachable_default_chain_wants(
    pair, control, pki
):
    """Every connection matches the plaintext catch-all chain, so neither
    server ever uses the mTLS default chain: both serve plaintext (pyxds
    refused the Listener: "chains need different transport security")."""
    ours, core = pair()

    def listener(address):
        return ib.server_listener(
            listener_name(address),
            address,
            [ib.filter_chain(name="all")],
            ib.filter_chain(name="mtls-default", tls=ib.downstream_tls()),
        )

    publish_both(control, ours, core, listener)
    for s in (ours, core):
        assert wait_served(s.address).startswith("OK:"), s.kind
    alice = pki.client_credentials("alice")
    got = {s.kind: (outcome(s.address), outcome(s.address, alice)) for s in (ours, core)}
    assert got == {ours.kind: ("OK", "UNAVAILABLE"), "core": ("OK", "UNAVAILABLE")}, got


def _chain_cases():
    """name -> (chains(port), default chain or None, expected outcome) for a
    client on 127.0.0.1 calling a server on 127.0.0.1: the chain a
    connection gets, as A36 orders the match and C-core builds its map.  A
    chain that must not be picked denies every RPC."""

    def deny(**match):
        return ib.filter_chain(
            http_filters=[ib.rbac_filter("deny", "DENY", {"all": ib.rbac_policy()})], **match
        )

    def allow(**match):
        return ib.filter_chain(**match)

    return {
        # C-core keeps the destination entry of a chain it leaves out (server
        # names): the more specific entry wins and has no chain -> default.
        "left-out chain's destination entry wins, then the default": (
            lambda port: [deny(), deny(prefix_ranges=["127.0.0.0/8"], server_names=["x"])],
            allow(),
            "OK",
        ),
        "raw_buffer chains replace chains without a transport protocol": (
            lambda port: [deny(), allow(transport_protocol="raw_buffer")],
            None,
            "OK",
        ),
        "a destination_port chain never matches": (
            lambda port: [allow(destination_port=port), deny(source_ports=[])],
            None,
            "PERMISSION_DENIED",
        ),
        "an application_protocols chain never matches": (
            lambda port: [allow(application_protocols=["h2"]), deny()],
            None,
            "PERMISSION_DENIED",
        ),
        "a transport_protocol other than raw_buffer never matches": (
            lambda port: [allow(transport_protocol="tls"), deny()],
            None,
            "PERMISSION_DENIED",
        ),
        "a loopback peer is SAME_IP_OR_LOOPBACK": (
            lambda port: [deny(source_type="EXTERNAL"), allow(source_type="SAME_IP_OR_LOOPBACK")],
            None,
            "OK",
        ),
        "ANY chains are unused once a typed chain exists": (
            lambda port: [deny(), allow(source_type="SAME_IP_OR_LOOPBACK")],
            None,
            "OK",
        ),
        "the most specific destination prefix wins": (
            lambda port: [
                deny(prefix_ranges=["127.0.0.0/8"]),
                allow(prefix_ranges=["127.0.0.1/32"]),
            ],
            None,
            "OK",
        ),
        "the most specific source prefix wins": (
            lambda port: [
                deny(source_prefix_ranges=["127.0.0.0/8"]),
                allow(source_prefix_ranges=["127.0.0.1/32"]),
            ],
            None,
            "OK",
        ),
        # grpc-java (FilterChainMatchingProtocolNegotiatorsTest filterChain_5stepMatch)
        # and Envoy fall back to ANY when the peer's own type has no chain.
        "ANY chains are unused for a loopback peer once an EXTERNAL chain exists": (
            lambda port: [allow(), deny(source_type="EXTERNAL")],
            None,
            "UNAVAILABLE",
        ),
        "no chain and no default: not served": (
            lambda port: [allow(source_prefix_ranges=["10.0.0.0/8"])],
            None,
            "UNAVAILABLE",
        ),
        "no chain: the default chain": (
            lambda port: [deny(source_prefix_ranges=["10.0.0.0/8"])],
            allow(),
            "OK",
        ),
    }


def test_filter_chain_matching_agrees_with_c_core(pair, control):
    """One Listener per case, published to both servers; each case must give
    its outcome on both.  Before each case a reset Listener (its one route
    has an unsupported action) is seen on both, so an outcome is never the
    previous case's."""
    ours, core = pair(with_pki=False, secure=False)
    servers = ((ours, ours_node(ours)), (core, "core"))

    def publish(version, make):
        for s, node in servers:
            lis = make(s.address, int(s.address.rsplit(":", 1)[1]))
            control.set_snapshot(Snapshot(version=version, listeners=[lis]), node_id=node)
        for _s, node in servers:
            control.wait_for_ack("LDS", version=version, node_id=node, timeout=10)

    def served(address):
        with Client(address) as client:
            return client.call()

    reset_routes = [b.route(prefix="/", cluster="c")]
    got = {}
    for k, (name, (chains, default, expected)) in enumerate(sorted(_chain_cases().items())):
        publish(f"reset-{k}", lambda a, _p: plain(a, routes=reset_routes))
        for s, _node in servers:
            assert wait_until(lambda s=s: "unsupported action" in served(s.address), 10), s.kind
        publish(
            f"case-{k}",
            lambda a, p, chains=chains, default=default: ib.server_listener(
                listener_name(a), a, chains(p), default
            ),
        )
        for s, _node in servers:
            wait_until(lambda s=s, e=expected: outcome(s.address) == e, 10)
            got[name, s.kind] = outcome(s.address)
        assert got[name, ours.kind] == got[name, "core"] == expected, (name, got)


# ------------------------------------------------------------------ the RBAC matrix


def _rbac_policies():
    by_header = ib.header_rule(b.header_matcher("x-team", exact="red"))
    deny = {
        "deny-stream-for-b": ib.rbac_policy(
            permissions=[ib.path_rule(exact=ECHO_STREAM)],
            principals=[ib.principal_name(prefix="spiffe://mesh.example/ns/b/")],
        ),
        "deny-blue": ib.rbac_policy(
            permissions=[ib.header_rule(b.header_matcher("x-team", exact="blue"))]
        ),
    }
    allow = {
        "alice-anything": ib.rbac_policy(principals=[ib.principal_name(exact=SPIFFE_A)]),
        "red-team-echo": ib.rbac_policy(
            permissions=[
                rbac_config_pb2.Permission(
                    and_rules=rbac_config_pb2.Permission.Set(
                        rules=[by_header, ib.path_rule(exact=ECHO)]
                    )
                )
            ],
            principals=[ib.authenticated()],
        ),
        "subject-carol": ib.rbac_policy(principals=[ib.principal_name(exact="CN=carol")]),
    }
    return deny, allow


def test_rbac_matrix_of_identity_method_and_header_agrees_with_c_core(pair, control, pki):
    ours, core = pair()
    deny, allow = _rbac_policies()
    publish_both(control, ours, core, lambda a: strict(a, deny=deny, allow=allow))
    for s in (ours, core):
        assert wait_served(s.address, pki.client_credentials("alice")).startswith("OK:"), s.kind
    identities = ["alice", "bob", "subject_only"]
    methods = [ECHO, ECHO_STREAM]
    headers = [(), (("x-team", "red"),), (("x-team", "blue"),)]
    table = {}
    clients = {
        (s.kind, who): Client(s.address, pki.client_credentials(who))
        for s in (ours, core)
        for who in identities
    }
    try:
        for who, method, md in itertools.product(identities, methods, headers):
            row = {s.kind: clients[s.kind, who].code(method, md) for s in (ours, core)}
            table[who, method, md] = row
    finally:
        for client in clients.values():
            client.close()
    mismatches = {k: v for k, v in table.items() if v[ours.kind] != v["core"]}
    assert not mismatches, mismatches
    outcomes = {v["core"] for v in table.values()}
    assert outcomes == {"OK", "PERMISSION_DENIED"}  # the matrix exercises both


# ------------------------------------------------------------------ RBAC edge cases

H = b.header_matcher
P = rbac_config_pb2.Permission
PR = rbac_config_pb2.Principal
DUAL_URI = "spiffe://mesh.example/ns/x/sa/other"
DUAL_DNS = "dual.mesh.example"


def _edge_cases():
    """name -> (permissions, principals, request metadata) of one ALLOW
    policy, replayed from A41's table and the reference suites (grpc-go
    rbac_engine_test, grpc-java GrpcAuthorizationEngineTest)."""
    from envoy.type.matcher.v3 import metadata_pb2

    def perm(rule, md=()):
        return [rule], None, list(md)

    def prin(rule, md=()):
        return None, [rule], list(md)

    return {
        "Host in capitals is :authority": perm(ib.header_rule(H("Host", present=True))),
        "TE is never present": perm(ib.header_rule(H("TE", present=False))),
        ":method is POST": perm(ib.header_rule(H(":method", exact="POST"))),
        "content-type": perm(ib.header_rule(H("content-type", exact="application/grpc"))),
        "user-agent": perm(ib.header_rule(H("user-agent", prefix="grpc-python"))),
        "values joined with commas": perm(
            ib.header_rule(H("x-m", exact="a,b")), [("x-m", "a"), ("x-m", "b")]
        ),
        "absent, exact inverted": perm(ib.header_rule(H("x-no", exact="a", invert_match=True))),
        "absent, present false": perm(ib.header_rule(H("x-no", present=False))),
        "absent, present inverted": perm(
            ib.header_rule(H("x-no", present=True, invert_match=True))
        ),
        "range with a sign": perm(ib.header_rule(H("x-n", range=(10, 20))), [("x-n", "+15")]),
        "url_path ignoring case": perm(ib.path_rule(prefix="/PYXDS.test", ignore_case=True)),
        "requested_server_name empty": perm(P(requested_server_name=ib.string_matcher(exact=""))),
        "metadata inverted": perm(P(metadata=metadata_pb2.MetadataMatcher(invert=True))),
        "any false is any": perm(P(any=False)),
        "empty and": perm(P(and_rules=P.Set(rules=[]))),
        "empty or": perm(P(or_rules=P.Set(rules=[]))),
        "destination_ip": perm(P(destination_ip=ib.cidr("127.0.0.1/32"))),
        "destination_port of another port": perm(P(destination_port=1)),
        "header name in capitals": perm(ib.header_rule(H("X-T", exact="1")), [("x-t", "1")]),
        "header value ignoring case": perm(
            ib.header_rule(H("x-t", exact="ABC", ignore_case=True)), [("x-t", "abc")]
        ),
        # C-core ignores case for ASCII letters only (U+212A KELVIN SIGN is not k).
        "header value ignoring case, Kelvin sign": perm(
            ib.header_rule(H("x-t", exact="\u212aey", ignore_case=True)), [("x-t", "key")]
        ),
        "legacy header suffix": perm(
            ib.header_rule(H("x-t", suffix="bc", legacy=True)), [("x-t", "abc")]
        ),
        "header range end is exclusive": perm(
            ib.header_rule(H("x-n", range=(10, 20))), [("x-n", "20")]
        ),
        "url_path exact without the leading slash": perm(ib.path_rule(exact=ECHO[1:])),
        "not destination_port of another port": perm(P(not_rule=P(destination_port=1))),
        "url_path regex": perm(ib.path_rule(safe_regex="/pyxds[.]test[.]Echo/.*")),
        "url_path suffix of another method": perm(ib.path_rule(suffix="/Other")),
        "requested_server_name not empty": perm(
            P(requested_server_name=ib.string_matcher(prefix="x"))
        ),
        "metadata not inverted": perm(P(metadata=metadata_pb2.MetadataMatcher())),
        "not of metadata": perm(P(not_rule=P(metadata=metadata_pb2.MetadataMatcher()))),
        "and of url_path and a header": perm(
            P(
                and_rules=P.Set(
                    rules=[ib.path_rule(prefix="/pyxds."), ib.header_rule(H("x-t", exact="1"))]
                )
            ),
            [("x-t", "1")],
        ),
        "and with one false rule": perm(
            P(and_rules=P.Set(rules=[ib.any_rule(), P(destination_port=1)]))
        ),
        "or of false rules then not": perm(
            P(
                not_rule=P(
                    or_rules=P.Set(
                        rules=[P(destination_port=1), P(metadata=metadata_pb2.MetadataMatcher())]
                    )
                )
            )
        ),
        "not of not of any": perm(P(not_rule=P(not_rule=ib.any_rule()))),
        "or_ids of a false and a true principal": prin(
            PR(or_ids=PR.Set(ids=[PR(source_ip=ib.cidr("10.0.0.0/8")), ib.authenticated()]))
        ),
        "and_ids with a false principal": prin(
            PR(and_ids=PR.Set(ids=[ib.authenticated(), PR(source_ip=ib.cidr("10.0.0.0/8"))]))
        ),
        "not_id of url_path": prin(PR(not_id=ib.path_rule(exact="/x.Y/Z", principal=True))),
        "source_ip": prin(PR(source_ip=ib.cidr("127.0.0.0/8"))),
        "remote_ip": prin(PR(remote_ip=ib.cidr("127.0.0.1/32"))),
        "direct_remote_ip of the other family": prin(PR(direct_remote_ip=ib.cidr("::/0"))),
        ":path principal": prin(ib.header_rule(H(":path", exact=ECHO), principal=True)),
        "authenticated": prin(ib.authenticated()),
        "not authenticated": prin(PR(not_id=ib.authenticated())),
        "URI SAN": prin(ib.principal_name(exact=DUAL_URI)),
        "empty name with a certificate": prin(ib.principal_name(exact="")),
        # Documented differences (A41 against C-core 1.85):
        "DNS SAN of a certificate with a URI SAN": prin(ib.principal_name(exact=DUAL_DNS)),
        "subject of a certificate with SANs": prin(ib.principal_name(exact="CN=dual")),
        "binary value as unpadded base64": perm(
            ib.header_rule(H("x-data-bin", exact="aGk")), [("x-data-bin", b"hi")]
        ),
        "binary value as raw bytes": perm(
            ib.header_rule(H("x-data-bin", exact="hi")), [("x-data-bin", b"hi")]
        ),
    }


EDGE_DIFFERENCES = {
    # case: (pyxds, C-core)
    "DNS SAN of a certificate with a URI SAN": ("PERMISSION_DENIED", "OK"),
    "subject of a certificate with SANs": ("PERMISSION_DENIED", "OK"),
    "binary value as unpadded base64": ("OK", "PERMISSION_DENIED"),
    "binary value as raw bytes": ("PERMISSION_DENIED", "OK"),
}


def _edge_listener(address, names):
    """One route per case (header ``x-case``), each overriding the RBAC
    filter (ALLOW nothing) with its own ALLOW policy; a route whose override
    is the fault filter's type under the RBAC filter's name (passed over:
    ALLOW nothing applies); the last route turns RBAC off."""
    cases = _edge_cases()
    routes = [
        b.route(
            prefix="/",
            headers=[H("x-case", exact="fault-typed")],
            typed_per_filter_config={"rbac": b.fault_config(abort_grpc_status=14)},
        )
    ]
    for i, name in enumerate(names):
        permissions, principals, _ = cases[name]
        policy = ib.rbac_policy(permissions=permissions, principals=principals)
        routes.append(
            b.route(
                prefix="/",
                headers=[H("x-case", exact=str(i))],
                typed_per_filter_config={"rbac": ib.rbac_per_route("ALLOW", {"p": policy})},
            )
        )
    routes.append(b.route(prefix="/", typed_per_filter_config={"rbac": ib.rbac_per_route()}))
    hcm = ib.inbound_hcm(
        ib.inbound_route_config("edges", routes),
        http_filters=[ib.rbac_filter("rbac", "ALLOW", {})],
    )
    chain = ib.filter_chain(hcm, tls=ib.downstream_tls("default", "default", True))
    return ib.server_listener(listener_name(address), address, [chain])


def test_rbac_edge_cases_agree_with_c_core_but_where_a41_says_otherwise(pair, control, pki):
    ours, core = pair()
    dual = pki.ca.issue("dual", dns=(DUAL_DNS,), uris=(DUAL_URI,))
    creds = grpc.ssl_channel_credentials(pki.ca.pem, dual.key, dual.cert)
    cases = _edge_cases()
    names = sorted(cases)
    publish_both(control, ours, core, lambda a: _edge_listener(a, names))
    got = {}
    for s in (ours, core):
        assert wait_served(s.address, creds).startswith("OK:"), s.kind
        with Client(s.address, creds) as client:
            got["fault-typed", s.kind] = client.code(ECHO, [("x-case", "fault-typed")])
            for i, name in enumerate(names):
                got[name, s.kind] = client.code(ECHO, [("x-case", str(i)), *cases[name][2]])
    assert got["fault-typed", ours.kind] == got["fault-typed", "core"] == "PERMISSION_DENIED"
    table = {name: (got[name, ours.kind], got[name, "core"]) for name in names}
    differences = {name: v for name, v in table.items() if v[0] != v[1]}
    expected = dict(EDGE_DIFFERENCES)
    if ours.kind == "pyxds-aio":  # grpc.aio hides :authority: the rule fails closed
        expected["Host in capitals is :authority"] = ("PERMISSION_DENIED", "OK")
    assert differences == expected, differences
    assert {v[1] for v in table.values()} == {"OK", "PERMISSION_DENIED"}


# ------------------------------------------------------------------ RDS


def test_rds_update_changes_outcomes_the_same_way(pair, control):
    """In place on both; after it: RBAC denies, an unsupported action and a
    path no route matches fail UNAVAILABLE, in the same words (routing comes
    before the method lookup: no handler exists for the unrouted path).  An
    RPC that reaches an unknown method is not sent to C-core: grpcio 1.85.3's
    xDS server aborts the process on it (tests/e2e/test_xds_server.py)."""
    ours, core = pair(with_pki=False, secure=False)
    rbac = [ib.rbac_filter("rbac", "ALLOW", {})]
    open_route = b.route(prefix="/", typed_per_filter_config={"rbac": ib.rbac_per_route()})
    first = ib.inbound_route_config("routes", [open_route])
    second = ib.inbound_route_config(
        "routes", [b.route(path=ECHO_STREAM, cluster="c"), b.route(prefix="/pyxds.test.Echo/")]
    )
    publish_both(control, ours, core, lambda a: plain(a, rbac, rds="routes"), routes=[first])
    for s in (ours, core):
        assert wait_served(s.address).startswith("OK:"), s.kind

    def outcomes(methods):
        out = {}
        for s in (ours, core):
            with Client(s.address) as client:
                out[s.kind] = [
                    client.call(m).removesuffix(s.servicer.name if s.kind != "core" else "core")
                    for m in methods
                ]
        return out

    before = outcomes([ECHO, ECHO_STREAM])
    assert before[ours.kind] == before["core"] == ["OK:", "OK:"]
    publish_both(control, ours, core, lambda a: plain(a, rbac, rds="routes"), routes=[second])
    want = [
        "PERMISSION_DENIED:Unauthorized RPC rejected",
        "UNAVAILABLE:UNAVAILABLE:matching route has unsupported action",
        "UNAVAILABLE:UNAVAILABLE:no route matched",
    ]
    seen: list = []

    def updated() -> bool:  # both servers answer by the new routes (not a fixed 1.5 s)
        seen[:] = [outcomes([ECHO, ECHO_STREAM, "/other.Svc/M"])]
        return seen[0][ours.kind] == seen[0]["core"] == want

    assert wait_until(updated, 10, interval=0.1), seen


# ------------------------------------------------------------------ NACKs


def _bad_listeners():
    """name -> function(address) -> Listener; ``-accepted`` ones both ACK;
    ``-a29`` ones pyxds NACKs as A29 says and C-core 1.85 ACKs
    (docs/differences-from-c-core.md)."""

    def lis(*chains, default=None):
        return lambda a: ib.server_listener(listener_name(a), a, chains, default)

    def edit(make, fn):
        def build(a):
            out = make(a)
            fn(out)
            return out

        return build

    def rbac(policy, action="ALLOW"):
        return lis(ib.filter_chain(http_filters=[ib.rbac_filter("rbac", action, {"p": policy})]))

    def tls(ctx):
        return lis(ib.filter_chain(tls=ctx))

    def rbac_typed(config):
        flt = ib.rbac_filter("rbac", "ALLOW", {})
        flt.typed_config.CopyFrom(b.pack(config))
        return lis(ib.filter_chain(http_filters=[flt]))

    def override(any_config):
        route = b.route(prefix="/")
        route.typed_per_filter_config["rbac"].CopyFrom(any_config)
        hcm = ib.inbound_hcm(
            ib.inbound_route_config("r", [route]),
            http_filters=[ib.rbac_filter("rbac", "ALLOW", {})],
        )
        return lis(ib.filter_chain(hcm))

    cases = {}
    cases["use-original-dst"] = edit(
        lis(ib.filter_chain()),
        lambda lis_: lis_.use_original_dst.CopyFrom(wrappers_pb2.BoolValue(value=True)),
    )
    cases["listener-filters-accepted"] = edit(
        lis(ib.filter_chain()), lambda lis_: lis_.listener_filters.add(name="tls_inspector")
    )
    cases["udp"] = edit(
        lis(ib.filter_chain()), lambda lis_: setattr(lis_.address.socket_address, "protocol", 1)
    )
    cases["no-chains"] = lis()
    two = ib.filter_chain()
    two.filters.append(two.filters[0])
    cases["two-filters"] = lis(two)
    cases["not-hcm"] = lis(
        listener_components_pb2.FilterChain(
            filters=[
                listener_components_pb2.Filter(name="x", typed_config=b.pack(router_pb2.Router()))
            ]
        )
    )
    cases["duplicate-chains"] = lis(
        ib.filter_chain(prefix_ranges=["10.1.2.3/8"]), ib.filter_chain(prefix_ranges=["10.0.0.0/8"])
    )
    cases["server-names-accepted"] = lis(
        ib.filter_chain(server_names=["a"]), ib.filter_chain(server_names=["a"]), ib.filter_chain()
    )
    cases["bad-cidr"] = lis(ib.filter_chain(source_prefix_ranges=["nope/8"]))
    # grpc-go filter_chain_test.go NACKs these three; C-core does not.
    cases["only-a-never-matching-chain-accepted"] = lis(ib.filter_chain(server_names=["a"]))
    cases["prefix-len-over-32-accepted"] = lis(
        ib.filter_chain(prefix_ranges=["10.1.1.0/50"], source_prefix_ranges=["::/200"])
    )
    odd_default = ib.filter_chain()
    odd_default.filter_chain_match.source_type = 5  # type: ignore[assignment]
    cases["default-chain-unknown-source-type"] = lis(ib.filter_chain(), default=odd_default)
    odd_chain = ib.filter_chain()
    odd_chain.filter_chain_match.source_type = 7  # type: ignore[assignment]
    cases["unknown-source-type"] = lis(odd_chain)
    cases["default-chain-bad-cidr"] = lis(
        ib.filter_chain(), default=ib.filter_chain(prefix_ranges=["nope/8"])
    )
    condition = ib.rbac_policy()
    condition.condition.const_expr.bool_value = True
    cases["rbac-condition"] = rbac(condition)
    cases["rbac-grpc-header"] = rbac(
        ib.rbac_policy(permissions=[ib.header_rule(b.header_matcher("grpc-x", exact="1"))])
    )
    cases["rbac-scheme-header"] = rbac(
        ib.rbac_policy(
            principals=[ib.header_rule(b.header_matcher(":scheme", exact="h"), principal=True)]
        )
    )
    cases["rbac-port-range"] = rbac(
        ib.rbac_policy(
            permissions=[
                rbac_config_pb2.Permission(
                    destination_port_range=range_pb2.Int32Range(start=1, end=2)
                )
            ]
        )
    )
    cases["rbac-log-accepted"] = rbac(ib.rbac_policy(), action="LOG")
    cases["rbac-bad-regex"] = rbac(
        ib.rbac_policy(permissions=[ib.header_rule(b.header_matcher("x-a", safe_regex="a("))])
    )
    cases["rbac-bad-cidr-accepted"] = rbac(
        ib.rbac_policy(principals=[rbac_config_pb2.Principal(source_ip=ib.cidr("nope/8"))])
    )
    cases["rbac-no-string-pattern"] = rbac(
        ib.rbac_policy(
            permissions=[rbac_config_pb2.Permission(requested_server_name=ib.string_matcher())]
        )
    )
    cases["fault-on-server"] = lis(
        ib.filter_chain(http_filters=[b.fault_filter(abort_grpc_status=14)])
    )
    cases["tls-no-identity"] = tls(ib.downstream_tls(None, "default", False))
    cases["tls-require-no-ca"] = tls(ib.downstream_tls("default", None, True))
    cases["tls-unknown-provider"] = tls(ib.downstream_tls("nope", "default", True))
    sni = ib.downstream_tls()
    sni.require_sni.value = True
    cases["tls-require-sni"] = tls(sni)
    ocsp = ib.downstream_tls()
    ocsp.ocsp_staple_policy = ocsp.STRICT_STAPLING
    cases["tls-ocsp"] = tls(ocsp)
    sans = ib.downstream_tls()
    sans.common_tls_context.combined_validation_context.default_validation_context.match_subject_alt_names.add(
        exact="x"
    )
    cases["tls-sans"] = tls(sans)
    xff = ib.inbound_hcm()
    xff.xff_num_trusted_hops = 2
    cases["xff"] = lis(ib.filter_chain(xff))
    unknown_action = ib.rbac_config("ALLOW", {"p": ib.rbac_policy()})
    unknown_action.rules.action = 3
    cases["rbac-unknown-action"] = rbac_typed(unknown_action)
    cases["rbac-per-route-as-the-filter"] = rbac_typed(ib.rbac_per_route("ALLOW", {}))
    audit = ib.rbac_config("ALLOW", {"p": ib.rbac_policy()})
    audit.rules.audit_logging_options.audit_condition = 9
    audit.rules.audit_logging_options.logger_configs.add(
        audit_logger=extension_pb2.TypedExtensionConfig(
            name="x", typed_config=b.pack(struct_pb2.Struct())
        )
    )
    cases["rbac-audit-logging-accepted"] = rbac_typed(audit)
    shadow = ib.rbac_config("DENY", {"p": ib.rbac_policy()})
    shadow.shadow_rules.action = 0
    cases["rbac-shadow-rules-accepted"] = rbac_typed(shadow)
    after_router = ib.inbound_hcm()
    after_router.http_filters.append(ib.rbac_filter("rbac", "ALLOW", {}))
    cases["rbac-after-the-router"] = lis(ib.filter_chain(after_router))
    cases["duplicate-filter-names"] = lis(
        ib.filter_chain(
            http_filters=[ib.rbac_filter("r", "ALLOW", {}), ib.rbac_filter("r", "DENY", {})]
        )
    )
    cases["override-of-the-rbac-type"] = override(b.pack(ib.rbac_config("DENY", {})))
    cases["override-of-the-rbac-type-optional-accepted"] = override(
        b.pack(
            route_components_pb2.FilterConfig(
                config=b.pack(ib.rbac_config("DENY", {})), is_optional=True
            )
        )
    )
    cases["override-in-a-typed-struct"] = override(
        b.pack(
            typed_struct_pb2.TypedStruct(
                type_url=f"type.googleapis.com/{RBAC_PER_ROUTE_TYPE}", value=struct_pb2.Struct()
            )
        )
    )
    named = ib.filter_chain(tls=ib.downstream_tls())
    named.transport_socket.name = "envoy.transport_sockets.raw_buffer"
    cases["tls-socket-name-a29"] = lis(named)
    # HTTP filters on servers (A39 as A36 asks): unknown, optional, ECDS, the router.
    from envoy.config.core.v3 import config_source_pb2
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    def filters(*http_filters, router=True):
        hcm = ib.inbound_hcm()
        del hcm.http_filters[:]
        hcm.http_filters.extend(http_filters)
        if router:
            hcm.http_filters.append(b.router_filter())
        return lis(ib.filter_chain(hcm))

    unknown = hcm_pb2.HttpFilter(name="unknown", typed_config=b.pack(wrappers_pb2.StringValue()))
    cases["unknown-filter"] = filters(unknown)
    optional_unknown = hcm_pb2.HttpFilter()
    optional_unknown.CopyFrom(unknown)
    optional_unknown.is_optional = True
    cases["unknown-filter-optional-accepted"] = filters(optional_unknown)
    optional_fault = b.fault_filter(abort_grpc_status=14)
    optional_fault.is_optional = True
    cases["fault-optional-on-server-accepted"] = filters(optional_fault)
    ecds = hcm_pb2.HttpFilter(
        name="ecds",
        config_discovery=config_source_pb2.ExtensionConfigSource(
            config_source=b.ads_config_source(), type_urls=["type.googleapis.com/x.Y"]
        ),
    )
    cases["ecds-filter"] = filters(ecds)
    optional_ecds = hcm_pb2.HttpFilter()
    optional_ecds.CopyFrom(ecds)
    optional_ecds.is_optional = True
    cases["ecds-filter-optional"] = filters(optional_ecds)
    cases["no-router"] = filters(ib.rbac_filter("rbac", "ALLOW", {}), router=False)
    cases["no-http-filters"] = filters(router=False)
    cases["only-an-optional-unknown-filter"] = filters(optional_unknown, router=False)
    cases["only-an-unknown-filter"] = filters(unknown, router=False)
    bad_rbac = ib.rbac_filter(
        "bad", "ALLOW", {"p": ib.rbac_policy(permissions=[ib.path_rule(safe_regex="(")])}
    )
    cases["only-a-bad-rbac-filter"] = filters(bad_rbac, router=False)
    junk_rbac = ib.rbac_filter("junk", "ALLOW", {})
    junk_rbac.typed_config.value = b"\xff"
    cases["only-an-unparsable-rbac-filter"] = filters(junk_rbac, router=False)
    cases["bad-rbac-router-rbac"] = filters(
        bad_rbac, b.router_filter(), ib.rbac_filter("good", "ALLOW", {}), router=False
    )
    router_in_struct = hcm_pb2.HttpFilter(
        name="router",
        typed_config=b.pack(
            typed_struct_pb2.TypedStruct(
                type_url="type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
            )
        ),
    )
    cases["router-in-a-typed-struct"] = filters(router_in_struct, router=False)
    rbac_in_struct = hcm_pb2.HttpFilter(
        name="rbac",
        typed_config=b.pack(
            typed_struct_pb2.TypedStruct(
                type_url="type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
            )
        ),
    )
    cases["rbac-in-a-typed-struct"] = filters(rbac_in_struct)
    unknown_in_struct = hcm_pb2.HttpFilter(
        name="unknown",
        is_optional=True,
        typed_config=b.pack(typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/x.Y")),
    )
    cases["unknown-in-a-typed-struct-optional-accepted"] = filters(unknown_in_struct)
    # Network filter, default chain and transport socket shapes.
    cases["bad-default-chain"] = lis(ib.filter_chain(), default=two)
    no_config = ib.filter_chain()
    no_config.filters[0].ClearField("typed_config")
    cases["network-filter-without-config"] = lis(no_config)
    hcm_struct = ib.filter_chain()
    hcm_struct.filters[0].typed_config.CopyFrom(
        b.pack(
            typed_struct_pb2.TypedStruct(
                type_url="type.googleapis.com/envoy.extensions.filters.network."
                "http_connection_manager.v3.HttpConnectionManager"
            )
        )
    )
    cases["hcm-in-a-typed-struct"] = lis(hcm_struct)
    socket_no_config = ib.filter_chain(tls=ib.downstream_tls())
    socket_no_config.transport_socket.ClearField("typed_config")
    cases["tls-socket-without-config"] = lis(socket_no_config)
    socket_struct = ib.filter_chain(tls=ib.downstream_tls())
    socket_struct.transport_socket.typed_config.CopyFrom(
        b.pack(
            typed_struct_pb2.TypedStruct(
                type_url="type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                "DownstreamTlsContext"
            )
        )
    )
    cases["tls-in-a-typed-struct"] = lis(socket_struct)
    socket_other = ib.filter_chain(tls=ib.downstream_tls())
    socket_other.transport_socket.typed_config.CopyFrom(b.pack(router_pb2.Router()))
    cases["tls-of-another-type"] = lis(socket_other)
    other_struct = ib.filter_chain()
    other_struct.filters[0].typed_config.CopyFrom(
        b.pack(typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/x.Y"))
    )
    cases["network-filter-in-a-typed-struct-of-another-type"] = lis(other_struct)
    # CommonTlsContext fields C-core refuses, and ones it passes over.
    from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

    def tls_edit(fn):
        ctx = ib.downstream_tls()
        fn(ctx.common_tls_context)
        return tls(ctx)

    def default_vc(common):
        return common.combined_validation_context.default_validation_context

    cases["tls-inline-certificates-accepted"] = tls_edit(lambda c: c.tls_certificates.add())
    cases["tls-sds-certificates-accepted"] = tls_edit(
        lambda c: c.tls_certificate_sds_secret_configs.add(name="s")
    )
    cases["tls-alpn-accepted"] = tls_edit(lambda c: c.alpn_protocols.append("h2"))
    cases["tls-sds-validation"] = tls_edit(
        lambda c: c.validation_context_sds_secret_config.CopyFrom(
            secret_pb2.SdsSecretConfig(name="s")
        )
    )
    cases["tls-verify-spki"] = tls_edit(lambda c: default_vc(c).verify_certificate_spki.append("x"))
    cases["tls-crl"] = tls_edit(lambda c: setattr(default_vc(c).crl, "inline_string", "x"))
    from envoy.config.route.v3 import route_components_pb2 as rc_pb2

    cases["override-disabled-without-config"] = override(b.pack(rc_pb2.FilterConfig(disabled=True)))
    cases["override-of-an-unknown-type"] = override(b.pack(wrappers_pb2.StringValue()))
    cases["override-of-the-router"] = override(b.pack(router_pb2.Router()))
    from envoy.extensions.filters.http.fault.v3 import fault_pb2

    unknown_denominator = fault_pb2.HTTPFault()
    unknown_denominator.abort.grpc_status = 14
    unknown_denominator.abort.percentage.denominator = 5  # type: ignore[assignment]
    cases["override-fault-unknown-denominator-accepted"] = override(b.pack(unknown_denominator))
    bad_status = fault_pb2.HTTPFault()
    bad_status.abort.grpc_status = 99
    cases["override-fault-bad-grpc-status"] = override(b.pack(bad_status))
    bad_delay = fault_pb2.HTTPFault()
    bad_delay.delay.fixed_delay.seconds = -1
    cases["override-fault-bad-delay"] = override(b.pack(bad_delay))
    cases["override-fault-in-a-typed-struct"] = override(
        b.pack(
            typed_struct_pb2.TypedStruct(
                type_url="type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"
            )
        )
    )
    optional_router = rc_pb2.FilterConfig(is_optional=True)
    optional_router.config.CopyFrom(b.pack(router_pb2.Router()))
    cases["override-of-the-router-optional-accepted"] = override(b.pack(optional_router))
    from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2

    optional_ssa = rc_pb2.FilterConfig(is_optional=True)
    optional_ssa.config.CopyFrom(b.pack(stateful_session_pb2.StatefulSession()))
    cases["override-of-the-stateful-session-type-optional-accepted"] = override(
        b.pack(optional_ssa)
    )
    unknown_wrapped = rc_pb2.FilterConfig()
    unknown_wrapped.config.CopyFrom(b.pack(wrappers_pb2.StringValue()))
    cases["override-of-an-unknown-type-in-a-filter-config"] = override(b.pack(unknown_wrapped))
    bad_wrapped = rc_pb2.FilterConfig()
    bad_wrapped.config.CopyFrom(
        b.pack(ib.rbac_per_route("ALLOW", {"p": ib.rbac_policy([ib.path_rule(safe_regex="(")])}))
    )
    cases["override-bad-rbac-in-a-filter-config"] = override(b.pack(bad_wrapped))
    with_config = rc_pb2.FilterConfig(disabled=True)
    with_config.config.CopyFrom(b.pack(ib.rbac_per_route("DENY", {})))
    cases["override-disabled-with-config-accepted"] = override(b.pack(with_config))
    with_matcher = ib.rbac_config("DENY", {})
    with_matcher.ClearField("rules")
    with_matcher.matcher.SetInParent()
    cases["rbac-matcher-api-accepted"] = rbac_typed(with_matcher)
    return cases


def _core_nack_errors(message):
    """C-core's NACK text: per resource name, its (field, error) pairs."""
    out = {}
    body = message[message.index("[") + 1 : message.rindex("]")]
    for part in body.split("resource index ")[1:]:
        _, name, rest = part.rstrip("; ").split(": ", 2)
        inner = rest[rest.index("[") + 1 : rest.rindex("]")]
        pairs = set()
        for item in inner.split("; field:"):
            field, sep, error = item.removeprefix("field:").partition(" error:")
            if not sep:  # several errors: "field:X errors:[a; b]"
                field, _, errors = item.removeprefix("field:").partition(" errors:[")
                pairs.update((field, e) for e in errors.rstrip("]").split("; "))
            else:
                pairs.add((field, error))
        out[name] = pairs
    return out


def _pyxds_nack_errors(message):
    out = {}
    body = message[message.index("[") + 1 : message.rindex("]")]
    for part in body.split("resource index ")[1:]:
        _, name, rest = part.rstrip("; ").split(": ", 2)
        out[name] = {tuple(item.split(": ", 1)) for item in rest.split("; ")}
    return out


def test_listener_nacks_agree_with_c_core(control, pki):
    """Every bad server Listener: NACKed by both with the same (field, error)
    pairs, and the ``-accepted`` ones ACKed by both."""
    cases = _bad_listeners()
    names = sorted(cases)
    extra = {"certificate_providers": pki.providers()}
    core = CoreXdsServer(
        control.bootstrap("nack-core", server_listener_resource_name_template=TEMPLATE, **extra),
        secure=False,
        extra_ports=len(names) - 1,
    )
    ours = pyxds.xds_server(
        None,
        bootstrap=control.bootstrap(
            "nack-ours", server_listener_resource_name_template=TEMPLATE, **extra
        ),
    )
    our_addresses = [f"127.0.0.1:{ours.add_insecure_port('127.0.0.1:0')}" for _ in names]
    for node, addresses in (("nack-core", core.addresses), ("nack-ours", our_addresses)):
        control.set_snapshot(
            Snapshot(listeners=[cases[n](a) for n, a in zip(names, addresses, strict=True)]),
            node_id=node,
        )
    core.start()
    ours.start()
    try:

        def errors(node, addresses, parse):
            def ready():
                nacks = control.nacks("LDS", node_id=node)
                if not nacks:
                    return None
                by_name = parse(nacks[-1].error_message)
                wanted = [n for n in names if not n.endswith("-accepted")]
                if node == "nack-core":
                    wanted = [n for n in wanted if not n.endswith("-a29")]
                return by_name if len(by_name) >= len(wanted) else None

            found = control.wait_until(
                ready, timeout=20, what=f"{node}'s NACK of every bad Listener"
            )
            case_of = {listener_name(a): n for n, a in zip(names, addresses, strict=True)}
            return {case_of[k]: v for k, v in found.items()}

        theirs = errors("nack-core", core.addresses, _core_nack_errors)
        mine = errors("nack-ours", our_addresses, _pyxds_nack_errors)
        assert set(theirs) == {n for n in names if not n.endswith(("-accepted", "-a29"))}
        diff = {n: (mine.get(n), theirs[n]) for n in theirs if mine.get(n) != theirs[n]}
        assert not diff, diff
        assert set(mine) == set(theirs) | {n for n in names if n.endswith("-a29")}
        assert mine["tls-socket-name-a29"] == {
            (
                "filter_chains[0].transport_socket.name",
                "unsupported transport socket name 'envoy.transport_sockets.raw_buffer' "
                "(gRFC A29: only envoy.transport_sockets.tls)",
            )
        }
    finally:
        ours.stop(None).wait(10)
        core.stop()
