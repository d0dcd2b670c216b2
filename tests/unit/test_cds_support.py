"""Builders shared by the cds / xds_cluster_impl / cluster_manager tests: XdsConfig
values made by hand (no xDS client), and small helpers to drive a policy tree
built on a FakeHelper.  (No tests here.)"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from pyxds.lb import ConnectivityState, PickComplete, ResolverUpdate, Status, registry
from pyxds.resolver.xds_config import (
    DEPENDENCY_MANAGER_ATTRIBUTE,
    XDS_CONFIG_ATTRIBUTE,
    AggregateConfig,
    ClusterConfig,
    EndpointConfig,
    XdsConfig,
)
from pyxds.testing import FakeHelper
from pyxds.xds.resources.types import (
    Cluster,
    ClusterLoadAssignment,
    DropOverload,
    EndpointAddress,
    Listener,
    Locality,
    LocalityName,
    RouteConfiguration,
    VirtualHost,
)

READY = ConnectivityState.READY
CONNECTING = ConnectivityState.CONNECTING
IDLE = ConnectivityState.IDLE
TF = ConnectivityState.TRANSIENT_FAILURE

_LISTENER = Listener("listener", route_config_name="routes")
_VHOST = VirtualHost("vh", ("*",), ())
_ROUTES = RouteConfiguration("routes", (_VHOST,))

OK = Status(grpc.StatusCode.OK)
PICK_FIRST_POLICY = '[{"pick_first": {}}]'
ROUND_ROBIN_POLICY = '[{"round_robin": {}}]'


def loc(region: str, zone: str = "z", sub_zone: str = "") -> LocalityName:
    return LocalityName(region, zone, sub_zone)


def locality(
    name: LocalityName | str,
    addresses: Iterable[str],
    weight: int = 1,
    endpoint_weights: Sequence[int] | None = None,
) -> Locality:
    if isinstance(name, str):
        name = loc(name)
    addresses = list(addresses)
    weights = list(endpoint_weights) if endpoint_weights else [1] * len(addresses)
    return Locality(
        name,
        weight,
        tuple(EndpointAddress((a,), w) for a, w in zip(addresses, weights, strict=True)),
    )


def eds_cluster(name: str, **kwargs: Any) -> Cluster:
    return Cluster(name, "EDS", **kwargs)


def dns_cluster(name: str, host: str = "dns.example", port: int = 443, **kwargs: Any) -> Cluster:
    return Cluster(name, "LOGICAL_DNS", dns_hostname=host, dns_port=port, **kwargs)


def aggregate_cluster(name: str, children: Sequence[str]) -> Cluster:
    return Cluster(name, "AGGREGATE", aggregate_children=tuple(children))


def eds_entry(
    cluster: Cluster | str,
    *priorities: Sequence[Locality],
    drops: Sequence[tuple[str, int]] = (),
    note: str = "",
    excluded: int = 0,
    missing: bool = False,
) -> ClusterConfig:
    if isinstance(cluster, str):
        cluster = eds_cluster(cluster)
    if missing:
        return ClusterConfig(cluster, EndpointConfig(None, note))
    load = ClusterLoadAssignment(
        cluster.eds_resource_name,
        tuple(tuple(p) for p in priorities),
        tuple(DropOverload(c, ppm) for c, ppm in drops),
        excluded,
    )
    return ClusterConfig(cluster, EndpointConfig(load, note))


def dns_entry(cluster: Cluster | str, addresses: Sequence[str], note: str = "") -> ClusterConfig:
    if isinstance(cluster, str):
        cluster = dns_cluster(cluster)
    if not addresses and note:
        return ClusterConfig(cluster, EndpointConfig(None, note))
    # One priority, one locality without a name, one endpoint with every address (A61).
    load = ClusterLoadAssignment(
        cluster.name,
        ((Locality(LocalityName(), 1, (EndpointAddress(tuple(addresses)),)),),)
        if addresses
        else (),
    )
    return ClusterConfig(cluster, EndpointConfig(load, note))


def aggregate_entry(name: str, leaves: Sequence[str]) -> ClusterConfig:
    return ClusterConfig(aggregate_cluster(name, leaves), AggregateConfig(tuple(leaves)))


def xds_config(clusters: dict[str, ClusterConfig | Status]) -> XdsConfig:
    return XdsConfig(_LISTENER, _ROUTES, _VHOST, clusters)


def not_found(name: str) -> Status:
    return Status(grpc.StatusCode.UNAVAILABLE, f"CDS resource {name} does not exist")


class FakeDependencyManager:
    """Records dynamic subscriptions (``subscribe_cluster`` -> handle.release())."""

    def __init__(self) -> None:
        self.subscribed: list[str] = []
        self.released: list[str] = []

    def subscribe_cluster(self, name: str) -> Any:
        manager = self
        self.subscribed.append(name)

        class _Handle:
            def release(self) -> None:
                manager.released.append(name)

        return _Handle()


def attributes(config: XdsConfig, manager: Any = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {XDS_CONFIG_ATTRIBUTE: config}
    if manager is not None:
        attrs[DEPENDENCY_MANAGER_ATTRIBUTE] = manager
    return attrs


def select(policy_json: list[dict[str, Any]]) -> Any:
    return registry.select(policy_json)


def build(policy_json: list[dict[str, Any]], helper: FakeHelper | None = None):
    """Build the policy named by a loadBalancingConfig list on a FakeHelper."""
    helper = helper or FakeHelper()
    factory, config = registry.select(policy_json)
    return helper, factory.build(helper), config


def cds_update(
    config: Any, xds: XdsConfig, manager: Any = None, endpoints: Sequence[Any] = ()
) -> ResolverUpdate:
    return ResolverUpdate(endpoints, config, attributes(xds, manager))


def connect_all(helper: FakeHelper, state: ConnectivityState = READY) -> None:
    """Move every live subchannel that is not yet in ``state`` to it."""
    for subchannel in helper.live_subchannels():
        if subchannel.state is not state:
            if state is READY and subchannel.state is not CONNECTING:
                subchannel.set_state(CONNECTING)
            subchannel.set_state(state)


def connect(helper: FakeHelper, address: str) -> None:
    """Take the live subchannel of ``address`` through CONNECTING to READY."""
    subchannel = helper.subchannel(address)
    subchannel.set_state(CONNECTING)
    subchannel.set_state(READY)


def picked_addresses(helper: FakeHelper, n: int = 60, **call_attributes: Any) -> list[str]:
    out = []
    for _ in range(n):
        result = helper.pick(**call_attributes)
        assert isinstance(result, PickComplete), result
        if result.on_call_done is not None:
            result.on_call_done(OK)
        out.append(result.subchannel.address)
    return out


_KIND = {
    "CdsPolicy": "cds",
    "XdsClusterImplPolicy": "xds_cluster_impl",
    "XdsOverrideHostPolicy": "xds_override_host",
    "PriorityLoadBalancer": "priority",
    "OutlierDetectionPolicy": "outlier_detection",
    "XdsWrrLocalityPolicy": "xds_wrr_locality",
    "WeightedTargetLoadBalancer": "weighted_target",
    "RoundRobin": "round_robin",
    "PickFirst": "pick_first",
    "XdsClusterManagerPolicy": "xds_cluster_manager",
}


def channel_subchannel(subchannel: Any) -> Any:
    """The subchannel a cds tree's pick starts its attempt on.  A cluster
    without outlier detection runs a no-op outlier_detection whose picker is
    its child's, unmapped (no work per pick): the pick names its wrapper,
    whose ``core`` is the channel's; this is the wrapped one."""
    from pyxds.lb.outlier_detection import OutlierDetectionSubchannel

    if isinstance(subchannel, OutlierDetectionSubchannel):
        return subchannel.real
    return subchannel


def cluster_impl_of(cds_policy: Any) -> Any:
    """The xds_cluster_impl policy of a leaf cds policy (A75: below its
    outlier_detection)."""
    return cds_policy.child.child


def _unwrap(obj: Any) -> Any:
    # a ChildPolicyHandler, or a parent's per-child record with .policy
    from pyxds.lb.child_handler import ChildPolicyHandler

    if isinstance(obj, ChildPolicyHandler):
        return obj.child
    policy = getattr(obj, "policy", None)
    if isinstance(policy, ChildPolicyHandler):
        return policy.child
    return policy


def describe(lb: Any) -> Any:
    """The policy tree below ``lb`` as nested tuples:
    ``(kind, child)`` for single-child policies, ``(kind, {name: child})`` for
    multi-child ones, ``kind`` for leaves."""
    if lb is None:
        return None
    kind = _KIND.get(type(lb).__name__, type(lb).__name__)
    children = getattr(lb, "children", None)
    if isinstance(children, Mapping):
        return (kind, {name: describe(_unwrap(c)) for name, c in children.items()})
    if hasattr(lb, "child"):
        return (kind, describe(lb.child))
    return kind
