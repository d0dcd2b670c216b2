"""RBAC conformance (gRFC A41): cases taken from the other implementations'
own suites and replayed sans-IO through pyxds's parser
(:func:`pyxds.xds.resources.rbac.parse_rbac`) and engine
(:class:`pyxds.serving.rbac.RbacEngine`).

Sources (each test names its case):

* grpc-go ``internal/xds/rbac/rbac_engine_test.go`` (TestNewChainEngine,
  TestChainEngine),
* grpc-java ``xds/src/test/java/io/grpc/xds/internal/rbac/engine/
  GrpcAuthorizationEngineTest.java`` and ``xds/src/test/java/io/grpc/xds/
  RbacFilterTest.java``,
* C-core ``test/core/security/authorization_matchers_test.cc``
  (AuthorizationMatchersTest).

Where the sources disagree, A41's text decides, then C-core (grpcio's own
xDS server); the cases that pyxds answers differently from one of them say
so (docs/differences-from-c-core.md).  Cases already covered elsewhere are
listed in /work/reports/conformsrv.md, not repeated here.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.type.matcher.v3 import metadata_pb2
from google.protobuf import struct_pb2

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.serving.rbac import RbacEngine, RequestInfo
from pyxds.xds.resources._common import Errors
from pyxds.xds.resources.rbac import NO_RBAC, parse_rbac, parse_rbac_override

P = rbac_config_pb2.Permission
I = rbac_config_pb2.Principal  # noqa: E741
H = b.header_matcher


def config(action: str, policies: dict[str, Any]) -> rbac_pb2.RBAC:
    return ib.rbac_config(action, policies)


def parse(msg: rbac_pb2.RBAC) -> tuple[Any, Errors]:
    errs = Errors()
    return parse_rbac(msg.SerializeToString(), "", errs), errs


def engine(action: str, policies: dict[str, Any]) -> RbacEngine:
    parsed, errs = parse(config(action, policies))
    assert not errs, errs
    return RbacEngine(parsed)


def rpc(**kw: Any) -> RequestInfo:
    """An RPC; addresses as text (``peer=None``: not an IP peer)."""
    base: dict[str, Any] = {
        "path": "/pkg.Svc/Method",
        "metadata": (),
        "authority": "svc.example",
        "peer_ip": "10.4.2.3",
        "local_ip": "10.1.2.3",
        "local_port": 8080,
    }
    base.update(kw)
    for key in ("peer_ip", "local_ip"):
        if isinstance(base[key], str):
            base[key] = ipaddress.ip_address(base[key])
    return RequestInfo(**base)


def allow(policy: Any, **kw: Any) -> bool:
    return engine("ALLOW", {"p": policy}).allows(rpc(**kw))


def policy(permissions: Any = None, principals: Any = None) -> Any:
    return ib.rbac_policy(permissions=permissions, principals=principals)


def cidr(address: str, prefix_len: int | None = None) -> Any:
    return ib.cidr(address if prefix_len is None else f"{address}/{prefix_len}")


# ---------------------------------------------------------------- grpc-go TestChainEngine


def test_any_permission_and_any_principal_allow_every_rpc():
    """grpc-go rbac_engine_test.go TestChainEngine SuccessCaseAnyMatch."""
    assert allow(policy(), path="some method", peer_ip="0.0.0.0")


@pytest.mark.parametrize(("path", "allowed"), [("localhost-fan-page", True), ("", False)])
def test_url_path_policy_allows_only_its_path(path, allowed):
    """grpc-go TestChainEngine SuccessCaseSimplePolicy (the second RPC has no
    method at all: url_path never matches it)."""
    rule = ib.path_rule(exact="localhost-fan-page")
    assert allow(policy([rule]), path=path) is allowed


ENVOY_EXAMPLE = {
    "service-admin": policy(
        [ib.any_rule()],
        [
            ib.principal_name(exact="//cluster.local/ns/default/sa/admin"),
            ib.principal_name(exact="//cluster.local/ns/default/sa/superuser"),
        ],
    ),
    "product-viewer": policy(
        [
            P(
                and_rules=P.Set(
                    rules=[
                        ib.header_rule(H(":method", exact="GET", legacy=True)),
                        ib.path_rule(prefix="/products"),
                    ]
                )
            )
        ]
    ),
}


@pytest.mark.parametrize(
    ("request_kw", "allowed"),
    [
        # A client certificate whose URI SAN is the admin's.
        (
            {
                "path": "some method",
                "secure": True,
                "uri_sans": ("//cluster.local/ns/default/sa/admin",),
            },
            True,
        ),
        ({"path": ""}, False),
        # :method is POST for gRPC (A41): the GET product viewer never matches.
        ({"path": "get-product-list"}, False),
        ({"path": "/products/list"}, False),
        # A certificate with only a subject, not an admin's.
        ({"path": "", "secure": True, "subject": "CN=localhost"}, False),
    ],
)
def test_envoy_documentation_example(request_kw, allowed):
    """grpc-go TestChainEngine SuccessCaseEnvoyExample (the example of
    Envoy's RBAC documentation), plus a /products path: still POST."""
    assert engine("ALLOW", ENVOY_EXAMPLE).allows(rpc(**request_kw)) is allowed


@pytest.mark.parametrize(
    ("path", "allowed"), [("/regular-content", True), ("/secret-content", False)]
)
def test_not_rule_inverts_a_url_path(path, allowed):
    """grpc-go TestChainEngine NotMatcher."""
    rule = P(not_rule=ib.path_rule(prefix="/secret-content"))
    assert allow(policy([rule]), path=path) is allowed


@pytest.mark.parametrize("field", ["direct_remote_ip", "remote_ip", "source_ip"])
@pytest.mark.parametrize(("peer", "allowed"), [("0.0.0.0", True), ("10.0.0.0", False)])
def test_peer_ip_principals_mask_the_prefix(field, peer, allowed):
    """grpc-go TestChainEngine DirectRemoteIpMatcher, RemoteIpMatcher and
    SourceIpMatcher: 0.0.0.0/10 holds 0.0.0.0, not 10.0.0.0 (A41: all three
    are the peer address)."""
    principal = I(**{field: cidr("0.0.0.0", 10)})
    assert allow(policy(None, [principal]), peer_ip=peer) is allowed


def test_destination_ip_is_the_local_address():
    """grpc-go TestChainEngine DestinationIpMatcher: 0.0.0.0/10 does not
    hold the server's loopback address."""
    rule = P(destination_ip=cidr("0.0.0.0", 10))
    assert not allow(policy([rule]), local_ip="127.0.0.1")
    assert allow(policy([rule]), local_ip="0.1.2.3")


@pytest.mark.parametrize(
    ("peer", "path", "allowed"),
    [
        ("0.0.0.0", "some method", True),  # allowed by the first, not denied by the second
        ("0.0.0.0", "localhost-fan-page", False),  # denied by the second
        ("10.0.0.0", "some method", False),  # not allowed by the first
        ("10.0.0.0", "localhost-fan-page", False),  # neither
    ],
)
def test_an_allow_filter_then_a_deny_filter(peer, path, allowed):
    """grpc-go TestChainEngine AllowAndDenyPolicy: two RBAC filters, the RPC
    goes on only when each lets it (the HCM runs them in order)."""
    first = engine("ALLOW", {"src": policy(None, [I(direct_remote_ip=cidr("0.0.0.0", 10))])})
    second = engine("DENY", {"fan": policy([ib.path_rule(exact="localhost-fan-page")])})
    request = rpc(peer_ip=peer, path=path)
    assert (first.allows(request) and second.allows(request)) is allowed


@pytest.mark.parametrize(
    ("regex", "value", "allowed"),
    [("abc", "abc", True), ("abc", "123abc456", False), (".*abc.*", "123abc456", True)],
)
def test_header_safe_regex_matches_the_whole_value(regex, value, allowed):
    """grpc-go TestChainEngine SafeRegexHeaderMatcherImplicitAnchoring and
    SafeRegexHeaderMatcherWildcard."""
    principal = ib.header_rule(H("foo", safe_regex=regex), principal=True)
    assert allow(policy(None, [principal]), metadata=(("foo", value),)) is allowed


@pytest.mark.parametrize(("invert", "allowed"), [(False, False), (True, True)])
def test_principal_metadata_never_matches_and_invert_always_does(invert, allowed):
    """grpc-go TestChainEngine PrincipalMetadata / PrincipalMetadataInvert
    (A41: Envoy metadata is an empty map)."""
    principal = I(metadata=metadata_pb2.MetadataMatcher(invert=invert))
    assert allow(policy(None, [principal])) is allowed


# ---------------------------------------------------------------- grpc-go TestNewChainEngine


@pytest.mark.parametrize("field", ["direct_remote_ip", "destination_ip"])
def test_a_cidr_without_prefix_length_holds_every_address_of_its_family(field):
    """grpc-go TestNewChainEngine RemoteIpMatcherUnsetPrefixLen and
    DestinationIpMatcherUnsetPrefixLen: accepted; the prefix length is 0."""
    if field == "direct_remote_ip":
        p = policy(None, [I(direct_remote_ip=cidr("0.0.0.0"))])
    else:
        p = policy([P(destination_ip=cidr("0.0.0.0"))])
    for address in ("10.4.2.3", "255.255.255.255"):
        assert allow(p, peer_ip=address, local_ip=address)
    assert not allow(p, peer_ip="::1", local_ip="::1")


def test_every_header_matcher_kind_on_method_parses_and_only_present_matches():
    """grpc-go TestNewChainEngine CertainHeaders (action unset: ALLOW), with
    what each matcher says of ``:method`` (POST, A41)."""
    kinds = [
        {"exact": "GET"},
        {"safe_regex": "GET"},
        {"range": (0, 64)},
        {"present": True},
        {"prefix": "GET"},
        {"suffix": "GET"},
        {"contains": "GET"},
    ]
    rules = [ib.header_rule(H(":method", legacy=True, **kw), principal=True) for kw in kinds]
    msg = rbac_pb2.RBAC(
        rules=rbac_config_pb2.RBAC(
            policies={"certain-headers": policy(None, [I(or_ids=I.Set(ids=rules))])}
        )
    )
    parsed, errs = parse(msg)
    assert not errs and parsed.action == "ALLOW"
    assert RbacEngine(parsed).allows(rpc())
    for i, rule in enumerate(rules):
        expected = kinds[i] == {"present": True}
        assert allow(policy(None, [rule])) is expected, kinds[i]


SOURCED = rbac_config_pb2.SourcedMetadata()
UNSUPPORTED_UNDER_NOT = {
    "Unsupported_field_in_NotRule": ([P(not_rule=P(sourced_metadata=SOURCED))], None),
    "supported_and_unsupported_fields_in_NotRule": (
        [
            P(
                not_rule=P(
                    and_rules=P.Set(
                        rules=[ib.path_rule(exact="allowed"), P(sourced_metadata=SOURCED)]
                    )
                )
            )
        ],
        None,
    ),
    "Unsupported_field_in_NotId": (None, [I(not_id=I(sourced_metadata=SOURCED))]),
    "supported_and_unsupported_fields_in_NotId": (
        None,
        [
            I(
                not_id=I(
                    and_ids=I.Set(
                        ids=[I(direct_remote_ip=cidr("0.0.0.0", 10)), I(sourced_metadata=SOURCED)]
                    )
                )
            )
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_UNDER_NOT))
def test_an_unsupported_rule_under_not_is_nacked(name):
    """grpc-go TestNewChainEngine (the case named; C-core's words: "invalid rule")."""
    permissions, principals = UNSUPPORTED_UNDER_NOT[name]
    _, errs = parse(config("ALLOW", {"anyone": policy(permissions, principals)}))
    assert errs and all(e.endswith("invalid rule") for e in errs), errs
    assert (".not_rule" if permissions else ".not_id") in errs[0]


def test_audit_logging_options_are_not_read_as_c_core_does():
    """grpc-go TestNewChainEngine "Missing Non-Optional AuditLogger fails"
    and Cannot_parse_*: grpc-go NACKs an unknown non-optional audit logger;
    C-core 1.85 reads ``audit_logging_options`` only with
    GRPC_EXPERIMENTAL_XDS_RBAC_AUDIT_LOGGING, so grpcio ACKs it and so does
    pyxds (tests/e2e/test_xds_server_differential.py
    ``rbac-audit-logging-accepted``); the rules still apply."""
    msg = config("ALLOW", {"anyone": policy()})
    options = msg.rules.audit_logging_options
    options.audit_condition = options.ON_ALLOW
    options.logger_configs.add(is_optional=False).audit_logger.name = "UnsupportedLogger"
    options.logger_configs[0].audit_logger.typed_config.Pack(struct_pb2.Struct())
    parsed, errs = parse(msg)
    assert not errs
    assert parsed.action == "ALLOW" and RbacEngine(parsed).allows(rpc())


def test_log_action_and_unset_action():
    """grpc-go TestNewChainEngine LogAction / ActionNotSpecified, grpc-java
    RbacFilterTest ignoredConfig: LOG is no RBAC at all; an unset action is
    ALLOW."""
    parsed, errs = parse(config("LOG", {"policy-name": rbac_config_pb2.Policy()}))
    assert not errs and parsed == NO_RBAC
    unset = rbac_pb2.RBAC(rules=rbac_config_pb2.RBAC(policies={"p": policy()}))
    parsed, errs = parse(unset)
    assert not errs and parsed.action == "ALLOW"


# ---------------------------------------------------------------- grpc-java


LOCAL = "10.10.10.0"
REMOTE = "68.36.0.19"


def test_destination_ip_and_port_with_source_ip():
    """grpc-java GrpcAuthorizationEngineTest ipMatcher: permission
    (destination port AND destination IP), principal source IP."""
    p = policy(
        [P(and_rules=P.Set(rules=[P(destination_port=100), P(destination_ip=cidr(LOCAL, 24))]))],
        [I(source_ip=cidr(REMOTE, 24))],
    )
    allow_engine = engine("ALLOW", {"policy-name": p})
    at = {"local_ip": LOCAL, "peer_ip": REMOTE, "local_port": 100}
    assert allow_engine.decision(rpc(**at)) == (True, "policy-name")
    assert allow_engine.decision(rpc(**{**at, "local_port": 2})) == (False, None)
    no_peer = {"local_ip": "1.1.1.1", "peer_ip": None, "local_port": 100}
    assert allow_engine.decision(rpc(**no_peer)) == (False, None)
    deny_engine = engine("DENY", {"policy-name": p})
    assert deny_engine.decision(rpc(**no_peer)) == (True, None)


def test_header_matcher_values_and_binary_keys():
    """grpc-java GrpcAuthorizationEngineTest headerMatcher: one value; two
    values joined with a comma; a ``-bin`` matcher does not see the text
    header of the same base name."""
    permission = P(not_rule=P(destination_port=101))
    one = (("header-key", "header-val"),)
    two = one * 2
    exact = ib.header_rule(H("header-key", exact="header-val"), principal=True)
    assert allow(policy([permission], [exact]), metadata=one)
    joined = ib.header_rule(H("header-key", exact="header-val,header-val"), principal=True)
    assert allow(policy(None, [joined]), metadata=two)
    assert not allow(policy(None, [exact]), metadata=two)
    binary = ib.header_rule(H("header-key-bin", exact="header-val"), principal=True)
    assert not allow(policy(None, [binary]), metadata=two)


def test_deny_names_the_first_matching_policy():
    """grpc-java GrpcAuthorizationEngineTest pathMatcher and
    multiplePolicies: a DENY decision names the policy that matched; with
    two matching policies, the first (pyxds orders policies by name, as the
    map's order carries no meaning: RbacFilterTest
    testOrderIndependenceOfPolicies)."""
    path = ib.path_rule(exact="/auth/engine")
    by_name = ib.principal_name(suffix="TEST.google.fr", ignore_case=True)
    first = policy(
        [P(and_rules=P.Set(rules=[path, P(not_rule=P(destination_port=101))]))],
        [I(and_ids=I.Set(ids=[by_name, ib.path_rule(exact="/auth/engine", principal=True)]))],
    )
    second = policy(
        [P(or_rules=P.Set(rules=[P(destination_ip=cidr(LOCAL, 24)), path]))],
        [
            ib.header_rule(H("header-key", exact="header-val1"), principal=True),
            ib.principal_name(contains="TEST.google.fr"),
        ],
    )
    deny = engine("DENY", {"policy-name": first, "policy-name-2": second})
    request = rpc(
        path="/auth/engine",
        local_ip=LOCAL,
        local_port=100,
        secure=True,
        dns_sans=("*.test.google.fr",),
    )
    assert deny.decision(request) == (False, "policy-name")
    # Only the second matches when the name must be in capitals.
    request.dns_sans = ("x.TEST.google.fr",)
    request.local_port = 101
    assert deny.decision(request) == (False, "policy-name-2")


@pytest.mark.parametrize(
    ("uris", "dns", "subject", "allowed"),
    [
        ((), ("*.test.google.fr",), "", True),  # the name is compared as text: no wildcard
        (("*.test.google.fr",), (), "", True),
        ((), ("a.test.google.fr",), "", False),  # a wildcard pattern is not expanded
        ((), (), "", False),  # a certificate without SANs or subject
        (("*.test.google.fr",), ("google.com",), "", True),
        (("google.com",), ("*.test.google.fr",), "", False),  # URI SANs only (A41 step 1)
        (("google.com", "*.test.google.fr"), (), "", True),
    ],
)
def test_authenticated_principal_name_against_certificate_names(uris, dns, subject, allowed):
    """grpc-java GrpcAuthorizationEngineTest authenticatedMatcher (SAN type 6
    is a URI, type 2 a DNS name; other SAN types are not names here)."""
    principal = ib.principal_name(exact="*.test.google.fr")
    request = {"secure": True, "uri_sans": uris, "dns_sans": dns, "subject": subject}
    assert allow(policy(None, [principal]), **request) is allowed


def test_authenticated_without_a_name_and_an_unverifiable_peer():
    """grpc-java GrpcAuthorizationEngineTest authenticatedMatcher, its end:
    no name matches any TLS peer whatever its names; a plaintext peer never;
    a TLS peer whose certificate cannot be read (pyxds: identity unknown)
    never gets through an ALLOW rule on a name."""
    p = policy(None, [ib.authenticated()])
    assert allow(p, secure=True, uri_sans=("random",))
    assert not allow(p)
    named = policy(None, [ib.principal_name(exact="")])
    assert not allow(named, secure=True, identity_unknown=True)


def test_and_of_destination_ip_and_port_with_and_of_every_peer_ip_kind():
    """grpc-java RbacFilterTest ipPortParser: a DENY policy whose permission
    is (destination_ip AND destination_port) and principal the AND of
    direct_remote_ip, remote_ip and source_ip denies the RPC they describe."""
    r = cidr(LOCAL, 24)
    p = policy(
        [P(and_rules=P.Set(rules=[P(destination_ip=r), P(destination_port=9090)]))],
        [I(and_ids=I.Set(ids=[I(direct_remote_ip=r), I(remote_ip=r), I(source_ip=r)]))],
    )
    deny = engine("DENY", {"policy-name": p})
    assert not deny.allows(rpc(local_ip=LOCAL, peer_ip=LOCAL, local_port=9090))
    assert deny.allows(rpc(local_ip=LOCAL, peer_ip=REMOTE, local_port=9090))


def test_or_of_metadata_and_not_of_metadata():
    """grpc-java RbacFilterTest compositeRules: DENY with permission
    or(metadata) (never) and principal not(metadata) (always): allowed."""
    m = metadata_pb2.MetadataMatcher()
    p = policy([P(or_rules=P.Set(rules=[P(metadata=m)]))], [I(not_id=I(metadata=m))])
    assert engine("DENY", {"policy-name": p}).allows(rpc())


def test_header_names_grpc_prefixed_and_scheme_are_nacked_in_an_override():
    """grpc-java RbacFilterTest headerParser_headerName: "grpc--feature" and
    ":scheme" are refused, here in an RBACPerRoute override."""
    p = policy(
        [ib.header_rule(H("grpc--feature", exact="win", legacy=True))],
        [ib.header_rule(H(":scheme", exact="win", legacy=True), principal=True)],
    )
    errs = Errors()
    parsed = parse_rbac_override(ib.rbac_per_route("DENY", {"p": p}).SerializeToString(), "o", errs)
    assert parsed is None
    assert any("'grpc-' prefixes not allowed in header" in e for e in errs), errs
    assert any("':scheme' not allowed in header" in e for e in errs), errs


def test_override_without_rbac_turns_the_filter_off_and_one_with_rbac_replaces_it():
    """grpc-java RbacFilterTest overrideConfig: an empty RBACPerRoute is no
    RBAC (every RPC passes); an override with rules is the one applied."""
    errs = Errors()
    assert parse_rbac_override(b"", "o", errs) == NO_RBAC and not errs
    over = ib.rbac_per_route("ALLOW", {"policy-matcher-override": policy([P(destination_port=20)])})
    parsed = parse_rbac_override(over.SerializeToString(), "o", errs)
    assert not errs
    assert RbacEngine(parsed).allows(rpc(local_ip="1::", local_port=20))
    assert not RbacEngine(parsed).allows(rpc(local_ip="1::", local_port=21))


def test_policies_in_any_order_parse_to_the_same_config():
    """grpc-java RbacFilterTest testOrderIndependenceOfPolicies."""
    names = [f"policy-{i}" for i in range(1, 7)]

    def build(order):
        return config("DENY", {n: policy([P(destination_port=int(n[-1]))]) for n in order})

    first, _ = parse(build(names))
    second, _ = parse(build(list(reversed(names))))
    assert first == second


# ---------------------------------------------------------------- C-core matchers


def test_and_or_of_header_and_destination_port():
    """C-core authorization_matchers_test.cc And/Or/Hybrid
    AuthorizationMatcher{Successful,Failed}Match."""
    foo_bar = ib.header_rule(H("foo", exact="bar", legacy=True))
    port = P(destination_port=123)
    other_port = P(destination_port=456)
    absent = ib.header_rule(H("absent_key", exact="some_value", legacy=True))
    at = {"local_ip": "255.255.255.255", "local_port": 123}
    bar = {"metadata": (("foo", "bar"),), **at}
    not_bar = {"metadata": (("foo", "not_bar"),), **at}
    and_rule = P(and_rules=P.Set(rules=[foo_bar, port]))
    assert allow(policy([and_rule]), **bar)
    assert not allow(policy([and_rule]), **not_bar)
    or_rule = P(or_rules=P.Set(rules=[foo_bar, other_port]))
    assert allow(policy([or_rule]), **bar)
    assert not allow(policy([P(or_rules=P.Set(rules=[foo_bar]))]), **not_bar)
    hybrid = P(
        and_rules=P.Set(
            rules=[P(and_rules=P.Set(rules=[foo_bar])), P(or_rules=P.Set(rules=[port]))]
        )
    )
    assert allow(policy([hybrid]), **bar)
    hybrid_absent = P(
        and_rules=P.Set(
            rules=[
                P(and_rules=P.Set(rules=[foo_bar, absent])),
                P(or_rules=P.Set(rules=[port])),
            ]
        )
    )
    assert not allow(policy([hybrid_absent]), **bar)


@pytest.mark.parametrize(
    ("metadata", "kw", "matches"),
    [
        ((("key123", "foo_xxx"),), {"prefix": "foo"}, True),
        ((("key123", "foo"),), {"exact": "bar"}, False),
        ((("key123", "foo"), ("key123", "bar")), {"exact": "foo"}, False),  # "foo,bar"
        ((), {"suffix": "foo"}, False),
    ],
)
def test_header_matcher_cases(metadata, kw, matches):
    """C-core AuthorizationMatchersTest HeaderAuthorizationMatcher
    {SuccessfulMatch, FailedMatch, FailedMatchMultivaluedHeader,
    FailedMatchMissingHeader}."""
    rule = ib.header_rule(H("key123", legacy=True, **kw))
    assert allow(policy([rule]), metadata=metadata) is matches


@pytest.mark.parametrize(
    ("kind", "address", "cidr_text", "matches"),
    [
        ("destination", "1.2.3.4", "1.7.8.9/8", True),
        ("destination", "1.2.3.4", "1.2.3.9/32", False),
        ("peer", "1:2:3::", "1:2:4::/32", True),
        ("peer", "1:2::", "1:3::/32", False),
    ],
)
def test_ip_matcher_cases(kind, address, cidr_text, matches):
    """C-core AuthorizationMatchersTest IpAuthorizationMatcher{LocalIp,
    PeerIp}{Successful,Failed}Match: the range's address is masked."""
    if kind == "destination":
        assert allow(policy([P(destination_ip=ib.cidr(cidr_text))]), local_ip=address) is matches
    else:
        principal = I(source_ip=ib.cidr(cidr_text))
        assert allow(policy(None, [principal]), peer_ip=address) is matches


def test_remote_ip_of_a_peer_that_is_not_an_ip_never_matches():
    """C-core AuthorizationMatchersTest IpAuthorizationMatcherUnsupportedIpFailedMatch."""
    assert not allow(policy(None, [I(remote_ip=cidr("0.0.0.0", 0))]), peer_ip=None)
    assert allow(policy(None, [I(not_id=I(remote_ip=cidr("0.0.0.0", 0)))]), peer_ip=None)


@pytest.mark.parametrize(
    ("request_kw", "name", "matches"),
    [
        ({}, "foo.com", False),  # AuthenticatedMatcherUnAuthenticatedConnection
        ({"secure": True}, "", True),  # ...AuthenticatedConnectionMatcherUnset
        (
            {"secure": True, "uri_sans": ("spiffe://foo.abc", "https://foo.domain.com")},
            "spiffe://foo.abc",
            True,
        ),  # ...SuccessfulUriSanMatches
        ({"secure": True, "uri_sans": ("spiffe://bar.abc",)}, "spiffe://foo.abc", False),
        (
            {"secure": True, "dns_sans": ("foo.test.domain.com", "bar.test.domain.com")},
            "bar.test.domain.com",
            True,
        ),  # ...SuccessfulDnsSanMatches, without the URI SAN (below)
        ({"secure": True, "dns_sans": ("foo.test.domain.com",)}, "bar.test.domain.com", False),
        ({"secure": True}, "foo", False),  # ...FailedNothingMatches
    ],
)
def test_authenticated_matcher_cases(request_kw, name, matches):
    """C-core AuthorizationMatchersTest AuthenticatedMatcher*."""
    assert allow(policy(None, [ib.principal_name(exact=name)]), **request_kw) is matches


def test_a_dns_san_is_not_tried_when_the_certificate_has_a_uri_san():
    """C-core AuthorizationMatchersTest AuthenticatedMatcherSuccessfulDnsSanMatches
    expects a match on the DNS SAN although the certificate's URI SAN does
    not match; A41 (steps 1-2), grpc-go and grpc-java try DNS SANs only when
    there is no URI SAN: pyxds follows A41 (docs/differences-from-c-core.md;
    checked against grpcio in
    test_rbac_edge_cases_agree_with_c_core_but_where_a41_says_otherwise)."""
    request = {
        "secure": True,
        "uri_sans": ("spiffe://bar.abc",),
        "dns_sans": ("foo.test.domain.com", "bar.test.domain.com"),
    }
    assert not allow(policy(None, [ib.principal_name(exact="bar.test.domain.com")]), **request)


@pytest.mark.parametrize(("value", "matches"), [("foo", True), ("bar", False)])
def test_policy_of_an_or_of_one_header_and_any_principal(value, matches):
    """C-core AuthorizationMatchersTest PolicyAuthorizationMatcher{Successful,Failed}Match."""
    rule = P(or_rules=P.Set(rules=[ib.header_rule(H("key123", exact=value, legacy=True))]))
    assert allow(policy([rule]), metadata=(("key123", "foo"),)) is matches


@pytest.mark.parametrize(("path", "matches"), [("/different/foo", True), ("/expected/foo", False)])
def test_not_of_a_url_path_principal(path, matches):
    """C-core AuthorizationMatchersTest NotAuthorizationMatcher{Successful,Failed}Match."""
    principal = I(not_id=ib.path_rule(exact="/expected/foo", principal=True))
    assert allow(policy(None, [principal]), path=path) is matches


# ---------------------------------------------------------------- A41 text


@pytest.mark.parametrize(
    ("matcher", "matches"),
    [
        ({"exact": ""}, True),
        ({"prefix": ""}, True),
        ({"safe_regex": ".*"}, True),
        ({"safe_regex": ".+"}, False),
        ({"contains": "a"}, False),
    ],
)
def test_requested_server_name_matches_what_matches_the_empty_string(matcher, matches):
    """A41: "requested_server_name can match if the matcher accepts empty string"."""
    rule = P(requested_server_name=ib.string_matcher(**matcher))
    assert allow(policy([rule])) is matches
    assert allow(policy([P(not_rule=rule)])) is not matches


@pytest.mark.parametrize(
    ("kw", "matches"),
    [
        ({"present": True}, False),
        ({"present": False}, True),
        ({"present": True, "invert_match": True}, True),
        ({"present": False, "invert_match": True}, False),
        ({"exact": "x", "invert_match": True}, False),
        ({"range": (0, 10), "invert_match": True}, False),
        ({"safe_regex": ".*", "invert_match": True}, False),
    ],
)
def test_an_absent_header_matches_only_present_match_equal_to_invert(kw, matches):
    """A41: "If a header is not present, HeaderMatch will not match except
    for present_match when present_match == invert_match"."""
    rule = ib.header_rule(H("x-absent", legacy=True, **kw))
    assert allow(policy([rule])) is matches


# ---------------------------------------------------------------- grpc-go xds_server_rbac_test.go


@pytest.mark.parametrize(
    ("name", "denied"),
    [
        ("user-agent", True),
        ("Host", True),  # match-on-host-canonical-case: host and te in any case
        ("User-Agent", False),  # as C-core; grpc-go lowercases the name and denies
    ],
)
def test_header_names_are_compared_as_written_but_host_and_te(name, denied):
    """grpc-go test/xds/xds_server_rbac_test.go TestRBACHTTPFilter
    deny-header-name-in-canonical-case expects a DENY on "User-Agent"
    present; grpcio's C-core looks the name up as written among the
    lowercase metadata keys, so only ``host`` and ``te`` (which it compares
    ignoring case) match in capitals.  pyxds does as C-core ("header name in
    capitals" in test_rbac_edge_cases_agree_with_c_core_but_where_a41_says_otherwise;
    docs/differences-from-c-core.md)."""
    rule = ib.header_rule(H(name, present=True, legacy=True))
    deny = engine("DENY", {"user-agent": policy([rule])})
    request = rpc(metadata=(("user-agent", "grpc-python/1.85"),))
    assert (not deny.allows(request)) is denied


# ---------------------------------------------------------------- C-core xds_end2end_test.cc

PORT = 50051
ECHO = "/grpc.testing.EchoTestService/Echo"
ANY_I = ib.any_rule(True)


def _rsn(exact: str) -> Any:
    return P(requested_server_name=ib.string_matcher(exact=exact))


# (test name, permission, principal, matches) for a plaintext RPC to ECHO
# from 127.0.0.1 to 127.0.0.1:PORT.
ACTION_PERMUTATIONS = [
    ("MethodPostPermissionAnyPrincipal", ib.header_rule(H(":method", exact="POST")), None, True),
    ("MethodGetPermissionAnyPrincipal", ib.header_rule(H(":method", exact="GET")), None, False),
    ("MethodPutPermissionAnyPrincipal", ib.header_rule(H(":method", exact="PUT")), None, False),
    ("UrlPathPermissionAnyPrincipal", ib.path_rule(exact=ECHO), None, True),
    ("UrlPathPermissionAnyPrincipal/Echo1", ib.path_rule(exact=ECHO + "1"), None, False),
    ("DestinationIpPermissionAnyPrincipal", P(destination_ip=cidr("127.0.0.1", 32)), None, True),
    (
        "DestinationIpPermissionAnyPrincipal/.2",
        P(destination_ip=cidr("127.0.0.2", 32)),
        None,
        False,
    ),
    ("DestinationPortPermissionAnyPrincipal", P(destination_port=PORT), None, True),
    ("DestinationPortPermissionAnyPrincipal/1", P(destination_port=1), None, False),
    ("MetadataPermissionAnyPrincipal", P(metadata=metadata_pb2.MetadataMatcher()), None, False),
    (
        "MetadataPermissionAnyPrincipal/invert",
        P(metadata=metadata_pb2.MetadataMatcher(invert=True)),
        None,
        True,
    ),
    ("ReqServerNamePermissionAnyPrincipal", _rsn("server_name"), None, False),
    ("ReqServerNamePermissionAnyPrincipal/empty", _rsn(""), None, True),
    ("NotRulePermissionAnyPrincipal", P(not_rule=_rsn("server_name")), None, True),
    ("NotRulePermissionAnyPrincipal/not-any", P(not_rule=ib.any_rule()), None, False),
    (
        "AndRulePermissionAnyPrincipal",
        P(and_rules=P.Set(rules=[ib.any_rule(), P(destination_port=PORT)])),
        None,
        True,
    ),
    (
        "AndRulePermissionAnyPrincipal/1",
        P(and_rules=P.Set(rules=[ib.any_rule(), P(destination_port=1)])),
        None,
        False,
    ),
    (
        "OrRulePermissionAnyPrincipal",
        P(or_rules=P.Set(rules=[P(not_rule=ib.any_rule()), P(destination_port=PORT)])),
        None,
        True,
    ),
    (
        "OrRulePermissionAnyPrincipal/1",
        P(or_rules=P.Set(rules=[P(not_rule=ib.any_rule()), P(destination_port=1)])),
        None,
        False,
    ),
    (
        "AnyPermissionMethodPostPrincipal",
        None,
        ib.header_rule(H(":method", exact="POST"), principal=True),
        True,
    ),
    (
        "AnyPermissionMethodGetPrincipal",
        None,
        ib.header_rule(H(":method", exact="GET"), principal=True),
        False,
    ),
    (
        "AnyPermissionMethodPutPrincipal",
        None,
        ib.header_rule(H(":method", exact="PUT"), principal=True),
        False,
    ),
    ("AnyPermissionUrlPathPrincipal", None, ib.path_rule(exact=ECHO, principal=True), True),
    (
        "AnyPermissionDirectRemoteIpPrincipal",
        None,
        I(direct_remote_ip=cidr("127.0.0.1", 32)),
        True,
    ),
    (
        "AnyPermissionDirectRemoteIpPrincipal/.2",
        None,
        I(direct_remote_ip=cidr("127.0.0.2", 32)),
        False,
    ),
    ("AnyPermissionRemoteIpPrincipal", None, I(remote_ip=cidr("127.0.0.1", 32)), True),
    ("AnyPermissionRemoteIpPrincipal/.2", None, I(remote_ip=cidr("127.0.0.2", 32)), False),
    (
        "AnyPermissionMetadataPrincipal",
        None,
        I(metadata=metadata_pb2.MetadataMatcher()),
        False,
    ),
]


@pytest.mark.parametrize("action", ["ALLOW", "DENY"])
@pytest.mark.parametrize(
    ("permission", "principal", "matches"),
    [case[1:] for case in ACTION_PERMUTATIONS],
    ids=[case[0] for case in ACTION_PERMUTATIONS],
)
def test_one_rule_under_both_actions(action, permission, principal, matches):
    """C-core test/cpp/end2end/xds/xds_end2end_test.cc
    XdsRbacTestWithActionPermutations (the cases named in the ids; PUT
    requests, which C-core's test server can be told to accept, do not
    reach a grpcio server: ``:method`` is POST, A41)."""
    p = policy(
        [permission] if permission is not None else None,
        [principal] if principal is not None else None,
    )
    request = rpc(path=ECHO, peer_ip="127.0.0.1", local_ip="127.0.0.1", local_port=PORT)
    allowed = engine(action, {"policy": p}).allows(request)
    assert allowed is (matches if action == "ALLOW" else not matches)


@pytest.mark.parametrize("action", ["ALLOW", "DENY"])
def test_an_empty_policy_map_allows_nothing_or_denies_nothing(action):
    """C-core XdsRbacTestWithActionPermutations EmptyRbacPolicy."""
    assert engine(action, {}).allows(rpc()) is (action == "DENY")


# ---------------------------------------------------------------- ignore_case


@pytest.mark.parametrize(
    ("kw", "value", "matches"),
    [
        ({"exact": "KEY"}, "key", True),
        ({"exact": "\u212aey"}, "key", False),  # KELVIN SIGN lowers to "k" in Python only
        ({"prefix": "\u212a"}, "key", False),
        ({"contains": "\u212a"}, "key", False),
        ({"suffix": "\u212aey"}, "a-key", False),
    ],
)
def test_ignore_case_folds_ascii_letters_only(kw, value, matches):
    """C-core's StringMatcher compares ignoring case with absl's ASCII
    helpers (EqualsIgnoreCase, StartsWithIgnoreCase, AsciiStrToLower): a
    non-ASCII letter never equals an ASCII one.  Python's str.lower() maps
    U+212A KELVIN SIGN to "k", which would let a principal name, a path or
    a header value match a pattern C-core says it does not."""
    principal = ib.principal_name(ignore_case=True, **kw)
    assert allow(policy(None, [principal]), secure=True, uri_sans=(value,)) is matches
    path = ib.path_rule(ignore_case=True, **kw)
    assert allow(policy([path]), path=value) is matches
    header = ib.header_rule(H("x-k", ignore_case=True, **kw))
    assert allow(policy([header]), metadata=(("x-k", value),)) is matches


def test_fields_other_than_rules_are_not_read():
    """A41 reads ``rules`` only (C-core xds_http_rbac_filter.cc likewise):
    stat prefixes, per-rule stats, shadow rules and matchers neither NACK
    nor change the decision (``rbac-shadow-rules-accepted`` and
    ``rbac-matcher-api-accepted`` in the NACK differential)."""
    deny_all = config("DENY", {"all": policy()})
    msg = rbac_pb2.RBAC()
    msg.CopyFrom(deny_all)
    msg.rules_stat_prefix = "rbac."
    msg.shadow_rules_stat_prefix = "shadow."
    msg.track_per_rule_stats = True
    msg.shadow_rules.action = rbac_config_pb2.RBAC.ALLOW
    msg.shadow_matcher.SetInParent()
    parsed, errs = parse(msg)
    assert not errs
    assert parsed == parse(deny_all)[0]
    assert not RbacEngine(parsed).allows(rpc())
