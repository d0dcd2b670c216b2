"""xDS v3 resource type URLs served by :mod:`pyxds.server` and how to name resources.

A27 "How gRPC Will Use the xDS API": the four resource types a gRPC client asks
for on one ADS stream, and the name each resource is known by (a Listener,
RouteConfiguration and Cluster by their ``name`` field, a ClusterLoadAssignment
by its ``cluster_name``).
"""

from __future__ import annotations

from typing import Any

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE_CONFIGURATION = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
CLUSTER_LOAD_ASSIGNMENT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

#: The four types in the order a client discovers them (LDS, RDS, CDS, EDS).
TYPE_URLS: tuple[str, ...] = (LISTENER, ROUTE_CONFIGURATION, CLUSTER, CLUSTER_LOAD_ASSIGNMENT)

#: Types for which an empty first request means "every resource" (legacy wildcard).
WILDCARD_TYPES = frozenset({LISTENER, CLUSTER})

#: The explicit wildcard resource name of the xDS protocol.
WILDCARD = "*"

#: Snapshot field name of each type URL.
FIELD_OF_TYPE: dict[str, str] = {
    LISTENER: "listeners",
    ROUTE_CONFIGURATION: "routes",
    CLUSTER: "clusters",
    CLUSTER_LOAD_ASSIGNMENT: "endpoints",
}
TYPE_OF_FIELD: dict[str, str] = {v: k for k, v in FIELD_OF_TYPE.items()}

_ALIASES: dict[str, str] = {
    "lds": LISTENER,
    "listener": LISTENER,
    "listeners": LISTENER,
    "rds": ROUTE_CONFIGURATION,
    "route": ROUTE_CONFIGURATION,
    "routes": ROUTE_CONFIGURATION,
    "routeconfiguration": ROUTE_CONFIGURATION,
    "cds": CLUSTER,
    "cluster": CLUSTER,
    "clusters": CLUSTER,
    "eds": CLUSTER_LOAD_ASSIGNMENT,
    "endpoint": CLUSTER_LOAD_ASSIGNMENT,
    "endpoints": CLUSTER_LOAD_ASSIGNMENT,
    "clusterloadassignment": CLUSTER_LOAD_ASSIGNMENT,
}


def resolve_type_url(type_url: str) -> str:
    """Accept a full v3 type URL or a short name ("LDS", "clusters", ...).

    Raises ValueError naming the unknown type.
    """
    if type_url in FIELD_OF_TYPE:
        return type_url
    alias = _ALIASES.get(type_url.lower())
    if alias is None:
        raise ValueError(
            f"unknown xDS resource type {type_url!r}: expected one of {', '.join(TYPE_URLS)} "
            "or LDS/RDS/CDS/EDS"
        )
    return alias


def resource_name(type_url: str, resource: Any) -> str:
    """The name a client subscribes to for ``resource`` of ``type_url``."""
    attr = "cluster_name" if type_url == CLUSTER_LOAD_ASSIGNMENT else "name"
    name = getattr(resource, attr, None)
    if not isinstance(name, str):
        raise TypeError(
            f"cannot name a {FIELD_OF_TYPE[type_url]} resource of type "
            f"{type(resource).__name__}: it has no string {attr!r} field "
            "(pass a mapping {name: resource} instead)"
        )
    return name
