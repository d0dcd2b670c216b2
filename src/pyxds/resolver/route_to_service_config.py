"""RouteConfiguration -> ``xds_routing_experimental`` service config (gRFC
A28 "Service config generating", "Action list", "Route list", Appendix).

This is A28's original design (before A31 moved routing into the
ConfigSelector); pyxds keeps it for static service configs and for tools.

Theory of operation
-------------------

Each forwarding route becomes ``{path|prefix|regex, headers, match_fraction,
action}``; routes whose action is not a cluster or weighted clusters are
ignored (A28).  Actions are deduplicated: two actions are the same when they
name the same clusters with the same weights.  :class:`ActionNameCache`
remembers the name of every action of the previous conversion:

1. actions seen before keep their names;
2. a new weighted action takes the name of a removed weighted action with
   the same *set* of clusters (a weight-only change, e.g. a canary
   rollout), so the xds_routing child is updated instead of recreated;
3. otherwise it gets a new name: ``cds:CLUSTER`` or
   ``weighted:C1_C2_N`` (clusters sorted, ``N`` counting from 1 per set).

Header matchers use A28's JSON names (``exact_match``, ``regex_match``,
``range_match {start, end}``, ``present_match``, ``prefix_match``,
``suffix_match``, ``invert_match``); pyxds adds ``contains_match``,
``ignore_case`` and ``case_sensitive`` (emitted only when used) so no xDS
matcher is lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyxds.xds.resources.types import (
    HeaderMatcher,
    PathMatch,
    PrefixMatch,
    RegexMatch,
    Route,
    RouteAction,
    RouteMatch,
)

__all__ = [
    "ActionKey",
    "ActionNameCache",
    "RouteConfigConverter",
    "action_key",
    "action_json",
    "route_match_json",
    "header_matcher_json",
]

ROUTING_POLICY = "xds_routing_experimental"
CDS_POLICY = "cds_experimental"
WEIGHTED_TARGET_POLICY = "weighted_target_experimental"

# ("cds", (cluster,)) or ("weighted", ((cluster, weight), ...)) with clusters sorted.
ActionKey = tuple[str, tuple[Any, ...]]


def action_key(action: RouteAction) -> ActionKey | None:
    """The identity of a route action (None: not routable, route ignored)."""
    if action.cluster is not None:
        return ("cds", (action.cluster,))
    if action.weighted_clusters:
        return ("weighted", tuple(sorted((cw.name, cw.weight) for cw in action.weighted_clusters)))
    return None


def _cluster_set(key: ActionKey) -> tuple[str, ...]:
    if key[0] == "cds":
        return key[1]
    return tuple(name for name, _ in key[1])


def _cds(cluster: str) -> list[dict[str, Any]]:
    return [{CDS_POLICY: {"cluster": cluster}}]


def action_json(key: ActionKey) -> dict[str, Any]:
    """``{"childPolicy": [...]}`` for an action (A28 "Action list")."""
    if key[0] == "cds":
        return {"childPolicy": _cds(key[1][0])}
    targets = {name: {"weight": weight, "childPolicy": _cds(name)} for name, weight in key[1]}
    return {"childPolicy": [{WEIGHTED_TARGET_POLICY: {"targets": targets}}]}


class ActionNameCache:
    """Names actions across conversions, reusing names for weight-only
    changes (module docstring)."""

    def __init__(self) -> None:
        self._names: dict[ActionKey, str] = {}
        self._counters: dict[tuple[str, ...], int] = {}

    @property
    def names(self) -> dict[ActionKey, str]:
        return dict(self._names)

    def _new_name(self, key: ActionKey, used: set[str]) -> str:
        if key[0] == "cds":
            name = f"cds:{key[1][0]}"
            if name not in used:
                return name
        clusters = _cluster_set(key)
        while True:
            count = self._counters.get(clusters, 0) + 1
            self._counters[clusters] = count
            name = f"weighted:{'_'.join(clusters)}_{count}"
            if name not in used:
                return name

    def assign(self, keys: Iterable[ActionKey]) -> dict[ActionKey, str]:
        """Names for this conversion's actions (in first-use order)."""
        ordered = list(dict.fromkeys(keys))
        wanted = set(ordered)
        old = self._names
        result = {k: old[k] for k in ordered if k in old}
        removed = [k for k in old if k not in wanted]
        used = set(result.values())
        for key in ordered:
            if key in result:
                continue
            reuse = None
            if key[0] == "weighted":
                clusters = _cluster_set(key)
                for candidate in removed:
                    if candidate[0] == "weighted" and _cluster_set(candidate) == clusters:
                        reuse = candidate
                        break
            if reuse is not None:
                removed.remove(reuse)
                name = old[reuse]
            else:
                name = self._new_name(key, used | {old[k] for k in removed})
            result[key] = name
            used.add(name)
        self._names = result
        return dict(result)


def header_matcher_json(matcher: HeaderMatcher) -> dict[str, Any]:
    out: dict[str, Any] = {"name": matcher.name}
    kind = matcher.kind
    if kind == "exact":
        out["exact_match"] = matcher.value
    elif kind == "safe_regex":
        out["regex_match"] = matcher.value
    elif kind == "range":
        out["range_match"] = {"start": matcher.range_start, "end": matcher.range_end}
    elif kind == "present":
        out["present_match"] = matcher.present_match
    elif kind == "prefix":
        out["prefix_match"] = matcher.value
    elif kind == "suffix":
        out["suffix_match"] = matcher.value
    elif kind == "contains":
        out["contains_match"] = matcher.value
    if matcher.ignore_case:
        out["ignore_case"] = True
    if matcher.invert_match:
        out["invert_match"] = True
    return out


def route_match_json(match: RouteMatch) -> dict[str, Any]:
    """The matcher part of an A28 route entry."""
    spec = match.path_specifier
    out: dict[str, Any] = {}
    if isinstance(spec, PathMatch):
        out["path"] = spec.path
    elif isinstance(spec, PrefixMatch):
        out["prefix"] = spec.prefix
    elif isinstance(spec, RegexMatch):
        out["regex"] = spec.regex_str
    if not match.case_sensitive and not isinstance(spec, RegexMatch):
        out["case_sensitive"] = False
    if match.headers:
        out["headers"] = [header_matcher_json(h) for h in match.headers]
    if match.runtime_fraction is not None:
        out["match_fraction"] = match.runtime_fraction.per_million
    return out


class RouteConfigConverter:
    """Converts successive route lists, keeping action names stable."""

    def __init__(self) -> None:
        self.cache = ActionNameCache()

    def convert(self, routes: Sequence[Route]) -> dict[str, Any]:
        """The service config (``{"loadBalancingConfig": [...]}``) for ``routes``."""
        usable: list[tuple[RouteMatch, ActionKey]] = []
        for route in routes:
            if not isinstance(route.action, RouteAction):
                continue
            key = action_key(route.action)
            if key is not None:
                usable.append((route.match, key))
        names = self.cache.assign(key for _, key in usable)
        actions = {names[key]: action_json(key) for key in dict.fromkeys(k for _, k in usable)}
        route_list = [{**route_match_json(m), "action": names[key]} for m, key in usable]
        return {"loadBalancingConfig": [{ROUTING_POLICY: {"action": actions, "route": route_list}}]}
