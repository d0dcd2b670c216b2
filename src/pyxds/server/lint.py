"""Resources a gRPC client accepts but that cannot serve: ``pyxds serve``'s warnings.

``pyxds serve`` refuses what a gRPC client would NACK (the client's own
validation, :func:`pyxds.server.files.validation_error`).  Some valid
configurations still leave RPCs with nowhere to go; the client ACKs them and
fails RPCs UNAVAILABLE later.  :func:`lint` finds them, sans-IO, over the
resources of the files served together (one group: the shared files, or one
node's files), by the client's rules:

* A locality whose ``load_balancing_weight`` is unset or 0 is ignored
  (gRFC A27 "ClusterLoadAssignment Proto"; C-core, grpc-go and grpc-java drop
  it before the LB policies see it).
* An endpoint whose ``health_status`` is neither UNKNOWN nor HEALTHY is not
  used (A27): a ClusterLoadAssignment whose endpoints are all UNHEALTHY,
  DRAINING, ... gives its cluster no endpoints.
* A ClusterLoadAssignment with no usable endpoint at all (no localities, or
  only empty ones) gives its cluster none either.
* An EDS cluster whose ClusterLoadAssignment no file defines has no
  endpoints.  A route to a cluster no file defines fails the RPCs it matches;
  a listener naming a RouteConfiguration no file defines fails every RPC.
  Worse, a client waits for a resource it subscribes to until its
  does-not-exist timer fires (15 s, A27; a SotW response without it is no
  proof, as it may answer an older request), and it applies no config that
  needs the resource before that (A74): a new client serves nothing for 15 s.
* An aggregate cluster none of whose children (transitively) is a defined
  leaf cluster has no leaf: its RPCs fail (A75; A74 skips missing children).
* A weighted cluster entry of weight 0 beside others is dropped by the
  client (A28, as C-core): that cluster gets no RPCs from the route.

Not warned because a client NACKs it (``pyxds serve`` already refuses it):
priorities with a gap (C-core: "priority N empty", also once the localities
without weight are dropped), weighted clusters whose weights sum to 0.
Resources a client would NACK (served with ``--no-validate``) are skipped.

Each :class:`Finding` names the resource, the field path inside its entry
(for :func:`pyxds.server.file_lines.locate_path` to find the line) and the
message; where a cluster ends up without endpoints the message ends with the
words ``pyxds inspect`` and RPC errors use ("cluster canary: no endpoints:
locality without weight ignored", :mod:`pyxds.resolver.cluster_problems`).
Findings come in file order (files as given, entries as written).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyxds._values import dataclass
from pyxds.resolver.cluster_problems import no_endpoints_words
from pyxds.server.file_lines import Lines
from pyxds.server.types import CLUSTER, CLUSTER_LOAD_ASSIGNMENT, LISTENER, ROUTE_CONFIGURATION
from pyxds.xds.resources import RESOURCE_TYPES
from pyxds.xds.resources.types import Cluster, ClusterLoadAssignment, Listener

Path = tuple[str | int, ...]
Add = Callable[[Path, str], None]

_KIND = {
    LISTENER: "Listener",
    ROUTE_CONFIGURATION: "RouteConfiguration",
    CLUSTER: "Cluster",
    CLUSTER_LOAD_ASSIGNMENT: "ClusterLoadAssignment",
}
_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
    "HttpConnectionManager"
)
_USED_HEALTH = (0, 1)  # UNKNOWN, HEALTHY
# A client waits for a resource it subscribes to until its does-not-exist
# timer (15 s, A27), and (A74) applies no config that needs it before then.
_WAIT = "clients wait 15 s for it (the does-not-exist timer)"
_UNDEFINED = f"is not defined in any file served with it: {_WAIT}"


@dataclass(frozen=True)
class Entry:
    """One resource of a file: ``resources[index]`` of ``source``, as parsed."""

    source: str
    index: int
    type_url: str
    message: Any  # the protobuf message


@dataclass(frozen=True)
class Finding:
    """One config that cannot serve; ``path`` is the field inside the entry."""

    source: str
    index: int
    kind: str
    name: str
    path: Path
    message: str

    @property
    def field(self) -> str:
        """``path`` as text: ``virtualHosts[0].routes[1].route.cluster``."""
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
        return out

    def line(self, line: int | None = None, severity: str = "warning") -> str:
        """The line ``pyxds serve`` prints: ``warning: FILE:LINE: KIND NAME: FIELD: MESSAGE``."""
        where = f"{self.source}:{line}" if line is not None else self.source
        field = f" {self.field}:" if self.path else ""
        return f"{severity}: {where}: {self.kind} {self.name}:{field} {self.message}"


def _locality(message: Any) -> str:
    loc = message.locality
    parts = [f"{k}={getattr(loc, k)}" for k in ("region", "zone", "sub_zone") if getattr(loc, k)]
    return "{" + ", ".join(parts) + "}" if parts else "(unnamed)"


@dataclass
class _Group:
    """What the files of one group define, decoded as a client decodes it."""

    clusters: dict[str, Cluster]
    loads: dict[str, ClusterLoadAssignment]
    route_configs: set[str]
    defined_clusters: set[str]
    #: EDS resource name -> the clusters that read it
    eds_users: dict[str, list[str]]


def _decoded(entry: Entry) -> Any:
    kind = RESOURCE_TYPES.get(entry.type_url)
    if kind is None:
        return None
    result = kind.decode(entry.message.SerializeToString(), use_memo=False)
    return result.resource if result.error is None else None


def lint(entries: Sequence[Entry]) -> list[Finding]:
    """Every config among ``entries`` (one group of files) that cannot serve, in order."""
    decoded = [(entry, _decoded(entry)) for entry in entries]
    group = _Group({}, {}, set(), set(), {})
    names: dict[str, set[str]] = {t: set() for t in _KIND}
    for entry, value in decoded:
        names[entry.type_url].add(_name(entry))
        if isinstance(value, Cluster):
            group.clusters[value.name] = value
            if value.kind == "EDS":
                group.eds_users.setdefault(value.eds_resource_name, []).append(value.name)
        elif isinstance(value, ClusterLoadAssignment):
            group.loads[value.cluster_name] = value
    group.route_configs = names[ROUTE_CONFIGURATION]
    group.defined_clusters = defined_clusters = names[CLUSTER]
    out: list[Finding] = []
    for entry, value in decoded:
        if value is None:
            continue  # a client NACKs it: served only with --no-validate
        add = _adder(out, entry)

        if isinstance(value, ClusterLoadAssignment):
            _lint_load(entry.message, value, group, add)
        elif isinstance(value, Cluster):
            _lint_cluster(value, group, names, add)
        elif isinstance(value, Listener):
            _lint_listener(entry.message, value, group, add)
        else:
            _lint_routes(entry.message, (), defined_clusters, add)
    return out


def report(
    entries: Sequence[Entry], texts: Mapping[str, str], severity: str = "warning"
) -> list[str]:
    """:func:`lint`'s findings as the lines ``pyxds serve`` prints, in file
    order (files as in ``entries``, then by line); ``texts`` maps each source
    to its text, to find the lines."""
    findings = lint(entries)
    if not findings:
        return []
    rank = {source: i for i, source in enumerate(dict.fromkeys(e.source for e in entries))}
    lines: dict[str, Lines] = {}
    placed = []
    for finding in findings:
        text = texts.get(finding.source)
        if text is not None and finding.source not in lines:
            lines[finding.source] = Lines(text)
        where = lines[finding.source].of(finding.index, finding.path) if text is not None else None
        placed.append((rank[finding.source], where or 0, finding.line(where, severity)))
    return [line for _, _, line in sorted(placed, key=lambda p: (p[0], p[1]))]


def _adder(out: list[Finding], entry: Entry) -> Add:
    kind, name = _KIND[entry.type_url], _name(entry)

    def add(path: Path, message: str) -> None:
        out.append(Finding(entry.source, entry.index, kind, name, path, message))

    return add


def _name(entry: Entry) -> str:
    attr = "cluster_name" if entry.type_url == CLUSTER_LOAD_ASSIGNMENT else "name"
    return str(getattr(entry.message, attr, ""))


def _consequence(cla: ClusterLoadAssignment, group: _Group) -> str:
    users = group.eds_users.get(cla.cluster_name) or []
    if not users:
        return f"EDS resource {cla.cluster_name}: no endpoints: {cla.no_endpoints_reason}"
    return "; ".join(no_endpoints_words(cluster, cla) for cluster in users)


def _lint_load(message: Any, cla: ClusterLoadAssignment, group: _Group, add: Add) -> None:
    empty = cla.endpoint_count == 0
    for i, lep in enumerate(message.endpoints):
        if lep.load_balancing_weight.value:
            continue
        how = (
            "loadBalancingWeight 0"
            if lep.HasField("load_balancing_weight")
            else "no loadBalancingWeight"
        )
        n = len(lep.lb_endpoints)
        lost = f"its {n} endpoint{'s' if n != 1 else ''} get{'s' if n == 1 else ''} no RPCs"
        then = _consequence(cla, group) if empty else lost
        add(
            ("endpoints", i, "loadBalancingWeight"),
            f"locality {_locality(lep)} has {how}: gRPC ignores the locality (A27); {then}",
        )
    if not empty:
        return
    if cla.excluded_endpoints:
        statuses = sorted(
            {
                _health_name(e.health_status)
                for lep in message.endpoints
                if lep.load_balancing_weight.value
                for e in lep.lb_endpoints
                if e.health_status not in _USED_HEALTH
            }
        )
        which = (
            "every endpoint of a weighted locality" if cla.ignored_localities else "every endpoint"
        )
        add(
            ("endpoints",),
            f"{which} is {'/'.join(statuses)}: gRPC uses only UNKNOWN and HEALTHY "
            f"endpoints (A27); {_consequence(cla, group)}",
        )
    elif not cla.ignored_localities:
        add(("endpoints",), f"lists no endpoint; {_consequence(cla, group)}")


def _health_name(value: int) -> str:
    from envoy.config.core.v3 import health_check_pb2

    try:
        return str(health_check_pb2.HealthStatus.Name(value))
    except ValueError:
        return str(value)


def _lint_cluster(cluster: Cluster, group: _Group, names: dict[str, set[str]], add: Add) -> None:
    if cluster.kind == "EDS" and cluster.eds_resource_name not in names[CLUSTER_LOAD_ASSIGNMENT]:
        eds = cluster.eds_resource_name
        add(
            ("edsClusterConfig",),
            f"ClusterLoadAssignment {eds} {_UNDEFINED}, then cluster {cluster.name}: "
            f"no endpoints: EDS resource {eds} does not exist",
        )
    elif cluster.kind == "AGGREGATE" and not _has_leaf(cluster.name, group, set()):
        children = ", ".join(cluster.aggregate_children)
        missing = any(c not in group.clusters for c in cluster.aggregate_children)
        wait = "clients wait 15 s for the missing ones (the does-not-exist timer), then "
        wait = wait if missing else ""
        add(
            ("clusterType", "typedConfig", "clusters"),
            f"none of its clusters ({children}) leads to a leaf cluster defined in any file "
            f"served with it: {wait}its RPCs fail (no leaf cluster, A74, A75)",
        )


def _has_leaf(name: str, group: _Group, seen: set[str]) -> bool:
    """True when the aggregate ``name`` reaches a defined leaf (EDS/LOGICAL_DNS) cluster."""
    if name in seen:
        return False
    seen.add(name)
    for child in group.clusters[name].aggregate_children:
        value = group.clusters.get(child)
        if value is None:
            continue
        if value.kind != "AGGREGATE" or _has_leaf(child, group, seen):
            return True
    return False


def _lint_listener(message: Any, listener: Listener, group: _Group, add: Add) -> None:
    if not listener.api_listener:
        return
    hcm = _unpack_hcm(message)
    base: Path = ("apiListener", "apiListener")
    if listener.route_config_name is not None:
        if listener.route_config_name not in group.route_configs:
            add(
                (*base, "rds", "routeConfigName"),
                f"RouteConfiguration {listener.route_config_name} {_UNDEFINED}, "
                "then every RPC to this listener fails",
            )
    elif hcm is not None:
        _lint_routes(hcm.route_config, (*base, "routeConfig"), group.defined_clusters, add)


def _unpack_hcm(listener: Any) -> Any:
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    api = listener.api_listener.api_listener
    if api.type_url != _HCM:
        return None
    hcm = hcm_pb2.HttpConnectionManager()
    return hcm if api.Unpack(hcm) else None


def _lint_routes(route_config: Any, base: Path, defined: set[str], add: Add) -> None:
    for v, vhost in enumerate(route_config.virtual_hosts):
        for r, route in enumerate(vhost.routes):
            if not route.HasField("route"):
                continue
            at: Path = (*base, "virtualHosts", v, "routes", r, "route")
            action = route.route
            which = action.WhichOneof("cluster_specifier")
            if which == "cluster" and action.cluster not in defined:
                add(
                    (*at, "cluster"),
                    f"cluster {action.cluster} {_UNDEFINED}, then the RPCs this route matches fail",
                )
            elif which == "weighted_clusters":
                _lint_weighted(action.weighted_clusters, (*at, "weightedClusters"), defined, add)


def _lint_weighted(weighted: Any, at: Path, defined: set[str], add: Add) -> None:
    entries = list(weighted.clusters)
    if not any(c.weight.value for c in entries):
        return  # weights summing to 0: NACKed
    for k, c in enumerate(entries):
        if not c.weight.value:
            add(
                (*at, "clusters", k, "weight"),
                f"weight 0: gRPC drops the entry (A28), cluster {c.name} gets no RPCs "
                "from this route",
            )
        elif c.name not in defined:
            add(
                (*at, "clusters", k, "name"),
                f"cluster {c.name} {_UNDEFINED}, then the RPCs this route sends it fail",
            )
