"""XdsDependencyManager: every xDS watch of a channel, delivered as one
complete :class:`XdsConfig` (gRFC A74 latest, A37, A75, A88).

Theory of operation
-------------------

The manager owns the watches; its state is the last thing each watch said.
Every event (a resource, an error, a DNS answer, a subscription change)
updates that state and re-runs one function, :meth:`_update`, which
recomputes the whole picture from scratch:

1. *Listener*: not arrived -> wait.  Failed (does not exist, or an error
   before any data) -> report the error.  A listener without an
   ``api_listener`` -> "not an API listener".  Route config inline, or else
   watch RDS ``route_config_name`` (switching the watch when the name
   changes): not arrived -> wait, or, when a config was delivered before,
   keep its listener and route configuration (cluster and endpoint updates
   keep flowing, as in C-core); failed -> report the error.
2. *Virtual host*: A28's most specific domain match for the data-plane
   authority (:func:`select_virtual_host`); none -> report the error.
3. *Clusters*: the clusters the routes name, then dynamic subscriptions.
   Each is resolved depth first: CDS watch; EDS clusters watch their EDS
   resource (``eds_service_name`` or the cluster name), LOGICAL_DNS
   clusters run DNS (:mod:`pyxds.resolver.dns`, never on the serializer),
   aggregate clusters recurse into their children in order.  The aggregate
   graph has a depth limit (:data:`MAX_AGGREGATE_DEPTH` levels); a deeper
   graph is an error for the clusters on that path.  A cluster is expanded
   once per update: a child that is already being expanded (a cycle, e.g.
   an aggregate listing itself) contributes no leaves and is no error, as
   in C-core (xds_cluster_type_end2end_test DependencyLoopWithLeafClusters:
   RPCs work; DependencyLoopWithNoLeafClusters: "aggregate cluster
   dependency graph for X has no leaf clusters").  Children that do not
   exist (or failed before any data) are skipped; leaves are deduplicated,
   first position wins (A37, A74 latest, A75).
4. Watches no longer needed are cancelled; while the listener or route
   configuration is failed or in flight, no virtual host names clusters, so
   every cluster watch (and the RDS watch) stays, as in C-core, and the same
   resources coming back deliver a config with nothing fetched again.  If
   anything needed has not yet arrived (or failed), nothing is delivered:
   the previous config stays in force and no half-applied change is ever
   seen (A74).  Otherwise the new XdsConfig is delivered if it differs from
   the last one.

Errors: only listener and route-config problems reach ``on_update`` as a
:class:`Status` (A74 latest); cluster and endpoint problems stay local to
their cluster (a ``Status`` in ``clusters`` or a ``resolution_note``).  A
``Status`` with code NOT_FOUND means the listener or route configuration
does not exist (the resolver drops its config for it); other errors are
UNAVAILABLE.  Ambient errors (A88: a problem while valid data is cached)
never replace data.

Threading: every method and callback runs on the channel's serializer;
watch callbacks and DNS answers are hopped there with ``serializer_run``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Any

import grpc

from pyxds._values import dataclass
from pyxds.clock import Clock, Timer
from pyxds.resolver.cluster_problems import no_endpoints_words
from pyxds.resolver.route_matching import select_virtual_host
from pyxds.resolver.xds_config import AggregateConfig, ClusterConfig, EndpointConfig, XdsConfig
from pyxds.status import Status
from pyxds.xds.resources import (
    CLUSTER_TYPE_URL,
    ENDPOINTS_TYPE_URL,
    LISTENER_TYPE_URL,
    ROUTE_CONFIG_TYPE_URL,
)
from pyxds.xds.resources.types import (
    Cluster,
    ClusterLoadAssignment,
    EndpointAddress,
    Listener,
    Locality,
    LocalityName,
    RouteAction,
    RouteConfiguration,
    VirtualHost,
)

if TYPE_CHECKING:  # DNS (LOGICAL_DNS clusters) loads with the first cluster that needs it
    from pyxds.resolver.dns import DnsResolver

__all__ = [
    "MAX_AGGREGATE_DEPTH",
    "DNS_RETRY_INITIAL",
    "DNS_RETRY_MAX",
    "DependencyManager",
    "ClusterSubscription",
    "route_cluster_names",
]

_log = logging.getLogger(__name__)

MAX_AGGREGATE_DEPTH = 16  # levels of an aggregate cluster graph (A37)
DNS_RETRY_INITIAL = 1.0  # seconds before re-trying a failed DNS lookup
DNS_RETRY_MAX = 120.0
DNS_RETRY_MULTIPLIER = 1.6

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def route_cluster_names(vhost: VirtualHost) -> list[str]:
    """Clusters named by a virtual host's forwarding routes, in route order, once each."""
    names: dict[str, None] = {}
    for route in vhost.routes:
        action = route.action
        if not isinstance(action, RouteAction):
            continue
        if action.cluster is not None:
            names.setdefault(action.cluster)
        elif action.weighted_clusters is not None:
            for cw in action.weighted_clusters:
                names.setdefault(cw.name)
    return list(names)


# ------------------------------------------------------------------ watch state


class _Watcher:
    """The object handed to XdsClient.watch: hops events onto the serializer
    and drops them once cancelled."""

    __slots__ = ("manager", "state", "cancelled")

    def __init__(self, manager: DependencyManager, state: _Watch) -> None:
        self.manager = manager
        self.state = state
        self.cancelled = False

    def on_resource_changed(self, value: Any) -> None:
        if not self.cancelled:
            self.manager._run(lambda: self._deliver(value, ambient=False))

    def on_ambient_error(self, status: Status) -> None:
        if not self.cancelled:
            self.manager._run(lambda: self._deliver(status, ambient=True))

    # Older watcher API names, accepted too.
    def on_error(self, status: Status) -> None:
        self.on_ambient_error(status)

    def on_resource_does_not_exist(self) -> None:
        self.on_resource_changed(Status(NOT_FOUND, "resource does not exist"))

    def _deliver(self, value: Any, ambient: bool) -> None:
        if self.cancelled:
            return
        self.manager._on_watch_event(self.state, value, ambient)


@dataclass(eq=False)
class _Watch:
    """One xDS resource watched for the config: what it last gave, and how
    to stop watching it."""

    kind: str  # LDS, RDS, CDS, EDS
    type_url: str
    name: str
    resource: Any = None  # last good data (None when failed / not yet)
    status: Status | None = None  # data replaced by an error (incl. does not exist)
    ambient: Status | None = None
    cancel: Callable[[], None] | None = None
    watcher: _Watcher | None = None

    @property
    def received(self) -> bool:
        return self.resource is not None or self.status is not None

    def describe_failure(self) -> str:
        """``CDS resource X does not exist`` / ``CDS resource X: <error>``
        (the client's text when it already names the resource)."""
        assert self.status is not None
        return self._describe(self.status)

    def describe_ambient(self) -> str:
        """The ambient error as a resolution note ("" when there is none)."""
        return self._describe(self.ambient) if self.ambient is not None else ""

    def _describe(self, status: Status) -> str:
        details = status.details
        if f"resource {self.name}" in details:
            return details
        if status.code is NOT_FOUND and (not details or details == "resource does not exist"):
            return f"{self.kind} resource {self.name} does not exist"
        return f"{self.kind} resource {self.name}: {details}"


@dataclass(eq=False)
class _Dns:
    """The DNS resolution of a LOGICAL_DNS cluster (A37): its last result,
    its retry timer and how many times in a row it failed."""

    cluster: str
    host: str
    port: int
    result: tuple[str, ...] | Status | None = None
    cancel: Callable[[], None] | None = None
    retry: Timer | None = None
    failures: int = 0
    generation: int = 0

    @property
    def target(self) -> str:
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"


class ClusterSubscription:
    """A handle on a dynamic cluster subscription (A74); ``release()`` once."""

    __slots__ = ("_manager", "name", "_released")

    def __init__(self, manager: DependencyManager, name: str) -> None:
        self._manager = manager
        self.name = name
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._manager._release(self.name)

    def __repr__(self) -> str:
        return f"ClusterSubscription({self.name!r}{', released' if self._released else ''})"


@dataclass
class _Resolution:
    """Result of resolving one cluster during an update."""

    kind: str  # "leaf", "aggregate", "missing", "error", "pending", "cycle"
    leaves: tuple[str, ...] = ()
    height: int = 1
    error: Status | None = None
    reasons: tuple[str, ...] = field(default_factory=tuple)
    depth: int = 0  # error: the depth it was found at (true from any deeper path)


_CYCLE = _Resolution("cycle", height=0)  # a child already being expanded


# ------------------------------------------------------------------ the manager


class DependencyManager:
    """Watches LDS -> RDS -> CDS -> EDS/DNS and delivers complete XdsConfigs.

    ``xds_client``: ``watch(type_url, name, watcher) -> cancel``.
    ``serializer_run``: runs a callable on the channel's serializer.
    ``on_update``: called (on the serializer) with an :class:`XdsConfig` or
    a :class:`Status` (module docstring).
    """

    def __init__(
        self,
        xds_client: Any,
        listener_name: str,
        authority: str,
        serializer_run: Callable[[Callable[[], None]], None],
        on_update: Callable[[XdsConfig | Status], None],
        dns_resolver: DnsResolver | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._client = xds_client
        self.listener_name = listener_name
        self.authority = authority
        self._run = serializer_run
        self._on_update = on_update
        self._dns_resolver = dns_resolver
        self._clock = clock
        self._shutdown = False
        self._lds = self._start_watch("LDS", LISTENER_TYPE_URL, listener_name)
        self._rds: _Watch | None = None
        self._clusters: dict[str, _Watch] = {}
        self._endpoints: dict[str, _Watch] = {}
        self._dns: dict[str, _Dns] = {}
        self._subscriptions: dict[str, int] = {}
        self._last: XdsConfig | Status | None = None
        self._update_scheduled = False

    # -- public API ----------------------------------------------------------
    def subscribe_cluster(self, name: str) -> ClusterSubscription:
        """Keep ``name`` in the XdsConfig until the handle is released (A74
        dynamic subscriptions; also the resolver's hold on every cluster in
        its LB config, A31)."""
        count = self._subscriptions.get(name, 0)
        self._subscriptions[name] = count + 1
        if count == 0 and name not in self._clusters:
            self._schedule_update()
        return ClusterSubscription(self, name)

    def _release(self, name: str) -> None:
        count = self._subscriptions.get(name, 0) - 1
        if count > 0:
            self._subscriptions[name] = count
            return
        self._subscriptions.pop(name, None)
        self._schedule_update()

    def request_reresolution(self) -> None:
        """Re-run DNS for every LOGICAL_DNS cluster (A74)."""
        for dns in list(self._dns.values()):
            self._start_dns(dns, reresolution=True)

    @property
    def subscriptions(self) -> dict[str, int]:
        return dict(self._subscriptions)

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        self._cancel_watch(self._lds)
        if self._rds is not None:
            self._cancel_watch(self._rds)
        for watch in self._clusters.values():
            self._cancel_watch(watch)
        for watch in self._endpoints.values():
            self._cancel_watch(watch)
        for dns in self._dns.values():
            self._stop_dns(dns)
        self._clusters.clear()
        self._endpoints.clear()
        self._dns.clear()

    def config_dump(self) -> dict[str, Any]:
        """What is watched and what each watch last said (for config_dump)."""

        def state(w: _Watch) -> str:
            if w.status is not None:
                return w.describe_failure()
            return "ACKED" if w.resource is not None else "REQUESTED"

        watches = [self._lds, *([self._rds] if self._rds else [])]
        watches += [*self._clusters.values(), *self._endpoints.values()]
        return {
            "listener": self.listener_name,
            "authority": self.authority,
            "watches": [{"type": w.kind, "name": w.name, "state": state(w)} for w in watches],
            "dns": {
                d.cluster: (
                    list(d.result) if isinstance(d.result, tuple) else str(d.result or "pending")
                )
                for d in self._dns.values()
            },
            "subscriptions": dict(self._subscriptions),
        }

    # -- watch plumbing ------------------------------------------------------
    def _start_watch(self, kind: str, type_url: str, name: str) -> _Watch:
        watch = _Watch(kind, type_url, name)
        watch.watcher = _Watcher(self, watch)
        watch.cancel = self._client.watch(type_url, name, watch.watcher)
        return watch

    @staticmethod
    def _cancel_watch(watch: _Watch) -> None:
        if watch.watcher is not None:
            watch.watcher.cancelled = True
        if watch.cancel is not None:
            cancel, watch.cancel = watch.cancel, None
            cancel()

    def _on_watch_event(self, watch: _Watch, value: Any, ambient: bool) -> None:
        if self._shutdown:
            return
        if ambient:
            # A88: keep the data; the error becomes a resolution note (as C-core).
            _log.debug("xds: ambient error on %s %s: %s", watch.kind, watch.name, value)
            if watch.resource is None:
                return
            new_ambient = None if value.ok else value  # OK: the condition cleared
            if new_ambient != watch.ambient:
                watch.ambient = new_ambient
                self._update()
            return
        if isinstance(value, Status):
            watch.resource = None
            watch.status = value
        else:
            watch.resource = value
            watch.status = None
            watch.ambient = None
        self._update()

    def _schedule_update(self) -> None:
        if self._update_scheduled or self._shutdown:
            return
        self._update_scheduled = True

        def run() -> None:
            self._update_scheduled = False
            self._update()

        self._run(run)

    # -- DNS -----------------------------------------------------------------
    def _start_dns(self, dns: _Dns, reresolution: bool = False) -> None:
        if dns.retry is not None:
            dns.retry.cancel()
            dns.retry = None
        if dns.cancel is not None:
            if reresolution:
                return  # a lookup is already in flight
            dns.cancel()
        dns.generation += 1
        generation = dns.generation
        resolver = self._dns_resolver
        if resolver is None:  # DNS loads with the first LOGICAL_DNS cluster
            from pyxds.resolver.dns import default_dns_resolver

            resolver = default_dns_resolver()

        def answered(result: Any) -> None:
            self._run(lambda: self._on_dns(dns, generation, result))

        dns.cancel = resolver.resolve(dns.host, dns.port, answered)

    @staticmethod
    def _stop_dns(dns: _Dns) -> None:
        dns.generation += 1
        if dns.cancel is not None:
            dns.cancel()
            dns.cancel = None
        if dns.retry is not None:
            dns.retry.cancel()
            dns.retry = None

    def _on_dns(self, dns: _Dns, generation: int, result: Any) -> None:
        if self._shutdown or generation != dns.generation or self._dns.get(dns.cluster) is not dns:
            return
        dns.cancel = None
        if isinstance(result, Status):
            # Keep the last good addresses on a failed re-resolution.
            if not isinstance(dns.result, tuple):
                dns.result = result
            dns.failures += 1
            if self._clock is not None:
                delay = min(
                    DNS_RETRY_INITIAL * DNS_RETRY_MULTIPLIER ** (dns.failures - 1), DNS_RETRY_MAX
                )
                dns.retry = self._clock.call_later(
                    delay, lambda: self._run(lambda: self._retry_dns(dns, generation))
                )
        else:
            dns.failures = 0
            dns.result = tuple(result)
        self._update()

    def _retry_dns(self, dns: _Dns, generation: int) -> None:
        if (
            not self._shutdown
            and self._dns.get(dns.cluster) is dns
            and dns.generation == generation
        ):
            dns.retry = None
            self._start_dns(dns)

    # -- the one update function ---------------------------------------------
    def _report(self, value: XdsConfig | Status) -> None:
        if value == self._last:
            return
        self._last = value
        self._on_update(value)

    def _route_config(self) -> tuple[Listener | None, RouteConfiguration | None, Status | None]:
        """(listener, route config, error); all None while waiting."""
        lds = self._lds
        if lds.status is not None:
            # The RDS watch stays (as in C-core): a listener that comes back
            # naming the same route configuration is served from it at once.
            code = NOT_FOUND if lds.status.code is NOT_FOUND else UNAVAILABLE
            return None, None, Status(code, lds.describe_failure())
        listener: Listener | None = lds.resource
        if listener is None:
            return None, None, None
        if not listener.api_listener:
            return None, None, Status(UNAVAILABLE, f"LDS resource {lds.name}: not an API listener")
        if listener.route_config is not None:
            self._drop_rds()
            return listener, listener.route_config, None
        name = listener.route_config_name
        if name is None:
            self._drop_rds()
            return (
                None,
                None,
                Status(UNAVAILABLE, f"LDS resource {lds.name}: no route configuration"),
            )
        if self._rds is None or self._rds.name != name:
            self._drop_rds()
            self._rds = self._start_watch("RDS", ROUTE_CONFIG_TYPE_URL, name)
        rds = self._rds
        if rds.status is not None:
            code = NOT_FOUND if rds.status.code is NOT_FOUND else UNAVAILABLE
            return listener, None, Status(code, rds.describe_failure())
        if rds.resource is None:
            last = self._last
            if isinstance(last, XdsConfig):
                # A new route configuration name is pending: the listener and
                # route configuration in force stay, and cluster and endpoint
                # updates keep flowing under them (C-core keeps its current
                # route config until the new RDS resource arrives).
                return last.listener, last.route_config, None
            return listener, None, None
        return listener, rds.resource, None

    def _drop_rds(self) -> None:
        if self._rds is not None:
            self._cancel_watch(self._rds)
            self._rds = None

    def _update(self) -> None:
        if self._shutdown:
            return
        listener, route_config, error = self._route_config()
        vhost = None
        if error is None and route_config is not None:
            vhost = select_virtual_host(route_config.virtual_hosts, self.authority)
            if vhost is None:
                kind, name = ("RDS", self._rds.name) if self._rds else ("LDS", self._lds.name)
                error = Status(
                    UNAVAILABLE,
                    f"{kind} resource {name}: could not find VirtualHost for "
                    f"{self.authority} in RouteConfiguration",
                )
        waiting_for_routes = error is None and vhost is None
        roots: dict[str, None] = {}
        if vhost is not None:
            roots.update(dict.fromkeys(route_cluster_names(vhost)))
        else:
            # Keep every cluster watch while the listener/route config is in
            # flight or failed (C-core keeps its watches until a virtual host
            # names other clusters), so a recovery needs no re-fetch.
            roots.update(dict.fromkeys(self._clusters))
        roots.update(dict.fromkeys(self._subscriptions))

        self._needed_clusters: set[str] = set()
        self._needed_eds: set[str] = set()
        self._needed_dns: set[str] = set()
        self._pending = False
        self._memo: dict[str, _Resolution] = {}
        self._entries: dict[str, ClusterConfig | Status] = {}
        for name in roots:
            self._resolve(name, 0, [])
        self._collect_garbage()

        if error is not None:
            self._report(error)
            return
        if waiting_for_routes or self._pending:
            return
        assert listener is not None and route_config is not None and vhost is not None
        self._report(XdsConfig(listener, route_config, vhost, self._entries))

    def _collect_garbage(self) -> None:
        for name in [n for n in self._clusters if n not in self._needed_clusters]:
            self._cancel_watch(self._clusters.pop(name))
        for name in [n for n in self._endpoints if n not in self._needed_eds]:
            self._cancel_watch(self._endpoints.pop(name))
        for name in [n for n in self._dns if n not in self._needed_dns]:
            self._stop_dns(self._dns.pop(name))

    def _resolve(self, name: str, depth: int, path: list[str]) -> _Resolution:
        """Resolve one cluster (module docstring, step 3)."""
        if name in path:
            return _CYCLE
        if depth >= MAX_AGGREGATE_DEPTH:
            return _Resolution(
                "error",
                error=Status(
                    UNAVAILABLE,
                    f"aggregate cluster graph exceeds max depth of {MAX_AGGREGATE_DEPTH} at {name}",
                ),
            )
        memo = self._memo.get(name)
        if memo is not None and memo.kind == "error" and depth < memo.depth:
            memo = None  # a depth error found deeper may not hold from here
        if memo is not None:
            if memo.kind == "aggregate" and depth + memo.height > MAX_AGGREGATE_DEPTH:
                return _Resolution(
                    "error",
                    error=Status(
                        UNAVAILABLE,
                        f"aggregate cluster graph exceeds max depth of {MAX_AGGREGATE_DEPTH} "
                        f"below {name}",
                    ),
                )
            return memo
        self._needed_clusters.add(name)
        watch = self._clusters.get(name)
        if watch is None:
            watch = self._clusters[name] = self._start_watch("CDS", CLUSTER_TYPE_URL, name)
        if not watch.received:
            self._pending = True
            return self._remember(name, _Resolution("pending"))
        if watch.status is not None:
            reason = watch.describe_failure()
            self._entries[name] = Status(UNAVAILABLE, reason)
            return self._remember(name, _Resolution("missing", reasons=(reason,)))
        cluster: Cluster = watch.resource
        if cluster.kind == "AGGREGATE":
            return self._resolve_aggregate(cluster, depth, path)
        if cluster.kind == "LOGICAL_DNS":
            endpoint_config = self._dns_endpoints(cluster)
        else:
            endpoint_config = self._eds_endpoints(cluster, name)
        if endpoint_config is None:
            self._pending = True
            return self._remember(name, _Resolution("pending"))
        self._entries[name] = ClusterConfig(cluster, endpoint_config)
        return self._remember(name, _Resolution("leaf", leaves=(name,)))

    def _remember(self, name: str, resolution: _Resolution) -> _Resolution:
        self._memo[name] = resolution
        return resolution

    def _resolve_aggregate(self, cluster: Cluster, depth: int, path: list[str]) -> _Resolution:
        name = cluster.name
        path.append(name)
        leaves: dict[str, None] = {}
        reasons: list[str] = []
        height = 1
        error: Status | None = None
        pending = False
        try:
            for child in cluster.aggregate_children:
                result = self._resolve(child, depth + 1, path)
                if result.kind == "cycle":
                    continue  # already being expanded above: nothing to add
                if result.kind == "error":
                    error = error or result.error
                elif result.kind == "pending":
                    pending = True
                elif result.kind == "missing":
                    reasons.extend(result.reasons)
                else:
                    leaves.update(dict.fromkeys(result.leaves))
                    height = max(height, result.height + 1)
                    if result.kind == "aggregate" and not result.leaves:
                        reasons.extend(result.reasons)
        finally:
            path.pop()
        if error is not None:
            # Errors on the path make every aggregate on it fail.  Memoised (so
            # a lattice-shaped graph costs linear time): a depth error holds
            # from any path that reaches it at least this deep (checked on reuse).
            self._entries[name] = Status(
                UNAVAILABLE,
                error.details
                if error.details.startswith("aggregate cluster")
                else f"aggregate cluster {name}: {error.details}",
            )
            return self._remember(name, _Resolution("error", error=error, depth=depth))
        if pending:
            return self._remember(name, _Resolution("pending"))
        if not leaves:
            why = f" ({'; '.join(reasons)})" if reasons else ""
            self._entries[name] = Status(
                UNAVAILABLE,
                f"aggregate cluster dependency graph for {name} has no leaf clusters{why}",
            )
        else:
            self._entries[name] = ClusterConfig(cluster, AggregateConfig(tuple(leaves)))
        return self._remember(
            name,
            _Resolution("aggregate", leaves=tuple(leaves), height=height, reasons=tuple(reasons)),
        )

    def _eds_endpoints(self, cluster: Cluster, name: str) -> EndpointConfig | None:
        """``name``: the cluster as watched (an xdstp resource may carry
        another spelling of it, A47)."""
        eds_name = cluster.eds_resource_name
        self._needed_eds.add(eds_name)
        watch = self._endpoints.get(eds_name)
        if watch is None:
            watch = self._endpoints[eds_name] = self._start_watch(
                "EDS", ENDPOINTS_TYPE_URL, eds_name
            )
        if not watch.received:
            return None
        cds_note = self._clusters[name].describe_ambient()
        notes = [self._lds.describe_ambient(), self._rds.describe_ambient() if self._rds else ""]
        notes.append(cds_note)
        if watch.status is not None:
            notes.append(f"{watch.describe_failure()} (cluster {cluster.name}: no endpoints)")
            return EndpointConfig(None, "; ".join(n for n in notes if n))
        cla: ClusterLoadAssignment = watch.resource
        if watch.ambient is not None:
            notes.append(watch.describe_ambient())
        # C-core's words, then (when the cluster has nothing to pick from) the
        # cluster and the cause, as `pyxds serve` and `pyxds inspect` say it.
        if not cla.priorities:
            note = f"EDS resource {eds_name}: contains no localities"
        else:
            empty = sorted(
                f'{{region="{loc.name.region}", zone="{loc.name.zone}", '
                f'sub_zone="{loc.name.sub_zone}"}}'
                for prio in cla.priorities
                for loc in prio
                if not loc.usable_count  # no endpoints, or only DRAINING ones (A55)
            )
            note = (
                f"EDS resource {eds_name}: contains empty localities: [{'; '.join(empty)}]"
                if empty
                else ""
            )
        if note and cla.endpoint_count == 0:
            note += f" ({no_endpoints_words(cluster.name, cla)})"
        notes.append(note)
        return EndpointConfig(cla, "; ".join(n for n in notes if n))

    def _dns_endpoints(self, cluster: Cluster) -> EndpointConfig | None:
        name = cluster.name
        self._needed_dns.add(name)
        host, port = cluster.dns_hostname or "", cluster.dns_port or 0
        dns = self._dns.get(name)
        if dns is not None and (dns.host, dns.port) != (host, port):
            self._stop_dns(self._dns.pop(name))
            dns = None
        if dns is None:
            dns = self._dns[name] = _Dns(name, host, port)
            self._start_dns(dns)
        if dns.result is None:
            return None
        if isinstance(dns.result, Status):
            # C-core's words: "DNS resolution failed for HOST:PORT: <error>".
            details = dns.result.details
            if not details.startswith("DNS resolution failed"):
                details = f"DNS resolution failed for {dns.target}: {details}"
            return EndpointConfig(None, details)
        # The DNS name is the endpoint's host name (C-core's address name:
        # "host:port", used by A101 auto_host_sni).
        endpoint = EndpointAddress(addresses=dns.result, hostname=dns.target)
        cla = ClusterLoadAssignment(
            cluster_name=name,
            priorities=((Locality(LocalityName(), 1, (endpoint,)),),),
        )
        return EndpointConfig(cla)
