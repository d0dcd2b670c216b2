"""``FakeXdsClient``: the XdsClient watch API driven by the test (sans-IO).

Same surface the resolver uses: ``watch(type_url, name, watcher,
executor=None) -> cancel``; watchers get ``on_resource_changed(resource or
Status)`` and ``on_ambient_error(Status)`` (A88).  The test pushes
resources, errors and does-not-exist; the fake records which names are
watched, and, like the real client, hands a new watcher the cached value at
once.  Does-not-exist is reported as ``Status(NOT_FOUND, ...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from pyxds.lb.api import OK_STATUS, Status
from pyxds.xds.resources.types import (
    Cluster,
    ClusterLoadAssignment,
    ClusterWeight,
    EndpointAddress,
    FractionalPercent,
    HeaderMatcher,
    Listener,
    Locality,
    LocalityName,
    NonForwardingAction,
    PathMatch,
    PrefixMatch,
    RegexMatch,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)

try:  # the real constants, once pyxds.xds.resources exports them
    from pyxds.xds.resources import (
        CLUSTER_TYPE_URL,
        ENDPOINTS_TYPE_URL,
        LISTENER_TYPE_URL,
        ROUTE_CONFIG_TYPE_URL,
    )
except ImportError:  # pragma: no cover - until the resources module lands
    LISTENER_TYPE_URL = "type.googleapis.com/envoy.config.listener.v3.Listener"
    ROUTE_CONFIG_TYPE_URL = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
    CLUSTER_TYPE_URL = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    ENDPOINTS_TYPE_URL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

__all__ = [
    "FakeXdsClient",
    "LISTENER_TYPE_URL",
    "ROUTE_CONFIG_TYPE_URL",
    "CLUSTER_TYPE_URL",
    "ENDPOINTS_TYPE_URL",
    "SHORT_TYPE",
]

SHORT_TYPE = {
    LISTENER_TYPE_URL: "LDS",
    ROUTE_CONFIG_TYPE_URL: "RDS",
    CLUSTER_TYPE_URL: "CDS",
    ENDPOINTS_TYPE_URL: "EDS",
}


def _type_and_name(resource: Any) -> tuple[str, str]:
    if isinstance(resource, Listener):
        return LISTENER_TYPE_URL, resource.name
    if isinstance(resource, RouteConfiguration):
        return ROUTE_CONFIG_TYPE_URL, resource.name
    if isinstance(resource, Cluster):
        return CLUSTER_TYPE_URL, resource.name
    if isinstance(resource, ClusterLoadAssignment):
        return ENDPOINTS_TYPE_URL, resource.cluster_name
    raise TypeError(f"not an xDS resource: {resource!r}")


class FakeXdsClient:
    """A test-driven XdsClient (see module docstring)."""

    def __init__(self) -> None:
        self._watchers: dict[tuple[str, str], list[Any]] = {}
        self._cache: dict[tuple[str, str], Any] = {}
        self._ambient: dict[tuple[str, str], bool] = {}
        self.watch_log: list[tuple[str, str]] = []  # every watch started, in order
        self.cancel_log: list[tuple[str, str]] = []

    # -- the XdsClient API ---------------------------------------------------
    def watch(
        self, type_url: str, name: str, watcher: Any, executor: Any = None
    ) -> Callable[[], None]:
        key = (type_url, name)
        self._watchers.setdefault(key, []).append(watcher)
        self.watch_log.append(key)
        if key in self._cache:
            watcher.on_resource_changed(self._cache[key])
        done = False

        def cancel() -> None:
            nonlocal done
            if done:
                return
            done = True
            self.cancel_log.append(key)
            watchers = self._watchers.get(key, [])
            if watcher in watchers:
                watchers.remove(watcher)
            if not watchers:
                self._watchers.pop(key, None)
                self._cache.pop(key, None)  # A28: no cache for unwatched names

        return cancel

    # -- test controls -------------------------------------------------------
    def watched(self, type_url: str) -> set[str]:
        """Names of ``type_url`` with at least one watcher."""
        return {name for (t, name), ws in self._watchers.items() if t == type_url and ws}

    def watcher_count(self, type_url: str, name: str) -> int:
        return len(self._watchers.get((type_url, name), []))

    def push(self, *resources: Any) -> None:
        """Deliver resources (type inferred) to their watchers and cache them."""
        for resource in resources:
            key = _type_and_name(resource)
            if self._cache.get(key) == resource:
                # Identical resources propagate nowhere (grpc-go#6565), but a
                # standing ambient error is cleared (A88: OK ambient status).
                if self._ambient.pop(key, False):
                    for watcher in list(self._watchers.get(key, [])):
                        watcher.on_ambient_error(OK_STATUS)
                continue
            self._ambient.pop(key, None)
            self._cache[key] = resource
            for watcher in list(self._watchers.get(key, [])):
                watcher.on_resource_changed(resource)

    def does_not_exist(self, type_url: str, name: str) -> None:
        """The resource was deleted or the does-not-exist timer fired."""
        key = (type_url, name)
        status = Status(
            grpc.StatusCode.NOT_FOUND,
            f"{SHORT_TYPE.get(type_url, type_url)} resource {name} does not exist",
        )
        self._cache[key] = status
        for watcher in list(self._watchers.get(key, [])):
            watcher.on_resource_changed(status)

    def error(self, type_url: str, name: str, details: str) -> None:
        """A data error (A88): dropped to ``on_resource_changed(Status)`` when
        nothing valid is cached, else an ambient error."""
        key = (type_url, name)
        status = Status(grpc.StatusCode.UNAVAILABLE, details)
        cached = self._cache.get(key)
        ambient = cached is not None and not isinstance(cached, Status)
        if not ambient:
            self._cache[key] = status
        else:
            self._ambient[key] = True
        for watcher in list(self._watchers.get(key, [])):
            if ambient:
                watcher.on_ambient_error(status)
            else:
                watcher.on_resource_changed(status)


# ------------------------------------------------------------------ builders
# Small constructors for the resources tests feed the fake client.


def make_route(
    prefix: str | None = "",
    *,
    path: str | None = None,
    regex: str | None = None,
    cluster: str | None = None,
    weighted: Sequence[tuple[str, int]] | None = None,
    headers: Sequence[HeaderMatcher] = (),
    case_sensitive: bool = True,
    fraction: FractionalPercent | None = None,
    max_stream_duration: float | None = None,
    non_forwarding: bool = False,
    name: str = "",
) -> Route:
    """A route; ``path``/``regex`` override the default ``prefix``."""
    spec: Any
    if path is not None:
        spec = PathMatch(path)
    elif regex is not None:
        import re2

        spec = RegexMatch(regex, re2.compile(regex))
    else:
        spec = PrefixMatch(prefix or "")
    match = RouteMatch(spec, case_sensitive, tuple(headers), fraction)
    action: Any
    if non_forwarding:
        action = NonForwardingAction()
    elif weighted is not None:
        action = RouteAction(
            weighted_clusters=tuple(ClusterWeight(n, w) for n, w in weighted),
            max_stream_duration=max_stream_duration,
        )
    else:
        action = RouteAction(cluster=cluster, max_stream_duration=max_stream_duration)
    return Route(match, action, name)


def make_route_config(
    name: str, routes: Sequence[Route], domains: Sequence[str] = ("*",)
) -> RouteConfiguration:
    """A route configuration with one virtual host."""
    return RouteConfiguration(name, (VirtualHost(f"{name}-vh", tuple(domains), tuple(routes)),))


def make_listener(
    name: str,
    rds: str | None = None,
    inline: RouteConfiguration | None = None,
    max_stream_duration: float | None = None,
    api_listener: bool = True,
) -> Listener:
    return Listener(
        name,
        route_config_name=rds,
        route_config=inline,
        max_stream_duration=max_stream_duration,
        api_listener=api_listener,
    )


def eds_cluster(name: str, eds_service_name: str | None = None) -> Cluster:
    return Cluster(name, "EDS", eds_service_name=eds_service_name)


def dns_cluster(name: str, host: str, port: int) -> Cluster:
    return Cluster(name, "LOGICAL_DNS", dns_hostname=host, dns_port=port)


def aggregate_cluster(name: str, *children: str) -> Cluster:
    return Cluster(name, "AGGREGATE", aggregate_children=tuple(children))


def make_cla(name: str, *addresses: str, unhealthy: int = 0) -> ClusterLoadAssignment:
    """An EDS resource with one locality holding ``addresses`` (and, as the
    parser leaves it, an empty locality when every endpoint is unhealthy)."""
    if not addresses and not unhealthy:
        return ClusterLoadAssignment(name, ())
    endpoints = tuple(EndpointAddress((a,)) for a in addresses)
    locality = Locality(LocalityName("r", "z", "s"), 1, endpoints)
    return ClusterLoadAssignment(name, ((locality,),), excluded_endpoints=unhealthy)
