"""The ``round_robin`` LB policy (gRPC's load-balancing doc, "round_robin";
A61 "Use pick_first as the Universal Leaf Policy"; A62 sticky
TRANSIENT_FAILURE), with C-core's aggregation rules and error text.

Config: ``{}`` (unknown fields are ignored).

Rules
=====

* One child per *endpoint* (A61): a :class:`~pyxds.lb.pick_first.PickFirst`
  given that endpoint alone, so a dual-stack endpoint is one backend that
  holds one connection (happy eyeballs over its addresses), never one share
  of the load per address.  An address that already appeared in an earlier
  endpoint is dropped from later ones (an endpoint left without addresses
  is dropped), so every address is connected once.
* Children are kept across updates: an endpoint with the same set of
  addresses keeps its child (and its connection); an endpoint whose set
  changed keeps the child of an old endpoint it shares an address with, and
  that child gets the new list (pick_first keeps a connection whose address
  is still listed).  The same list twice changes nothing and reports nothing.
* Children are updated (and so start connecting) from a random endpoint
  onwards, as C-core does, so clients sharing a list spread their first
  connections.
* Every child is kept connected: a child reporting IDLE (its connection
  dropped) is told to ``exit_idle`` at once (TRAPS.md, grpc-node#2667).
  Re-resolution requests come from the children (pick_first asks when all
  of an endpoint's addresses failed and when a connection drops).
* Aggregate state (first rule that matches): READY if any child is READY;
  CONNECTING if any child is CONNECTING or IDLE; else (all children in
  TRANSIENT_FAILURE) TRANSIENT_FAILURE with UNAVAILABLE "connections to all
  backends failing; last error: <the last child failure>", C-core's words.
  Children are pick_first, whose TRANSIENT_FAILURE is sticky, so once
  round_robin reports TRANSIENT_FAILURE it stays there until a child is
  READY or a new endpoint arrives (A62).
* The READY picker rotates over the READY children from a random start
  (``helper.random``).  A pick_first child's READY picker returns one
  constant result, so the round_robin picker is a precomputed tuple of
  PickComplete results behind ``itertools.cycle``: a pick is one C call.
* Children of removed endpoints are shut down at once, except while the
  new list has no READY endpoint: then (as C-core's pending endpoint list)
  the removed READY children keep serving until a new endpoint is READY,
  every new endpoint is in TRANSIENT_FAILURE, or no old one is READY any
  more; they are then shut down.  They are never reconnected.
* An empty list is rejected: TRANSIENT_FAILURE "empty address list" and the
  status returned from ``update`` (the caller re-resolves).  A resolver
  error is reported only before the first address list (an empty one
  included): after that the last list stays in use (C-core).
* A state is reported only when it (or its picker's READY set, or its
  error) changed.

Cost (issue 18: 1000 endpoints connecting report 1000 READYs): a child's
report updates counts of children per state and the READY children's
pickers (kept in endpoint order; a bisect on the endpoint index, a C-level
insert) instead of scanning every child, and a version number bumped on
every change of those pickers keys the published READY picker (not a tuple
of N pickers built and compared per report).  A report costs O(log N)
Python steps plus the C-level copy of the READY results into the new
picker, not O(N) Python steps.  An update rebuilds them (it is O(N)
anyway), except an update whose list is the very same endpoint objects as
the last one (what weighted_target passes each unchanged locality of an
EDS update, see :func:`pyxds.lb.hierarchy.split`): that one is checked by
identity in C and changes nothing.  The published states, pickers and their order are exactly those
of a full recount (tests/unit/test_round_robin_bookkeeping.py).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import grpc

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    Endpoint,
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
    address_set,
)
from pyxds.lb.child_handler import DelegatingHelper
from pyxds.lb.errors import LBConfigError, describe
from pyxds.lb.pick_first import PickFirst, PickFirstConfig, all_ready_pickers, constant_result

__all__ = [
    "POLICY_NAME",
    "RoundRobin",
    "RoundRobinConfig",
    "RoundRobinFactory",
    "RoundRobinPicker",
]

POLICY_NAME = "round_robin"

_IDLE = ConnectivityState.IDLE
_CONNECTING = ConnectivityState.CONNECTING
_READY = ConnectivityState.READY
_TF = ConnectivityState.TRANSIENT_FAILURE
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_CHILD_CONFIG = PickFirstConfig()


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

    __slots__ = ("_cycle", "_next", "results")

    def __init__(self, results: Sequence[PickComplete], start: int) -> None:
        self.results = tuple(results)
        rotated = self.results[start:] + self.results[:start]
        self._cycle = itertools.cycle(rotated)
        self._next = self._cycle.__next__

    def pick(self, args: PickArgs) -> PickResult:
        return self._next()

    def result_stream(self) -> Iterator[PickResult]:
        return self._cycle

    def __repr__(self) -> str:
        return f"RoundRobinPicker({[r.subchannel.address for r in self.results]})"


class _DelegatingRoundRobinPicker(Picker):
    """Rotates over child pickers (used only if a child's READY picker is not
    pick_first's constant one, e.g. a custom leaf)."""

    __slots__ = ("_next", "pickers")

    def __init__(self, pickers: Sequence[Picker], start: int) -> None:
        self.pickers = tuple(pickers)
        rotated = self.pickers[start:] + self.pickers[:start]
        self._next = itertools.cycle(rotated).__next__

    def pick(self, args: PickArgs) -> PickResult:
        return self._next().pick(args)


#: a child's picker until it reports (never published: shared, stateless)
_UNREPORTED = QueuePicker()


class _Child(DelegatingHelper):
    """One endpoint: its pick_first policy and what that policy last reported.
    It is also the helper that policy sees."""

    def __init__(self, owner: RoundRobin, addresses: frozenset[str]) -> None:
        super().__init__(owner.helper)
        self.owner = owner
        self.addresses = addresses
        #: position in the current endpoint list (-1: removed, maybe draining)
        self.index = -1
        self.state = _CONNECTING  # until the child reports
        self.status = OK_STATUS
        self.picker: Picker = _UNREPORTED  # until the child reports
        self.closed = False
        # what the child was last given, to skip unchanged ones (not the
        # ResolverUpdate: two objects fewer per endpoint, issue 18)
        self.last_endpoint: Endpoint | None = None
        self.last_note = ""
        self.policy = PickFirst(self, omit_status_prefix=True, health_watch=True)

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if not self.closed:
            self.owner._on_child_state(self, state, status, picker)

    def request_reresolution(self) -> None:
        if not self.closed:
            self.parent.request_reresolution()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.policy.shutdown()

    def __repr__(self) -> str:
        return f"_Child({sorted(self.addresses)}, {self.state.name})"


def _unique_endpoints(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """Each address once (first endpoint that lists it wins); endpoints left
    without an address are dropped."""
    seen: set[str] = set()
    out: list[Endpoint] = []
    for endpoint in endpoints:
        kept = tuple(a for a in dict.fromkeys(endpoint.addresses) if a not in seen)
        if not kept:
            continue
        seen.update(kept)
        out.append(endpoint if kept == endpoint.addresses else Endpoint(kept, endpoint.attributes))
    return out


class RoundRobin(LoadBalancer):
    """round_robin over one pick_first child per endpoint (module docstring)."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._children: dict[frozenset[str], _Child] = {}
        # Removed children still serving while the new list connects.
        self._draining: list[_Child] = []
        self._last_failure = "no connection attempt yet"
        self._reported_key: tuple[Any, ...] | None = None
        self._shutdown = False
        self._updating = False
        self._has_list = False  # an address list (even empty) was applied
        #: the last non-empty list applied, as given, and its note
        self._last_list: Sequence[Endpoint] | None = None
        self._last_note = ""
        # Kept per report (module docstring "Cost"), over the current children:
        self._ready_count = 0
        self._tf_count = 0
        #: endpoint indices of the READY children, ascending; the children,
        #: their pickers and pick results (None: not pick_first's constant
        #: picker) alongside
        self._ready_at: list[int] = []
        self._ready_children: list[_Child] = []
        self._ready_pickers: list[Picker] = []
        self._ready_results: list[PickComplete | None] = []
        self._non_constant = 0  # READY pickers that are not pick_first's constant one
        #: bumped whenever the READY pickers change: the key of a report over
        #: them, instead of a tuple of N pickers built and compared per report
        self._ready_version = 0

    # -- introspection (tests, config dumps) -----------------------------------
    @property
    def subchannels(self) -> list[Any]:
        """Every subchannel held by the current children, endpoint order
        (then those of removed endpoints still serving)."""
        return [sc for child in self.children for sc in child.policy.subchannels]

    @property
    def children(self) -> list[_Child]:
        """The current children, then removed ones still serving."""
        return [*self._children.values(), *self._draining]

    # -- LoadBalancer ------------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shutdown:
            return None
        if isinstance(update.endpoints, Status):
            self.resolver_error(update.endpoints)
            return update.endpoints
        previous = self._last_list
        if (
            previous is not None
            and len(previous) == len(update.endpoints)
            and all(map(operator.is_, previous, update.endpoints))
            and self._last_note == update.resolution_note
        ):
            # The very endpoint objects of the last update (an unchanged
            # locality of an EDS update, module docstring "Cost"): every
            # child would be skipped, the counts and the report would be the
            # same; only the random start is drawn, as the full path does.
            self.helper.random.randrange(len(self._children))
            return None
        self._last_list = None
        endpoints = _unique_endpoints(update.endpoints)
        self._has_list = True
        if not endpoints:
            note = update.resolution_note
            status = Status(
                _UNAVAILABLE, f"empty address list: {note}" if note else "empty address list"
            )
            for child in [*self._children.values(), *self._draining]:
                child.close()
            self._children = {}
            self._draining = []
            self._recount()
            self._report(_TF, status, FailPicker(status), key=(_TF, status))
            return status
        # Removed children still serving may be listed again: they are old
        # children like the others.
        old = dict(self._children)
        for child in self._draining:
            old.setdefault(child.addresses, child)
        self._draining = []
        children = self._match_children(endpoints, old)
        kept = {id(child) for child in children.values()}
        removed = [child for child in old.values() if id(child) not in kept]
        # Removed READY children may keep serving (see _settle_draining).
        self._draining += [child for child in removed if child.state is _READY]
        for child in removed:
            child.index = -1
            if child.state is not _READY:
                child.close()
        self._children = children
        for index, child in enumerate(children.values()):
            child.index = index
        pairs = list(zip(endpoints, children.values(), strict=True))
        # C-core EndpointList: start connecting from a random endpoint, so
        # that clients given the same list do not all hit the first one.
        start = self.helper.random.randrange(len(pairs))
        self._updating = True
        try:
            for endpoint, child in pairs[start:] + pairs[:start]:
                last = child.last_endpoint
                if (
                    last is not None
                    and (last is endpoint or last == endpoint)
                    and child.last_note == update.resolution_note
                ):
                    # Unchanged endpoint: nothing for its pick_first child to
                    # do (pick_first reads no update attributes, so a new
                    # xds_config attribute alone does not reach 10k children).
                    continue
                child.last_endpoint = endpoint
                child.last_note = update.resolution_note
                child.policy.update(
                    ResolverUpdate(
                        (endpoint,), _CHILD_CONFIG, update.attributes, update.resolution_note
                    )
                )
        finally:
            self._updating = False
            self._recount()
        self._aggregate()
        self._last_list = update.endpoints
        self._last_note = update.resolution_note
        return None

    def resolver_error(self, status: Status) -> None:
        if not self._shutdown and not self._has_list:
            self._report(_TF, status, FailPicker(status), key=(_TF, status))

    def exit_idle(self) -> None:
        for child in list(self._children.values()):
            if child.state is _IDLE:
                child.policy.exit_idle()

    def reset_backoff(self) -> None:
        for child in [*self._children.values(), *self._draining]:
            child.policy.reset_backoff()

    def shutdown(self) -> None:
        self._shutdown = True
        for child in [*self._children.values(), *self._draining]:
            child.close()
        self._children = {}
        self._draining = []
        self._recount()

    # -- updates -----------------------------------------------------------------
    def _match_children(
        self, endpoints: Sequence[Endpoint], old: Mapping[frozenset[str], _Child]
    ) -> dict[frozenset[str], _Child]:
        """New endpoint -> child: same address set first, then an unused old
        child sharing an address, else a new child."""
        keys = [address_set(endpoint) for endpoint in endpoints]
        wanted = set(keys)
        unused = {key: child for key, child in old.items() if key not in wanted}
        by_address = {address: key for key in unused for address in key}
        children: dict[frozenset[str], _Child] = {}
        for key in keys:
            child = old.get(key)
            if child is None:
                for address in key:
                    old_key = by_address.get(address)
                    if old_key is not None and old_key in unused:
                        child = unused.pop(old_key)
                        child.addresses = key
                        break
            if child is None:
                child = _Child(self, key)
            children[key] = child
        return children

    # -- events --------------------------------------------------------------
    def _on_child_state(
        self, child: _Child, state: ConnectivityState, status: Status, picker: Picker
    ) -> None:
        if (
            state is _TF
            and child.state is _TF
            and child.index >= 0
            and (self._ready_count or self._tf_count < len(self._children))
            and not self._draining
            and not self._updating
        ):
            # A failing child fails again (pick_first re-reports after every
            # failed attempt) while the aggregate is READY or CONNECTING: the
            # counts, the READY set and so the report are those of the last
            # aggregation (only an all-failing aggregate names the failure).
            child.status, child.picker = status, picker
            self._last_failure = status.details
            return
        if child.index >= 0 and not self._updating:
            self._count(child, state, picker)
        child.state, child.status, child.picker = state, status, picker
        if child.index < 0:
            if child in self._draining and state is not _READY:
                # an old endpoint is never reconnected
                self._draining.remove(child)
                child.close()
            if not self._updating and not self._shutdown:
                self._aggregate()
            return
        if state is _TF:
            self._last_failure = status.details
        if state is _IDLE:
            child.policy.exit_idle()  # reconnect at once; may report again (nested)
        if not self._updating and not self._shutdown:
            self._aggregate()

    # -- bookkeeping (module docstring "Cost") -----------------------------------
    def _count(self, child: _Child, state: ConnectivityState, picker: Picker) -> None:
        """Move a current child from its recorded state and picker to
        ``state`` and ``picker`` in the counts and the READY lists."""
        old = child.state
        if old is _READY and state is _READY and picker is child.picker:
            return  # the same picker again: nothing changed
        if old is _READY:
            self._ready_count -= 1
            self._unlist(child)
        elif old is _TF:
            self._tf_count -= 1
        if state is _READY:
            self._ready_count += 1
            self._list(child, picker)
        elif state is _TF:
            self._tf_count += 1

    def _ready_result(self, child: _Child, picker: Picker) -> PickComplete | None:
        """What the READY picker rotates over for ``child`` READY with
        ``picker``: pick_first's constant result, None when ``picker`` is not
        pick_first's constant one (weighted_round_robin adds its hooks)."""
        return constant_result(picker)

    def _list(self, child: _Child, picker: Picker) -> None:
        at = bisect.bisect_left(self._ready_at, child.index)
        result = self._ready_result(child, picker)
        self._ready_at.insert(at, child.index)
        self._ready_children.insert(at, child)
        self._ready_pickers.insert(at, picker)
        self._ready_results.insert(at, result)
        if result is None:
            self._non_constant += 1
        self._ready_version += 1

    def _unlist(self, child: _Child) -> None:
        at = bisect.bisect_left(self._ready_at, child.index)
        del self._ready_at[at]
        del self._ready_children[at]
        del self._ready_pickers[at]
        if self._ready_results.pop(at) is None:
            self._non_constant -= 1
        self._ready_version += 1

    def _recount(self) -> None:
        """Rebuild the counts and READY lists from the current children (the
        version changes only if the READY pickers did)."""
        before = self._ready_pickers
        self._ready_count = self._tf_count = self._non_constant = 0
        self._ready_at, self._ready_children = [], []
        self._ready_pickers, self._ready_results = [], []
        for child in self._children.values():
            state = child.state
            if state is _READY:
                self._ready_count += 1
                self._ready_at.append(child.index)
                self._ready_children.append(child)
                self._ready_pickers.append(child.picker)
                result = self._ready_result(child, child.picker)
                self._ready_results.append(result)
                if result is None:
                    self._non_constant += 1
            elif state is _TF:
                self._tf_count += 1
        if self._ready_pickers != before:
            if self._reported_key == (_READY, self._ready_version):
                # published over the old pickers: remember them as they were
                self._reported_key = (_READY, None, *before)
            self._ready_version += 1

    def _settle_draining(self) -> list[_Child]:
        """C-core's rule for swapping in the pending endpoint list: the old
        READY children keep serving until a new child is READY, every new
        child is in TRANSIENT_FAILURE, or none of them is READY any more.
        Returns the old children still serving."""
        if not self._draining:
            return []
        if self._ready_count or self._tf_count == len(self._children):
            for child in self._draining:
                child.close()
            self._draining = []
        return [child for child in self._draining if child.state is _READY]

    def _aggregate(self) -> None:
        serving = self._settle_draining()
        if serving:
            self._report_ready(serving)
            return
        if self._ready_count:
            self._report_ready(self._ready_children)
            return
        if self._tf_count < len(self._children):  # some child CONNECTING or IDLE
            self._report(_CONNECTING, OK_STATUS, QueuePicker(), key=(_CONNECTING,))
            return
        status = Status(
            _UNAVAILABLE, f"connections to all backends failing; last error: {self._last_failure}"
        )
        self._report(_TF, status, FailPicker(status), key=(_TF, status))

    def _report_ready(self, ready: list[_Child]) -> None:
        """Publish the READY picker over ``ready`` (unless it is the one
        published already).  The current READY children come with their
        pickers and results listed already (``_ready_children``)."""
        listed = ready is self._ready_children
        pickers = self._ready_pickers if listed else [child.picker for child in ready]
        # Keys: the current READY pickers by their version (the same version,
        # the same pickers), other pickers by themselves (_READY, None, *them).
        current = (_READY, self._ready_version)
        reported = self._reported_key
        if listed:
            key: tuple[Any, ...] = current
            # the same pickers as published by themselves (e.g. re-listed
            # after draining): nothing to publish
            if (
                reported is not None
                and reported[:2] == (_READY, None)
                and list(reported[2:]) == pickers
            ):
                self._reported_key = key
                return
        else:  # removed children serving: no current child is READY
            key = (_READY, None, *pickers)
        if key == reported:
            return
        start = self.helper.random.randrange(len(pickers))
        picker: Picker
        if listed and not self._non_constant:
            picker = RoundRobinPicker(cast("list[PickComplete]", self._ready_results), start)
        elif not listed and all_ready_pickers(pickers):
            picker = RoundRobinPicker([p.result for p in pickers], start)
        else:
            picker = _DelegatingRoundRobinPicker(pickers, start)
        self._report(_READY, OK_STATUS, picker, key)

    # -- plumbing -------------------------------------------------------------
    def _report(
        self, state: ConnectivityState, status: Status, picker: Picker, key: tuple[Any, ...]
    ) -> None:
        if key == self._reported_key:
            return
        self._reported_key = key
        self.helper.update_state(state, status, picker)


registry.register(RoundRobinFactory())
