"""``priority_experimental``: failover across a prioritized list of children (gRFC A56).

Theory of operation (every rule cites the A56 section it implements; where
A56 and its ``.latest.md`` differ, the latter wins):

Config ("LB Policy Configuration")
    ``children`` maps a name to a child config (a ``loadBalancingConfig`` list
    and ``ignore_reresolution_requests``); ``priorities`` lists child names,
    highest priority first.  Names decouple children from priorities, so a
    child keeps its policy object (and its connections) when it moves to
    another priority.  Every priority must name a child and appear once.

Children ("Child Lifetime Management")
    Children are created lazily: only when the choice below reaches their
    priority.  A child is *deactivated*, never destroyed at once, when

    * a higher priority becomes usable (READY or IDLE), or
    * a config update no longer lists it in ``priorities``;

    deactivation starts a ``CHILD_RETENTION`` (15 min) timer that destroys
    the child.  Deactivating an already deactivated child keeps its timer.
    The choice reactivates (cancels the timer of) every child it walks past.
    A child re-added by name gets its new config at once but stays
    deactivated until the choice reaches it.  gRFC A115's opt-out
    (``destroy_removed_children``, off by default) destroys children dropped
    from the config at once instead; lower priorities left behind are still
    retained.  A child of the config map that no priority names counts as
    dropped (it can never be chosen).

Child state ("Child Connectivity State Tracking")
    Each child starts CONNECTING with a queueing picker, and its last state,
    status and picker are kept.  Its *failover timer* (``FAILOVER_TIMEOUT``,
    10 s) starts when the child is created and again when the child
    transitions into CONNECTING from another state while it has reported
    READY or IDLE more recently than TRANSIENT_FAILURE (a duplicate
    CONNECTING never restarts it; IDLE -> CONNECTING is a reconnect and
    starts it; TRANSIENT_FAILURE -> CONNECTING does not).  READY, IDLE and
    TRANSIENT_FAILURE cancel it.  When it fires, the child simply stops
    counting as "pending" and the priority is chosen again: no state is
    invented for the child (A56 latest).

Updates ("Configuration Updates")
    A parent update first updates every existing child (or deactivates /
    destroys those no longer listed), with choosing suspended: child reports
    arriving meanwhile are recorded but do not trigger a choice.  The choice
    runs exactly once, explicitly, after the last child was updated.

Choice ("Algorithm for Choosing a Priority")
    One idempotent function, run on every parent update, every child report
    and every failover expiry:

    1. no priorities: TRANSIENT_FAILURE "priority policy has empty priority list";
    2. walk priorities from the top, creating or reactivating each child;
       the first READY or IDLE child is chosen and all lower priorities are
       deactivated; else the first child with a pending failover timer is
       chosen;
    3. else the first CONNECTING child; 4. else the last priority.

    The chosen child's own state, status and picker object are published
    (nothing wraps the pick path).  An IDLE child's picker asks it to exit
    idle; ``exit_idle`` from the parent goes to the chosen child.

    Two shortcuts keep the parent free of duplicate reports, both provably
    equivalent to re-running the choice: a report from a child that no
    priority names cannot change the choice, nor can a report from a child
    below a choice made in step 2 (the walk stops before reaching it).

Re-entrancy
    A child may report synchronously while it is being created by the
    choice; such reports mark the choice dirty and it is run again before
    the (single) publication.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.clock import Clock
from pyxds.lb import hierarchy, registry
from pyxds.lb.api import (
    EMPTY_ATTRIBUTES,
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    LoadBalancer,
    Picker,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper
from pyxds.lb.errors import (
    LBConfigError,
    describe,
    expect_bool,
    expect_list,
    expect_object,
    key_path,
)
from pyxds.lb.registry import PolicySelection
from pyxds.lb.timer_slot import TimerSlot

__all__ = [
    "CHILD_RETENTION",
    "DESTROY_REMOVED_CHILDREN",
    "FAILOVER_TIMEOUT",
    "POLICY_NAME",
    "PriorityChild",
    "PriorityConfig",
    "PriorityFactory",
    "PriorityLoadBalancer",
]

POLICY_NAME = "priority_experimental"

FAILOVER_TIMEOUT = 10.0
"""A56 "Child Connectivity State Tracking": the 10-second failover timer."""

CHILD_RETENTION = 900.0
"""A56 "Child Lifetime Management": a deactivated child lives 15 minutes."""

_CACHE_ENV = "GRPC_EXPERIMENTAL_ENABLE_PRIORITY_LB_CHILD_POLICY_CACHE"

DESTROY_REMOVED_CHILDREN: bool = os.environ.get(_CACHE_ENV, "").strip().lower() == "false"
"""gRFC A115's option, off by default: destroy children dropped from the config
at once instead of retaining them for ``CHILD_RETENTION``.  Read when a policy
is built (unless its factory was given ``destroy_removed_children``).  The
environment variable A115 names, set to ``false``, turns it on."""

# A pass creates children only once; a second pass sees no new reports
# unless a child reports about another child.  The bound is a safety net.
_MAX_CHOICE_PASSES = 8

_EMPTY_STATUS = Status(grpc.StatusCode.UNAVAILABLE, "priority policy has empty priority list")

_READY = ConnectivityState.READY
_IDLE = ConnectivityState.IDLE
_CONNECTING = ConnectivityState.CONNECTING
_TF = ConnectivityState.TRANSIENT_FAILURE


# --------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PriorityChild:
    """One entry of ``children``: the child's policy and its re-resolution flag."""

    config: PolicySelection
    ignore_reresolution_requests: bool = False


@dataclass(frozen=True)
class PriorityConfig:
    """Parsed ``priority_experimental`` config: a frozen value with structural
    equality (the same config twice compares equal).  Built by
    :meth:`PriorityFactory.parse_config` or directly by xDS policies."""

    children: Mapping[str, PriorityChild] = field(default_factory=lambda: EMPTY_ATTRIBUTES)
    priorities: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.children, MappingProxyType):
            object.__setattr__(self, "children", MappingProxyType(dict(self.children)))
        if not isinstance(self.priorities, tuple):
            object.__setattr__(self, "priorities", tuple(self.priorities))
        _check_priorities(self.priorities, self.children)

    def __hash__(self) -> int:
        return hash((self.priorities, tuple(sorted(self.children))))


def _check_priorities(priorities: tuple[Any, ...], children: Mapping[str, Any]) -> None:
    seen: dict[str, int] = {}
    for index, name in enumerate(priorities):
        path = f"priorities[{index}]"
        if not isinstance(name, str):
            raise LBConfigError(path, f"expected string, got {describe(name)}")
        if name not in children:
            raise LBConfigError(
                path, f"unknown priority {json.dumps(name)}: no such child in children"
            )
        if name in seen:
            raise LBConfigError(
                path, f"duplicate priority {json.dumps(name)} (also priorities[{seen[name]}])"
            )
        seen[name] = index


def parse_priority_config(json_config: Any) -> PriorityConfig:
    """Validate the JSON config; errors name the field relative to this
    policy's config object (A56 "LB Policy Configuration")."""
    obj = expect_object(json_config, "")
    if "children" not in obj:
        raise LBConfigError("children", "required field missing")
    children_json = expect_object(obj["children"], "children")
    children: dict[str, PriorityChild] = {}
    for name, child_json in children_json.items():
        path = key_path("children", name)
        child_obj = expect_object(child_json, path)
        if "config" not in child_obj:
            raise LBConfigError(f"{path}.config", "required field missing")
        selection = registry.select_policy(child_obj["config"], f"{path}.config")
        ignore = expect_bool(child_obj, "ignore_reresolution_requests", path, default=False)
        children[name] = PriorityChild(selection, ignore)
    priorities = expect_list(obj, "priorities", "")
    return PriorityConfig(children, tuple(priorities))


# --------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------


class _ChildHelper(DelegatingHelper):
    """What one child sees: its reports go to the priority policy; its
    re-resolution requests are dropped when its config says so (A37)."""

    def __init__(self, parent: Helper, policy: PriorityLoadBalancer, child: _Child) -> None:
        super().__init__(parent)
        self._policy = policy
        self._child = child

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self._policy._on_child_state(self._child, state, status, picker)

    def request_reresolution(self) -> None:
        child = self._child
        if child.closed or child.ignore_reresolution_requests:
            return
        self.parent.request_reresolution()


class _Child:
    """A56's ChildPriority: the child policy plus its last report and timers."""

    __slots__ = (
        "name",
        "handler",
        "state",
        "status",
        "picker",
        "seen_ready_or_idle_since_failure",
        "failover_timer",
        "retention_timer",
        "ignore_reresolution_requests",
        "closed",
    )

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self.handler: ChildPolicyHandler | None = None
        self.state = _CONNECTING
        self.status = OK_STATUS
        self.picker: Picker = QueuePicker()
        self.seen_ready_or_idle_since_failure = True
        self.failover_timer = TimerSlot(clock)
        self.retention_timer = TimerSlot(clock)
        self.ignore_reresolution_requests = False
        self.closed = False

    @property
    def failover_pending(self) -> bool:
        return self.failover_timer.pending

    @property
    def deactivated(self) -> bool:
        return self.retention_timer.pending

    @property
    def policy(self) -> LoadBalancer | None:
        """The child's current policy (tests and config dumps)."""
        return self.handler.child if self.handler is not None else None

    def __repr__(self) -> str:
        flags = []
        if self.failover_pending:
            flags.append("failover-pending")
        if self.deactivated:
            flags.append("deactivated")
        return f"_Child({self.name!r}, {self.state.name}{', ' if flags else ''}{', '.join(flags)})"


# --------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------


class PriorityLoadBalancer(LoadBalancer):
    """``priority_experimental`` (gRFC A56); see the module docstring."""

    def __init__(
        self,
        helper: Helper,
        *,
        destroy_removed_children: bool = False,
        failover_timeout: float = FAILOVER_TIMEOUT,
        child_retention: float = CHILD_RETENTION,
    ) -> None:
        self.helper = helper
        self.destroy_removed_children = destroy_removed_children
        self.failover_timeout = failover_timeout
        self.child_retention = child_retention
        self._config: PriorityConfig | None = None
        self._index: dict[str, int] = {}
        self._endpoints: dict[str, list[Endpoint]] | Status = {}
        self._attributes: Mapping[str, Any] = EMPTY_ATTRIBUTES
        self._note = ""
        self._children: dict[str, _Child] = {}
        self._updating = False
        self._reports_while_updating = 0
        self._choosing = False
        self._dirty = False
        self._current: _Child | None = None
        self._current_index = -1
        self._current_settled = False
        self._shut_down = False

    # -- introspection (tests, config dumps) ----------------------------
    @property
    def children(self) -> Mapping[str, _Child]:
        return MappingProxyType(self._children)

    @property
    def current_child(self) -> str | None:
        """Name of the child whose picker was published last, if any."""
        return self._current.name if self._current is not None else None

    # -- LoadBalancer -----------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        """A56 "Configuration Updates": update every child, then choose once."""
        if self._shut_down:
            return None
        config = update.config
        if not isinstance(config, PriorityConfig):
            return Status(
                grpc.StatusCode.UNAVAILABLE,
                f"{POLICY_NAME}: expected a PriorityConfig, got {type(config).__name__}",
            )
        self._config = config
        self._index = {name: i for i, name in enumerate(config.priorities)}
        endpoints = update.endpoints
        self._endpoints = endpoints if isinstance(endpoints, Status) else hierarchy.split(endpoints)
        self._attributes = update.attributes
        self._note = update.resolution_note
        errors: list[str] = []
        self._updating = True
        try:
            for name, child in list(self._children.items()):
                if name not in self._index:
                    if self.destroy_removed_children:
                        self._destroy(child)
                    else:
                        self._deactivate(child)
                    continue
                status = self._update_child(child)
                if status is not None:
                    errors.append(f"child {name}: {status}")
        finally:
            self._updating = False
        self._choose()
        if errors:
            return Status(
                grpc.StatusCode.UNAVAILABLE, f"errors from children: [{'; '.join(errors)}]"
            )
        return None

    def resolver_error(self, status: Status) -> None:
        """Pass the error to every child the config lists (a child dropped
        from the config gets nothing more, as C-core updates only the
        children of its config and grpc-java skips delisted ones); with no
        listed child yet, fail with the error."""
        if self._shut_down:
            return
        listed = [
            child
            for child in self._children.values()
            if child.name in self._index and child.handler is not None and not child.closed
        ]
        if not listed:
            self.helper.update_state(_TF, status, FailPicker(status))
            return
        self._reports_while_updating = 0
        self._updating = True
        try:
            for child in listed:
                if child.handler is not None and not child.closed:
                    child.handler.resolver_error(status)
        finally:
            self._updating = False
        if self._reports_while_updating:
            self._choose()

    def exit_idle(self) -> None:
        child = self._current
        if child is not None and not child.closed and child.handler is not None:
            child.handler.exit_idle()

    def reset_backoff(self) -> None:
        for child in list(self._children.values()):
            if child.handler is not None:
                child.handler.reset_backoff()

    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        children = list(self._children.values())
        self._children.clear()
        self._current = None
        for child in children:
            self._close(child)

    # -- child lifetime ---------------------------------------------------
    def _child_update(self, child: _Child) -> ResolverUpdate:
        assert self._config is not None
        split = self._endpoints
        endpoints: Sequence[Endpoint] | Status = (
            split.get(child.name, ()) if not isinstance(split, Status) else split
        )
        return ResolverUpdate(
            endpoints=endpoints,
            config=self._config.children[child.name].config,
            attributes=self._attributes,
            resolution_note=self._note,
        )

    def _update_child(self, child: _Child) -> Status | None:
        assert self._config is not None and child.handler is not None
        child.ignore_reresolution_requests = self._config.children[
            child.name
        ].ignore_reresolution_requests
        return child.handler.update(self._child_update(child))

    def _create_child(self, name: str) -> _Child:
        child = _Child(name, self.helper.clock)
        child.handler = ChildPolicyHandler(_ChildHelper(self.helper, self, child))
        self._children[name] = child
        self._start_failover_timer(child)
        status = self._update_child(child)
        if status is not None:
            # As C-core does: a child that rejects its first update asks the
            # resolver for another try.
            self.helper.request_reresolution()
        return child

    def _deactivate(self, child: _Child) -> None:
        if not child.retention_timer.pending:
            child.retention_timer.start(
                self.child_retention, lambda: self._on_retention_timer(child)
            )

    def _reactivate(self, child: _Child) -> None:
        if child.retention_timer.pending:
            child.retention_timer.cancel()

    def _on_retention_timer(self, child: _Child) -> None:
        # The slot drops callbacks of cancelled or restarted timers; a child
        # replaced under the same name is a different slot.
        if self._shut_down or child.closed or self._children.get(child.name) is not child:
            return
        self._destroy(child)

    def _destroy(self, child: _Child) -> None:
        if self._children.get(child.name) is child:
            del self._children[child.name]
        if self._current is child:
            self._current = None
            self._current_index = -1
        self._close(child)

    def _close(self, child: _Child) -> None:
        child.closed = True
        child.failover_timer.cancel()
        child.retention_timer.cancel()
        if child.handler is not None:
            child.handler.shutdown()

    # -- failover timer ---------------------------------------------------
    def _start_failover_timer(self, child: _Child) -> None:
        child.failover_timer.start(self.failover_timeout, lambda: self._on_failover_timer(child))

    def _cancel_failover_timer(self, child: _Child) -> None:
        child.failover_timer.cancel()

    def _on_failover_timer(self, child: _Child) -> None:
        if self._shut_down or child.closed or self._children.get(child.name) is not child:
            return
        # A56 latest: expiry only re-runs the choice; the child's own state,
        # status and picker stay what it reported.
        if not self._updating and not self._choice_unaffected_by(child):
            self._choose()

    # -- child reports ----------------------------------------------------
    def _on_child_state(
        self, child: _Child, state: ConnectivityState, status: Status, picker: Picker
    ) -> None:
        if self._shut_down or child.closed:
            return
        previous = child.state
        child.state, child.status, child.picker = state, status, picker
        if state is _CONNECTING:
            if (
                previous is not _CONNECTING
                and child.seen_ready_or_idle_since_failure
                and not child.failover_timer.pending
            ):
                self._start_failover_timer(child)
        elif state is _READY or state is _IDLE:
            child.seen_ready_or_idle_since_failure = True
            self._cancel_failover_timer(child)
        elif state is _TF:
            child.seen_ready_or_idle_since_failure = False
            self._cancel_failover_timer(child)
        if self._updating:
            # A56: never choose on a partially applied parent update.
            self._reports_while_updating += 1
            return
        if (
            state is previous
            and child is self._current
            and (state is _READY or state is _TF)
            and not self._choosing
        ):
            # The current child reports its READY or TRANSIENT_FAILURE again
            # with a new picker (an endpoint of its locality came, went or
            # failed another connection attempt): the choice saw every other
            # child as it is now and this one in this state, so the walk
            # would choose it again; its report is published as is (issue
            # 18: one report per failed attempt while every endpoint fails).
            self.helper.update_state(state, status, picker)
            return
        if self._choice_unaffected_by(child):
            return
        self._choose()

    def _choice_unaffected_by(self, child: _Child) -> bool:
        """True when re-running the choice would provably re-publish the
        current child unchanged: the child is named by no priority, or sits
        below a child chosen in the first walk (READY/IDLE/pending timer)."""
        if self._choosing:
            return False
        index = self._index.get(child.name)
        if index is None:
            return True
        return self._current is not None and self._current_settled and index > self._current_index

    # -- the choice (A56 "Algorithm for Choosing a Priority") -------------
    def _choose(self) -> None:
        if self._shut_down or self._updating or self._config is None:
            return
        if self._choosing:
            self._dirty = True
            return
        self._choosing = True
        try:
            for _ in range(_MAX_CHOICE_PASSES):
                self._dirty = False
                result = self._choose_once()
                if not self._dirty or self._shut_down:
                    break
        finally:
            self._choosing = False
        if self._shut_down:
            return
        state, status, picker = result
        self.helper.update_state(state, status, picker)

    def _choose_once(self) -> tuple[ConnectivityState, Status, Picker]:
        config = self._config
        assert config is not None
        priorities = config.priorities
        if not priorities:
            self._current = None
            self._current_index = -1
            self._current_settled = False
            return _TF, _EMPTY_STATUS, FailPicker(_EMPTY_STATUS)
        children = self._children
        for index, name in enumerate(priorities):
            child = children.get(name)
            if child is None:
                child = self._create_child(name)
            else:
                self._reactivate(child)
            if child.state is _READY or child.state is _IDLE:
                return self._set_current(index, child, deactivate_lower=True, settled=True)
            if child.failover_timer.pending:
                return self._set_current(index, child, deactivate_lower=False, settled=True)
        for index, name in enumerate(priorities):
            child = children[name]
            if child.state is _CONNECTING:
                return self._set_current(index, child, deactivate_lower=False, settled=False)
        last = len(priorities) - 1
        return self._set_current(last, children[priorities[last]], False, settled=False)

    def _set_current(
        self, index: int, child: _Child, deactivate_lower: bool, settled: bool
    ) -> tuple[ConnectivityState, Status, Picker]:
        if deactivate_lower:
            assert self._config is not None
            for name in self._config.priorities[index + 1 :]:
                lower = self._children.get(name)
                if lower is not None:
                    self._deactivate(lower)
        self._current = child
        self._current_index = index
        self._current_settled = settled
        return child.state, child.status, child.picker


# --------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------


class PriorityFactory(PolicyFactory):
    """Builds ``priority_experimental`` policies.

    ``destroy_removed_children`` is gRFC A115's option: True destroys a child
    dropped from the config at once instead of retaining it for 15 minutes.
    None (the default) reads the module-level ``DESTROY_REMOVED_CHILDREN``
    when each policy is built.
    """

    name = POLICY_NAME

    def __init__(
        self,
        destroy_removed_children: bool | None = None,
        *,
        failover_timeout: float = FAILOVER_TIMEOUT,
        child_retention: float = CHILD_RETENTION,
    ) -> None:
        self.destroy_removed_children = destroy_removed_children
        self.failover_timeout = failover_timeout
        self.child_retention = child_retention

    def parse_config(self, json_config: Any) -> PriorityConfig:
        return parse_priority_config(json_config)

    def build(self, helper: Helper) -> PriorityLoadBalancer:
        destroy = self.destroy_removed_children
        if destroy is None:
            destroy = DESTROY_REMOVED_CHILDREN
        return PriorityLoadBalancer(
            helper,
            destroy_removed_children=destroy,
            failover_timeout=self.failover_timeout,
            child_retention=self.child_retention,
        )


registry.register(PriorityFactory())
