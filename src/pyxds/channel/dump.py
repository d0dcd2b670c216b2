"""``channel.config_dump()``: the CSDS-style view of one channel.

The xDS part (resources, versions, ACK/NACK states, errors) comes from the
resolver's ``config_dump()`` (the xds resolver includes its XdsClient's
dump).  The channel part walks the LB policy tree:

* every policy may define ``config_dump(self) -> dict`` (optional hook: a
  policy reports what matters about itself, e.g. priority's current
  priority, the cluster_manager's children); a policy reports its children
  by calling :func:`dump_policy` on each child's ``ChildPolicyHandler``;
* without the hook, the walk looks for the usual places children live
  (``children``/``_children`` mappings, ``child`` attributes) and for
  subchannels, defensively (``getattr``, never raising).

The result also lists every subchannel of the channel with its state,
(``load_reports``) the last load report the XdsClient sent per cluster (A27)
and (``cannot_serve``) each cluster of the config in use that cannot serve
and why ("cluster canary: no endpoints: locality without weight ignored",
the words the RPC errors use: :mod:`pyxds.resolver.cluster_problems`).
A subchannel of a TLS cluster (A29) is listed as ``"address (tls)"`` with a
``security`` entry: the SANs of the last verified peer, the last error.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Set
from typing import TYPE_CHECKING, Any

from pyxds.channel.subchannel import core_of
from pyxds.lb.child_handler import ChildPolicyHandler
from pyxds.resolver.cluster_problems import cluster_problems

if TYPE_CHECKING:
    from pyxds.channel.core import ChannelCore

_MAX_DEPTH = 24


def _own(value: Any, name: str) -> Any:
    """``value.name`` without ``__getattr__`` fallbacks: a DelegatingHelper
    forwards unknown attributes to its parent helper, which would lead the
    walk back up the tree."""
    try:
        return object.__getattribute__(value, name)
    except AttributeError:
        return None


def _child_of(value: Any) -> Any:
    """A child policy or handler behind a container value, or None."""
    for name in ("handler", "policy", "balancer", "lb", "child"):
        inner = _own(value, name)
        if inner is not None and hasattr(inner, "update") and hasattr(inner, "shutdown"):
            return inner
    if hasattr(value, "update") and hasattr(value, "shutdown"):
        return value
    return None


def dump_policy(policy: Any, depth: int = 0) -> dict[str, Any]:
    """Dump one policy (or a ChildPolicyHandler around it) and its subtree."""
    if policy is None:
        return {}
    if depth > _MAX_DEPTH:
        return {"truncated": True}
    try:
        if isinstance(policy, ChildPolicyHandler):
            child_out = dump_policy(policy.child, depth + 1)
            if policy.policy_name:
                child_out["policy"] = policy.policy_name
            return child_out
        out: dict[str, Any] = {"policy": getattr(policy, "name", None) or type(policy).__name__}
        state = getattr(policy, "state", None) or getattr(policy, "_state", None)
        if state is not None and hasattr(state, "name"):
            out["state"] = state.name
        hook = getattr(policy, "config_dump", None)
        if callable(hook):
            extra = hook()
            if isinstance(extra, Mapping):
                out.update(extra)
                if "children" in extra:
                    return out
        _add_priority(policy, out)
        _add_subchannels(policy, out)
        for attr in ("children", "_children"):
            children = _own(policy, attr)
            if isinstance(children, Mapping) and children:
                dumped = {}
                for name, value in list(children.items()):
                    child = _child_of(value)
                    entry = dump_policy(child, depth + 1) if child is not None else {}
                    cstate = _own(value, "state")
                    if cstate is not None and hasattr(cstate, "name"):
                        entry.setdefault("state", cstate.name)
                    dumped[_child_name(name)] = entry
                out["children"] = dumped
                break
        else:
            for attr in ("child", "_child", "_handler"):
                child = _own(policy, attr)
                if child is not None and child is not policy and hasattr(child, "update"):
                    out["child"] = dump_policy(child, depth + 1)
                    break
        return out
    except Exception as err:  # a dump never breaks the channel
        return {"policy": type(policy).__name__, "dump_error": str(err)}


def _add_priority(policy: Any, out: dict[str, Any]) -> None:
    """priority: the child currently chosen (A56), when the policy shows it."""
    if "current_priority" in out:
        return
    index = getattr(policy, "_current_index", None)
    config = getattr(policy, "_config", None)
    priorities = getattr(config, "priorities", None)
    if isinstance(index, int) and priorities is not None:
        out["priorities"] = list(priorities)
        out["current_priority"] = priorities[index] if 0 <= index < len(priorities) else None


def _add_subchannels(policy: Any, out: dict[str, Any]) -> None:
    """Leaf policies: each subchannel with its state."""
    subchannels = getattr(policy, "subchannels", None)
    if callable(subchannels):
        subchannels = subchannels()
    if not isinstance(subchannels, list | tuple) or not subchannels:
        return
    listed = []
    for sub in subchannels:
        core = core_of(sub)
        state = core.state if core is not None else getattr(sub, "state", None)
        listed.append(
            {
                "address": getattr(sub, "address", "?"),
                "state": getattr(state, "name", str(state)),
            }
        )
    out["subchannels"] = listed


def _child_name(name: Any) -> str:
    """A child's key as text: an endpoint child keyed by its address set
    (round_robin, ring_hash) reads ``127.0.0.1:443``, several joined by ", "."""
    if isinstance(name, Set | tuple | list):
        return ", ".join(sorted(str(part) for part in name))
    return str(name)


def xds_client_dump(resolver: Any) -> Any:
    """The CSDS ClientConfig of the resolver's XdsClient (outside any serializer)."""
    client = getattr(resolver, "xds_client", None) or getattr(resolver, "_client", None)
    dump = getattr(client, "dump", None)
    if not callable(dump):
        return None
    try:
        return dump()
    except Exception as err:
        return {"dump_error": str(err)}


def load_reports_dump(resolver: Any) -> Any:
    """The last load report sent per cluster by the resolver's XdsClient
    (A27 LRS), as ``ClusterStats``-shaped dicts; None without an XdsClient."""
    client = getattr(resolver, "xds_client", None) or getattr(resolver, "_client", None)
    reports = getattr(client, "load_reports", None)
    if not callable(reports):
        return None
    try:
        return [r.to_json() for r in reports()]
    except Exception as err:
        return {"dump_error": str(err)}


def _route_action(route: Any) -> Any:
    action = getattr(route, "action", None)
    cluster = getattr(action, "cluster", None)
    if cluster:
        return {"cluster": cluster}
    weighted = getattr(action, "weighted_clusters", None)
    if weighted:
        return {
            "weighted_clusters": {
                getattr(w, "name", str(w)): getattr(w, "weight", None) for w in weighted
            }
        }
    plugin = getattr(action, "cluster_specifier_plugin", None)
    if plugin:
        return {"cluster_specifier_plugin": plugin}
    return {"non_forwarding": True}


def xds_config_dump(core: ChannelCore) -> Any:
    """The XdsConfig in use (A74): listener, route config, the chosen
    virtual host with its routes, and each cluster's kind or error."""
    result = core.last_result
    if result is None:
        return None
    config = result.attributes.get("xds_config") if result.attributes else None
    if config is None:
        return None
    try:
        vhost = config.virtual_host
        clusters: dict[str, Any] = {}
        for name, value in config.clusters.items():
            if hasattr(value, "code"):
                clusters[name] = {"error": str(value)}
            else:
                children = getattr(value, "children", None)
                clusters[name] = {"kind": type(children).__name__}
                clusters[name].update(_endpoints_dump(children))
        return {
            "listener": getattr(config.listener, "name", None),
            "route_config": getattr(config.route_config, "name", None),
            "virtual_host": {
                "name": vhost.name,
                "domains": list(vhost.domains),
                "routes": [
                    {"match": repr(getattr(r, "match", None)), **_route_action(r)}
                    for r in vhost.routes
                ],
            },
            "clusters": clusters,
        }
    except Exception as err:
        return {"dump_error": str(err)}


def _endpoints_dump(children: Any) -> dict[str, Any]:
    """A leaf cluster's usable endpoint count and the localities the client
    ignores (no load_balancing_weight, A27), as the client sees them."""
    cla = getattr(children, "endpoints", None)
    if cla is None or not hasattr(cla, "endpoint_count"):
        return {}
    out: dict[str, Any] = {"endpoints": cla.endpoint_count}
    if cla.ignored_localities:
        out["ignored_localities"] = [
            {
                "region": name.region,
                "zone": name.zone,
                "sub_zone": name.sub_zone,
                "why": "no load_balancing_weight (A27)",
            }
            for name in cla.ignored_localities
        ]
    return out


def cannot_serve_dump(core: ChannelCore) -> list[str]:
    """The clusters of the config in use that cannot serve, and why
    (:func:`pyxds.resolver.cluster_problems.cluster_problems`)."""
    result = core.last_result
    config = (
        result.attributes.get("xds_config") if result is not None and result.attributes else None
    )
    if config is None:
        return []
    try:
        return cluster_problems(config)
    except Exception as err:  # a dump never breaks the channel
        return [f"dump_error: {err}"]


def channel_dump(core: ChannelCore, xds: Any = None) -> dict[str, Any]:
    resolver = core.resolver
    try:
        resolver_dump = resolver.config_dump() if resolver is not None else {}
    except Exception as err:
        resolver_dump = {"dump_error": str(err)}
    selector = core.selector
    selector_dump: Any = None
    hook = getattr(selector, "config_dump", None)
    if callable(hook):
        try:
            selector_dump = hook()
        except Exception as err:
            selector_dump = {"dump_error": str(err)}
    return {
        "target": core.target,
        "state": core.state.name,
        "status": str(core.status) if not core.status.ok else "OK",
        "cannot_serve": cannot_serve_dump(core),
        "idle": core.idle,
        "resolver": resolver_dump,
        "xds_client": xds,
        "xds_config": xds_config_dump(core),
        "load_reports": load_reports_dump(resolver),
        "config_selector": selector_dump,
        "lb_policy": dump_policy(core.lb),
        "subchannels": {_subchannel_name(sub): _subchannel_dump(sub) for sub in core.pool.cores()},
    }


def _subchannel_name(sub: Any) -> str:
    return f"{sub.address} (tls)" if getattr(sub, "security_info", None) else sub.address


def _subchannel_dump(sub: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "state": sub.state.name,
        "status": str(sub.status) if not sub.status.ok else "OK",
    }
    info = getattr(sub, "security_info", None)
    if info is not None:
        try:
            out["security"] = info()
        except Exception as err:  # a dump never breaks the channel
            out["security"] = {"dump_error": str(err)}
    return out


def config_dump(core: ChannelCore) -> dict[str, Any]:
    """``channel.config_dump()``: taken on the channel's serializer, so the LB
    tree is seen between two updates (without it after 5 s if the serializer
    is stuck)."""
    xds = xds_client_dump(core.resolver)
    if core.serializer.in_serializer:
        return channel_dump(core, xds)
    box: list[dict[str, Any]] = []
    done = threading.Event()

    def go() -> None:
        try:
            box.append(channel_dump(core, xds))
        finally:
            done.set()

    core.serializer.run(go)
    if not done.wait(5.0):
        return channel_dump(core, xds)
    return box[0]
