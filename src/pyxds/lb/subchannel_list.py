"""Subchannel bookkeeping for leaf policies (pick_first; round_robin and
other petiole policies delegate to pick_first per endpoint, A61).

* :func:`unique_addresses` flattens an endpoint list into ``(address,
  attributes)`` pairs, first occurrence wins (A61 "Address List Handling in
  pick_first", step 2; duplicates are connected once).
* :class:`SubchannelEntry` wraps one subchannel a policy owns: it remembers
  the last state and status the subchannel reported and forwards every later
  report to the policy's handler.  Reports arriving while the policy is still
  building its list (``watch_state`` reports the current state at once) are
  recorded but not forwarded until :meth:`SubchannelEntry.activate`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyxds.lb.api import OK_STATUS, ConnectivityState, Endpoint, Helper, Status, Subchannel

__all__ = ["SubchannelEntry", "unique_addresses"]


def unique_addresses(endpoints: Iterable[Endpoint]) -> list[tuple[str, Mapping[str, Any]]]:
    """Every address of every endpoint, in order, each once (first occurrence
    wins, with its endpoint's attributes)."""
    seen: set[str] = set()
    out: list[tuple[str, Mapping[str, Any]]] = []
    for endpoint in endpoints:
        for address in endpoint.addresses:
            if address not in seen:
                seen.add(address)
                out.append((address, endpoint.attributes))
    return out


StateHandler = Callable[["SubchannelEntry", ConnectivityState, Status], None]


class SubchannelEntry:
    """One owned subchannel plus its last reported connectivity.

    ``state`` starts as whatever the subchannel reports when watched (the
    watch reports the current state at once).  ``on_state(entry, prev_state,
    status)`` runs for every later report once :meth:`activate` was called;
    it sees the new state in ``entry.state``.  After :meth:`shutdown` nothing
    is forwarded.
    """

    __slots__ = (
        "address",
        "subchannel",
        "state",
        "status",
        "_handler",
        "_active",
        "_closed",
        "_unwatch",
    )

    def __init__(
        self, helper: Helper, address: str, attributes: Mapping[str, Any], on_state: StateHandler
    ) -> None:
        self.address = address
        self.state = ConnectivityState.IDLE
        self.status = OK_STATUS
        self._handler = on_state
        self._active = False
        self._closed = False
        self._unwatch: Callable[[], None] | None = None
        self.subchannel: Subchannel = helper.create_subchannel(address, attributes)
        self._unwatch = self.subchannel.watch_state(self)

    @property
    def live(self) -> bool:
        return not self._closed

    def activate(self) -> None:
        """Start forwarding reports to the handler."""
        self._active = True

    def __call__(self, state: ConnectivityState, status: Status) -> None:
        """The subchannel's report (the entry is its watcher: no bound
        method per endpoint, issue 18)."""
        if self._closed:
            return  # shut down: late reports are dropped
        prev = self.state
        self.state = state
        self.status = status
        if self._active:
            self._handler(self, prev, status)

    def shutdown(self) -> None:
        """Stop watching and shut the subchannel down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        self.subchannel.shutdown()

    def __repr__(self) -> str:
        return f"SubchannelEntry({self.address!r}, {self.state.name})"
