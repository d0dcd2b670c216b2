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

The result also lists every subchannel of the channel with its state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyxds.lb.child_handler import ChildPolicyHandler

if TYPE_CHECKING:
    from pyxds.channel.core import ChannelCore

_MAX_DEPTH = 24


def _child_of(value: Any) -> Any:
    """A child policy or handler behind a container value, or None."""
    for name in ("handler", "policy", "balancer", "lb", "child"):
        inner = getattr(value, name, None)
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
            out = dump_policy(policy.child, depth + 1)
            if policy.policy_name:
                out["policy"] = policy.policy_name
            return out
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
        for attr in ("children", "_children"):
            children = getattr(policy, attr, None)
            if isinstance(children, Mapping) and children:
                dumped = {}
                for name, value in list(children.items()):
                    child = _child_of(value)
                    entry = dump_policy(child, depth + 1) if child is not None else {}
                    cstate = getattr(value, "state", None)
                    if cstate is not None and hasattr(cstate, "name"):
                        entry.setdefault("state", cstate.name)
                    dumped[str(name)] = entry
                out["children"] = dumped
                break
        else:
            for attr in ("child", "_child", "_handler"):
                child = getattr(policy, attr, None)
                if child is not None and child is not policy and hasattr(child, "update"):
                    out["child"] = dump_policy(child, depth + 1)
                    break
        return out
    except Exception as err:  # a dump never breaks the channel
        return {"policy": type(policy).__name__, "dump_error": str(err)}


def channel_dump(core: ChannelCore) -> dict[str, Any]:
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
        "idle": core.idle,
        "resolver": resolver_dump,
        "xds": resolver_dump.get("xds_client", resolver_dump.get("xds"))
        if isinstance(resolver_dump, dict)
        else None,
        "config_selector": selector_dump,
        "lb_policy": dump_policy(core.lb),
        "subchannels": {
            sub.address: {
                "state": sub.state.name,
                "status": str(sub.status) if not sub.status.ok else "OK",
            }
            for sub in core.pool.cores()
        },
    }
