"""Server Listener validation (A36, A29 server side, A41), in C-core's words.

Each case is what grpcio 1.85's C-core NACKs or ACKs (xds_listener_parser.cc,
xds_http_rbac_filter.cc); tests/e2e/test_xds_server_differential.py checks
a set of them against C-core itself.
"""

from __future__ import annotations

import pytest
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.type.v3 import range_pb2
from google.protobuf import wrappers_pb2

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.xds.resources import LISTENER, ROUTE_CONFIG
from pyxds.xds.resources.listener import decode_listener
from pyxds.xds.resources.rbac import RbacConfig
from pyxds.xds.resources.types import NonForwardingAction, UnsupportedAction

ADDRESS = "0.0.0.0:8080"
HCM0 = (
    "filter_chains[0].filters[0].typed_config.value["
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager]"
)
RBAC_VALUE = "typed_config.value[envoy.extensions.filters.http.rbac.v3.RBAC]"
TLS0 = (
    "filter_chains[0].transport_socket.typed_config.value["
    "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext]"
)
PROVIDERS = {"default": {"plugin_name": "file_watcher", "config": {"ca_certificate_file": "x"}}}


def decode(lis: listener_pb2.Listener, providers=None):
    _name, resource, error = decode_listener(lis.SerializeToString(), providers)
    return resource, error


def listener(*chains, default=None, address=ADDRESS):
    return ib.server_listener("lis", address, chains, default)


def ok(lis, providers=None):
    resource, error = decode(lis, providers)
    assert error is None, error
    return resource.tcp_listener


def nack(lis, providers=None) -> str:
    resource, error = decode(lis, providers)
    assert resource is None and error, "expected a NACK"
    return error


# ------------------------------------------------------------------ the Istio shape


def test_istio_strict_listener_is_accepted_with_both_tls_field_generations():
    lis = ib.istio_inbound_listener(
        ADDRESS,
        strict=True,
        deny={"deny-0": ib.rbac_policy(principals=[ib.principal_name(exact="spiffe://a")])},
        allow={"allow-0": ib.rbac_policy()},
    )
    tcp = ok(lis, PROVIDERS)
    assert tcp.address == ADDRESS
    (chain,) = tcp.filter_chains
    assert chain.tls.identity.instance_name == "default"
    assert chain.tls.identity.certificate_name == "default"
    assert chain.tls.ca.instance_name == "default"
    assert chain.tls.require_client_certificate
    assert [f.name for f in chain.hcm.http_filters] == [
        "envoy.filters.http.rbac.DENY",
        "envoy.filters.http.rbac",
        "router",
    ]
    assert [f.rbac.action if f.rbac else None for f in chain.hcm.http_filters] == [
        "DENY",
        "ALLOW",
        None,
    ]
    (vh,) = chain.hcm.route_config.virtual_hosts
    assert vh.domains == ("*",) and vh.routes[0].action == NonForwardingAction()


def test_same_listener_twice_decodes_to_equal_values():
    lis = ib.istio_inbound_listener(ADDRESS, strict=True, allow={"a": ib.rbac_policy()})
    assert decode(lis)[0] == decode(lis)[0]


def test_deprecated_only_tls_fields_name_the_providers():
    ctx = ib.downstream_tls(
        "default", "default", True, deprecated_fields=True, current_fields=False
    )
    tcp = ok(listener(ib.filter_chain(tls=ctx)))
    tls = tcp.filter_chains[0].tls
    assert (tls.identity.instance_name, tls.ca.instance_name) == ("default", "default")


# ------------------------------------------------------------------ Listener fields


def test_use_original_dst_is_nacked():
    lis = listener(ib.filter_chain())
    lis.use_original_dst.CopyFrom(wrappers_pb2.BoolValue(value=True))
    assert "use_original_dst: field not supported" in nack(lis)


def test_use_original_dst_false_is_accepted():
    lis = listener(ib.filter_chain())
    lis.use_original_dst.CopyFrom(wrappers_pb2.BoolValue(value=False))
    ok(lis)


def test_listener_filters_are_accepted_as_c_core_does():
    lis = listener(ib.filter_chain())
    lis.listener_filters.add(name="envoy.filters.listener.tls_inspector")
    ok(lis)


def test_address_must_be_a_tcp_socket_address():
    lis = listener(ib.filter_chain())
    lis.address.ClearField("socket_address")
    lis.address.pipe.path = "/tmp/x"
    assert "address.socket_address: field not present" in nack(lis)
    lis = listener(ib.filter_chain())
    lis.address.socket_address.protocol = 1  # UDP
    assert "address.socket_address.protocol: value must be TCP" in nack(lis)


def test_ipv6_address_is_kept_bracketed():
    assert ok(listener(ib.filter_chain(), address="[::]:8080")).address == "[::]:8080"


def test_a_listener_needs_a_chain_or_a_default_chain():
    assert "default_filter_chain: must be set if filter_chains is unset" in nack(listener())
    assert ok(listener(default=ib.filter_chain())).default_filter_chain is not None


def test_neither_address_nor_api_listener_is_rejected_in_c_core_words():
    _resource, error = decode(listener_pb2.Listener(name="x"))
    assert error == "Listener has neither address nor ApiListener"


# ------------------------------------------------------------------ filter chains


def test_a_chain_needs_exactly_one_filter():
    fc = ib.filter_chain()
    fc.filters.append(fc.filters[0])
    assert (
        "filter_chains[0].filters: must have exactly one filter (HttpConnectionManager -- "
        "no other filter is supported at the moment)" in nack(listener(fc))
    )
    fc.ClearField("filters")
    assert "filter_chains[0].filters: must have exactly one filter" in nack(listener(fc))


def test_a_non_hcm_network_filter_is_nacked():
    fc = listener_components_pb2.FilterChain(
        filters=[listener_components_pb2.Filter(name="x", typed_config=b.pack(router_pb2.Router()))]
    )
    err = nack(listener(fc))
    assert (
        "filter_chains[0].filters[0].typed_config.value["
        "envoy.extensions.filters.http.router.v3.Router]: unsupported filter type" in err
    )


def test_duplicate_matching_rules_are_nacked_after_normalisation():
    """10.1.2.3/8 and 10.0.0.0/8 are the same range once masked (A36)."""
    lis = listener(
        ib.filter_chain(prefix_ranges=["10.1.2.3/8"]),
        ib.filter_chain(prefix_ranges=["10.0.0.0/8"]),
    )
    assert (
        "filter_chains: duplicate matching rules detected when adding filter chain: "
        "{prefix_ranges={{address_prefix=10.0.0.0:0, prefix_len=8}}}" in nack(lis)
    )


def test_duplicates_are_found_in_the_cartesian_product_of_fields():
    lis = listener(
        ib.filter_chain(source_prefix_ranges=["192.168.1.0/24", "10.2.0.0/16"]),
        ib.filter_chain(source_prefix_ranges=["10.2.0.0/16"], source_ports=[0]),
    )
    assert "duplicate matching rules" in nack(lis)


def test_chains_that_can_never_match_are_dropped_before_the_duplicate_check():
    """C-core leaves chains with server_names / application_protocols /
    another transport protocol / a destination port out of its map first,
    so identical ones do not conflict (A36 would check them; C-core does not)."""
    tcp = ok(
        listener(
            ib.filter_chain(server_names=["a"]),
            ib.filter_chain(server_names=["a"]),
            ib.filter_chain(application_protocols=["h2"]),
            ib.filter_chain(application_protocols=["h2"]),
            ib.filter_chain(transport_protocol="tls"),
            ib.filter_chain(destination_port=8080),
            ib.filter_chain(destination_port=8080),
            ib.filter_chain(name="usable"),
        )
    )
    assert [c.name for c in tcp.all_chains()] == ["usable"]


def test_raw_buffer_chains_replace_chains_without_a_transport_protocol():
    tcp = ok(
        listener(
            ib.filter_chain(name="plain"),
            ib.filter_chain(name="raw", transport_protocol="raw_buffer"),
            ib.filter_chain(name="plain-after"),
        )
    )
    assert [c.name for c in tcp.all_chains()] == ["raw"]


def test_an_unknown_source_type_is_nacked_not_read_as_any():
    """``source_type`` is an open enum: a value past EXTERNAL was read as ANY
    (the chain then served every peer).  grpc-go NACKs it ("unsupported
    source type"); grpcio 1.85's C-core NACKs it in these words
    (``unknown-source-type`` in the NACK differential)."""
    chain = ib.filter_chain(name="odd")
    chain.filter_chain_match.source_type = 3  # type: ignore[assignment]
    err = nack(listener(chain))
    assert "filter_chains[0].filter_chain_match.source_type: invalid value" in err
    # The default chain's match is never used, but C-core checks it all the same.
    err = nack(listener(ib.filter_chain(), default=chain))
    assert err.endswith("default_filter_chain.filter_chain_match.source_type: invalid value")
    known = ib.filter_chain(name="external", source_type="EXTERNAL")
    assert ok(listener(known)).filter_chains[0].match.source_type == 2


def test_bad_cidr_is_nacked_naming_the_field():
    err = nack(listener(ib.filter_chain(prefix_ranges=["not-an-ip/8"])))
    assert (
        "filter_chains[0].filter_chain_match.prefix_ranges[0].address_prefix: "
        "Failed to parse address:not-an-ip:0" in err
    )


def test_prefix_length_is_clamped_and_the_address_masked():
    tcp = ok(listener(ib.filter_chain(prefix_ranges=["10.1.2.3/99"], source_prefix_ranges=["::1"])))
    match = tcp.filter_chains[0].match
    assert str(match.prefix_ranges[0]) == "10.1.2.3/32"
    assert str(match.source_prefix_ranges[0]) == "::/0"


# ------------------------------------------------------------------ HTTP filters


def test_an_rbac_filter_with_invalid_rules_still_counts_in_the_filter_order():
    """C-core keeps an RBAC filter whose rules have errors in the chain it
    checks the order of (its config exists, with errors), even one whose
    bytes do not parse: [bad RBAC, router, RBAC] has the router in the
    middle too."""
    bad = ib.rbac_filter("bad", "ALLOW", {"p": ib.rbac_policy([ib.path_rule(safe_regex="(")])})
    hcm = ib.inbound_hcm()
    del hcm.http_filters[:]
    hcm.http_filters.extend([bad, b.router_filter(), ib.rbac_filter("good", "ALLOW", {})])
    err = nack(listener(ib.filter_chain(hcm)))
    router = "envoy.extensions.filters.http.router.v3.Router"
    assert f"terminal filter for config type {router} must be the last filter" in err
    assert "non-terminal filter for config type envoy.extensions.filters.http.rbac.v3.RBAC" in err
    only_bad = ib.inbound_hcm()
    del only_bad.http_filters[:]
    only_bad.http_filters.append(bad)
    err = nack(listener(ib.filter_chain(only_bad)))
    assert "non-terminal filter for config type envoy.extensions.filters.http.rbac.v3.RBAC" in err
    unparsable = ib.rbac_filter("junk", "ALLOW", {})
    unparsable.typed_config.value = b"\xff"
    del only_bad.http_filters[:]
    only_bad.http_filters.append(unparsable)
    err = nack(listener(ib.filter_chain(only_bad)))
    assert "could not parse HTTP RBAC filter config" in err
    assert "non-terminal filter for config type envoy.extensions.filters.http.rbac.v3.RBAC" in err


def test_fault_filter_is_not_supported_on_servers():
    fc = ib.filter_chain(http_filters=[b.fault_filter(abort_grpc_status=14)])
    err = nack(listener(fc))
    assert (
        f"{HCM0}.http_filters[0].typed_config.value[envoy.extensions.filters.http.fault.v3"
        ".HTTPFault]: filter is not supported on servers" in err
    )


def test_optional_unsupported_filter_is_skipped_on_servers():
    flt = b.fault_filter(abort_grpc_status=14)
    flt.is_optional = True
    tcp = ok(listener(ib.filter_chain(http_filters=[flt])))
    assert [f.name for f in tcp.filter_chains[0].hcm.http_filters] == ["router"]


def test_xff_num_trusted_hops_must_be_zero_on_servers_too():
    hcm = ib.inbound_hcm()
    hcm.xff_num_trusted_hops = 1
    assert f"{HCM0}.xff_num_trusted_hops: must be zero" in nack(listener(ib.filter_chain(hcm)))


def test_rds_config_source_must_be_ads():
    hcm = ib.inbound_hcm(rds="routes")
    hcm.rds.config_source.ClearField("ads")
    hcm.rds.config_source.path = "/x"
    assert f"{HCM0}.rds.config_source: ConfigSource does not specify ADS or SELF" in nack(
        listener(ib.filter_chain(hcm))
    )


# ------------------------------------------------------------------ RBAC (A41)


def rbac_chain(policy, action="ALLOW"):
    return ib.filter_chain(http_filters=[ib.rbac_filter("rbac", action, {"p": policy})])


def test_rbac_condition_is_nacked():
    policy = ib.rbac_policy()
    policy.condition.const_expr.bool_value = True
    err = nack(listener(rbac_chain(policy)))
    assert f"{HCM0}.http_filters[0].{RBAC_VALUE}.rules.policies[p].condition: " in err
    assert "condition not supported" in err


def test_rbac_checked_condition_is_nacked():
    policy = ib.rbac_policy()
    policy.checked_condition.expr.const_expr.bool_value = True
    assert "checked condition not supported" in nack(listener(rbac_chain(policy)))


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("grpc-timeout", "'grpc-' prefixes not allowed in header"),
        (":scheme", "':scheme' not allowed in header"),
    ],
)
def test_rbac_header_rules_on_grpc_headers_and_scheme_are_nacked(name, problem):
    rule = ib.header_rule(b.header_matcher(name, exact="x"))
    err = nack(listener(rbac_chain(ib.rbac_policy(permissions=[rule]))))
    assert f"rules.policies[p].permissions[0].header.name: {problem}" in err
    principal = ib.header_rule(b.header_matcher(name, present=True), principal=True)
    err = nack(listener(rbac_chain(ib.rbac_policy(principals=[principal]))))
    assert f"rules.policies[p].principals[0].header.name: {problem}" in err


def test_rbac_rules_grpc_does_not_know_are_invalid():
    perm = rbac_config_pb2.Permission(destination_port_range=range_pb2.Int32Range(start=1, end=2))
    err = nack(listener(rbac_chain(ib.rbac_policy(permissions=[perm]))))
    assert "rules.policies[p].permissions[0]: invalid rule" in err
    assert "invalid rule" in nack(
        listener(rbac_chain(ib.rbac_policy(principals=[rbac_config_pb2.Principal()])))
    )


def test_rbac_bad_regex_is_nacked_naming_the_field():
    rule = ib.header_rule(b.header_matcher("x-a", safe_regex="a("))
    err = nack(listener(rbac_chain(ib.rbac_policy(permissions=[rule]))))
    assert (
        "permissions[0].header.string_match: Invalid regex string specified in matcher: "
        "missing ): a(" in err
    )


def test_rbac_cidr_that_is_not_an_ip_is_accepted_and_never_matches():
    """As C-core: the rule compares against an empty address."""
    from envoy.config.rbac.v3 import rbac_pb2 as r

    principal = r.Principal(source_ip=ib.cidr("nope/8"))
    tcp = ok(listener(rbac_chain(ib.rbac_policy(principals=[principal]))))
    (rule,) = tcp.filter_chains[0].hcm.http_filters[0].rbac.policies[0].principals
    assert rule.kind == "source_ip" and rule.cidr is None


def test_rbac_log_action_is_as_if_there_were_no_rbac():
    tcp = ok(listener(rbac_chain(ib.rbac_policy(), action="LOG")))
    assert tcp.filter_chains[0].hcm.http_filters[0].rbac == RbacConfig(None)


def test_rbac_without_rules_does_nothing():
    from envoy.extensions.filters.http.rbac.v3 import rbac_pb2

    flt = b.router_filter()
    flt.name = "rbac"
    flt.typed_config.Pack(rbac_pb2.RBAC())
    tcp = ok(listener(ib.filter_chain(http_filters=[flt])))
    assert tcp.filter_chains[0].hcm.http_filters[0].rbac == RbacConfig(None)


def test_rbac_per_route_override_is_validated_in_rds():
    """RDS does not know who reads it: a bad override NACKs the
    RouteConfiguration for clients and servers alike (as C-core)."""
    bad = ib.rbac_policy()
    bad.condition.const_expr.bool_value = True
    r = b.route(prefix="/", typed_per_filter_config={"rbac": ib.rbac_per_route("DENY", {"p": bad})})
    rc = ib.inbound_route_config("rc", [r])
    result = ROUTE_CONFIG.decode(rc.SerializeToString(), use_memo=False)
    assert "condition not supported" in result.error
    good = b.route(
        prefix="/",
        typed_per_filter_config={"rbac": ib.rbac_per_route("DENY", {"p": ib.rbac_policy()})},
    )
    rc = ib.inbound_route_config("rc", [good])
    assert ROUTE_CONFIG.decode(rc.SerializeToString(), use_memo=False).error is None


RBAC_OVERRIDE0 = "virtual_hosts[0].routes[0].typed_per_filter_config[rbac]"


def test_an_rbac_top_level_config_is_not_an_override():
    """A39: an override of the filter's top-level type (RBAC, not
    RBACPerRoute) fails validation; C-core 1.85: "unsupported filter type".
    Read as an RBACPerRoute, its ``rules`` would vanish and turn RBAC off."""
    r = b.route(
        prefix="/",
        typed_per_filter_config={"rbac": ib.rbac_config("DENY", {"all": ib.rbac_policy()})},
    )
    rc = ib.inbound_route_config("rc", [r])
    error = ROUTE_CONFIG.decode(rc.SerializeToString(), use_memo=False).error
    assert f"{RBAC_OVERRIDE0}.value[envoy.extensions.filters.http.rbac.v3.RBAC]: " in error
    assert "unsupported filter type" in error


def test_an_optional_rbac_top_level_override_is_ignored():
    """C-core 1.85 ACKs an optional override of a type that is no override
    and applies no override (the filter's own config holds)."""
    wrapper = route_components_pb2.FilterConfig(
        config=b.pack(ib.rbac_config("ALLOW", {})), is_optional=True
    )
    r = b.route(prefix="/")
    r.typed_per_filter_config["rbac"].CopyFrom(b.pack(wrapper))
    rc = ib.inbound_route_config("rc", [r])
    result = ROUTE_CONFIG.decode(rc.SerializeToString(), use_memo=False)
    assert result.error is None
    assert result.resource.virtual_hosts[0].routes[0].filter_overrides == ()


def test_an_rbac_per_route_in_a_typed_struct_cannot_be_parsed():
    from google.protobuf import struct_pb2
    from xds.type.v3 import typed_struct_pb2

    ts = typed_struct_pb2.TypedStruct(
        type_url="type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute",
        value=struct_pb2.Struct(),
    )
    r = b.route(prefix="/")
    r.typed_per_filter_config["rbac"].CopyFrom(b.pack(ts))
    rc = ib.inbound_route_config("rc", [r])
    error = ROUTE_CONFIG.decode(rc.SerializeToString(), use_memo=False).error
    assert (
        f"{RBAC_OVERRIDE0}.value[xds.type.v3.TypedStruct].value["
        "envoy.extensions.filters.http.rbac.v3.RBACPerRoute]: could not parse RBACPerRoute"
    ) in error


def test_an_unknown_rbac_action_is_nacked_in_c_core_words():
    from envoy.extensions.filters.http.rbac.v3 import rbac_pb2

    config = ib.rbac_config("ALLOW", {"p": ib.rbac_policy()})
    config.rules.action = 3
    flt = ib.rbac_filter("rbac", "ALLOW", {})
    flt.typed_config.Pack(config)
    assert isinstance(config, rbac_pb2.RBAC)
    err = nack(listener(ib.filter_chain(http_filters=[flt])))
    assert f"{HCM0}.http_filters[0].{RBAC_VALUE}.rules.action: unknown action" in err
    assert "unknown action 3" not in err


def test_route_actions_other_than_non_forwarding_are_kept_as_unsupported():
    redirect = route_components_pb2.Route(
        match=route_components_pb2.RouteMatch(prefix="/a"),
        redirect=route_components_pb2.RedirectAction(host_redirect="x"),
    )
    rc = ib.inbound_route_config("rc", [redirect, b.route(prefix="/")])
    routes = ROUTE_CONFIG.decode(rc.SerializeToString(), use_memo=False).resource
    assert [r.action for r in routes.virtual_hosts[0].routes] == [
        UnsupportedAction("redirect"),
        NonForwardingAction(),
    ]


# ------------------------------------------------------------------ DownstreamTlsContext


def tls_error(ctx, providers=PROVIDERS) -> str:
    return nack(listener(ib.filter_chain(tls=ctx)), providers)


def test_tls_without_an_identity_provider_is_nacked():
    err = tls_error(ib.downstream_tls(None, "default", False))
    assert (
        f"{TLS0}: TLS configuration provided but no tls_certificate_provider_instance found" in err
    )


def test_required_client_certificate_needs_a_ca_provider():
    err = tls_error(ib.downstream_tls("default", None, True))
    assert (
        f"{TLS0}.require_client_certificate: client certificate required but no certificate "
        "provider instance specified for validation" in err
    )


def test_unknown_provider_instance_is_nacked():
    err = tls_error(ib.downstream_tls("nope", "default", True))
    assert "unrecognized certificate provider instance name: nope" in err


def test_require_sni_and_strict_ocsp_stapling_are_nacked():
    ctx = ib.downstream_tls()
    ctx.require_sni.value = True
    assert f"{TLS0}.require_sni: field unsupported" in tls_error(ctx)
    ctx = ib.downstream_tls()
    ctx.ocsp_staple_policy = ctx.STRICT_STAPLING
    assert f"{TLS0}.ocsp_staple_policy: value must be LENIENT_STAPLING" in tls_error(ctx)


def test_san_matchers_and_system_roots_are_not_supported_on_servers():
    ctx = ib.downstream_tls()
    dvc = ctx.common_tls_context.combined_validation_context.default_validation_context
    dvc.match_subject_alt_names.add(exact="x")
    assert "match_subject_alt_names not supported on servers" in tls_error(ctx)
    ctx = ib.downstream_tls(ca=None, require_client_certificate=False)
    ctx.common_tls_context.validation_context.system_root_certs.SetInParent()
    assert "system_root_certs not supported" in tls_error(ctx)


def test_a_transport_socket_of_another_type_is_nacked():
    fc = ib.filter_chain()
    fc.transport_socket.typed_config.CopyFrom(b.pack(router_pb2.Router()))
    assert (
        "filter_chains[0].transport_socket.typed_config.value["
        "envoy.extensions.filters.http.router.v3.Router].type_url: "
        "unsupported transport socket type" in nack(listener(fc))
    )


def test_typed_structs_for_the_hcm_and_the_tls_context_are_nacked_in_c_core_words():
    """A TypedStruct names its type inside and holds JSON: C-core reads the
    type, then cannot decode the config; the field names both types."""
    from xds.type.v3 import typed_struct_pb2

    def struct(type_name):
        return b.pack(typed_struct_pb2.TypedStruct(type_url=f"type.googleapis.com/{type_name}"))

    ts = "value[xds.type.v3.TypedStruct]"
    hcm_type = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    fc = ib.filter_chain()
    fc.filters[0].typed_config.CopyFrom(struct(hcm_type))
    assert (
        f"filter_chains[0].filters[0].typed_config.{ts}.value[{hcm_type}]: "
        "could not parse HttpConnectionManager config" in nack(listener(fc))
    )
    fc.filters[0].typed_config.CopyFrom(struct("x.Y"))
    assert (
        f"filter_chains[0].filters[0].typed_config.{ts}.value[x.Y]: unsupported filter type"
        in nack(listener(fc))
    )
    tls_type = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
    fc = ib.filter_chain(tls=ib.downstream_tls())
    fc.transport_socket.typed_config.CopyFrom(struct(tls_type))
    assert (
        f"filter_chains[0].transport_socket.typed_config.{ts}.value[{tls_type}]: "
        "can't decode DownstreamTlsContext" in nack(listener(fc), PROVIDERS)
    )


@pytest.mark.parametrize("name", ["", "envoy.transport_sockets.raw_buffer", "tls"])
def test_a_transport_socket_not_named_tls_is_nacked(name):
    """A29 "LDS for Server Side Security": a ``transport_socket`` whose name
    is not ``envoy.transport_sockets.tls`` is NACKed (as grpc-go's
    filter_chain_test "unexpected transport socket name" and grpc-java;
    C-core 1.85 reads only the type, docs/differences-from-c-core.md)."""
    fc = ib.filter_chain(tls=ib.downstream_tls())
    fc.transport_socket.name = name
    err = nack(listener(fc), PROVIDERS)
    assert (
        f"filter_chains[0].transport_socket.name: unsupported transport socket name {name!r}" in err
    )


def test_the_tls_transport_socket_name_is_accepted():
    fc = ib.filter_chain(tls=ib.downstream_tls())
    assert fc.transport_socket.name == "envoy.transport_sockets.tls"
    assert ok(listener(fc), PROVIDERS).filter_chains[0].tls is not None


def test_tls_without_client_verification_is_kept():
    tcp = ok(listener(ib.filter_chain(tls=ib.downstream_tls("default", None, False))), PROVIDERS)
    tls = tcp.filter_chains[0].tls
    assert tls.ca is None and not tls.require_client_certificate


def test_lds_is_memo_free_and_checks_providers_only_when_given():
    """Without a bootstrap (resource files) provider names are not checked."""
    lis = listener(ib.filter_chain(tls=ib.downstream_tls("nope", "nope", True)))
    assert LISTENER.decode(lis.SerializeToString()).error is None
