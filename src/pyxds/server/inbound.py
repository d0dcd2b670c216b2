"""Builders of inbound (server-side) Listeners: what an xDS-enabled gRPC
server reads (gRFC A36), with mTLS (A29 ``DownstreamTlsContext``) and RBAC
(A41).  Every function returns an envoy proto.

    from pyxds.server import inbound as ib

    listener = ib.server_listener(
        "grpc/server?xds.resource.listening_address=0.0.0.0:50051",
        "0.0.0.0:50051",
        [ib.filter_chain(tls=ib.downstream_tls("mesh"), http_filters=[
            ib.rbac_filter("allow", "ALLOW", {"mesh": ib.rbac_policy(
                principals=[ib.principal_name(exact="spiffe://td/ns/a/sa/b")])}),
        ])],
    )

:func:`istio_inbound_listener` builds exactly the shape istiod sends a
proxyless gRPC server (one filter chain, inline routes with a
``non_forwarding_action``, RBAC DENY then ALLOW then the router, STRICT
mTLS from the provider instance ``default``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import path_pb2, string_pb2
from google.protobuf import wrappers_pb2

from pyxds.server.builders import (
    _split_address,
    _string_matcher,
    http_connection_manager,
    pack,
    route,
    route_config,
    router_filter,
    virtual_host,
)

__all__ = [
    "ISTIO_INBOUND_PREFIX",
    "any_rule",
    "authenticated",
    "cidr",
    "downstream_tls",
    "filter_chain",
    "header_rule",
    "inbound_hcm",
    "inbound_route_config",
    "istio_inbound_listener",
    "path_rule",
    "principal_name",
    "rbac_filter",
    "rbac_per_route",
    "rbac_policy",
    "server_listener",
    "socket_address",
]

ISTIO_INBOUND_PREFIX = "xds.istio.io/grpc/lds/inbound/"
"""istiod's ``server_listener_resource_name_template`` without the ``%s``."""

_ACTIONS = {"ALLOW": 0, "DENY": 1, "LOG": 2}


def socket_address(address: str) -> address_pb2.Address:
    """A TCP socket Address from ``ip:port`` (``[::]:port`` for IPv6)."""
    host, port = _split_address(address)
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
    )


def server_listener(
    name: str,
    address: str,
    filter_chains: Iterable[listener_components_pb2.FilterChain] = (),
    default_filter_chain: listener_components_pb2.FilterChain | None = None,
) -> listener_pb2.Listener:
    """A server Listener on ``address`` (no ``api_listener``, A36)."""
    lis = listener_pb2.Listener(
        name=name, address=socket_address(address), filter_chains=list(filter_chains)
    )
    if default_filter_chain is not None:
        lis.default_filter_chain.CopyFrom(default_filter_chain)
    return lis


def inbound_route_config(
    name: str = "inbound", routes: Sequence[route_components_pb2.Route] | None = None
) -> route_pb2.RouteConfiguration:
    """A server RouteConfiguration: one virtual host for every domain with
    ``routes`` (default: one ``prefix "/"`` route with a ``non_forwarding_action``)."""
    if routes is None:
        routes = [route(prefix="/")]
    return route_config(name, [virtual_host("inbound", ["*"], routes)])


def inbound_hcm(
    route_config: route_pb2.RouteConfiguration | None = None,
    rds: str | None = None,
    http_filters: Sequence[hcm_pb2.HttpFilter] = (),
) -> hcm_pb2.HttpConnectionManager:
    """A server HttpConnectionManager: routes from RDS (``rds``) or inline
    (default :func:`inbound_route_config`), ``http_filters`` then the router."""
    if rds is not None:
        return http_connection_manager(route_config_name=rds, http_filters=http_filters)
    return http_connection_manager(
        route_config=route_config or inbound_route_config(), http_filters=http_filters
    )


def cidr(text: str) -> Any:
    """A CidrRange from ``"10.0.0.0/8"`` (a bare address: prefix length unset)."""
    from envoy.config.core.v3 import address_pb2 as a

    prefix, _, length = text.partition("/")
    out = a.CidrRange(address_prefix=prefix)
    if length:
        out.prefix_len.CopyFrom(wrappers_pb2.UInt32Value(value=int(length)))
    return out


def filter_chain(
    hcm: hcm_pb2.HttpConnectionManager | None = None,
    *,
    name: str = "",
    tls: tls_pb2.DownstreamTlsContext | None = None,
    http_filters: Sequence[hcm_pb2.HttpFilter] = (),
    rds: str | None = None,
    destination_port: int | None = None,
    prefix_ranges: Iterable[str] = (),
    source_type: str | None = None,
    source_prefix_ranges: Iterable[str] = (),
    source_ports: Iterable[int] = (),
    server_names: Iterable[str] = (),
    transport_protocol: str = "",
    application_protocols: Iterable[str] = (),
) -> listener_components_pb2.FilterChain:
    """A FilterChain: its HttpConnectionManager (default :func:`inbound_hcm`
    with ``http_filters``/``rds``), TLS, and ``filter_chain_match`` fields
    (``source_type``: ``SAME_IP_OR_LOOPBACK`` or ``EXTERNAL``)."""
    if hcm is None:
        hcm = inbound_hcm(rds=rds, http_filters=http_filters)
    fc = listener_components_pb2.FilterChain(
        name=name,
        filters=[listener_components_pb2.Filter(name="hcm", typed_config=pack(hcm))],
    )
    m = listener_components_pb2.FilterChainMatch(
        prefix_ranges=[cidr(c) for c in prefix_ranges],
        source_prefix_ranges=[cidr(c) for c in source_prefix_ranges],
        source_ports=list(source_ports),
        server_names=list(server_names),
        transport_protocol=transport_protocol,
        application_protocols=list(application_protocols),
    )
    if destination_port is not None:
        m.destination_port.CopyFrom(wrappers_pb2.UInt32Value(value=destination_port))
    if source_type is not None:
        m.source_type = listener_components_pb2.FilterChainMatch.ConnectionSourceType.Value(
            source_type
        )
    if m.ByteSize():
        fc.filter_chain_match.CopyFrom(m)
    if tls is not None:
        fc.transport_socket.CopyFrom(
            base_pb2.TransportSocket(name="envoy.transport_sockets.tls", typed_config=pack(tls))
        )
    return fc


def downstream_tls(
    identity: str | None = "default",
    ca: str | None = "default",
    require_client_certificate: bool | None = True,
    *,
    identity_cert: str = "",
    ca_cert: str = "",
    deprecated_fields: bool = False,
    current_fields: bool = True,
) -> tls_pb2.DownstreamTlsContext:
    """A DownstreamTlsContext (A29 server side): the server identity from
    provider instance ``identity``, client certificates verified against
    ``ca`` (None: not verified), ``require_client_certificate`` (None:
    unset).  ``current_fields`` / ``deprecated_fields`` choose where the
    instances are named (both: as istiod does)."""
    common = tls_pb2.CommonTlsContext()
    if identity is not None:
        if current_fields:
            common.tls_certificate_provider_instance.CopyFrom(
                common_pb2.CertificateProviderPluginInstance(
                    instance_name=identity, certificate_name=identity_cert
                )
            )
        if deprecated_fields:
            common.tls_certificate_certificate_provider_instance.CopyFrom(
                tls_pb2.CommonTlsContext.CertificateProviderInstance(
                    instance_name=identity, certificate_name=identity_cert
                )
            )
    if ca is not None:
        combined = common.combined_validation_context
        if current_fields:
            combined.default_validation_context.ca_certificate_provider_instance.CopyFrom(
                common_pb2.CertificateProviderPluginInstance(
                    instance_name=ca, certificate_name=ca_cert
                )
            )
        else:
            combined.default_validation_context.SetInParent()
        if deprecated_fields:
            combined.validation_context_certificate_provider_instance.CopyFrom(
                tls_pb2.CommonTlsContext.CertificateProviderInstance(
                    instance_name=ca, certificate_name=ca_cert
                )
            )
        if not current_fields and not deprecated_fields:
            common.ClearField("combined_validation_context")
    ctx = tls_pb2.DownstreamTlsContext(common_tls_context=common)
    if require_client_certificate is not None:
        ctx.require_client_certificate.CopyFrom(
            wrappers_pb2.BoolValue(value=require_client_certificate)
        )
    return ctx


# ----------------------------------------------------------------------- RBAC


def string_matcher(
    exact: str | None = None,
    prefix: str | None = None,
    suffix: str | None = None,
    contains: str | None = None,
    safe_regex: str | None = None,
    ignore_case: bool = False,
) -> string_pb2.StringMatcher:
    """A StringMatcher; give exactly one pattern (none: an invalid one, for tests)."""
    return _string_matcher(exact, prefix, suffix, contains, safe_regex, ignore_case)


def any_rule(principal: bool = False) -> Any:
    """A Permission (or Principal) that matches everything."""
    cls = rbac_config_pb2.Principal if principal else rbac_config_pb2.Permission
    return cls(any=True)


def path_rule(principal: bool = False, **matcher: Any) -> Any:
    """A ``url_path`` Permission (or Principal): ``path_rule(exact="/pkg.S/M")``."""
    cls = rbac_config_pb2.Principal if principal else rbac_config_pb2.Permission
    return cls(url_path=path_pb2.PathMatcher(path=string_matcher(**matcher)))


def header_rule(header: route_components_pb2.HeaderMatcher, principal: bool = False) -> Any:
    """A ``header`` Permission (or Principal) from a HeaderMatcher
    (:func:`pyxds.server.builders.header_matcher`)."""
    cls = rbac_config_pb2.Principal if principal else rbac_config_pb2.Permission
    return cls(header=header)


def principal_name(**matcher: Any) -> rbac_config_pb2.Principal:
    """``authenticated.principal_name`` (the peer certificate's URI SAN, DNS
    SAN or subject, A41): ``principal_name(exact="spiffe://td/ns/a/sa/b")``."""
    return rbac_config_pb2.Principal(
        authenticated=rbac_config_pb2.Principal.Authenticated(
            principal_name=string_matcher(**matcher)
        )
    )


def authenticated() -> rbac_config_pb2.Principal:
    """``authenticated`` without a name: any peer on a TLS connection."""
    return rbac_config_pb2.Principal(authenticated=rbac_config_pb2.Principal.Authenticated())


def rbac_policy(
    permissions: Sequence[rbac_config_pb2.Permission] | None = None,
    principals: Sequence[rbac_config_pb2.Principal] | None = None,
) -> rbac_config_pb2.Policy:
    """A Policy (default permissions and principals: ``any``)."""
    return rbac_config_pb2.Policy(
        permissions=list(permissions) if permissions is not None else [any_rule()],
        principals=list(principals) if principals is not None else [any_rule(True)],
    )


def rbac_config(action: str, policies: Mapping[str, rbac_config_pb2.Policy]) -> rbac_pb2.RBAC:
    """The RBAC HTTP filter config: ``action`` ALLOW, DENY or LOG."""
    return rbac_pb2.RBAC(
        rules=rbac_config_pb2.RBAC(action=_ACTIONS[action], policies=dict(policies))
    )


def rbac_filter(
    name: str, action: str, policies: Mapping[str, rbac_config_pb2.Policy]
) -> hcm_pb2.HttpFilter:
    """An RBAC HTTP filter (A41) named ``name``."""
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(rbac_config(action, policies)))


def rbac_per_route(
    action: str | None = None, policies: Mapping[str, rbac_config_pb2.Policy] | None = None
) -> rbac_pb2.RBACPerRoute:
    """An RBACPerRoute override (``action`` None: RBAC off for the route)."""
    if action is None:
        return rbac_pb2.RBACPerRoute()
    return rbac_pb2.RBACPerRoute(rbac=rbac_config(action, policies or {}))


# ----------------------------------------------------------------------- Istio


def istio_inbound_listener(
    address: str,
    *,
    strict: bool = False,
    deny: Mapping[str, rbac_config_pb2.Policy] | None = None,
    allow: Mapping[str, rbac_config_pb2.Policy] | None = None,
    prefix: str = ISTIO_INBOUND_PREFIX,
) -> listener_pb2.Listener:
    """The inbound Listener istiod sends a proxyless gRPC server for
    ``address`` (pilot/pkg/networking/grpcgen/lds.go): named
    ``prefix + address``; one chain without ``filter_chain_match``; an HCM
    with an inline route config (virtual host ``*``, route ``prefix "/"``
    with a ``non_forwarding_action``); http_filters RBAC DENY
    (``envoy.filters.http.rbac.DENY``) and RBAC ALLOW
    (``envoy.filters.http.rbac``) when given, then the router; with
    ``strict`` a DownstreamTlsContext requiring client certificates whose
    identity (``default``/``default``) and roots (``default``/``ROOTCA``)
    are named in both the current and the deprecated fields."""
    filters = []
    if deny:
        filters.append(rbac_filter("envoy.filters.http.rbac.DENY", "DENY", deny))
    if allow:
        filters.append(rbac_filter("envoy.filters.http.rbac", "ALLOW", allow))
    hcm = hcm_pb2.HttpConnectionManager(
        route_config=route_pb2.RouteConfiguration(
            name="inbound",
            virtual_hosts=[
                route_components_pb2.VirtualHost(
                    domains=["*"],
                    routes=[
                        route_components_pb2.Route(
                            match=route_components_pb2.RouteMatch(prefix="/"),
                            non_forwarding_action=route_components_pb2.NonForwardingAction(),
                        )
                    ],
                )
            ],
        ),
        http_filters=[*filters, router_filter()],
    )
    suffix = "mtls" if strict else "plaintext"
    fc = listener_components_pb2.FilterChain(
        name=f"inbound-{suffix}",
        filters=[
            listener_components_pb2.Filter(name=f"inbound-hcm{suffix}", typed_config=pack(hcm))
        ],
    )
    if strict:
        ctx = downstream_tls(
            "default",
            "default",
            True,
            identity_cert="default",
            ca_cert="ROOTCA",
            deprecated_fields=True,
        )
        fc.transport_socket.CopyFrom(
            base_pb2.TransportSocket(name="envoy.transport_sockets.tls", typed_config=pack(ctx))
        )
    return listener_pb2.Listener(
        name=prefix + address, address=socket_address(address), filter_chains=[fc]
    )
