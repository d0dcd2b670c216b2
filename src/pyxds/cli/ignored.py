"""Fields set in a resource that gRPC's xDS client does not read.

A control plane written for Envoy often sets fields a gRPC client ignores
(``connect_timeout``, ``health_checks``, ``dns_lookup_family``, ...). They are
accepted (not NACKed) and have no effect, which is easy to miss; ``pyxds
inspect`` lists them. The sets below are the fields gRPC reads (gRFC A27,
A28, A29, A31, A33, A37, A39, A44, A48, A50, A52, A76, A86/A88 and friends),
by the resource's JSON (proto) field names, for the resource's own level and
the levels ``inspect`` shows.
"""

from __future__ import annotations

from typing import Any

READ: dict[str, frozenset[str]] = {
    "Listener": frozenset({"@type", "name", "api_listener"}),
    # A server Listener (no api_listener, A36); listener_filters are not read.
    "ServerListener": frozenset(
        {"@type", "name", "address", "filter_chains", "default_filter_chain", "use_original_dst"}
    ),
    "FilterChain": frozenset({"name", "filter_chain_match", "filters", "transport_socket"}),
    "HttpConnectionManager": frozenset(
        {"@type", "rds", "route_config", "http_filters", "common_http_protocol_options"}
    ),
    "RouteConfiguration": frozenset(
        {"@type", "name", "virtual_hosts", "cluster_specifier_plugins"}
    ),
    "VirtualHost": frozenset(
        {"name", "domains", "routes", "typed_per_filter_config", "retry_policy"}
    ),
    "Route": frozenset(
        {"name", "match", "route", "non_forwarding_action", "typed_per_filter_config"}
    ),
    "Cluster": frozenset(
        {
            "@type",
            "name",
            "type",
            "cluster_type",
            "eds_cluster_config",
            "lb_policy",
            "load_balancing_policy",
            "ring_hash_lb_config",
            "least_request_lb_config",
            "common_lb_config",
            "circuit_breakers",
            "lrs_server",
            "transport_socket",
            "outlier_detection",
            "load_assignment",
            "metadata",
            "upstream_config",
            "lrs_report_endpoint_metrics",
        }
    ),
    "ClusterLoadAssignment": frozenset({"@type", "cluster_name", "endpoints", "policy"}),
    "LocalityLbEndpoints": frozenset(
        {"locality", "lb_endpoints", "load_balancing_weight", "priority"}
    ),
    "LbEndpoint": frozenset({"endpoint", "health_status", "load_balancing_weight", "metadata"}),
}


def unread_fields(kind: str, message: dict[str, Any], where: str = "") -> list[str]:
    """Dotted names of the fields of ``message`` (a JSON dict) gRPC does not read."""
    if kind == "Listener" and isinstance(message, dict) and "api_listener" not in message:
        kind = "ServerListener"
    read = READ.get(kind)
    if read is None or not isinstance(message, dict):
        return []
    out = [f"{where}{key}" for key in message if key not in read]
    if kind == "Listener":
        hcm = (message.get("api_listener") or {}).get("api_listener") or {}
        out += unread_fields("HttpConnectionManager", hcm, f"{where}api_listener.api_listener.")
    elif kind == "ServerListener":
        chains = [
            (f"filter_chains[{i}]", c) for i, c in enumerate(message.get("filter_chains") or [])
        ]
        if isinstance(message.get("default_filter_chain"), dict):
            chains.append(("default_filter_chain", message["default_filter_chain"]))
        for name, chain in chains:
            out += unread_fields("FilterChain", chain, f"{where}{name}.")
            for j, flt in enumerate(chain.get("filters") or []):
                hcm = flt.get("typed_config") or {} if isinstance(flt, dict) else {}
                out += unread_fields(
                    "HttpConnectionManager", hcm, f"{where}{name}.filters[{j}].typed_config."
                )
    elif kind == "RouteConfiguration":
        for i, vhost in enumerate(message.get("virtual_hosts") or []):
            prefix = f"{where}virtual_hosts[{i}]."
            out += unread_fields("VirtualHost", vhost, prefix)
            for j, route in enumerate(vhost.get("routes") or []):
                out += unread_fields("Route", route, f"{prefix}routes[{j}].")
    elif kind == "ClusterLoadAssignment":
        for i, group in enumerate(message.get("endpoints") or []):
            prefix = f"{where}endpoints[{i}]."
            out += unread_fields("LocalityLbEndpoints", group, prefix)
            for j, endpoint in enumerate(group.get("lb_endpoints") or []):
                out += unread_fields("LbEndpoint", endpoint, f"{prefix}lb_endpoints[{j}].")
    return out
