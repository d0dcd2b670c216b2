"""Listener validation (A27 "Listener Proto", A31, A39 HTTP filters, A36).

Rules:

* A Listener without ``api_listener`` but with an ``address`` is a server
  listener, validated by :mod:`pyxds.xds.resources.server_listener` (A36)
  into ``Listener(name, api_listener=False, tcp_listener=...)``; the
  resolver reports "not an API listener".  With neither, it is an error (as
  C-core).
* ``api_listener.api_listener`` must hold an ``HttpConnectionManager``.
* Exactly one of ``rds`` (its ``config_source`` must be ``ads`` or ``self``)
  and ``route_config`` (validated as an RDS resource would be).
* ``http_filters``: non-empty; each has a non-empty unique name and a
  ``typed_config`` (``config_discovery``, ECDS, is "field not present" even
  for an optional filter, as C-core; a TypedStruct is unwrapped to the type
  it names, and the router, fault and RBAC configs cannot be one); a type
  this client does not know is an error unless ``is_optional`` (then it is
  skipped); of the filters kept, the last must be terminal (the router) and
  no other may be.  Known on clients: the router, the fault filter (A33;
  validated and kept, as C-core accepts it: Istio sends it on every client
  listener) and the stateful session filter (A55, :mod:`.stateful_session`);
  on servers (:func:`parse_server_hcm`): the router and RBAC (A41, its
  config validated).  A filter of the other side is "filter is not
  supported on clients" / "... on servers" unless optional.
* ``common_http_protocol_options.max_stream_duration`` becomes the listener-wide
  ``max_stream_duration`` (A31).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyxds.xds import descriptors
from pyxds.xds.resources._common import (
    FAULT_FILTER_TYPE,
    FILTER_OVERRIDE_TYPES,
    HTTP_FILTER_TYPES,
    RBAC_FILTER_TYPE,
    ROUTER_FILTER_TYPE,
    SERVER_HTTP_FILTER_TYPES,
    TYPED_STRUCT_TYPES,
    Errors,
    any_type,
    config_source_is_ads_or_self,
    duration,
    type_name,
    typed_struct_inner_type,
    valid_fault_config,
    validate_filter_config,
)
from pyxds.xds.resources.route_config import parse_route_configuration
from pyxds.xds.resources.types import HttpFilter, Listener, RouteConfiguration

if TYPE_CHECKING:
    from envoy.config.listener.v3 import listener_pb2
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2,
    )
else:  # loaded on first use without the generated modules (pyxds.xds.descriptors)
    listener_pb2 = descriptors.module("envoy.config.listener.v3.listener_pb2")
    http_connection_manager_pb2 = descriptors.module(
        "envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2"
    )

if TYPE_CHECKING:  # the server side's types load with the first server Listener
    from pyxds.xds.resources.server_types import ServerHcm

__all__ = [
    "decode_listener",
    "HTTP_FILTER_TYPES",
    "register_http_filter",
    "HCM_TYPE",
    "parse_server_hcm",
]

HCM_TYPE = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER_TYPE = ROUTER_FILTER_TYPE


def register_http_filter(
    type_name_: str, terminal: bool = False, override_types: tuple[str, ...] | None = None
) -> None:
    """Declare an HTTP filter config type supported by the client (A39) and
    the config types its ``typed_per_filter_config`` overrides may have
    (default: its own type; none for a terminal filter)."""
    HTTP_FILTER_TYPES[type_name_] = terminal
    if override_types is None:
        override_types = () if terminal else (type_name_,)
    FILTER_OVERRIDE_TYPES.update(override_types)
    # RDS results are memoized by their bytes, and typed_per_filter_config
    # validity depends on the supported types: forget them.
    from pyxds.xds.resources import ROUTE_CONFIG

    ROUTE_CONFIG.clear_memo()


def decode_listener(
    data: bytes, providers: Mapping[str, Any] | None = None, trusted: bool = False
) -> tuple[str | None, Any, str | None]:
    """Parse and validate serialized Listener bytes: (name, resource, error).

    ``providers``: the bootstrap's ``certificate_providers``, against which a
    server listener's TLS provider instance names are checked (None: not
    checked).  ``trusted``: the server has ``trusted_xds_server`` (A81: an
    inline route config's ``auto_host_rewrite`` is read)."""
    lis = listener_pb2.Listener()
    try:
        lis.ParseFromString(data)
    except Exception as err:
        return None, None, f"could not parse Listener: {err}"
    name = lis.name
    if not lis.HasField("api_listener"):
        if not lis.HasField("address"):  # C-core's words
            return name, None, "Listener has neither address nor ApiListener"
        from pyxds.xds.resources.server_listener import parse_tcp_listener

        errs = Errors()
        tcp = parse_tcp_listener(lis, errs, providers)
        if errs or tcp is None:
            return name, None, errs.text() or "invalid server Listener"
        return name, Listener(name, api_listener=False, tcp_listener=tcp), None
    errs = Errors()
    resource = _parse_api_listener(lis, errs, trusted)
    if errs:
        return name, None, errs.text()
    return name, resource, None


def _parse_api_listener(lis: Any, errs: Errors, trusted: bool = False) -> Listener | None:
    any_msg = lis.api_listener.api_listener
    path = "api_listener.api_listener"
    # C-core's words and fields: the Any's type names the value.
    if not lis.api_listener.HasField("api_listener"):
        errs.add(path, "field not present")
        return None
    tname = any_type(any_msg.type_url, path, errs)
    if tname is None:
        return None
    if tname != HCM_TYPE:
        errs.add(f"{path}.value[{tname}]", "unsupported filter type")
        return None
    hcm = http_connection_manager_pb2.HttpConnectionManager()
    try:
        hcm.ParseFromString(any_msg.value)
    except Exception:  # google.protobuf.message.DecodeError
        errs.add(f"{path}.value[{HCM_TYPE}]", "could not parse HttpConnectionManager config")
        return None
    return parse_http_connection_manager(hcm, lis.name, errs, f"{path}.value[{HCM_TYPE}]", trusted)


def parse_http_connection_manager(
    hcm: Any, name: str, errs: Errors, path: str, trusted: bool = False
) -> Listener:
    """Validate a client HttpConnectionManager; ``path`` names it in errors."""
    route_config_name, route_config = _routes_and_ip_detection(hcm, errs, path, trusted)
    filters = _parse_http_filters(hcm, errs, path)
    msd = None
    if hcm.HasField("common_http_protocol_options"):
        cho = hcm.common_http_protocol_options
        if cho.HasField("max_stream_duration"):
            msd = duration(
                cho.max_stream_duration,
                f"{path}.common_http_protocol_options.max_stream_duration",
                errs,
            )
    return Listener(name, route_config_name, route_config, filters, msd)


def parse_server_hcm(hcm: Any, errs: Errors, path: str) -> ServerHcm:
    """Validate the HttpConnectionManager of a server filter chain (A36):
    the same rules as a client's, with the servers' filters (router, RBAC)."""
    from pyxds.xds.resources.server_types import ServerHcm, ServerHttpFilter

    route_config_name, route_config = _routes_and_ip_detection(hcm, errs, path)
    filters = _parse_http_filters(hcm, errs, path, server=True)
    if hcm.HasField("common_http_protocol_options"):
        cho = hcm.common_http_protocol_options
        if cho.HasField("max_stream_duration"):
            duration(
                cho.max_stream_duration,
                f"{path}.common_http_protocol_options.max_stream_duration",
                errs,
            )
    server_filters = tuple(
        ServerHttpFilter(f.name, f.type_url, rbac, f.disabled) for f, rbac in filters
    )
    return ServerHcm(route_config_name, route_config, server_filters)


def _routes_and_ip_detection(
    hcm: Any, errs: Errors, path: str, trusted: bool = False
) -> tuple[str | None, RouteConfiguration | None]:
    route_config_name = None
    route_config = None
    which = hcm.WhichOneof("route_specifier")
    if which == "rds":
        rds = hcm.rds
        if not rds.HasField("config_source"):
            errs.add(f"{path}.rds.config_source", "field not present")
        elif not config_source_is_ads_or_self(rds.config_source):
            errs.add(f"{path}.rds.config_source", "ConfigSource does not specify ADS or SELF")
        route_config_name = rds.route_config_name
    elif which == "route_config":
        route_config = parse_route_configuration(
            hcm.route_config, errs, f"{path}.route_config", trusted
        )
    else:  # unset or scoped_routes
        errs.add(path, "neither route_config nor rds fields are present")
    # A41: gRPC trusts no proxy hops and does no original-IP detection.
    if hcm.xff_num_trusted_hops != 0:
        errs.add(f"{path}.xff_num_trusted_hops", "must be zero")
    if len(hcm.original_ip_detection_extensions):
        errs.add(f"{path}.original_ip_detection_extensions", "must be empty")
    return route_config_name, route_config


_NO_TYPED_STRUCT = {
    ROUTER_FILTER_TYPE: "could not parse router filter config",
    FAULT_FILTER_TYPE: "could not parse fault injection filter config",
    RBAC_FILTER_TYPE: "could not parse HTTP RBAC filter config",
}
"""Filters whose config must be protobuf bytes (C-core's words when it
comes as a TypedStruct); the stateful session filter says it itself."""


def _router_config_parses(value: bytes) -> bool:
    """The router's config has nothing gRPC uses, but it must parse as a
    ``Router`` (C-core's router filter factory NACKs it otherwise).  The
    usual empty config needs no parsing, so its module loads only for a
    router config with something in it."""
    if not value:
        return True
    from envoy.extensions.filters.http.router.v3 import router_pb2

    try:
        router_pb2.Router().ParseFromString(value)
    except Exception:  # google.protobuf.message.DecodeError
        return False
    return True


def _parse_http_filters(hcm: Any, errs: Errors, path: str, server: bool = False) -> tuple[Any, ...]:
    """The HCM's filters: HttpFilter values (client) or (HttpFilter, RBAC
    config or None) pairs (``server``)."""
    known, other = (
        (SERVER_HTTP_FILTER_TYPES, HTTP_FILTER_TYPES)
        if server
        else (HTTP_FILTER_TYPES, SERVER_HTTP_FILTER_TYPES)
    )
    out: list[Any] = []
    seen: set[str] = set()
    n_errors = len(errs)
    order: list[tuple[str, bool]] = []  # (config type, terminal) of the chain
    for i, f in enumerate(hcm.http_filters):
        p = f"{path}.http_filters[{i}]"
        name = f.name
        if not name:
            errs.add(f"{p}.name", "empty filter name")
            continue
        if name in seen:
            errs.add(f"{p}.name", f"duplicate HTTP filter name: {name}")
            continue
        seen.add(name)
        if f.WhichOneof("config_type") != "typed_config":
            # No config, or config_discovery (ECDS, not supported): C-core
            # reads only typed_config, so both are "field not present", even
            # for an optional filter.
            errs.add(f"{p}.typed_config", "field not present")
            continue
        any_msg = f.typed_config
        vp = f"{p}.typed_config"
        tname = any_type(any_msg.type_url, vp, errs)  # C-core: even when optional
        if tname is None:
            continue
        if tname in TYPED_STRUCT_TYPES:
            vp = f"{vp}.value[{tname}]"
            tname = typed_struct_inner_type(any_msg.value, vp, errs)
            if tname is None:
                continue
        vp = f"{vp}.value[{tname}]"
        terminal = known.get(tname)
        if terminal is None:
            if f.is_optional:
                continue
            errs.add(
                f"{p}.typed_config.value[{tname}]",
                f"filter is not supported on {'servers' if server else 'clients'}"
                if tname in other
                else "unsupported filter type",
            )
            continue
        unparsed = _NO_TYPED_STRUCT.get(tname)
        if unparsed is not None and type_name(any_msg.type_url) in TYPED_STRUCT_TYPES:
            # A TypedStruct holds JSON, not the config's protobuf bytes: as
            # C-core, these filters cannot read their config from it.
            errs.add(vp, unparsed)
            continue
        if tname == FAULT_FILTER_TYPE:
            if not valid_fault_config(any_msg, vp, errs):
                continue
        elif tname == ROUTER_FILTER_TYPE:
            if not _router_config_parses(any_msg.value):
                errs.add(vp, "could not parse router filter config")  # C-core's words
                continue
        elif not validate_filter_config(tname, any_msg, f"{p}.typed_config", errs):
            continue
        flt = HttpFilter(name, tname, any_msg.value, f.is_optional, f.disabled)
        order.append((tname, terminal))
        if not server:
            out.append(flt)
            continue
        rbac = None
        if tname == RBAC_FILTER_TYPE:
            from pyxds.xds.resources.rbac import parse_rbac

            rbac = parse_rbac(any_msg.value, vp, errs)
            if rbac is None:
                continue
        out.append((flt, rbac))
    # Ordering is checked on the filters C-core keeps: not the skipped
    # optional ones, nor a router or fault filter whose config it could not
    # read, but an RBAC filter with an invalid config is (C-core's RBAC
    # filter has a config even then).  Only the last may be, and it must be,
    # terminal.
    p = f"{path}.http_filters"
    if not order:
        if len(errs) == n_errors:
            errs.add(p, "expected at least one HTTP filter")
        return ()
    for k, (type_url, terminal) in enumerate(order):
        if k != len(order) - 1 and terminal:
            errs.add(
                p,
                f"terminal filter for config type {type_url} must be the last filter in the chain",
            )
    type_url, terminal = order[-1]
    if not terminal:
        errs.add(
            p,
            f"non-terminal filter for config type {type_url} is the last filter in the chain",
        )
    return tuple(out)
