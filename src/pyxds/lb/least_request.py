"""``least_request_experimental``: power-of-choice over outstanding calls (gRFC A48).

Config: ``{"choiceCount": N}`` (A48 "LB Policy Config"): default 2; a value
above 10 is clamped to 10; below 2 is rejected (:class:`LBConfigError`
naming ``choiceCount``).

Everything but the picker is round_robin's (A48 "Subchannel connectivity
management", "Aggregated Connectivity State"): this policy *is* a
:class:`~pyxds.lb.round_robin.RoundRobin` (one pick_first child per endpoint,
A61; same sticky-TF aggregation, same child reuse across updates), with a
different READY picker.

Outstanding-request counters (A48 "Outstanding request counters"): one
:class:`Outstanding` per endpoint child, living as long as that child (so
across picker rebuilds and address-list updates that keep the endpoint).
It counts with operations that are each atomic (``deque``/``list``
``append`` and ``pop``), so RPC threads count without a lock:

* ``tokens``: a deque of at most :data:`TOKENS` free slots, full when the
  endpoint has no call in flight.  A pick takes one (``pop``); the call's
  ``on_call_done`` *is* ``tokens.append``, so ending a call runs no Python
  frame.  A done beyond the calls taken finds the deque full and is
  dropped (``maxlen``): the count never goes below zero.
* ``overflow``: calls picked while ``tokens`` was empty (more than
  ``TOKENS`` in flight on the endpoint), each ended by a Python
  ``on_call_done`` that never goes below zero.  While any endpoint of the
  policy has such calls (the policy-wide ``spill`` list is not empty),
  every pick compares the exact counts (slow path), so the choice is A48's
  at any load.

The count is ``TOKENS - len(tokens) + len(overflow)``.  The channel calls
``on_call_done`` exactly once per attempt (``Rpc._report`` clears it
before calling), whatever ends the attempt (status, cancellation,
deadline, aio task cancellation), so retries count per attempt and nothing
leaks.

Picker (A48 "Picker Behavior"): draw ``choiceCount`` READY endpoints
uniformly at random with replacement (``helper.random``, drawn in blocks by
:func:`pyxds.lb.sampling.uniform_indices` and consumed through a C
iterator); the first drawn is the candidate, a later one replaces it only
with strictly fewer outstanding requests.  Each endpoint's result is
precomputed (its pick_first child's constant result with the counting
``on_call_done``), so a pick allocates nothing.  ``choiceCount`` 2 (the
default) has its own pick function: two indices, one comparison of free
slots (exact while no endpoint overflows), one ``pop``.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    Helper,
    PickArgs,
    PickComplete,
    Picker,
    PickResult,
    PolicyFactory,
    Status,
)
from pyxds.lb.errors import LBConfigError, expect_object, expect_uint32
from pyxds.lb.round_robin import RoundRobin, _Child
from pyxds.lb.sampling import uniform_indices

__all__ = [
    "POLICY_NAME",
    "MAX_CHOICE_COUNT",
    "TOKENS",
    "FIRST_BLOCK",
    "MAX_BLOCK",
    "LeastRequestConfig",
    "LeastRequestFactory",
    "LeastRequest",
    "LeastRequestPicker",
    "Outstanding",
]

POLICY_NAME = "least_request_experimental"
MAX_CHOICE_COUNT = 10
TOKENS = 256
"""Calls in flight on one endpoint counted by the C-level fast path; more
are counted exactly by the slow path (module docstring)."""
FIRST_BLOCK = 64
"""Raw draws in a picker's first block of random indices; each later block
doubles, up to :data:`MAX_BLOCK` (a picker replaced after a few picks draws
little)."""
MAX_BLOCK = 16384
_READY = ConnectivityState.READY


@dataclass(frozen=True)
class LeastRequestConfig:
    choice_count: int = 2


class LeastRequestFactory(PolicyFactory):
    name = POLICY_NAME

    def parse_config(self, json_config: Any) -> LeastRequestConfig:
        obj = expect_object({} if json_config is None else json_config, "")
        count = expect_uint32(obj, "choiceCount", "", 2)
        if count < 2:
            raise LBConfigError("choiceCount", f"must be greater than or equal to 2, got {count}")
        return LeastRequestConfig(min(count, MAX_CHOICE_COUNT))

    def build(self, helper: Helper) -> LeastRequest:
        return LeastRequest(helper)


class Outstanding:
    """One endpoint's outstanding-request counter (module docstring).
    ``spill`` is the policy-wide list with one entry per overflow call."""

    __slots__ = ("tokens", "overflow", "spill")

    def __init__(self, spill: list[None]) -> None:
        # Only the count matters: an ended call puts back its Status as the token.
        self.tokens: collections.deque[object] = collections.deque(
            itertools.repeat(None, TOKENS), maxlen=TOKENS
        )
        self.overflow: list[None] = []
        self.spill = spill

    @property
    def count(self) -> int:
        return TOKENS - len(self.tokens) + len(self.overflow)

    def take(self) -> bool:
        """Count one call: True if it took a token (ended by
        ``tokens.append``), False if it overflowed (ended by
        :meth:`end_overflow`)."""
        try:
            self.tokens.pop()
            return True
        except IndexError:
            self.overflow.append(None)
            self.spill.append(None)
            return False

    def end_overflow(self, status: Status) -> None:
        try:
            self.overflow.pop()
        except IndexError:  # a done beyond the calls taken: never below zero
            return
        try:
            self.spill.pop()
        except IndexError:
            pass

    def __repr__(self) -> str:
        return f"Outstanding({self.count})"


def _then(
    first: Callable[[Status], None], inner: Callable[[Status], None] | None
) -> Callable[[Status], None]:
    """``first``, then the child's own ``on_call_done`` if it has one."""
    if inner is None:
        return first

    def on_call_done(status: Status) -> None:
        first(status)
        inner(status)

    return on_call_done


class LeastRequestPicker(Picker):
    """A48's picker over the READY endpoints (module docstring).

    ``constants[i]`` is endpoint i's pick_first constant result (None: ask
    ``children[i]``, a non-constant child picker); ``counters[i]`` its
    :class:`Outstanding`.  ``pick`` is a per-instance function (a slot), so
    a pick runs one Python frame."""

    __slots__ = (
        "pick",
        "_constants",
        "_results",
        "_overflow_results",
        "_counters",
        "_children",
        "_choice_count",
        "_random",
        "_block",
        "_samples",
    )
    # mypy reports any attribute standing in for a method.
    pick: Callable[[PickArgs], PickResult]  # type: ignore[assignment]  # slot for the method

    def __init__(
        self,
        constants: Sequence[PickComplete | None],
        counters: Sequence[Outstanding],
        choice_count: int,
        random_source: Any,
        children: Sequence[Picker] = (),
    ) -> None:
        self._constants = tuple(constants)
        self._counters = tuple(counters)
        self._children = tuple(children)
        self._choice_count = choice_count
        self._random = random_source
        self._block = FIRST_BLOCK
        self._results = tuple(
            None if c is None else replace(c, on_call_done=_then(o.tokens.append, c.on_call_done))
            for c, o in zip(self._constants, self._counters, strict=True)
        )
        self._overflow_results: list[PickComplete | None] = [None] * len(self._constants)
        self._samples: Iterator[tuple[int, ...]] = iter(())
        fast = choice_count == 2 and None not in self._results
        self.pick = self._make_pick_two() if fast else self._pick_exact

    # -- sampling -----------------------------------------------------------
    def _refill(self) -> Iterator[tuple[int, ...]]:
        """The next block of samples: ``choice_count`` indices per pick.
        Threads that find the block used up at once each draw one; the
        last one stored wins (unused draws are dropped, which biases
        nothing: every index is independent of the others)."""
        block = self._block
        self._block = min(block * 2, MAX_BLOCK)
        indices = iter(uniform_indices(self._random, len(self._constants), block))
        self._samples = zip(*itertools.repeat(indices, self._choice_count), strict=False)
        return self._samples

    def _draw(self) -> tuple[int, ...]:
        while True:
            try:
                return next(self._samples)
            except StopIteration:
                self._refill()

    # -- picks --------------------------------------------------------------
    def _make_pick_two(self) -> Callable[[PickArgs], PickResult]:
        """choiceCount 2 over constant results, while no endpoint of the
        policy overflows: the sample with more free tokens has fewer
        outstanding calls (module docstring); else :meth:`_pick_exact`."""
        pops = [counter.tokens.pop for counter in self._counters]
        tokens = [counter.tokens for counter in self._counters]
        # Only called when no result is None (fast, in __init__).
        results = cast("tuple[PickComplete, ...]", self._results)
        spill = self._counters[0].spill if self._counters else []
        refill, exact, counted = self._refill, self._pick_exact, self._counted
        samples = self._samples

        def pick(
            args: PickArgs,
            tokens: list[collections.deque[object]] = tokens,
            results: tuple[PickComplete, ...] = results,
            pops: list[Callable[[], object]] = pops,
            spill: list[None] = spill,
        ) -> PickResult:
            nonlocal samples
            if spill:
                return exact(args)
            try:
                i, j = next(samples)
            except StopIteration:
                samples = refill()
                return pick(args)
            if len(tokens[j]) > len(tokens[i]):
                i = j
            try:
                pops[i]()
            except IndexError:  # every sample is at TOKENS calls: count exactly
                return counted(i, args)
            return results[i]

        return pick

    def _pick_exact(self, args: PickArgs) -> PickResult:
        """Any choiceCount, exact counts (A48 pseudo-code)."""
        counters = self._counters
        sample = self._draw()
        best = sample[0]
        best_count = counters[best].count
        for index in sample[1:]:
            count = counters[index].count
            if count < best_count:
                best, best_count = index, count
        return self._counted(best, args)

    def _counted(self, index: int, args: PickArgs) -> PickResult:
        """Endpoint ``index``'s result, counting the call on it."""
        counter = self._counters[index]
        constant = self._constants[index]
        if constant is None:  # a non-constant child picker (custom leaf)
            result = self._children[index].pick(args)
            if type(result) is not PickComplete:
                return result
            first = counter.tokens.append if counter.take() else counter.end_overflow
            return replace(result, on_call_done=_then(first, result.on_call_done))
        if counter.take():
            # not None: the constant is not None (a cast would cost a call per pick)
            return self._results[index]  # type: ignore[return-value]  # None only without constant
        overflow = self._overflow_results[index]
        if overflow is None:
            overflow = replace(
                constant, on_call_done=_then(counter.end_overflow, constant.on_call_done)
            )
            self._overflow_results[index] = overflow
        return overflow

    # -- introspection --------------------------------------------------------
    @property
    def counters(self) -> list[int]:
        """Outstanding requests per READY endpoint (tests)."""
        return [counter.count for counter in self._counters]

    @property
    def results(self) -> tuple[PickComplete | None, ...]:
        """Each endpoint's precomputed result (None: a non-constant child)."""
        return self._results

    def __repr__(self) -> str:
        return f"LeastRequestPicker(choice_count={self._choice_count}, counters={self.counters})"


class LeastRequest(RoundRobin):
    """round_robin's endpoint management with A48's picker."""

    def __init__(self, helper: Helper) -> None:
        super().__init__(helper)
        self._choice_count = 2
        self._spill: list[None] = []  # one entry per overflow call in flight

    def update(self, update: Any) -> Status | None:
        config = update.config
        if isinstance(config, LeastRequestConfig) and config.choice_count != self._choice_count:
            self._choice_count = config.choice_count
            self._reported_key = None  # republish the READY picker with the new count
            # ... even for the very endpoint objects round_robin has (cds
            # hands an unchanged locality's on), which it would skip
            self._last_list = None
        return super().update(update)

    def _report_ready(self, ready: list[_Child]) -> None:
        pickers = [child.picker for child in ready]
        key = (_READY, self._choice_count, *pickers)
        if key == self._reported_key:
            return
        constants: list[PickComplete | None] = []
        for child in ready:
            constant = getattr(child.picker, "result", None)
            constants.append(constant if type(constant) is PickComplete else None)
        counters = [self._counter(child) for child in ready]
        picker = LeastRequestPicker(
            constants, counters, self._choice_count, self.helper.random, pickers
        )
        self._report(_READY, OK_STATUS, picker, key)

    def _counter(self, child: _Child) -> Outstanding:
        """The child's counter (made on first use; lives as long as the child)."""
        counter = getattr(child, "outstanding", None)
        if counter is None:
            counter = Outstanding(self._spill)
            # round_robin's child carries this policy's state for it (no slot declared there)
            child.outstanding = counter  # type: ignore[attr-defined]  # per-policy state on the child
        return counter


registry.register(LeastRequestFactory())
