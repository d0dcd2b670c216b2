"""Owning one child policy: :class:`ChildPolicyHandler` and :class:`DelegatingHelper`.

Every parent policy (priority, weighted_target, the xDS policies) owns each
child through a ChildPolicyHandler.  The handler is itself a
:class:`LoadBalancer`: the parent calls ``update`` with
``config=PolicySelection(name, config)`` and the handler builds the named
policy from the registry and forwards the update with the child's own config.

Graceful switch (what grpc-go's gracefulswitch balancer does, A56 "Child
policy handling" leaves the mechanism to the implementation):

* First update: build the policy; it is *current* at once.
* An update naming the current policy goes to current (and discards a pending
  policy if there is one).
* An update naming a different policy builds a *pending* child (replacing
  an older pending one) and sends the update to it.  The pending child's
  state reports are held back.  Pending replaces current as soon as either
  the pending child reports a state other than CONNECTING, or current is not
  READY (on its next report, or at once if its last report was not READY).
  The old child is then shut down and the pending child's last state is
  published.
* Reports from a child that was shut down or replaced are dropped.
* Resolver errors, ``exit_idle`` and re-resolution requests concern only the
  *latest* child (pending if there is one, else current): it is the one the
  next resolver result will reach (C-core ChildPolicyHandler, grpc-go
  gracefulswitch).  ``reset_backoff`` reaches both.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    LoadBalancer,
    Picker,
    QueuePicker,
    ResolverUpdate,
    Status,
    Subchannel,
)
from pyxds.lb.registry import PolicySelection

if TYPE_CHECKING:
    from pyxds.clock import Clock


class DelegatingHelper(Helper):
    """A helper that forwards everything to ``parent``; subclasses override
    ``update_state`` (and anything else they intercept)."""

    def __init__(self, parent: Helper) -> None:
        self.parent = parent
        # The helper above the run of delegating helpers this one ends: no
        # level of the run can change ``clock`` or ``random`` (read-only
        # properties here), so each reads them from there in one step, not
        # one per level (round_robin reads ``random`` on every READY report,
        # 7 levels below the channel in the xDS tree; issue 18).
        # A level whose class gives its own ``clock`` or ``random`` (a custom
        # policy's helper) starts a run of its own.
        self._origin: Helper = (
            parent._origin
            if isinstance(parent, DelegatingHelper)
            and type(parent).clock is DelegatingHelper.clock
            and type(parent).random is DelegatingHelper.random
            else parent
        )
        # The nearest helper above that makes subchannels itself (the
        # channel, or a level that wraps them): the levels between only
        # forward, ten of them for each new endpoint in the xDS tree.
        self._maker: Helper = (
            parent._maker
            if isinstance(parent, DelegatingHelper)
            and type(parent).create_subchannel is DelegatingHelper.create_subchannel
            else parent
        )

    # Helper declares these as attributes; here they are read-only views of
    # the parent's, which mypy reports as an override of a settable attribute.
    @property
    def clock(self) -> Clock:  # type: ignore[override]  # read-only view of parent.clock
        return self._origin.clock

    @property
    def random(self) -> random.Random:  # type: ignore[override]  # view of parent.random
        return self._origin.random

    @property
    def channel_target(self) -> str:  # type: ignore[override]  # view of the parent's
        return getattr(self.parent, "channel_target", "")

    @property
    def channel_authority(self) -> str:  # type: ignore[override]
        return getattr(self.parent, "channel_authority", "")

    def create_route_lookup_channel(self, target: str, service_config: str | None) -> Any:
        """The optional capability of ``rls_experimental`` (api.Helper),
        from the channel through every level of the tree."""
        create = getattr(self.parent, "create_route_lookup_channel", None)
        if create is None:
            raise NotImplementedError("this channel offers no Route Lookup Service channel")
        return create(target, service_config)

    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> Subchannel:
        return self._maker.create_subchannel(address, attributes)

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self.parent.update_state(state, status, picker)

    def request_reresolution(self) -> None:
        self.parent.request_reresolution()


class _ChildSlot(DelegatingHelper):
    """The helper one child of the handler sees."""

    def __init__(self, handler: ChildPolicyHandler, name: str) -> None:
        super().__init__(handler.helper)
        self.handler = handler
        self.name = name
        self.policy: LoadBalancer | None = None
        self.state = ConnectivityState.CONNECTING
        self.status = OK_STATUS
        self.picker: Picker = QueuePicker()
        self.reported = False
        self.closed = False

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self.closed:
            return
        self.state, self.status, self.picker = state, status, picker
        self.reported = True
        handler = self.handler
        if handler._pending is None and handler._current is self:
            # the one child, no switch pending: what _child_reported does,
            # without its frame (a report of a failed connection attempt
            # passes up to seven handlers in the xDS tree, issue 18)
            handler.helper.update_state(state, status, picker)
        else:
            handler._child_reported(self)

    def request_reresolution(self) -> None:
        handler = self.handler
        # (the handler's _latest() inline: one frame fewer per level)
        if not self.closed and (handler._pending or handler._current) is self:
            self.parent.request_reresolution()

    def close(self) -> None:
        self.closed = True
        if self.policy is not None:
            self.policy.shutdown()
            self.policy = None


class ChildPolicyHandler(LoadBalancer):
    """Owns one child policy, switching gracefully when its name changes."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._current: _ChildSlot | None = None
        self._pending: _ChildSlot | None = None

    # -- introspection -------------------------------------------------
    @property
    def policy_name(self) -> str | None:
        slot = self._pending or self._current
        return slot.name if slot else None

    @property
    def child(self) -> LoadBalancer | None:
        """The current child policy (for tests and config dumps)."""
        return self._current.policy if self._current else None

    # -- LoadBalancer --------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        selection = update.config
        if not isinstance(selection, PolicySelection):
            raise TypeError("ChildPolicyHandler.update needs config=PolicySelection")
        child_update = update.replace(config=selection.config)
        target = self._slot_for(selection)
        assert target.policy is not None
        return target.policy.update(child_update)

    def resolver_error(self, status: Status) -> None:
        slot = self._latest()
        if slot is not None and slot.policy is not None:
            slot.policy.resolver_error(status)

    def exit_idle(self) -> None:
        slot = self._latest()
        if slot is not None and slot.policy is not None:
            slot.policy.exit_idle()

    def reset_backoff(self) -> None:
        for slot in self._slots():
            if slot.policy is not None:
                slot.policy.reset_backoff()

    def shutdown(self) -> None:
        for slot in self._slots():
            slot.close()
        self._current = self._pending = None

    # -- internals -----------------------------------------------------
    def _latest(self) -> _ChildSlot | None:
        return self._pending or self._current

    def _slots(self) -> list[_ChildSlot]:
        return [s for s in (self._current, self._pending) if s is not None]

    def _slot_for(self, selection: PolicySelection) -> _ChildSlot:
        if self._current is None:
            slot = self._current = _ChildSlot(self, selection.name)
            slot.policy = selection.factory.build(slot)
            return slot
        if self._current.name == selection.name:
            if self._pending is not None:
                self._pending.close()
                self._pending = None
            return self._current
        if self._pending is not None and self._pending.name == selection.name:
            return self._pending
        if self._pending is not None:
            self._pending.close()
        slot = self._pending = _ChildSlot(self, selection.name)
        slot.policy = selection.factory.build(slot)
        if self._current.state is not ConnectivityState.READY:
            self._swap()
        return slot

    def _child_reported(self, slot: _ChildSlot) -> None:
        if slot is self._current:
            if self._pending is not None and slot.state is not ConnectivityState.READY:
                # Publish the pending child's state even if it has not reported
                # yet (CONNECTING, queue): the current child's READY picker is
                # about to die with it.
                self._swap(publish_unreported=True)
                return
            self.helper.update_state(slot.state, slot.status, slot.picker)
        elif slot is self._pending and (
            slot.state is not ConnectivityState.CONNECTING
            or self._current is None
            or self._current.state is not ConnectivityState.READY
        ):
            self._swap()

    def _swap(self, publish_unreported: bool = False) -> None:
        pending = self._pending
        if pending is None:
            return
        old = self._current
        self._current, self._pending = pending, None
        if old is not None:
            old.close()
        if pending.reported or publish_unreported:
            self.helper.update_state(pending.state, pending.status, pending.picker)


def on_state_callback(
    fn: Callable[[ConnectivityState, Status, Picker], None], parent: Helper
) -> DelegatingHelper:
    """A helper whose ``update_state`` calls ``fn`` instead of the parent's."""

    class _Helper(DelegatingHelper):
        def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
            fn(state, status, picker)

    return _Helper(parent)


class OneChildPolicy(LoadBalancer):
    """The part of a policy over one :class:`ChildPolicyHandler` (``_child``)
    that only passes on: outlier_detection, xds_cluster_impl and
    xds_override_host, as C-core's.  Before its first config (``_config``
    None) there is no child to ask: a resolver error is the policy's own
    TRANSIENT_FAILURE with the error's status."""

    helper: Helper
    _child: ChildPolicyHandler
    _config: object | None

    @property
    def child(self) -> LoadBalancer | None:
        """The child policy now (for tests and config dumps)."""
        return self._child.child

    def resolver_error(self, status: Status) -> None:
        if self._config is None:
            self.helper.update_state(
                ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status)
            )
            return
        self._child.resolver_error(status)

    def exit_idle(self) -> None:
        self._child.exit_idle()

    def reset_backoff(self) -> None:
        self._child.reset_backoff()
