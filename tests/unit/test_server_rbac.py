"""The RBAC engine, table-driven from gRFC A41's mapping of RBAC to gRPC
(and C-core's evaluate_args.cc / matchers.cc where A41 leaves room)."""

from __future__ import annotations

import ipaddress

import pytest
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.serving.rbac import RbacEngine, RequestInfo
from pyxds.xds.resources._common import Errors
from pyxds.xds.resources.rbac import parse_rbac

P = rbac_config_pb2.Permission
I = rbac_config_pb2.Principal  # noqa: E741


def engine(action, policies):
    errs = Errors()
    config = parse_rbac(ib.rbac_config(action, policies).SerializeToString(), "", errs)
    assert not errs, errs
    return RbacEngine(config)


def info(**kw):
    base = dict(
        path="/pkg.Svc/Method",
        metadata=(),
        authority="svc.example:80",
        peer_ip=ipaddress.ip_address("10.0.0.5"),
        local_ip=ipaddress.ip_address("10.0.0.1"),
        local_port=8080,
    )
    base.update(kw)
    return RequestInfo(**base)


def allows_permission(permission, **kw) -> bool:
    """Whether an ALLOW policy with this single permission allows the RPC."""
    return engine("ALLOW", {"p": ib.rbac_policy(permissions=[permission])}).allows(info(**kw))


def allows_principal(principal, **kw) -> bool:
    return engine("ALLOW", {"p": ib.rbac_policy(principals=[principal])}).allows(info(**kw))


def header(name, **kw):
    return ib.header_rule(b.header_matcher(name, **kw))


HEADER_CASES = [
    # (matcher name, matcher, request kwargs, matches)
    (":path", {"exact": "/pkg.Svc/Method"}, {}, True),
    (":method", {"exact": "POST"}, {}, True),
    (":authority", {"exact": "svc.example:80"}, {}, True),
    ("host", {"exact": "svc.example:80"}, {}, True),  # Host aliases :authority (A41)
    ("content-type", {"prefix": "application/grpc"}, {}, True),
    ("te", {"present": True}, {"metadata": (("te", "trailers"),)}, False),  # hop-by-hop
    ("x-user", {"exact": "a,b"}, {"metadata": (("x-user", "a"), ("x-user", "b"))}, True),
    ("x-user", {"exact": "a"}, {}, False),  # absent
    ("x-user", {"present": False}, {}, True),  # absent: only present_match false
    ("x-user", {"exact": "a", "invert_match": True}, {}, False),  # invert never rescues absent
    # binary values as the base64 gRPC sends on the wire: unpadded (A41; grpc-java)
    ("x-bin", {"exact": "AAE"}, {"metadata": (("x-bin", b"\x00\x01"),)}, True),
    ("x-bin", {"exact": "AAE="}, {"metadata": (("x-bin", b"\x00\x01"),)}, False),
    ("Host", {"exact": "svc.example:80"}, {}, True),  # C-core: any case of host and te
    ("TE", {"present": True}, {"metadata": (("te", "trailers"),)}, False),
    ("x-user", {"safe_regex": "a+b"}, {"metadata": (("x-user", "aab"),)}, True),
    ("x-n", {"range": (10, 20)}, {"metadata": (("x-n", "15"),)}, True),
    ("x-n", {"range": (10, 20)}, {"metadata": (("x-n", "20"),)}, False),
    ("user-agent", {"contains": "grpc"}, {"metadata": (("user-agent", "grpc-python"),)}, True),
]


@pytest.mark.parametrize(("name", "kw", "req", "expected"), HEADER_CASES)
def test_header_rules_see_what_a41_says(name, kw, req, expected):
    assert allows_permission(header(name, **kw), **req) is expected


@pytest.mark.parametrize(
    ("matcher", "expected"),
    [({"exact": "/pkg.Svc/Method"}, True), ({"prefix": "/pkg.Other/"}, False)],
)
def test_url_path_is_the_method_path(matcher, expected):
    assert allows_permission(ib.path_rule(**matcher)) is expected


def test_destination_ip_and_port_are_the_local_address():
    assert allows_permission(P(destination_ip=ib.cidr("10.0.0.0/24")))
    assert not allows_permission(P(destination_ip=ib.cidr("10.0.1.0/24")))
    assert allows_permission(P(destination_port=8080))
    assert not allows_permission(P(destination_port=8081))


@pytest.mark.parametrize("field", ["source_ip", "direct_remote_ip", "remote_ip"])
def test_every_peer_ip_principal_is_the_peer_address(field):
    assert allows_principal(I(**{field: ib.cidr("10.0.0.0/29")}))
    assert not allows_principal(I(**{field: ib.cidr("10.0.0.8/29")}))
    assert not allows_principal(I(**{field: ib.cidr("10.0.0.0/29")}), peer_ip=None)


def test_metadata_never_matches_and_requested_server_name_is_empty():
    from envoy.type.matcher.v3 import metadata_pb2

    assert not allows_permission(P(metadata=metadata_pb2.MetadataMatcher()))
    assert allows_permission(P(metadata=metadata_pb2.MetadataMatcher(invert=True)))
    assert allows_permission(P(requested_server_name=ib.string_matcher(exact="")))
    assert not allows_permission(P(requested_server_name=ib.string_matcher(exact="x")))


AUTH = {
    "secure": True,
    "uri_sans": ("spiffe://td/ns/a/sa/b",),
    "dns_sans": ("client.example",),
    "subject": "CN=client,O=Org",
}


@pytest.mark.parametrize(
    ("matcher", "req", "expected"),
    [
        ({"exact": "spiffe://td/ns/a/sa/b"}, AUTH, True),
        ({"prefix": "spiffe://other/"}, AUTH, False),
        ({"exact": ""}, {"secure": True}, True),  # TLS without a client certificate
        ({"exact": "spiffe://td/ns/a/sa/b"}, {}, False),  # plaintext
    ],
)
def test_authenticated_principal_name(matcher, req, expected):
    assert allows_principal(ib.principal_name(**matcher), **req) is expected


# grpc-go rbac_engine_test.go TestAuthenticatedMatcherIdentitySourcePrecedence
# (A41 steps 1-3: only the first kind of name the certificate has is tried;
# C-core 1.85 tries them all, docs/differences-from-c-core.md).
@pytest.mark.parametrize(
    ("uris", "dns", "subject", "contains", "expected"),
    [
        (
            ("spiffe://corp.example/svc/legitimate",),
            (),
            "",
            "spiffe://corp.example/svc/legitimate",
            True,
        ),
        (
            ("spiffe://corp.example/svc/other",),
            ("spiffe://corp.example/svc/legitimate",),
            "",
            "spiffe://corp.example/svc/legitimate",
            False,
        ),
        (
            ("spiffe://corp.example/svc/other",),
            (),
            "CN=spiffe://corp.example/svc/legitimate",
            "spiffe://corp.example/svc/legitimate",
            False,
        ),
        ((), ("svc.legitimate.internal",), "", "svc.legitimate.internal", True),
        (
            (),
            ("svc.other.internal",),
            "CN=svc.legitimate.internal",
            "svc.legitimate.internal",
            False,
        ),
        ((), (), "CN=svc.legitimate.internal", "svc.legitimate.internal", True),
    ],
)
def test_authenticated_principal_name_tries_only_the_first_kind_of_name(
    uris, dns, subject, contains, expected
):
    req = {"secure": True, "uri_sans": uris, "dns_sans": dns, "subject": subject}
    assert allows_principal(ib.principal_name(contains=contains), **req) is expected
    # The exact-match fast path agrees.
    for name in (*uris, *dns, subject):
        if contains in name and name == contains:
            assert allows_principal(ib.principal_name(exact=name), **req) is expected


def test_a_certificate_with_a_uri_san_does_not_match_the_empty_name():
    """grpc-go default-matching-no-credentials: "" matches only a TLS peer
    without a certificate, not one whose URI SAN is something else."""
    cert = {"secure": True, "uri_sans": ("spiffe://cluster.local/ns/default/sa/admin",)}
    assert not allows_principal(ib.principal_name(exact=""), **cert)
    assert allows_principal(ib.principal_name(exact=""), secure=True)


def test_authenticated_without_a_name_needs_only_tls():
    assert allows_principal(ib.authenticated(), secure=True)
    assert not allows_principal(ib.authenticated())


def test_and_or_not_compose():
    yes = ib.path_rule(prefix="/pkg.Svc/")
    no = P(destination_port=1)
    assert allows_permission(P(and_rules=P.Set(rules=[yes, P(not_rule=no)])))
    assert not allows_permission(P(and_rules=P.Set(rules=[yes, no])))
    assert allows_permission(P(or_rules=P.Set(rules=[no, yes])))
    assert not allows_permission(P(not_rule=yes))
    assert allows_principal(I(or_ids=I.Set(ids=[I(not_id=I(any=True)), I(any=True)])))


def test_a_policy_needs_a_matching_permission_and_principal():
    policy = ib.rbac_policy(permissions=[ib.any_rule()], principals=[I(not_id=I(any=True))])
    assert not engine("ALLOW", {"p": policy}).allows(info())
    empty = rbac_config_pb2.Policy()
    assert not engine("ALLOW", {"p": empty}).allows(info())


def test_allow_and_deny_actions():
    match = ib.rbac_policy(permissions=[ib.path_rule(exact="/pkg.Svc/Method")])
    miss = ib.rbac_policy(permissions=[ib.path_rule(exact="/pkg.Svc/Other")])
    assert engine("ALLOW", {"m": match, "x": miss}).allows(info())
    assert not engine("ALLOW", {"x": miss}).allows(info())
    assert not engine("ALLOW", {}).allows(info())  # ALLOW with no policy allows nothing
    assert not engine("DENY", {"m": match}).allows(info())
    assert engine("DENY", {"x": miss}).allows(info())
    assert engine("DENY", {}).allows(info())


def test_log_action_and_missing_rules_allow_everything():
    assert engine("LOG", {"m": ib.rbac_policy()}).noop


# -- unknown :authority (grpc.aio servers) and local address: fail closed ----------


def test_allow_on_an_unknown_authority_does_not_allow():
    rule = header(":authority", exact="svc.example:80")
    assert not allows_permission(rule, authority=None)
    assert not allows_permission(P(not_rule=rule), authority=None)


def test_deny_on_an_unknown_authority_denies():
    rule = header(":authority", exact="evil.example")
    deny = engine("DENY", {"d": ib.rbac_policy(permissions=[rule])})
    assert deny.allows(info())  # known and different: allowed
    assert not deny.allows(info(authority=None))  # unknown: denied


def test_unknown_input_under_a_definite_false_is_irrelevant():
    """An AND with a definitely false part is false whatever is unknown: a
    DENY policy that cannot match lets the RPC through."""
    rule = P(
        and_rules=P.Set(rules=[header(":authority", exact="x"), ib.path_rule(exact="/no.S/M")])
    )
    deny = engine("DENY", {"d": ib.rbac_policy(permissions=[rule])})
    assert deny.allows(info(authority=None))


def test_unknown_local_address_is_unknown_for_destination_ip():
    deny = engine(
        "DENY", {"d": ib.rbac_policy(permissions=[P(destination_ip=ib.cidr("1.1.1.1/32"))])}
    )
    assert deny.allows(info())
    assert not deny.allows(info(local_ip=None))
