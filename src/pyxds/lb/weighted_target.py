"""``weighted_target_experimental``: weighted random picking among children
(gRFC A28 "Weighted target LB policy"; the locality level of A56's tree).

Theory of operation:

Config
    ``targets`` maps a name to ``weight`` (uint32 >= 1) and ``childPolicy`` (a
    ``loadBalancingConfig`` list).  Names let an update reach the existing
    child instead of recreating it; the xDS layer makes names unique per
    (priority, locality).

Children
    Every target gets a child at once (eagerly).  A weight-only change
    rebuilds the picker and nothing else.  A target dropped from the config
    is *deactivated*: it no longer counts for the aggregate state or picks,
    and a ``CHILD_RETENTION`` (15 min) timer destroys it; re-adding the
    name before then reactivates and reuses it.

Updates
    A parent update updates (or creates, or deactivates) every child first;
    child reports arriving meanwhile are recorded but not aggregated.  The
    state is aggregated exactly once afterwards, so a locality that is
    momentarily empty mid-update never turns the whole policy
    TRANSIENT_FAILURE (grpc#22831).

Child states (as C-core)
    A child that reported TRANSIENT_FAILURE keeps counting as
    TRANSIENT_FAILURE (with its last failing picker and status) until it
    reports READY; its CONNECTING or IDLE in between do not count.  A child
    reporting IDLE is told to exit idle at once, from inside its report (as
    C-core does), right after its IDLE was aggregated: a report the child
    makes from inside ``exit_idle`` (say CONNECTING) is then the newest one
    and is aggregated last.

Aggregate (over active children)
    READY if any child is READY; else CONNECTING if any is CONNECTING; else
    IDLE if any is IDLE; else TRANSIENT_FAILURE.  Pickers: READY picks among
    the READY children only, weighted by config weight (cumulative weights
    and a bisect, O(log n), made O(1) by a bucket table that is built once
    per weights, not on every child report; a single READY child publishes
    its own picker);
    CONNECTING and IDLE queue; TRANSIENT_FAILURE picks among the failing
    children by weight, so an RPC fails with that child's own error.  No
    active child at all: "no children in weighted_target policy: <note>".
    The same aggregate twice (state, status, weights and child picker
    objects) is not re-published: the same update twice is a no-op.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    PickArgs,
    Picker,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper
from pyxds.lb.errors import LBConfigError, expect_object, expect_uint32, key_path
from pyxds.lb.registry import PolicySelection
from pyxds.lb.timer_slot import TimerSlot

__all__ = [
    "CHILD_RETENTION",
    "POLICY_NAME",
    "WeightedPicker",
    "WeightedTarget",
    "WeightedTargetConfig",
    "WeightedTargetFactory",
    "WeightedTargetLoadBalancer",
]

POLICY_NAME = "weighted_target_experimental"

CHILD_RETENTION = 900.0
"""A28: "When a child policy is removed, it will be cached for 15 minutes"."""

_READY = ConnectivityState.READY
_IDLE = ConnectivityState.IDLE
_CONNECTING = ConnectivityState.CONNECTING
_TF = ConnectivityState.TRANSIENT_FAILURE


# --------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightedTarget:
    """One target: its weight (>= 1) and child policy."""

    weight: int
    child_policy: PolicySelection

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, int):
            raise LBConfigError("weight", f"expected integer, got {self.weight!r}")
        if not 1 <= self.weight <= 0xFFFFFFFF:
            raise LBConfigError("weight", f"expected integer in [1, 4294967295], got {self.weight}")


@dataclass(frozen=True)
class WeightedTargetConfig:
    """Parsed ``weighted_target_experimental`` config (frozen, structural equality)."""

    targets: Mapping[str, WeightedTarget] = field(default_factory=lambda: EMPTY_ATTRIBUTES)

    def __post_init__(self) -> None:
        if not isinstance(self.targets, MappingProxyType):
            object.__setattr__(self, "targets", MappingProxyType(dict(self.targets)))

    def __hash__(self) -> int:
        return hash(tuple(sorted((name, t.weight) for name, t in self.targets.items())))


def parse_weighted_target_config(json_config: Any) -> WeightedTargetConfig:
    """Validate the JSON config; errors name the field relative to this
    policy's config object."""
    obj = expect_object(json_config, "")
    if "targets" not in obj:
        raise LBConfigError("targets", "required field missing")
    targets_json = expect_object(obj["targets"], "targets")
    targets: dict[str, WeightedTarget] = {}
    for name, target_json in targets_json.items():
        path = key_path("targets", name)
        target_obj = expect_object(target_json, path)
        weight = expect_uint32(target_obj, "weight", path, minimum=1)
        if "childPolicy" not in target_obj:
            raise LBConfigError(f"{path}.childPolicy", "required field missing")
        selection = registry.select_policy(target_obj["childPolicy"], f"{path}.childPolicy")
        targets[name] = WeightedTarget(weight, selection)
    return WeightedTargetConfig(targets)


# --------------------------------------------------------------------------
# Picker
# --------------------------------------------------------------------------


_BUCKETS_PER_CHILD = 64
_MAX_BUCKETS = 8192


class BucketIndex:
    """The draw of a child *index* for one weights sequence: the part of a
    :class:`WeightedPicker` that depends only on the weights, built once
    per weights and shared by every picker over them (issue 18).

    The draw ``u`` is uniform in [0, 1) and the child is the one whose slice
    of the cumulative weights (normalised to [0, 1]) holds ``u``: a bisect,
    O(log n).  To make the common case O(1), [0, 1) is cut into ``buckets``
    (a power of two, about 64 per child, at most 8192): a bucket lying
    inside one child's slice maps straight to that child, so a draw takes
    the bucket with ``getrandbits`` and only for a bucket that straddles a
    slice boundary draws the position inside it (``(j + random()) / B``)
    and bisects.  The result has exactly the distribution of the plain
    bisect.  Randomness comes from the helper's ``random.Random``.

    ``indices`` is an endless iterator of child indices composed from C
    iterators (``map`` over ``getrandbits``, the bucket table's
    ``__getitem__``, each bucket's own index iterator: ``repeat(c)`` inside
    one slice, a bisecting ``map`` for a straddling bucket): no Python frame
    per draw.  It holds no child picker, so a child's new picker needs no
    new table: a report that changes a READY child's picker but not the
    weights costs the new picker O(children), not O(buckets).  A draw at the
    very top of the range (a float rounding up to 1.0) yields ``n``, which
    pickers map to the last child.  Pickers sharing an index share its
    draws, exactly as they share the helper's ``random.Random``: each draw
    is independent of the others, and no picker's result depends on
    another's."""

    __slots__ = ("weights", "buckets", "rng", "indices")

    def __init__(self, weights: tuple[int, ...], rng: random.Random) -> None:
        if not weights:
            raise ValueError("WeightedPicker needs at least one child")
        total = sum(weights)
        if total <= 0:
            raise ValueError("WeightedPicker needs a positive total weight")
        self.weights = weights
        self.rng = rng
        bounds: list[float] = []
        running = 0
        for weight in weights:
            running += weight
            bounds.append(running / total)
        bounds[-1] = 1.0
        bits = (min(_MAX_BUCKETS, _BUCKETS_PER_CHILD * len(bounds)) - 1).bit_length()
        self.buckets = 1 << bits
        # Shared by every straddling bucket: one endless source of
        # rng.random() draws, the scale, the bisect.  A draw into a
        # straddling bucket advances the shared source once.
        randoms = iter(rng.random, None)
        scales = itertools.repeat(1.0 / self.buckets)
        child_index = functools.partial(bisect.bisect_right, bounds)

        def straddling(bucket: int) -> Iterator[int]:
            positions = map(
                operator.mul, map(operator.add, itertools.repeat(bucket), randoms), scales
            )
            return map(child_index, positions)

        inside = [itertools.repeat(index) for index in range(len(bounds))]
        table = _bucket_table(bounds, bits, inside, straddling)
        draws = map(rng.getrandbits, itertools.repeat(bits))
        self.indices: Iterator[int] = map(next, map(table.__getitem__, draws))

    def fits(self, weights: tuple[int, ...], rng: random.Random) -> bool:
        """Whether this index serves a picker over ``weights`` drawing from ``rng``."""
        return self.rng is rng and self.weights == weights


class WeightedPicker(Picker):
    """Weighted random choice among child pickers; the pick is then the
    chosen child's own pick.  The child is drawn by a :class:`BucketIndex`
    (O(1) but for a bucket holding a slice boundary), given or built here.

    Two ways to run it, chosen once per picker:

    * **streams** (``fast`` is true): when every child offers a
      :meth:`Picker.result_stream` (its picks do not depend on the RPC, as
      round_robin's and pick_first's READY pickers), the whole draw is
      composed from C-level iterators (the index draws, then the tuple of
      the children's streams' ``__getitem__``, then ``next``) and ``pick``
      is ``functools.partial(next, stream)``: no Python frame runs per pick,
      and this picker offers that stream to its own parent.
    * **calls**: otherwise ``pick`` calls the drawn child's ``pick``.

    The picker is immutable: its children's pickers are fixed when it is
    built; only the index's draws are shared with other pickers.
    """

    __slots__ = ("pick", "_stream", "_children", "index")
    # A per-instance function in a slot (a C partial): no Python frame of its
    # own per pick.  mypy reports any attribute standing in for a method.
    pick: Callable[[PickArgs], PickResult]  # type: ignore[assignment]  # slot for the method
    _stream: Iterator[PickResult] | None
    # the children's streams (streams) or pick methods (calls), by index;
    # the final entry repeats the last child (a draw at the very top)
    _children: tuple[Any, ...]
    index: BucketIndex

    def __init__(
        self,
        entries: Sequence[tuple[int, Picker]],
        rng: random.Random,
        index: BucketIndex | None = None,
    ) -> None:
        weights = tuple([weight for weight, _ in entries])
        if index is None or not index.fits(weights, rng):
            index = BucketIndex(weights, rng)
        self.index = index
        streams: list[Iterator[PickResult] | None] = [
            getattr(picker, "result_stream", _no_stream)() for _, picker in entries
        ]
        ready = [stream for stream in streams if stream is not None]
        if len(ready) == len(streams):
            # A draw at the very top of the range yields n: the last child again.
            self._start_stream((*ready, ready[-1]))
        else:
            picks = [picker.pick for _, picker in entries]
            self._start_calls((*picks, picks[-1]))

    def _start_stream(self, streams: tuple[Iterator[PickResult], ...]) -> None:
        self._children = streams
        self._stream = map(next, map(streams.__getitem__, self.index.indices))
        self.pick = functools.partial(next, self._stream)

    def _start_calls(self, picks: tuple[Callable[[PickArgs], PickResult], ...]) -> None:
        self._stream = None
        self._children = picks
        self.pick = functools.partial(_indexed_pick, picks, self.index.indices.__next__)

    def replacing(self, position: int, picker: Picker) -> WeightedPicker | None:
        """This picker with child ``position``'s picker replaced by
        ``picker`` (same weights, same index), in O(1) Python steps: what a
        new picker over the new entries would be.  ``None`` when that may
        run the other way (a streams picker and ``picker`` offers no stream,
        or a calls picker and ``picker`` offers one: whether every child
        would then offer one is not known here): the caller then builds one
        from its entries.  A calls picker (TRANSIENT_FAILURE children's, a
        failed connection attempt re-reported by one of them) stays one."""
        stream = getattr(picker, "result_stream", _no_stream)()
        streams = self._stream is not None
        if streams is (stream is None):
            return None
        item = stream if streams else picker.pick
        children = self._children
        last = len(children) - 2  # the final entry repeats the last child
        if position == last:
            items = (*children[:last], item, item)
        else:
            items = (*children[:position], item, *children[position + 1 :])
        new = WeightedPicker.__new__(WeightedPicker)
        new.index = self.index
        if streams:
            new._start_stream(items)
        else:
            new._start_calls(items)
        return new

    @property
    def weights(self) -> list[int]:
        """The children's weights, in order."""
        return list(self.index.weights)

    @property
    def buckets(self) -> int:
        return self.index.buckets

    @property
    def fast(self) -> bool:
        """Whether picks run as composed C iterators (see the class doc)."""
        return self._stream is not None

    def result_stream(self) -> Iterator[PickResult] | None:
        return self._stream

    def __repr__(self) -> str:
        return f"WeightedPicker(weights={self.weights})"


def _no_stream() -> None:
    return None


def _bucket_table(
    bounds: list[float],
    bits: int,
    children: Sequence[Any],
    straddling: Callable[[int], Any],
) -> tuple[Any, ...]:
    """Entry ``j`` serves bucket [j/B, (j+1)/B): the child whose slice holds
    the whole bucket, else ``straddling(j)``.

    Built a child at a time (list repetition, O(n) Python steps for B
    entries).  With B a power of two, ``j/B`` and ``bound*B`` are exact, so
    child ``c`` holds the buckets from ``ceil(bounds[c-1]*B)`` up to
    ``ceil(bounds[c]*B)``, the last of them straddling when ``bounds[c]*B``
    is not a whole number; several boundaries inside one bucket share its
    one straddling entry."""
    buckets = 1 << bits
    table: list[Any] = []
    last = len(bounds) - 1
    for index, bound in enumerate(bounds):
        edge = buckets if index == last else bound * buckets
        end = math.ceil(edge)
        straddles = end != edge
        pure_end = end - 1 if straddles else end
        if pure_end > len(table):
            table.extend([children[index]] * (pure_end - len(table)))
        if straddles and len(table) == end - 1:
            table.append(straddling(end - 1))
    return tuple(table)


def _indexed_pick(
    picks: tuple[Callable[[PickArgs], PickResult], ...],
    next_index: Callable[[], int],
    args: PickArgs,
) -> PickResult:
    return picks[next_index()](args)


# --------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------


class _TargetHelper(DelegatingHelper):
    def __init__(self, parent: Helper, policy: WeightedTargetLoadBalancer, target: _Target):
        super().__init__(parent)
        self._policy = policy
        self._target = target

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self._policy._on_child_state(self._target, state, status, picker)

    def request_reresolution(self) -> None:
        if not self._target.closed:
            self.parent.request_reresolution()


class _Target:
    """One child: its policy, weight, last raw report and aggregation view."""

    __slots__ = (
        "name",
        "handler",
        "weight",
        "raw_state",
        "state",
        "status",
        "picker",
        "retention_timer",
        "exiting_idle",
        "closed",
    )

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self.handler: ChildPolicyHandler | None = None
        self.weight = 0
        self.raw_state = _CONNECTING
        # What counts for aggregation (sticky TRANSIENT_FAILURE).
        self.state = _CONNECTING
        self.status = OK_STATUS
        self.picker: Picker = QueuePicker()
        self.retention_timer = TimerSlot(clock)
        self.exiting_idle = False
        self.closed = False

    @property
    def active(self) -> bool:
        return not self.retention_timer.pending and not self.closed

    @property
    def policy(self) -> LoadBalancer | None:
        return self.handler.child if self.handler is not None else None

    def __repr__(self) -> str:
        extra = "" if self.active else ", deactivated"
        return f"_Target({self.name!r}, w={self.weight}, {self.state.name}{extra})"


# --------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------


class WeightedTargetLoadBalancer(LoadBalancer):
    """``weighted_target_experimental`` (gRFC A28); see the module docstring."""

    def __init__(self, helper: Helper, *, child_retention: float = CHILD_RETENTION) -> None:
        self.helper = helper
        self.child_retention = child_retention
        self._config: WeightedTargetConfig | None = None
        self._children: dict[str, _Target] = {}
        self._active: list[_Target] = []
        self._note = ""
        self._updating = False
        self._reports_while_updating = 0
        self._last: tuple[ConnectivityState, Status, tuple[tuple[int, Picker], ...]] | None = None
        # the draw of a child index for the last weights published (see BucketIndex)
        self._index: BucketIndex | None = None
        # The last READY or TRANSIENT_FAILURE publish: each of its targets'
        # position in its entries, and the picker published (see _republish).
        self._positions: dict[_Target, int] = {}
        self._published: Picker | None = None
        self._shut_down = False

    @property
    def children(self) -> Mapping[str, _Target]:
        return MappingProxyType(self._children)

    # -- LoadBalancer -----------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shut_down:
            return None
        config = update.config
        if not isinstance(config, WeightedTargetConfig):
            return Status(
                grpc.StatusCode.UNAVAILABLE,
                f"{POLICY_NAME}: expected a WeightedTargetConfig, got {type(config).__name__}",
            )
        self._config = config
        self._note = update.resolution_note
        endpoints = update.endpoints
        split: dict[str, list[Endpoint]] | Status = (
            endpoints if isinstance(endpoints, Status) else hierarchy.split(endpoints)
        )
        errors: list[str] = []
        self._updating = True
        try:
            for name, target in list(self._children.items()):
                if name not in config.targets:
                    self._deactivate(target)
            for name, spec in config.targets.items():
                existing = self._children.get(name)
                if existing is None:
                    existing = self._create(name)
                else:
                    self._reactivate(existing)
                existing.weight = spec.weight
                child_endpoints: Sequence[Endpoint] | Status = (
                    split.get(name, ()) if not isinstance(split, Status) else split
                )
                assert existing.handler is not None
                status = existing.handler.update(
                    ResolverUpdate(
                        endpoints=child_endpoints,
                        config=spec.child_policy,
                        attributes=update.attributes,
                        resolution_note=update.resolution_note,
                    )
                )
                if status is not None:
                    errors.append(f"child {name}: {status}")
        finally:
            self._updating = False
        self._active = [self._children[name] for name in config.targets]
        self._aggregate()
        if errors:
            return Status(
                grpc.StatusCode.UNAVAILABLE, f"errors from children: [{'; '.join(errors)}]"
            )
        return None

    def resolver_error(self, status: Status) -> None:
        """Pass the error to every target of the config (a removed target
        gets nothing more, as C-core updates only the targets of its
        config); with no target yet, fail with the error."""
        if self._shut_down:
            return
        if not self._active:
            self._forget_last()
            self.helper.update_state(_TF, status, FailPicker(status))
            return
        self._reports_while_updating = 0
        self._updating = True
        try:
            for target in list(self._active):
                if target.handler is not None and not target.closed:
                    target.handler.resolver_error(status)
        finally:
            self._updating = False
        if self._reports_while_updating:
            self._aggregate()

    def exit_idle(self) -> None:
        for target in list(self._active):
            if target.handler is not None and not target.closed:
                target.handler.exit_idle()

    def reset_backoff(self) -> None:
        for target in list(self._children.values()):
            if target.handler is not None:
                target.handler.reset_backoff()

    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        targets = list(self._children.values())
        self._children.clear()
        self._active = []
        for target in targets:
            self._close(target)

    # -- child lifetime ---------------------------------------------------
    def _create(self, name: str) -> _Target:
        target = _Target(name, self.helper.clock)
        target.handler = ChildPolicyHandler(_TargetHelper(self.helper, self, target))
        self._children[name] = target
        return target

    def _deactivate(self, target: _Target) -> None:
        if not target.retention_timer.pending:
            target.retention_timer.start(
                self.child_retention, lambda: self._on_retention_timer(target)
            )

    def _reactivate(self, target: _Target) -> None:
        target.retention_timer.cancel()

    def _on_retention_timer(self, target: _Target) -> None:
        if self._shut_down or target.closed or self._children.get(target.name) is not target:
            return
        del self._children[target.name]
        self._close(target)

    def _close(self, target: _Target) -> None:
        target.closed = True
        target.retention_timer.cancel()
        if target.handler is not None:
            target.handler.shutdown()

    # -- child reports ----------------------------------------------------
    def _on_child_state(
        self, target: _Target, state: ConnectivityState, status: Status, picker: Picker
    ) -> None:
        if self._shut_down or target.closed:
            return
        target.raw_state = state
        # Sticky TRANSIENT_FAILURE: only READY (or a fresh failure) replaces it;
        # otherwise the child still counts as failing: nothing to aggregate anew.
        if target.state is not _TF or state is _READY or state is _TF:
            again = state is target.state and (state is _READY or state is _TF)
            target.state, target.status, target.picker = state, status, picker
            if self._updating:
                self._reports_while_updating += 1
            elif target.active and not (again and self._republish(target, state, status, picker)):
                self._aggregate()
        if state is _IDLE:
            self._exit_idle_child(target)

    def _exit_idle_child(self, target: _Target) -> None:
        """Tell a child that just reported IDLE to exit idle, at once (C-core
        WeightedChild).  An IDLE the child reports from inside that call is
        not answered again (no unbounded recursion)."""
        if self._shut_down or target.closed or target.exiting_idle or target.handler is None:
            return
        target.exiting_idle = True
        try:
            target.handler.exit_idle()
        finally:
            target.exiting_idle = False

    # -- aggregation ------------------------------------------------------
    def _republish(
        self, target: _Target, state: ConnectivityState, status: Status, picker: Picker
    ) -> bool:
        """A child that was READY (or failing) in the last READY (or
        TRANSIENT_FAILURE) publish reports that state again with a new
        picker (an endpoint of its locality came or went; one of its
        endpoints failed another connection attempt): the aggregate is the
        last one with that child's picker replaced (and, failing, the
        status when it is the first failing child's), so publish exactly
        that, in O(1) Python steps rather than a pass over every child
        (issue 18: growing to 10,000 endpoints in 100 localities makes
        ~9,000 such reports; 9,000 refusing endpoints, one a failed
        attempt).  False when the last publish does not hold this child
        (the caller aggregates)."""
        position = self._positions.get(target)
        last = self._last
        if position is None or last is None or last[0] is not state:
            return False
        entries = last[2]
        weight, previous = entries[position]
        if weight != target.weight:
            return False
        # failing: the status is the first failing child's (_aggregate)
        published_status = status if state is _TF and position == 0 else last[1]
        if previous is picker and (published_status is last[1] or published_status == last[1]):
            return True  # the same input twice publishes nothing new
        entries = (*entries[:position], (weight, picker), *entries[position + 1 :])
        self._last = (state, published_status, entries)
        if len(entries) == 1:
            published: Picker | None = picker
        elif isinstance(self._published, WeightedPicker):
            published = self._published.replacing(position, picker)
        else:
            published = None
        if published is None:
            published = self._weighted_picker(entries)
        self._published = published
        self.helper.update_state(state, published_status, published)
        return True

    def _forget_last(self) -> None:
        self._last = None
        self._positions = {}
        self._published = None

    def _aggregate(self) -> None:
        if self._shut_down or self._updating or self._config is None:
            return
        ready_targets: list[_Target] = []
        ready: list[tuple[int, Picker]] = []
        failing_targets: list[_Target] = []
        failing: list[tuple[int, Picker]] = []
        first_failure: Status | None = None
        connecting = idle = 0
        for target in self._active:
            state = target.state
            if state is _READY:
                ready.append((target.weight, target.picker))
                ready_targets.append(target)
            elif state is _CONNECTING:
                connecting += 1
            elif state is _IDLE:
                idle += 1
            elif state is _TF:
                failing.append((target.weight, target.picker))
                failing_targets.append(target)
                if first_failure is None:
                    first_failure = target.status
        published = ready_targets if ready else failing_targets if not (connecting or idle) else ()
        self._positions = {target: i for i, target in enumerate(published)}
        if ready:
            self._publish(_READY, OK_STATUS, ready)
        elif connecting:
            self._publish(_CONNECTING, OK_STATUS, ())
        elif idle:
            self._publish(_IDLE, OK_STATUS, ())
        elif failing:
            assert first_failure is not None
            self._publish(_TF, first_failure, failing)
        else:
            status = Status(
                grpc.StatusCode.UNAVAILABLE,
                f"no children in weighted_target policy: {self._note}",
            )
            self._publish(_TF, status, ())

    def _publish(
        self, state: ConnectivityState, status: Status, entries: Sequence[tuple[int, Picker]]
    ) -> None:
        """Report unless the parent already has exactly this (same state,
        status, weights and child picker objects): the same input twice
        publishes nothing new."""
        last = self._last
        if (
            last is not None
            and last[0] is state
            and last[1] == status
            and len(last[2]) == len(entries)
            and all(
                w1 == w2 and p1 is p2 for (w1, p1), (w2, p2) in zip(last[2], entries, strict=True)
            )
        ):
            return
        self._last = (state, status, tuple(entries))
        picker: Picker
        if len(entries) == 1:
            picker = entries[0][1]  # one child: its own picker, nothing wrapped
        elif entries:
            picker = self._weighted_picker(entries)
        elif state is _TF:
            picker = FailPicker(status)
        else:
            picker = QueuePicker()
        self._published = picker
        self.helper.update_state(state, status, picker)

    def _weighted_picker(self, entries: Sequence[tuple[int, Picker]]) -> WeightedPicker:
        picker = WeightedPicker(entries, self.helper.random, self._index)
        self._index = picker.index  # the next picker over these weights reuses it
        return picker


# --------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------


class WeightedTargetFactory(PolicyFactory):
    """Builds ``weighted_target_experimental`` policies."""

    name = POLICY_NAME

    def __init__(self, *, child_retention: float = CHILD_RETENTION) -> None:
        self.child_retention = child_retention

    def parse_config(self, json_config: Any) -> WeightedTargetConfig:
        return parse_weighted_target_config(json_config)

    def build(self, helper: Helper) -> WeightedTargetLoadBalancer:
        return WeightedTargetLoadBalancer(helper, child_retention=self.child_retention)


registry.register(WeightedTargetFactory())
