"""The ``round_robin`` LB policy (gRPC's load-balancing doc, "round_robin";
A61 for endpoint handling; A62 for sticky TRANSIENT_FAILURE).

Config: ``{}`` (unknown fields are ignored).

Rules
=====

* One subchannel per address, every address of every endpoint, duplicates
  once.  (C-core gives each *endpoint* a pick_first child; pyxds treats each
  address of a multi-address endpoint as its own backend.  Resolvers in
  pyxds hand round_robin single-address endpoints, except dual-stack EDS,
  where this spreads load over both families of the backend.)
* Every subchannel is kept connected: an IDLE subchannel (initially, after
  its backoff ended, or after a READY connection dropped) is asked to
  connect at once (TRAPS.md, grpc-node#2667).
* A subchannel reporting TRANSIENT_FAILURE, or dropping from READY, requests
  re-resolution.
* Each subchannel is *failing* from its first TRANSIENT_FAILURE until it is
  READY again (its reconnect attempts in between do not count as
  CONNECTING), as C-core's pick_first children are sticky.
* Aggregate state: READY if any subchannel is READY; else CONNECTING if any
  subchannel is IDLE or CONNECTING and not failing; else TRANSIENT_FAILURE,
  with UNAVAILABLE "connections to all backends failing; last error: <last
  subchannel failure>".  Because a failing subchannel stays failing through
  its reconnect attempts, once TRANSIENT_FAILURE is reported it stays until
  a subchannel is READY (sticky, A62) -- only a subchannel that has not
  failed yet (a new address in an update) can bring back CONNECTING, as in
  C-core.
* The READY picker rotates over the READY subchannels from a random start
  (``helper.random``); it is a precomputed tuple of PickComplete results
  behind ``itertools.cycle``, so a pick is one C call.
* An update keeps the subchannels of unchanged addresses; the same list
  twice changes nothing and reports nothing.  A state is reported only when
  it (or its picker's READY set, or its error) changed.
* An empty list is rejected: TRANSIENT_FAILURE "empty address list",
  re-resolution requested, and the status returned from ``update``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    LoadBalancer,
    PickArgs,
    PickComplete,
    Picker,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
)
from pyxds.lb.errors import LBConfigError, describe
from pyxds.lb.subchannel_list import SubchannelEntry, unique_addresses

__all__ = ["POLICY_NAME", "RoundRobin", "RoundRobinConfig", "RoundRobinFactory"]

POLICY_NAME = "round_robin"

_IDLE = ConnectivityState.IDLE
_CONNECTING = ConnectivityState.CONNECTING
_READY = ConnectivityState.READY
_TF = ConnectivityState.TRANSIENT_FAILURE
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@dataclass(frozen=True)
class RoundRobinConfig:
    """round_robin has no settings; all its configs are equal."""


class RoundRobinFactory(PolicyFactory):
    name = POLICY_NAME

    def parse_config(self, json_config: Any) -> RoundRobinConfig:
        if json_config is not None and not isinstance(json_config, dict):
            raise LBConfigError("", f"expected object, got {describe(json_config)}")
        return RoundRobinConfig()

    def build(self, helper: Helper) -> RoundRobin:
        return RoundRobin(helper)


class RoundRobinPicker(Picker):
    """Rotates over precomputed results.  ``itertools.cycle.__next__`` is a
    single C call, atomic under the GIL, so concurrent picks stay fair."""

    __slots__ = ("_next", "results")

    def __init__(self, results: Sequence[PickComplete], start: int) -> None:
        self.results = tuple(results)
        rotated = self.results[start:] + self.results[:start]
        self._next = itertools.cycle(rotated).__next__

    def pick(self, args: PickArgs) -> PickResult:
        return self._next()

    def __repr__(self) -> str:
        return f"RoundRobinPicker({[r.subchannel.address for r in self.results]})"


class _Entry(SubchannelEntry):
    __slots__ = ("failing", "result")

    def __init__(self, *args: Any) -> None:
        self.failing = False
        super().__init__(*args)
        self.result = PickComplete(self.subchannel)


class RoundRobin(LoadBalancer):
    """round_robin over one subchannel per address (module docstring)."""

    def __init__(self, helper: Helper) -> None:
        self._helper = helper
        self._entries: dict[str, _Entry] = {}
        self._last_failure: Status = Status(_UNAVAILABLE, "no connection attempt yet")
        self._reported_key: tuple[Any, ...] | None = None
        self._shutdown = False
        self._updating = False

    @property
    def subchannels(self) -> list[Any]:
        return [entry.subchannel for entry in self._entries.values()]

    # -- LoadBalancer ------------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shutdown:
            return None
        if isinstance(update.endpoints, Status):
            self.resolver_error(update.endpoints)
            return update.endpoints
        pairs = unique_addresses(update.endpoints)
        if not pairs:
            note = update.resolution_note
            status = Status(
                _UNAVAILABLE, f"empty address list: {note}" if note else "empty address list"
            )
            self._drop(set())
            self._helper.request_reresolution()
            self._report(_TF, status, FailPicker(status), key=(_TF, status))
            return status
        wanted = {address for address, _ in pairs}
        self._drop(wanted)
        entries: dict[str, _Entry] = {}
        created: list[_Entry] = []
        for address, attributes in pairs:
            entry = self._entries.get(address)
            if entry is None:
                entry = _Entry(self._helper, address, attributes, self._on_subchannel_state)
                created.append(entry)
            entries[address] = entry
        self._entries = entries
        self._updating = True
        try:
            for entry in created:
                entry.activate()
                if entry.state is _TF:
                    entry.failing = True
                    self._last_failure = entry.status
                elif entry.state is _IDLE:
                    entry.subchannel.connect()
        finally:
            self._updating = False
        self._aggregate()
        return None

    def resolver_error(self, status: Status) -> None:
        if not self._shutdown and not self._entries:
            self._report(_TF, status, FailPicker(status), key=(_TF, status))

    def exit_idle(self) -> None:
        for entry in self._entries.values():
            if entry.state is _IDLE:
                entry.subchannel.connect()

    def reset_backoff(self) -> None:
        for entry in self._entries.values():
            entry.subchannel.reset_backoff()

    def shutdown(self) -> None:
        self._shutdown = True
        self._drop(set())

    # -- events --------------------------------------------------------------
    def _on_subchannel_state(
        self, entry: SubchannelEntry, prev: ConnectivityState, status: Status
    ) -> None:
        assert isinstance(entry, _Entry)
        state = entry.state
        if state is _READY:
            entry.failing = False
        elif state is _TF:
            entry.failing = True
            self._last_failure = status
            self._helper.request_reresolution()
        elif state is _IDLE:
            if prev is _READY:
                self._helper.request_reresolution()
            entry.subchannel.connect()
        if not self._updating:
            self._aggregate()

    def _aggregate(self) -> None:
        entries = self._entries.values()
        ready = [entry for entry in entries if entry.state is _READY]
        if ready:
            key = (_READY, *(entry.subchannel for entry in ready))
            if key != self._reported_key:
                start = self._helper.random.randrange(len(ready))
                picker = RoundRobinPicker([entry.result for entry in ready], start)
                self._report(_READY, OK_STATUS, picker, key)
            return
        connecting = any(
            entry.state in (_IDLE, _CONNECTING) and not entry.failing for entry in entries
        )
        if connecting:
            self._report(_CONNECTING, OK_STATUS, QueuePicker(), key=(_CONNECTING,))
            return
        status = Status(
            _UNAVAILABLE,
            f"connections to all backends failing; last error: {self._last_failure}",
        )
        self._report(_TF, status, FailPicker(status), key=(_TF, status))

    # -- plumbing -------------------------------------------------------------
    def _drop(self, keep: set[str]) -> None:
        for address in [a for a in self._entries if a not in keep]:
            self._entries.pop(address).shutdown()

    def _report(
        self, state: ConnectivityState, status: Status, picker: Picker, key: tuple[Any, ...]
    ) -> None:
        if key == self._reported_key:
            return
        self._reported_key = key
        self._helper.update_state(state, status, picker)


registry.register(RoundRobinFactory())
