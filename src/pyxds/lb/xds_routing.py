"""``xds_routing_experimental``: A28's routing LB policy ("Routing LB
policy": "LB policy config", "Picking").

Superseded for xDS by the ConfigSelector + xds_cluster_manager (A31), kept
for static service configs (e.g. the output of
:mod:`pyxds.resolver.route_to_service_config`).

Config (JSON; ``route``/``action`` also accepted as ``Route``/``Action``,
``childPolicy`` as ``child_policy``, ``match_fraction`` as
``matchFraction``)::

    {"route": [{"path"|"prefix"|"regex": "...", "headers": [...],
                "match_fraction": N, "action": "NAME"}, ...],
     "action": {"NAME": {"childPolicy": [<LB config list>]}, ...}}

Validation (A28): exactly one path matcher per route; the action must be
in the action map; every action must be used by some route; every action's
``childPolicy`` must select a registered policy with a valid config (the
first registered name wins; its config failing is an error, no moving on).
Duplicate matchers are allowed (the later one never wins).

Behaviour: one child per action, keyed by action name (an action name that
persists is updated, not recreated; removed actions are shut down).  The
picker matches routes in order, first match wins, with the same matching
rules and index as the xds resolver (:class:`RouteTable`), and always
delegates to the matched child's picker whatever its state; a child with
no picker yet queues; no match fails UNAVAILABLE.  The policy's state
aggregates the children's like weighted_target: READY if any is READY,
else CONNECTING, else IDLE, else TRANSIENT_FAILURE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    LoadBalancer,
    PickArgs,
    Picker,
    PickFail,
    PickQueue,
    PickResult,
    PolicyFactory,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper
from pyxds.lb.errors import LBConfigError, describe, key_path
from pyxds.lb.registry import PolicySelection
from pyxds.resolver.route_matching import RouteTable
from pyxds.xds.resources.types import (
    FractionalPercent,
    HeaderMatcher,
    PathMatch,
    PrefixMatch,
    RegexMatch,
    RouteMatch,
)

if TYPE_CHECKING:
    from re2 import _Regexp  # google-re2's compiled pattern (typings/re2.pyi)

__all__ = ["XdsRoutingConfig", "XdsRoutingFactory", "XdsRoutingLB", "NAME", "NO_ROUTE_MESSAGE"]

NAME = "xds_routing_experimental"
NO_ROUTE_MESSAGE = "xds_routing: no matching route found"
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

_PATH_KEYS = ("path", "prefix", "regex")
_HEADER_KINDS = {
    "exact_match": "exact",
    "regex_match": "safe_regex",
    "range_match": "range",
    "present_match": "present",
    "prefix_match": "prefix",
    "suffix_match": "suffix",
    "contains_match": "contains",
}


@dataclass(frozen=True)
class XdsRoutingConfig:
    """Parsed config: routes as (RouteMatch, action name) in order, and the
    actions as (name, PolicySelection) sorted by name.  Frozen, comparable."""

    routes: tuple[tuple[RouteMatch, str], ...]
    actions: tuple[tuple[str, PolicySelection], ...]


def _field(obj: dict[str, Any], *names: str) -> tuple[str | None, Any]:
    for name in names:
        if name in obj:
            return name, obj[name]
    return None, None


def _compile_re2(pattern: str, path: str) -> _Regexp:
    import re2

    try:
        return re2.compile(pattern)
    except re2.error as err:
        raise LBConfigError(path, f"invalid RE2 regex {describe(pattern)}: {err}") from None


def _parse_header(value: Any, path: str) -> HeaderMatcher:
    if not isinstance(value, dict):
        raise LBConfigError(path, f"expected object, got {describe(value)}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise LBConfigError(f"{path}.name", f"expected non-empty string, got {describe(name)}")
    specifiers = [k for k in _HEADER_KINDS if k in value]
    if len(specifiers) != 1:
        raise LBConfigError(
            path,
            "exactly one of " + ", ".join(_HEADER_KINDS) + f" is required, got {specifiers or 0}",
        )
    (spec,) = specifiers
    kind = _HEADER_KINDS[spec]
    raw = value[spec]
    spec_path = f"{path}.{spec}"
    invert = value.get("invert_match", False)
    ignore_case = value.get("ignore_case", False)
    for flag, flag_value in (("invert_match", invert), ("ignore_case", ignore_case)):
        if not isinstance(flag_value, bool):
            raise LBConfigError(f"{path}.{flag}", f"expected boolean, got {describe(flag_value)}")
    if kind == "present":
        if not isinstance(raw, bool):
            raise LBConfigError(spec_path, f"expected boolean, got {describe(raw)}")
        return HeaderMatcher(name.lower(), kind, invert_match=invert, present_match=raw)
    if kind == "range":
        if not isinstance(raw, dict):
            raise LBConfigError(spec_path, f"expected object, got {describe(raw)}")
        bounds = []
        for bound in ("start", "end"):
            b = raw.get(bound, 0)
            if isinstance(b, str) and b.isascii() and b.lstrip("-").isdigit():
                b = int(b)  # int64 in proto JSON may be a string
            if isinstance(b, bool) or not isinstance(b, int):
                raise LBConfigError(f"{spec_path}.{bound}", f"expected integer, got {describe(b)}")
            bounds.append(b)
        return HeaderMatcher(
            name.lower(), kind, invert_match=invert, range_start=bounds[0], range_end=bounds[1]
        )
    if not isinstance(raw, str):
        raise LBConfigError(spec_path, f"expected string, got {describe(raw)}")
    regex = _compile_re2(raw, spec_path) if kind == "safe_regex" else None
    return HeaderMatcher(
        name.lower(), kind, raw, invert_match=invert, ignore_case=ignore_case, regex=regex
    )


def _parse_route(value: Any, path: str, actions: dict[str, Any]) -> tuple[RouteMatch, str]:
    if not isinstance(value, dict):
        raise LBConfigError(path, f"expected object, got {describe(value)}")
    present = [k for k in _PATH_KEYS if k in value]
    if len(present) != 1:
        raise LBConfigError(
            path, f"exactly one of path, prefix, regex is required, got {present or 'none'}"
        )
    (key,) = present
    text = value[key]
    if not isinstance(text, str):
        raise LBConfigError(f"{path}.{key}", f"expected string, got {describe(text)}")
    spec: Any
    if key == "path":
        spec = PathMatch(text)
    elif key == "prefix":
        spec = PrefixMatch(text)
    else:
        spec = RegexMatch(text, _compile_re2(text, f"{path}.regex"))
    case_sensitive = value.get("case_sensitive", True)
    if not isinstance(case_sensitive, bool):
        raise LBConfigError(
            f"{path}.case_sensitive", f"expected boolean, got {describe(case_sensitive)}"
        )
    headers_raw = value.get("headers", [])
    if not isinstance(headers_raw, list):
        raise LBConfigError(f"{path}.headers", f"expected array, got {describe(headers_raw)}")
    headers = tuple(_parse_header(h, f"{path}.headers[{i}]") for i, h in enumerate(headers_raw))
    fraction = None
    fkey, fvalue = _field(value, "match_fraction", "matchFraction")
    if fkey is not None:
        if isinstance(fvalue, dict):  # UInt32Value as an object
            fvalue = fvalue.get("value", 0)
        if isinstance(fvalue, bool) or not isinstance(fvalue, int) or not 0 <= fvalue < 2**32:
            raise LBConfigError(f"{path}.{fkey}", f"expected uint32, got {describe(fvalue)}")
        fraction = FractionalPercent(fvalue, 1_000_000)
    action = value.get("action")
    if not isinstance(action, str):
        raise LBConfigError(f"{path}.action", f"expected string, got {describe(action)}")
    if action not in actions:
        raise LBConfigError(f"{path}.action", f"action {describe(action)} is not in the action map")
    return RouteMatch(spec, case_sensitive, headers, fraction), action


class XdsRoutingFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> XdsRoutingConfig:
        if not isinstance(json_config, dict):
            raise LBConfigError("", f"expected object, got {describe(json_config)}")
        akey, actions_raw = _field(json_config, "action", "Action")
        if akey is None:
            actions_raw, akey = {}, "action"
        if not isinstance(actions_raw, dict):
            raise LBConfigError(akey, f"expected object, got {describe(actions_raw)}")
        actions: dict[str, PolicySelection] = {}
        for name, action in actions_raw.items():
            apath = key_path(akey, name)
            if not isinstance(action, dict):
                raise LBConfigError(apath, f"expected object, got {describe(action)}")
            ckey, child = _field(action, "childPolicy", "child_policy")
            if ckey is None:
                raise LBConfigError(f"{apath}.childPolicy", "required field missing")
            actions[name] = registry.select_policy(child, f"{apath}.{ckey}")
        rkey, routes_raw = _field(json_config, "route", "Route")
        if rkey is None:
            routes_raw, rkey = [], "route"
        if not isinstance(routes_raw, list):
            raise LBConfigError(rkey, f"expected array, got {describe(routes_raw)}")
        routes = tuple(_parse_route(r, f"{rkey}[{i}]", actions) for i, r in enumerate(routes_raw))
        used = {action for _, action in routes}
        for name in actions:
            if name not in used:
                raise LBConfigError(key_path(akey, name), "action is not used by any route")
        return XdsRoutingConfig(routes, tuple(sorted(actions.items())))

    def build(self, helper: Helper) -> XdsRoutingLB:
        return XdsRoutingLB(helper)


class _RoutingPicker(Picker):
    __slots__ = ("_table", "_pickers", "_rand", "_no_route")

    def __init__(
        self, table: RouteTable[str], pickers: dict[str, Picker | None], rand: Any
    ) -> None:
        self._table = table
        self._pickers = pickers
        self._rand = rand
        self._no_route = PickFail(Status(UNAVAILABLE, NO_ROUTE_MESSAGE))

    def pick(self, args: PickArgs) -> PickResult:
        action = self._table.match(args.path, args.metadata, self._rand)
        if action is None:
            return self._no_route
        picker = self._pickers.get(action)
        if picker is None:
            return PickQueue()
        return picker.pick(args)


class _Child(DelegatingHelper):
    def __init__(self, policy: XdsRoutingLB, name: str) -> None:
        super().__init__(policy.helper)
        self.policy = policy
        self.name = name
        self.handler = ChildPolicyHandler(self)
        self.state = ConnectivityState.CONNECTING
        self.status = OK_STATUS
        self.picker: Picker | None = None
        self.closed = False

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self.closed:
            return
        self.state, self.status, self.picker = state, status, picker
        self.policy._child_changed()


class XdsRoutingLB(LoadBalancer):
    """See the module docstring."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._children: dict[str, _Child] = {}
        self._config: XdsRoutingConfig | None = None
        self._table: RouteTable[str] = RouteTable([])
        self._updating = False

    @property
    def children(self) -> dict[str, _Child]:
        return dict(self._children)

    def update(self, update: ResolverUpdate) -> Status | None:
        config: XdsRoutingConfig = update.config
        if config != self._config:
            self._table = RouteTable(config.routes)
        self._config = config
        wanted = dict(config.actions)
        self._updating = True
        try:
            for name in [n for n in self._children if n not in wanted]:
                child = self._children.pop(name)
                child.closed = True
                child.handler.shutdown()
            for name, selection in config.actions:
                existing = self._children.get(name)
                if existing is None:
                    existing = self._children[name] = _Child(self, name)
                existing.handler.update(update.replace(config=selection))
        finally:
            self._updating = False
        self._publish()
        return None

    def resolver_error(self, status: Status) -> None:
        self._updating = True
        try:
            for child in self._children.values():
                child.handler.resolver_error(status)
        finally:
            self._updating = False
        if not self._children:
            self.helper.update_state(
                ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status)
            )
        else:
            self._publish()

    def exit_idle(self) -> None:
        for child in list(self._children.values()):
            child.handler.exit_idle()

    def reset_backoff(self) -> None:
        for child in self._children.values():
            child.handler.reset_backoff()

    def shutdown(self) -> None:
        for child in self._children.values():
            child.closed = True
            child.handler.shutdown()
        self._children.clear()

    def _child_changed(self) -> None:
        if not self._updating:
            self._publish()

    def _publish(self) -> None:
        children = list(self._children.values())
        if not children:
            status = Status(UNAVAILABLE, "xds_routing: no actions configured")
            self.helper.update_state(
                ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status)
            )
            return
        states = {c.state for c in children}
        status = OK_STATUS
        if ConnectivityState.READY in states:
            state = ConnectivityState.READY
        elif ConnectivityState.CONNECTING in states:
            state = ConnectivityState.CONNECTING
        elif ConnectivityState.IDLE in states:
            state = ConnectivityState.IDLE
        else:
            state = ConnectivityState.TRANSIENT_FAILURE
            status = next(
                (c.status for c in children if not c.status.ok),
                Status(UNAVAILABLE, "xds_routing: every child is in TRANSIENT_FAILURE"),
            )
        pickers: dict[str, Picker | None] = {c.name: c.picker for c in children}
        picker = _RoutingPicker(self._table, pickers, self.helper.random.randrange)
        self.helper.update_state(state, status, picker)


registry.register(XdsRoutingFactory())
