"""``xds_cluster_manager_experimental``: one child per cluster, picked by name.

gRFC A28 ("Routing LB policy", as reshaped by A31): the xds resolver's
ConfigSelector chooses the cluster of each RPC and puts the child name
(``"cluster:NAME"``) in ``PickArgs.call_attributes["cluster"]``; this
policy's picker hands the pick to that child's picker, whatever the child's
state (A28 "Picking": the pick is always delegated to the matched child).

Config: ``{"children": {"cluster:NAME": {"childPolicy": [...]}}}``.

Rules:

* Each child is owned by a :class:`ChildPolicyHandler`.  An update first
  *deactivates* the children no longer in the config, then updates (or
  creates) every child of the config, then reports one aggregate state.
  Reports children make during the update are folded into that one report.
* Retention (A28 "When a child policy is removed, it will be cached for 15
  minutes", as C-core's ``kChildRetentionInterval`` and grpc-java): a
  deactivated child stays alive for ``CHILD_RETENTION`` (900 s) and is then
  shut down.  It counts for neither the aggregate state nor the picker (its
  cluster's picks fail as unknown); its reports are recorded but change
  nothing, so they are not re-published.  It still gets ``exit_idle`` and
  ``reset_backoff`` (C-core sends both to every child) but no resolver error
  (C-core updates only the children of the config).  Re-adding its name
  cancels the timer and updates the same child, so its subchannels are
  reused.  Shutdown cancels every timer.
* Aggregate state over the children of the config, as weighted_target (A28):
  READY if any child is READY, else CONNECTING if any is CONNECTING, else
  IDLE if any is IDLE, else TRANSIENT_FAILURE.  A child that has not
  reported counts as CONNECTING; a child in TRANSIENT_FAILURE stays there
  for aggregation until it is READY (sticky, as C-core).
* The picker is a dict from each cluster of the config to its child's latest
  picker (a queueing picker until the child reports).  An unknown cluster
  fails the pick UNAVAILABLE
  ``xds cluster manager picker: unknown cluster "NAME"``.
"""

from __future__ import annotations

from typing import Any

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
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper
from pyxds.lb.errors import LBConfigError, expect_object, key_path
from pyxds.lb.registry import PolicySelection
from pyxds.lb.timer_slot import TimerSlot

NAME = "xds_cluster_manager_experimental"
CLUSTER_ATTRIBUTE = "cluster"

CHILD_RETENTION = 900.0
"""A28: a child removed from the config is kept 15 minutes (C-core
``kChildRetentionInterval``, grpc-java ``DELAYED_CHILD_DELETION_TIME_MINUTES``)."""

_READY = ConnectivityState.READY
_CONNECTING = ConnectivityState.CONNECTING
_IDLE = ConnectivityState.IDLE
_TF = ConnectivityState.TRANSIENT_FAILURE
_TF_STATUS = Status(grpc.StatusCode.UNAVAILABLE, "TRANSIENT_FAILURE from XdsClusterManagerLb")


@dataclass(frozen=True)
class XdsClusterManagerConfig:
    """Parsed config: ``children`` is a tuple of (name, PolicySelection)."""

    children: tuple[tuple[str, PolicySelection], ...]

    def as_dict(self) -> dict[str, PolicySelection]:
        return dict(self.children)


class ClusterManagerPicker(Picker):
    """Delegates each pick to the picker of the cluster the ConfigSelector chose."""

    __slots__ = ("_pickers",)

    def __init__(self, pickers: dict[str, Picker]) -> None:
        self._pickers = pickers

    def pick(self, args: PickArgs) -> PickResult:
        cluster = args.call_attributes.get(CLUSTER_ATTRIBUTE)
        picker = self._pickers.get(cluster) if cluster is not None else None
        if picker is None:
            return PickFail(
                Status(
                    grpc.StatusCode.UNAVAILABLE,
                    f'xds cluster manager picker: unknown cluster "{cluster or ""}"',
                )
            )
        return picker.pick(args)

    @property
    def clusters(self) -> list[str]:
        return list(self._pickers)

    def __repr__(self) -> str:
        return f"ClusterManagerPicker({sorted(self._pickers)})"


class _Child(DelegatingHelper):
    """One cluster: its handler and the last state it reported."""

    def __init__(self, policy: XdsClusterManagerPolicy, name: str) -> None:
        super().__init__(policy.helper)
        self.policy = policy
        self.name = name
        self.state = _CONNECTING
        self.status = OK_STATUS
        self.picker: Picker = QueuePicker()
        self.closed = False
        self.retention_timer = TimerSlot(policy.helper.clock)
        self.handler = ChildPolicyHandler(self)

    @property
    def active(self) -> bool:
        """In the config (not waiting out its retention)."""
        return not self.retention_timer.pending and not self.closed

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self.closed:
            return
        self.picker = picker
        if self.state is not _TF or state is _READY:
            self.state = state
        self.status = status
        if self.active:
            self.policy._child_changed()

    def request_reresolution(self) -> None:
        if not self.closed:
            self.parent.request_reresolution()

    def close(self) -> None:
        self.closed = True
        self.retention_timer.cancel()
        self.handler.shutdown()


class XdsClusterManagerPolicy(LoadBalancer):
    """The cluster manager.  See the module docstring for the rules."""

    def __init__(self, helper: Helper, *, child_retention: float = CHILD_RETENTION) -> None:
        self.helper = helper
        self.child_retention = child_retention
        self._children: dict[str, _Child] = {}
        # the children of the last config, in its order
        self._active: list[_Child] = []
        self._updating = False
        self._shut_down = False

    @property
    def children(self) -> dict[str, ChildPolicyHandler]:
        """Child name -> handler of the config's children (introspection for
        tests and config dumps); retained children are in :attr:`retained`."""
        return {child.name: child.handler for child in self._active}

    @property
    def retained(self) -> dict[str, ChildPolicyHandler]:
        """Child name -> handler of the removed children still kept (A28)."""
        return {n: c.handler for n, c in self._children.items() if not c.active}

    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shut_down:
            return None
        config: XdsClusterManagerConfig = update.config
        wanted = config.as_dict()
        for name, old in self._children.items():
            if name not in wanted:
                self._deactivate(old)
        errors: list[str] = []
        self._updating = True
        try:
            for name, selection in config.children:
                child = self._children.get(name)
                if child is None:
                    child = self._children[name] = _Child(self, name)
                else:
                    child.retention_timer.cancel()
                status = child.handler.update(update.replace(config=selection))
                if status is not None and not status.ok:
                    errors.append(f"child {name}: {status}")
        finally:
            self._updating = False
        self._active = [self._children[name] for name, _ in config.children]
        self._report()
        if errors:
            return Status(
                grpc.StatusCode.UNAVAILABLE, f"errors from children: [{'; '.join(errors)}]"
            )
        return None

    def resolver_error(self, status: Status) -> None:
        if not self._active:
            self.helper.update_state(_TF, status, FailPicker(status))
            return
        self._updating = True
        try:
            for child in list(self._active):
                child.handler.resolver_error(status)
        finally:
            self._updating = False
        self._report()

    def exit_idle(self) -> None:
        for child in list(self._children.values()):
            child.handler.exit_idle()

    def reset_backoff(self) -> None:
        for child in list(self._children.values()):
            child.handler.reset_backoff()

    def shutdown(self) -> None:
        self._shut_down = True
        for child in self._children.values():
            child.close()
        self._children.clear()
        self._active = []

    # -- internals -----------------------------------------------------
    def _deactivate(self, child: _Child) -> None:
        if not child.retention_timer.pending:
            child.retention_timer.start(self.child_retention, lambda: self._on_retention(child))

    def _on_retention(self, child: _Child) -> None:
        if self._shut_down or self._children.get(child.name) is not child:
            return
        del self._children[child.name]
        child.close()

    def _child_changed(self) -> None:
        if not self._updating and not self._shut_down:
            self._report()

    def _report(self) -> None:
        # the children's states by identity, not in a set (an enum member's
        # hash is a Python call: four per report, issue 18)
        ready = connecting = idle = False
        pickers: dict[str, Picker] = {}
        for child in self._active:
            state = child.state
            if state is _READY:
                ready = True
            elif state is _CONNECTING:
                connecting = True
            elif state is _IDLE:
                idle = True
            pickers[child.name] = child.picker
        if ready:
            state, status = _READY, OK_STATUS
        elif connecting:
            state, status = _CONNECTING, OK_STATUS
        elif idle:
            state, status = _IDLE, OK_STATUS
        else:
            state = _TF
            status = Status(
                grpc.StatusCode.UNAVAILABLE, "TRANSIENT_FAILURE from XdsClusterManagerLb"
            )
            if len(self._active) == 1:
                status = self._active[0].status
        self.helper.update_state(state, status, ClusterManagerPicker(pickers))


class XdsClusterManagerFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> XdsClusterManagerConfig:
        obj = expect_object(json_config, "")
        if "children" not in obj:
            raise LBConfigError("children", "required field missing")
        children_json = expect_object(obj["children"], "children")
        children: list[tuple[str, PolicySelection]] = []
        for name, child in children_json.items():
            path = key_path("children", name)
            child_obj = expect_object(child, path)
            if "childPolicy" not in child_obj:
                raise LBConfigError(f"{path}.childPolicy", "required field missing")
            selection = registry.select_policy(child_obj["childPolicy"], f"{path}.childPolicy")
            children.append((name, selection))
        return XdsClusterManagerConfig(tuple(children))

    def __init__(self, *, child_retention: float = CHILD_RETENTION) -> None:
        self.child_retention = child_retention

    def build(self, helper: Helper) -> XdsClusterManagerPolicy:
        return XdsClusterManagerPolicy(helper, child_retention=self.child_retention)


registry.register(XdsClusterManagerFactory())
