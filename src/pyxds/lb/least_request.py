"""``least_request_experimental``: power-of-choice over outstanding calls (gRFC A48).

Config: ``{"choiceCount": N}`` (A48 "LB Policy Config"): default 2; a value
above 10 is clamped to 10; below 2 is rejected (:class:`LBConfigError`
naming ``choiceCount``).

Everything but the picker is round_robin's (A48 "Subchannel connectivity
management", "Aggregated Connectivity State"): this policy *is* a
:class:`~pyxds.lb.round_robin.RoundRobin` (one pick_first child per endpoint,
A61; same sticky-TF aggregation, same child reuse across updates), with a
different READY picker.

Outstanding-request counters (A48 "Outstanding request counters"): one per
endpoint child, living as long as that child (so across picker rebuilds and
address-list updates that keep the endpoint).  A counter is a
``collections.deque`` whose length is the count: ``append`` on a completed
pick and ``pop`` in ``on_call_done`` are each atomic, so RPC threads count
without a lock.  The channel calls ``on_call_done`` exactly once per
attempt (``Rpc.attempt_done`` clears it before calling), whatever ends the
attempt (status, cancellation, deadline, aio task cancellation), so retries
count per attempt and nothing leaks.

Picker (A48 "Picker Behavior"): draw ``choiceCount`` READY endpoints
uniformly at random (with replacement, ``helper.random``); the first drawn
is the candidate, a later one replaces it only with strictly fewer
outstanding requests.  Each endpoint's result is precomputed (its
pick_first child's constant result plus the counting ``on_call_done``), so
a pick allocates nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

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

__all__ = [
    "POLICY_NAME",
    "MAX_CHOICE_COUNT",
    "LeastRequestConfig",
    "LeastRequestFactory",
    "LeastRequest",
    "LeastRequestPicker",
]

POLICY_NAME = "least_request_experimental"
MAX_CHOICE_COUNT = 10
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


def _counting_done(
    counter: collections.deque, inner: Callable[[Status], None] | None
) -> Callable[[Status], None]:
    pop = counter.pop
    if inner is None:

        def on_call_done(status: Status) -> None:
            try:
                pop()
            except IndexError:  # never below zero, whatever a caller does
                pass

        return on_call_done

    def on_call_done_chained(status: Status) -> None:
        try:
            pop()
        except IndexError:
            pass
        inner(status)

    return on_call_done_chained


class LeastRequestPicker(Picker):
    """A48's picker over the READY endpoints (module docstring).
    ``results[i]`` is endpoint i's precomputed result (None: ask
    ``children[i]``, a non-constant child picker); ``counters[i]`` its
    outstanding-request counter."""

    __slots__ = ("_results", "_counters", "_n", "_choice_count", "_random", "_children")

    def __init__(
        self,
        results: Sequence[PickComplete | None],
        counters: Sequence[collections.deque],
        choice_count: int,
        random_source: Any,
        children: Sequence[Picker] = (),
    ) -> None:
        self._results = tuple(results)
        self._counters = tuple(counters)
        self._n = len(self._results)
        self._choice_count = choice_count
        self._random = random_source.random
        self._children = tuple(children)

    @property
    def counters(self) -> list[int]:
        """Outstanding requests per READY endpoint (tests)."""
        return [len(counter) for counter in self._counters]

    @property
    def results(self) -> tuple[PickComplete | None, ...]:
        return self._results

    def pick(self, args: PickArgs) -> PickResult:
        counters, n, draw = self._counters, self._n, self._random
        best = int(draw() * n)
        if self._choice_count == 2:  # the default, unrolled
            sampled = int(draw() * n)
            if len(counters[sampled]) < len(counters[best]):
                best = sampled
        else:
            best_count = len(counters[best])
            for _ in range(self._choice_count - 1):
                sampled = int(draw() * n)
                count = len(counters[sampled])
                if count < best_count:
                    best, best_count = sampled, count
        result = self._results[best]
        if result is None:  # a non-constant child picker (custom leaf)
            return self._delegate(best, args)
        counters[best].append(None)
        return result

    def _delegate(self, index: int, args: PickArgs) -> PickResult:
        result = self._children[index].pick(args)
        if type(result) is not PickComplete:
            return result
        counter = self._counters[index]
        counter.append(None)
        return replace(result, on_call_done=_counting_done(counter, result.on_call_done))

    def __repr__(self) -> str:
        return f"LeastRequestPicker(choice_count={self._choice_count}, counters={self.counters})"


class LeastRequest(RoundRobin):
    """round_robin's endpoint management with A48's picker."""

    def __init__(self, helper: Helper) -> None:
        super().__init__(helper)
        self._choice_count = 2

    def update(self, update: Any) -> Status | None:
        config = update.config
        if isinstance(config, LeastRequestConfig) and config.choice_count != self._choice_count:
            self._choice_count = config.choice_count
            self._reported_key = None  # republish the READY picker with the new count
        return super().update(update)

    def _report_ready(self, ready: list[_Child]) -> None:
        pickers = [child.picker for child in ready]
        key = (_READY, self._choice_count, *pickers)
        if key == self._reported_key:
            return
        results: list[PickComplete | None] = []
        counters = []
        for child in ready:
            counter = _counter(child)
            constant = getattr(child.picker, "result", None)
            if type(constant) is PickComplete:
                done = _counting_done(counter, constant.on_call_done)
                results.append(replace(constant, on_call_done=done))
            else:
                results.append(None)
            counters.append(counter)
        picker = LeastRequestPicker(
            results, counters, self._choice_count, self.helper.random, pickers
        )
        self._report(_READY, OK_STATUS, picker, key)


def _counter(child: _Child) -> collections.deque:
    """The child's outstanding-request counter (made on first use; lives as
    long as the child)."""
    counter = getattr(child, "outstanding", None)
    if counter is None:
        counter = collections.deque()
        child.outstanding = counter  # type: ignore[attr-defined]
    return counter


registry.register(LeastRequestFactory())
