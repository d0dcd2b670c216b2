"""``FakeClock``: the :class:`pyxds.clock.Clock` API driven by the test.

``advance(seconds)`` moves time forward and fires every timer that falls
due, in deadline order (ties in scheduling order), including timers that a
fired callback schedules inside the advanced window.  Nothing runs until the
test calls ``advance`` (``call_later(0, fn)`` runs on ``advance(0)``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from pyxds.clock import Clock, Timer


class FakeTimer(Timer):
    __slots__ = ("deadline", "seq", "fn", "_cancelled", "fired")

    def __init__(self, deadline: float, seq: int, fn: Callable[[], None]) -> None:
        self.deadline = deadline
        self.seq = seq
        self.fn = fn
        self._cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def __lt__(self, other: FakeTimer) -> bool:
        return (self.deadline, self.seq) < (other.deadline, other.seq)

    def __repr__(self) -> str:
        state = "cancelled" if self._cancelled else ("fired" if self.fired else "pending")
        return f"FakeTimer(deadline={self.deadline:.3f}, {state})"


class FakeClock(Clock):
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._heap: list[FakeTimer] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = FakeTimer(self._now + max(0.0, delay), next(self._seq), fn)
        heapq.heappush(self._heap, timer)
        return timer

    def advance(self, seconds: float = 0.0) -> int:
        """Move time forward by ``seconds``, firing due timers in order.
        Returns how many callbacks ran."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go backwards")
        target = self._now + seconds
        fired = 0
        while self._heap and self._heap[0].deadline <= target + 1e-12:
            timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.deadline)
            timer.fired = True
            timer.fn()
            fired += 1
        self._now = target
        return fired

    def run_pending(self) -> int:
        """Fire timers already due (``advance(0)``)."""
        return self.advance(0.0)

    @property
    def pending(self) -> list[FakeTimer]:
        """Timers not yet fired nor cancelled, in deadline order."""
        return sorted(t for t in self._heap if not t.cancelled)

    def next_deadline(self) -> float | None:
        pending = self.pending
        return pending[0].deadline if pending else None
