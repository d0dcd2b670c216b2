"""The resolved tree ``pyxds inspect`` shows, built from ``channel.config_dump()``.

:func:`build` turns a dump (the channel's state, its XdsClient's CSDS dump
with the raw resources, the subchannels' states) into plain data: the
listener, the route table of its virtual hosts, and every cluster with its
type, LB policy, priorities, localities (weights) and endpoints (EDS health,
the subchannel's connectivity state, and for weighted_round_robin the
endpoint's weight and its source, or why it has none); plus NACK reasons
and fields gRPC does not read. It shows what the client really uses: a
locality without ``load_balancing_weight`` is marked ``ignored`` (A27) and
its endpoints and those whose health is neither UNKNOWN nor HEALTHY are
``not used`` with the reason (a DRAINING one keeps the sessions pinned to it,
A55: its subchannel's state is shown when it has one); the clusters that
cannot serve (``config_dump()["cannot_serve"]``) are named on the state line
and under each cluster. No I/O: the view renders it, tests read it.
"""

from __future__ import annotations

from typing import Any

from pyxds.cli.ignored import unread_fields

_SHORT = {
    "envoy.config.listener.v3.Listener": "Listener",
    "envoy.config.route.v3.RouteConfiguration": "RouteConfiguration",
    "envoy.config.cluster.v3.Cluster": "Cluster",
    "envoy.config.endpoint.v3.ClusterLoadAssignment": "ClusterLoadAssignment",
}


def short_type(type_url: str) -> str:
    return _SHORT.get(type_url.rsplit("/", 1)[-1], type_url.rsplit(".", 1)[-1])


def resources(dump: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(short type, name) -> CSDS GenericXdsConfig dict`` of the channel's XdsClient."""
    client = dump.get("xds_client") or {}
    return {
        (short_type(e.get("type_url", "")), e.get("name", "")): e
        for e in client.get("generic_xds_configs", [])
    }


def _status(entry: dict[str, Any] | None) -> dict[str, Any]:
    if entry is None:
        return {"status": "NOT_REQUESTED", "version": ""}
    out = {"status": entry.get("client_status", ""), "version": entry.get("version_info", "")}
    if rejected(entry):
        out["nack"] = entry["error_state"].get("details", "")
    return out


def rejected(entry: dict[str, Any]) -> bool:
    """Whether the entry's ``error_state`` is a rejection (a NACK, an error
    from the server, a server's reason not to serve), not A88's note on a
    DOES_NOT_EXIST or TIMEOUT entry."""
    return "error_state" in entry and entry.get("client_status") not in (
        "DOES_NOT_EXIST",
        "TIMEOUT",
    )


def _match(match: dict[str, Any]) -> str:
    if "path" in match:
        text = f"path {match['path']}"
    elif "safe_regex" in match:
        text = f"regex {match['safe_regex'].get('regex', '')}"
    elif "path_separated_prefix" in match:
        text = f"prefix {match['path_separated_prefix']}/"
    else:
        text = f'prefix "{match.get("prefix", "")}"'
    for header in match.get("headers") or []:
        text += f" header {header.get('name', '')}"
    if match.get("case_sensitive") is False:
        text += " (ignore case)"
    return text


def _action(route: dict[str, Any]) -> str:
    action = route.get("route")
    if action is None:
        return "non-forwarding" if "non_forwarding_action" in route else "no action"
    text = _destination(action)
    if action.get("auto_host_rewrite") is True:
        # A81: heeded from a server with the trusted_xds_server feature only
        text += ", auto_host_rewrite"
    return text


def _destination(action: dict[str, Any]) -> str:
    if "cluster" in action:
        return f"cluster {action['cluster']}"
    if "weighted_clusters" in action:
        parts = action["weighted_clusters"].get("clusters") or []
        total = sum(int(p.get("weight", 0)) for p in parts) or 1
        return "split " + ", ".join(
            f"{p.get('name')} {100 * int(p.get('weight', 0)) / total:.0f}%" for p in parts
        )
    if "cluster_specifier_plugin" in action:
        return f"plugin {action['cluster_specifier_plugin']}"
    if "cluster_header" in action:
        return f"cluster from header {action['cluster_header']}"
    return "no cluster"


def _locality(locality: dict[str, Any]) -> str:
    parts = [f"{k}={locality[k]}" for k in ("region", "zone", "sub_zone") if locality.get(k)]
    return ", ".join(parts) or "(no locality)"


def _address(endpoint: dict[str, Any]) -> str:
    socket = ((endpoint.get("endpoint") or {}).get("address") or {}).get("socket_address") or {}
    host = socket.get("address", "?")
    port = socket.get("port_value", 0)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _lb_policy(cluster: dict[str, Any]) -> str:
    policies = (cluster.get("load_balancing_policy") or {}).get("policies") or []
    for policy in policies:
        config = policy.get("typed_extension_config") or {}
        type_url = (config.get("typed_config") or {}).get("@type", "")
        if type_url.endswith("TypedStruct"):
            type_url = (config.get("typed_config") or {}).get("type_url", type_url)
        return type_url.rsplit(".", 1)[-1] or str(config.get("name", "?"))
    return str(cluster.get("lb_policy", "ROUND_ROBIN"))


def _cluster_type(cluster: dict[str, Any]) -> str:
    if "cluster_type" in cluster:
        return "AGGREGATE"
    return str(cluster.get("type", "STATIC"))


def wrr_weights(lb_policy: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """``(cluster, address) -> {"weight", "source", "no_weight"?}`` from the
    weighted_round_robin policies of a channel's LB tree dump (A58: each
    endpoint's weight and where it comes from, or why it has none)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            rows = value.get("endpoint_weights")
            if isinstance(rows, list):
                cluster = str(value.get("cluster", ""))
                for row in rows:
                    for address in row.get("addresses") or []:
                        found[(cluster, address)] = {
                            k: row[k] for k in ("weight", "source", "no_weight") if k in row
                        }
            for inner in value.values():
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(lb_policy)
    return found


_USED_HEALTH = ("UNKNOWN", "HEALTHY")
IGNORED_LOCALITY = "no load_balancing_weight: gRPC ignores the locality (A27)"
DRAINING_WHY = "health DRAINING: no new traffic (stateful sessions may stay, A55)"


def _endpoint(
    e: dict[str, Any],
    states: dict[str, str],
    ignored: bool,
    wrr: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One lb_endpoint as the client uses it: ``state`` is the subchannel's,
    or ``not used`` (with ``why``) when the client never connects to it."""
    health = e.get("health_status", "UNKNOWN")
    address = _address(e)
    out: dict[str, Any] = {
        "address": address,
        "health": health,
        "weight": e.get("load_balancing_weight"),
        "state": states.get(address, "IDLE"),
    }
    if ignored:
        out.update(state="not used", why="its locality is ignored")
    elif health == "DRAINING":
        out.update(state=states.get(address, "not used"), why=DRAINING_WHY)
    elif health not in _USED_HEALTH:
        out.update(state="not used", why=f"health {health} (only UNKNOWN and HEALTHY are used)")
    if wrr is not None:
        out["wrr"] = wrr
    return out


def _priorities(
    cla: dict[str, Any],
    states: dict[str, str],
    weights: dict[tuple[str, str], dict[str, Any]] | None = None,
    cluster: str = "",
) -> list[dict[str, Any]]:
    groups: dict[int, list[dict[str, Any]]] = {}
    for group in cla.get("endpoints") or []:
        weight = group.get("load_balancing_weight")
        ignored = not weight  # unset or 0: dropped by the client (A27)
        locality: dict[str, Any] = {
            "locality": _locality(group.get("locality") or {}),
            "weight": weight,
            "endpoints": [
                _endpoint(e, states, ignored, (weights or {}).get((cluster, _address(e))))
                for e in group.get("lb_endpoints") or []
            ],
        }
        if ignored:
            locality["ignored"] = IGNORED_LOCALITY
        groups.setdefault(int(group.get("priority", 0)), []).append(locality)
    return [{"priority": p, "localities": groups[p]} for p in sorted(groups)]


def _cluster(
    name: str,
    found: dict[tuple[str, str], dict[str, Any]],
    dump: dict[str, Any],
    states: dict[str, str],
) -> dict[str, Any]:
    entry = found.get(("Cluster", name))
    out: dict[str, Any] = {"name": name, **_status(entry)}
    prefix = f"cluster {name}: "
    problems = [p[len(prefix) :] for p in dump.get("cannot_serve") or () if p.startswith(prefix)]
    if problems:
        out["cannot_serve"] = problems[0]
    raw = (entry or {}).get("xds_config")
    if not raw:
        return out
    out["type"] = _cluster_type(raw)
    out["lb_policy"] = _lb_policy(raw)
    if out["type"] == "AGGREGATE":
        typed = (raw.get("cluster_type") or {}).get("typed_config") or {}
        out["children"] = list(typed.get("clusters") or [])
    elif out["type"] == "EDS":
        eds_name = (raw.get("eds_cluster_config") or {}).get("service_name") or name
        cla_entry = found.get(("ClusterLoadAssignment", eds_name))
        out["eds"] = {"name": eds_name, **_status(cla_entry)}
        cla = (cla_entry or {}).get("xds_config") or {}
        out["priorities"] = _priorities(cla, states, wrr_weights(dump.get("lb_policy")), name)
        drops = (cla.get("policy") or {}).get("drop_overloads") or []
        if drops:
            out["drops"] = [d.get("category", "") for d in drops]
    elif out["type"] == "LOGICAL_DNS":
        dns = ((dump.get("resolver") or {}).get("dependency_manager") or {}).get("dns") or {}
        addresses = dns.get(name) or []
        out["priorities"] = [
            {
                "priority": 0,
                "localities": [
                    {
                        "locality": "(DNS)",
                        "weight": None,
                        "endpoints": [
                            {
                                "address": a,
                                "health": "UNKNOWN",
                                "weight": None,
                                "state": states.get(a, "IDLE"),
                            }
                            for a in addresses
                        ],
                    }
                ],
            }
        ]
    return out


def build(dump: dict[str, Any]) -> dict[str, Any]:
    """The inspect model of one channel dump (see module doc)."""
    found = resources(dump)
    states = {a: s.get("state", "") for a, s in (dump.get("subchannels") or {}).items()}
    manager = (dump.get("resolver") or {}).get("dependency_manager") or {}
    listener_name = manager.get("listener") or ""
    model: dict[str, Any] = {
        "target": dump.get("target"),
        "state": dump.get("state"),
        "status": dump.get("status"),
        "cannot_serve": list(dump.get("cannot_serve") or ()),
    }
    lds = found.get(("Listener", listener_name))
    listener: dict[str, Any] = {"name": listener_name, **_status(lds)}
    hcm = (((lds or {}).get("xds_config") or {}).get("api_listener") or {}).get("api_listener")
    route_config = None
    if hcm:
        if "rds" in hcm:
            listener["rds"] = hcm["rds"].get("route_config_name", "")
            rds = found.get(("RouteConfiguration", listener["rds"]))
            route_config = {"name": listener["rds"], **_status(rds)}
            raw_rc = (rds or {}).get("xds_config")
        else:
            route_config = {"name": "(inline)", "status": listener["status"], "version": ""}
            raw_rc = hcm.get("route_config")
        if raw_rc:
            route_config["virtual_hosts"] = [
                {
                    "name": v.get("name", ""),
                    "domains": list(v.get("domains") or []),
                    "routes": [
                        {"match": _match(r.get("match") or {}), "action": _action(r)}
                        for r in v.get("routes") or []
                    ],
                }
                for v in raw_rc.get("virtual_hosts") or []
            ]
        filters = [f.get("name", "") for f in hcm.get("http_filters") or []]
        listener["http_filters"] = filters
    model["listener"] = listener
    model["route_config"] = route_config
    cluster_names = [name for (kind, name) in found if kind == "Cluster"]
    model["clusters"] = [_cluster(n, found, dump, states) for n in sorted(cluster_names)]
    model["nacks"] = [
        {"type": kind, "name": name, "details": e["error_state"].get("details", "")}
        for (kind, name), e in sorted(found.items())
        if rejected(e)
    ]
    model["ignored_fields"] = [
        {"type": kind, "name": name, "fields": fields}
        for (kind, name), e in sorted(found.items())
        if (fields := unread_fields(kind, e.get("xds_config") or {}))
    ]
    return model
