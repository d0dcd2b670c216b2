"""``XdsConfig``: the complete, consistent xDS configuration (gRFC A74 latest).

The XdsDependencyManager delivers an XdsConfig only when every resource it
needs has arrived or failed, so the resolver and the LB policies never see a
half-applied change.  Cluster problems stay local: ``clusters[name]`` is a
``Status`` when the cluster failed (does not exist, or an error before any
data); endpoint problems become ``EndpointConfig.resolution_note`` with
``endpoints`` None.  All values are frozen with structural equality, so an
unchanged cluster compares equal and its subtree does nothing (TRAPS:
"configs and equality").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from types import MappingProxyType
from typing import Any, Union

import grpc

from pyxds._values import dataclass
from pyxds.status import Status
from pyxds.xds.resources.types import (
    Cluster,
    ClusterLoadAssignment,
    Listener,
    RouteConfiguration,
    VirtualHost,
)

XDS_CONFIG_ATTRIBUTE = "xds_config"
DEPENDENCY_MANAGER_ATTRIBUTE = "dependency_manager"
XDS_CLIENT_ATTRIBUTE = "xds_client"
"""The channel's XdsClient, for xds_cluster_impl's load reporting (A74 keeps
the XdsClient reachable from the LB tree; A27 LRS)."""


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """EDS or LOGICAL_DNS data of a leaf cluster.  ``endpoints`` None with a
    ``resolution_note`` when EDS/DNS failed or has not produced data."""

    endpoints: ClusterLoadAssignment | None
    resolution_note: str = ""


@dataclass(frozen=True, slots=True)
class AggregateConfig:
    """The ordered, deduplicated leaf clusters of an aggregate cluster (A75);
    children that do not exist are skipped (A74 latest)."""

    leaf_clusters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A cluster that arrived: its CDS resource and what it resolved to (the
    endpoints of a leaf cluster, or an aggregate's leaf clusters)."""

    cluster: Cluster
    children: Union[EndpointConfig, AggregateConfig]


@dataclass(frozen=True)
class XdsConfig:
    """The channel's complete xDS configuration (module docstring): the
    Listener, its RouteConfiguration and chosen VirtualHost, and each cluster
    the routes name, as a :class:`ClusterConfig` or its failure."""

    listener: Listener
    route_config: RouteConfiguration
    virtual_host: VirtualHost
    clusters: Mapping[str, ClusterConfig | Status] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def __post_init__(self) -> None:
        if not isinstance(self.clusters, MappingProxyType):
            object.__setattr__(self, "clusters", MappingProxyType(dict(self.clusters)))

    def __hash__(self) -> int:
        return hash((self.listener.name, self.route_config.name, tuple(self.clusters)))


def cluster_entry(
    attributes: Mapping[str, Any], cluster: str, policy: str, leaf: bool = False
) -> ClusterConfig | Status:
    """The entry of ``cluster`` in the XdsConfig the cds policy passes down
    its tree (``attributes[XDS_CONFIG_ATTRIBUTE]``, A74), as
    xds_cluster_impl and xds_override_host read it; else the INTERNAL
    status they fail with: no XdsConfig passed to ``policy``, or no entry
    for the cluster (with ``leaf``, none with endpoints)."""
    xds_config = attributes.get(XDS_CONFIG_ATTRIBUTE)
    if xds_config is None:
        return Status(grpc.StatusCode.INTERNAL, f"xDS config not passed to {policy} LB policy")
    entry = xds_config.clusters.get(cluster)
    if not isinstance(entry, ClusterConfig) or (
        leaf and not isinstance(entry.children, EndpointConfig)
    ):
        return Status(grpc.StatusCode.INTERNAL, f"xDS config has no entry for cluster {cluster}")
    return entry
