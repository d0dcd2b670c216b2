"""``cds_experimental``: one cluster's subtree, built from the XdsConfig.

gRFC A74 latest ("Changes in cds LB policy"), A37 and A75.  Config:
``{"cluster": NAME, "isDynamic": bool}``.  The cluster's data comes from the
``xds_config`` attribute (:class:`pyxds.resolver.xds_config.XdsConfig`),
never from a watch.

Theory of operation, per update:

1. Dynamic cluster (``isDynamic``): on the first update, subscribe through
   the ``dependency_manager`` attribute (``subscribe_cluster(name)``); the
   handle is released at shutdown.  An update whose XdsConfig has no entry
   for the cluster yet is ignored (A74: the subscription has not produced
   data).  A static cluster without an entry is a bug upstream: TRANSIENT_FAILURE
   "xDS config has no entry for static cluster NAME".
2. Cluster in error (a Status in ``xds_config.clusters``): the child tree is
   destroyed and the policy reports TRANSIENT_FAILURE with that status.
3. Leaf cluster (EDS or LOGICAL_DNS) whose ClusterConfig equals the last one
   applied: nothing to do (TRAPS.md "configs and equality").
4. Leaf cluster (A75 "Aggregate Cluster Changes", C-core's order): child
   ``outlier_detection_experimental`` (A50; the cluster's
   ``outlier_detection``, else a no-op config) over
   ``xds_cluster_impl_experimental {clusterName}`` over
   ``xds_override_host_experimental {clusterName}`` (A55/A75 stateful
   session affinity, always there as in C-core: a no-op without sessions)
   over ``priority_experimental`` with one child per EDS priority (exactly one for
   LOGICAL_DNS, and exactly one without endpoints when the EDS resource
   failed, is missing or has no endpoints, so that an aggregate parent fails
   over: TRAPS.md, grpc-go#6462).  Outlier detection thus sees every
   endpoint of every priority and counts every pick, a session's included.
   Each priority child runs the cluster's LB
   policy (``Cluster.lb_policy_config``, A52; default xds_wrr_locality over
   round_robin; ``pick_first`` per A62) with
   ``ignore_reresolution_requests`` for EDS (A37).  Priority child names are
   ``{cluster=NAME, child_number=N}``, kept stable by
   :mod:`pyxds.lb.priority_names`.  Endpoints carry
   ``hierarchical_path = (priority child name, str(locality))``,
   ``weight = locality weight x endpoint weight``, ``locality``,
   ``locality_weight``, ``health_status`` (the EDS status: DRAINING
   endpoints are here for xds_override_host, which keeps them from the
   priorities), ``xds_cluster`` (the cluster's name), when EDS metadata sets one and
   GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT is ``false``, ``hash_key`` (A76),
   and ``address_name``, the endpoint's host name (EDS ``hostname``, or
   ``host:port`` of a LOGICAL_DNS cluster) when there is one (A101).
   A priority with no endpoints gets ``resolution_note`` saying why: the
   dependency manager's note, else "EDS resource X: all endpoints unhealthy"
   / "EDS resource X contains no endpoints".
5. Aggregate cluster: child ``priority_experimental`` with one
   ``cds_experimental {cluster: LEAF}`` child per leaf cluster, in order,
   named after the leaf (A75).  No leaves (every child missing, A74 latest):
   TRANSIENT_FAILURE "aggregate cluster dependency graph for NAME has no leaf
   clusters".  Aggregates always pass the update down (their leaves may have
   changed even when the aggregate did not).
6. The child gets the update's attributes unchanged, so nested cds policies
   see the same XdsConfig.  A change of cluster type (EDS, LOGICAL_DNS,
   AGGREGATE, either way) reuses nothing: name state starts over; between a
   leaf and an aggregate the child's policy name changes and the
   ChildPolicyHandler builds the new tree while the old one serves until the
   new one leaves CONNECTING; between EDS and LOGICAL_DNS the old tree is
   shut down first.  (grpcio 1.85.1 crashed here: TRAPS.md.)  A change of
   the cluster's outlier detection config updates the outlier_detection
   policy in place (same subchannels).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    LoadBalancer,
    PolicyFactory,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler
from pyxds.lb.errors import LBConfigError, expect_bool, expect_object, expect_string
from pyxds.lb.hierarchy import PATH_KEY
from pyxds.lb.pick_first import weighted_shuffling_enabled
from pyxds.lb.priority_names import PriorityNames, assign_child_numbers
from pyxds.lb.registry import PolicySelection
from pyxds.resolver.xds_config import (
    DEPENDENCY_MANAGER_ATTRIBUTE,
    XDS_CONFIG_ATTRIBUTE,
    AggregateConfig,
    ClusterConfig,
    EndpointConfig,
)
from pyxds.security.tls_config import ADDRESS_NAME_ATTRIBUTE
from pyxds.xds.resources.types import (
    ClusterLoadAssignment,
    EndpointAddress,
    Locality,
    LocalityName,
)

NAME = "cds_experimental"
PRIORITY = "priority_experimental"
CLUSTER_IMPL = "xds_cluster_impl_experimental"
OUTLIER_DETECTION = "outlier_detection_experimental"
OVERRIDE_HOST = "xds_override_host_experimental"
WEIGHT_ATTRIBUTE = "weight"
LOCALITY_ATTRIBUTE = "locality"
LOCALITY_WEIGHT_ATTRIBUTE = "locality_weight"
#: the EDS health status name (UNKNOWN, HEALTHY, DRAINING), read by xds_override_host
HEALTH_STATUS_ATTRIBUTE = "health_status"
#: the leaf cluster's name (messages of the policies below, e.g. WRR's warning)
CLUSTER_NAME_ATTRIBUTE = "xds_cluster"
HASH_KEY_ATTRIBUTE = "hash_key"
HASH_KEY_BACKWARD_COMPAT_ENV = "GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT"


def endpoint_hash_keys_enabled() -> bool:
    """A76 "Temporary environment variable protection": EDS ``hash_key``
    metadata is used only when GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT is
    ``false``; unset means ``true`` (ignore it), as in grpcio 1.85's C-core."""
    return os.environ.get(HASH_KEY_BACKWARD_COMPAT_ENV, "").strip().lower() == "false"


#: what cds caches per locality: (priority child, Locality, A113 share or None)
_CacheKey = tuple[str, Locality, "int | None"]
#: a locality built before: (Locality, its A113 share or None, its endpoints)
_Built = tuple[Locality, "int | None", "tuple[Endpoint, ...]"]

_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_INTERNAL = grpc.StatusCode.INTERNAL


@dataclass(frozen=True)
class CdsConfig:
    """The cds policy's config: its cluster, and whether the policy
    subscribes to it itself (A74 ``isDynamic``: a cluster no route names,
    e.g. an RLS target)."""

    cluster: str
    is_dynamic: bool = False


def empty_priority_note(cluster_name: str, endpoint_config: EndpointConfig) -> str:
    """Why a leaf cluster has no endpoints (the text its empty priority fails with)."""
    if endpoint_config.resolution_note:
        return endpoint_config.resolution_note
    load = endpoint_config.endpoints
    if load is None:
        return f"no endpoint data for cluster {cluster_name}"
    if load.all_endpoints_unhealthy:
        return f"EDS resource {load.cluster_name}: all endpoints unhealthy"
    return f"EDS resource {load.cluster_name} contains no endpoints"


class CdsPolicy(LoadBalancer):
    """See the module docstring."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._cluster: str | None = None
        self._subscription: Any = None
        self._child: ChildPolicyHandler | None = None
        self._applied: ClusterConfig | None = None
        self._names: PriorityNames | None = None
        # (child name, Locality, A113 share) -> endpoints built for it, reused
        # while unchanged
        self._endpoint_cache: dict[_CacheKey, tuple[Endpoint, ...]] = {}
        self._config_cache: dict[tuple[Any, ...], PolicySelection] = {}
        self._shut_down = False

    # -- introspection -------------------------------------------------
    @property
    def child(self) -> LoadBalancer | None:
        return self._child.child if self._child is not None else None

    @property
    def child_policy_name(self) -> str | None:
        return self._child.policy_name if self._child is not None else None

    @property
    def priority_names(self) -> list[str]:
        """The current priority child names of a leaf cluster ([] otherwise)."""
        if self._names is None or self._cluster is None:
            return []
        return self._names.names(self._cluster)

    # -- LoadBalancer --------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shut_down:
            return None
        config: CdsConfig = update.config
        if self._cluster != config.cluster:
            # Parents key cds children by cluster name, so this is a new
            # cluster only if a parent reuses a child: start over.
            if self._cluster is not None:
                self._reset()
                self._release()
            self._cluster = config.cluster
        name = self._cluster
        if config.is_dynamic and self._subscription is None:
            manager = update.attributes.get(DEPENDENCY_MANAGER_ATTRIBUTE)
            if manager is None:
                return self._fail(
                    Status(_INTERNAL, "xDS dependency mgr not passed to CDS LB policy")
                )
            self._subscription = manager.subscribe_cluster(name)
        xds_config = update.attributes.get(XDS_CONFIG_ATTRIBUTE)
        if xds_config is None:
            return self._fail(Status(_INTERNAL, "xDS config not passed to CDS LB policy"))
        entry = xds_config.clusters.get(name)
        if entry is None:
            if config.is_dynamic:
                return None  # subscribed; wait for an XdsConfig that has it
            return self._fail(
                Status(_UNAVAILABLE, f"xDS config has no entry for static cluster {name}")
            )
        if isinstance(entry, Status):
            return self._fail(entry)
        children = entry.children
        applied = self._applied
        if applied is not None and applied.cluster.kind != entry.cluster.kind:
            self._type_changed(
                leaf_to_leaf=isinstance(children, EndpointConfig)
                and isinstance(applied.children, EndpointConfig)
            )
        if isinstance(children, EndpointConfig):
            if entry == self._applied and self._child is not None:
                return None
            return self._update_leaf(update, entry, children)
        return self._update_aggregate(update, entry, children)

    def resolver_error(self, status: Status) -> None:
        if self._child is not None:
            self._child.resolver_error(status)
        else:
            self.helper.update_state(
                ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status)
            )

    def exit_idle(self) -> None:
        if self._child is not None:
            self._child.exit_idle()

    def reset_backoff(self) -> None:
        if self._child is not None:
            self._child.reset_backoff()

    def shutdown(self) -> None:
        self._shut_down = True
        self._reset()
        self._release()

    def _release(self) -> None:
        if self._subscription is not None:
            self._subscription.release()
            self._subscription = None

    # -- leaf clusters -------------------------------------------------
    def _update_leaf(
        self, update: ResolverUpdate, entry: ClusterConfig, endpoint_config: EndpointConfig
    ) -> Status | None:
        name = self._cluster
        assert name is not None
        cluster = entry.cluster
        is_dns = cluster.kind == "LOGICAL_DNS"
        load: ClusterLoadAssignment | None = endpoint_config.endpoints
        priorities: tuple[tuple[Locality, ...], ...] = ((),)
        if load is not None and load.priorities:
            priorities = load.priorities
        previous = self._names if self._applied_is_leaf() else None
        names_state = assign_child_numbers(previous, [[loc.name for loc in p] for p in priorities])
        child_names = names_state.names(name)
        endpoints: list[Endpoint] = []
        cache: dict[_CacheKey, tuple[Endpoint, ...]] = {}
        old_cache = self._endpoint_cache
        by_name: dict[tuple[str, LocalityName], _Built] | None = None
        normalize = weighted_shuffling_enabled()
        for child, localities in zip(child_names, priorities, strict=True):
            total = sum(loc.weight for loc in localities) if normalize else 0
            for locality in localities:
                # A113: the locality's share of its priority, UQ1.31
                share = (locality.weight << 31) // total if normalize else None
                key = (child, locality, share)
                built = old_cache.get(key)
                if built is None:
                    if by_name is None:
                        by_name = {
                            (c, old.name): (old, old_share, b)
                            for (c, old, old_share), b in old_cache.items()
                        }
                    built = _locality_endpoints(
                        name, child, locality, by_name.get((child, locality.name)), share
                    )
                cache[key] = built
                endpoints.extend(built)
        note = endpoint_config.resolution_note
        if not endpoints:
            note = empty_priority_note(name, endpoint_config)
        try:
            selection = self._leaf_config(
                name,
                tuple(child_names),
                cluster.lb_policy_config,
                is_dns,
                cluster.outlier_detection,
            )
        except LBConfigError as err:
            return self._fail(
                Status(_INTERNAL, f"{name}: error parsing child policy config: {err}")
            )
        self._names = names_state
        self._endpoint_cache = cache
        self._applied = entry
        return self._child_update(
            update.replace(endpoints=endpoints, config=selection, resolution_note=note)
        )

    def _leaf_config(
        self,
        name: str,
        child_names: tuple[str, ...],
        lb_policy: str,
        is_dns: bool,
        outlier_detection: str | None = None,
    ) -> PolicySelection:
        key = ("leaf", child_names, lb_policy, is_dns, outlier_detection)
        cached = self._config_cache.get(key)
        if cached is not None:
            return cached
        # A75 "Aggregate Cluster Changes": outlier_detection, xds_cluster_impl
        # and xds_override_host sit above the priority policy, so outlier
        # detection counts every endpoint of every priority and every pick
        # (a session's too), as C-core builds it (cds.cc).  Each priority
        # child runs the cluster's own policy.
        children: dict[str, Any] = {}
        policy = json.loads(lb_policy)
        for child in child_names:
            child_config: dict[str, Any] = {"config": policy}
            if not is_dns:
                child_config["ignore_reresolution_requests"] = True
            children[child] = child_config
        priority = [{PRIORITY: {"children": children, "priorities": list(child_names)}}]
        override_host = [{OVERRIDE_HOST: {"clusterName": name, "childPolicy": priority}}]
        cluster_impl = [{CLUSTER_IMPL: {"clusterName": name, "childPolicy": override_host}}]
        # A50 "xDS Integration": the cluster's outlier_detection config, else
        # a no-op one (no algorithm: nothing counted, nothing ejected).
        od = json.loads(outlier_detection) if outlier_detection else {}
        od["childPolicy"] = cluster_impl
        tree = [{OUTLIER_DETECTION: od}]
        selection = registry.select_policy(tree)
        self._config_cache = {key: selection}
        return selection

    def _applied_is_leaf(self) -> bool:
        return self._applied is not None and isinstance(self._applied.children, EndpointConfig)

    # -- aggregate clusters --------------------------------------------
    def _update_aggregate(
        self, update: ResolverUpdate, entry: ClusterConfig, aggregate: AggregateConfig
    ) -> Status | None:
        name = self._cluster
        leaves = aggregate.leaf_clusters
        if not leaves:
            return self._fail(
                Status(
                    _UNAVAILABLE,
                    f"aggregate cluster dependency graph for {name} has no leaf clusters",
                )
            )
        key = ("aggregate", leaves)
        selection = self._config_cache.get(key)
        if selection is None:
            children = {leaf: {"config": [{NAME: {"cluster": leaf}}]} for leaf in leaves}
            try:
                selection = registry.select_policy(
                    [{PRIORITY: {"children": children, "priorities": list(leaves)}}]
                )
            except LBConfigError as err:
                return self._fail(
                    Status(_INTERNAL, f"{name}: error parsing child policy config: {err}")
                )
            self._config_cache = {key: selection}
        self._names = None
        self._endpoint_cache = {}
        self._applied = entry
        return self._child_update(update.replace(endpoints=(), config=selection))

    # -- common ----------------------------------------------------------
    def _child_update(self, update: ResolverUpdate) -> Status | None:
        if self._child is None:
            self._child = ChildPolicyHandler(self.helper)
        return self._child.update(update)

    def _type_changed(self, leaf_to_leaf: bool) -> None:
        """The cluster changed type: nothing of the old tree is reused.  Between
        a leaf and an aggregate the child's policy name changes and the
        handler switches gracefully; between EDS and LOGICAL_DNS (both
        outlier_detection over xds_cluster_impl) the old tree is shut down
        here."""
        self._reset(shut_child=leaf_to_leaf)

    def _reset(self, shut_child: bool = True) -> None:
        """Forget what was applied; with ``shut_child``, shut its child down."""
        if shut_child and self._child is not None:
            self._child.shutdown()
            self._child = None
        self._applied = None
        self._names = None
        self._endpoint_cache = {}
        self._config_cache = {}

    def _fail(self, status: Status) -> Status:
        self._reset()
        self.helper.update_state(ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status))
        return status


def _locality_endpoints(
    cluster: str,
    child: str,
    locality: Locality,
    previous: _Built | None = None,
    share: int | None = None,
) -> tuple[Endpoint, ...]:
    """The endpoints of one locality of priority child ``child``.  When the
    same locality (by name, same weight) was built before, an endpoint whose
    EDS entry is unchanged is the Endpoint built then (one changed endpoint
    rebuilds only itself, and the levels below see the others unchanged).

    An endpoint's ``weight`` is the locality weight times the endpoint
    weight, as grpcio 1.85 computes it by default; with A113's
    GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING on, ``share`` is the locality's
    normalized weight in its priority (UQ1.31) and the endpoint's weight the
    product of that and its normalized weight in the locality (A113 "CDS LB
    Policy changes: Computing Endpoint Weights": ``(share * w * 2**31 //
    sum(w)) >> 31``, at least 1).  The locality weight attribute stays the
    raw one (xds_wrr_locality's).

    Endpoints whose attributes are equal share one read-only mapping: in a
    locality they differ only by the entry's weight, health status, hostname
    and hash key, usually all alike, so a locality of 100 endpoints builds
    one dict (and proxy) where it built 100, and the levels below split one
    mapping (issue 18: objects the cyclic GC walks, and the time to build
    them in a 10,000-endpoint update)."""
    path = (child, str(locality.name))
    weight = locality.weight
    total = sum(a.weight for a in locality.endpoints) if share is not None else 0
    reuse: dict[EndpointAddress, Endpoint] = {}
    if (
        previous is not None
        and previous[0].weight == weight
        and previous[1] == share
        and (share is None or sum(a.weight for a in previous[0].endpoints) == total)
    ):
        reuse = dict(zip(previous[0].endpoints, previous[2], strict=True))
    hash_keys = endpoint_hash_keys_enabled()
    shared: dict[tuple[int, str, str, str], Mapping[str, Any]] = {}
    out = []
    for address in locality.endpoints:
        kept = reuse.get(address)
        if kept is not None:
            out.append(kept)
            continue
        hash_key = address.hash_key if hash_keys else ""
        key = (address.weight, address.health_status, address.hostname, hash_key)
        attributes = shared.get(key)
        if attributes is None:
            if share is None:
                endpoint_weight = weight * address.weight
            else:
                endpoint_weight = (share * ((address.weight << 31) // total)) >> 31 or 1
            values: dict[str, Any] = {
                PATH_KEY: path,
                WEIGHT_ATTRIBUTE: endpoint_weight,
                LOCALITY_ATTRIBUTE: locality.name,
                LOCALITY_WEIGHT_ATTRIBUTE: weight,
                HEALTH_STATUS_ATTRIBUTE: address.health_status,
                CLUSTER_NAME_ATTRIBUTE: cluster,
            }
            if hash_key:
                values[HASH_KEY_ATTRIBUTE] = hash_key  # A76: the ring_hash key
            if address.hostname:
                values[ADDRESS_NAME_ATTRIBUTE] = address.hostname  # A101 auto_host_sni
            attributes = shared[key] = MappingProxyType(values)
        out.append(Endpoint(address.addresses, attributes))
    return tuple(out)


class CdsFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> CdsConfig:
        obj = expect_object(json_config, "")
        cluster = expect_string(obj, "cluster", "")
        if not cluster:
            raise LBConfigError("cluster", "must be non-empty")
        return CdsConfig(cluster, expect_bool(obj, "isDynamic", "", default=False))

    def build(self, helper: Helper) -> CdsPolicy:
        return CdsPolicy(helper)


registry.register(CdsFactory())
