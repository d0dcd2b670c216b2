"""``TimerSlot``: at most one pending timer, immune to late callbacks.

The priority policy's failover timer and the 15-minute retention timers of
priority and weighted_target (A56 "Failover Timer", "Child Lifetime
Management") share one hazard: a timer cancelled or restarted just as it
fires must not act (TRAPS: "A timer callback that fires after the child was
reactivated or replaced deleted the wrong child", grpc#30045).  Each start
bumps a generation; a callback whose generation is stale does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from pyxds.clock import Clock, Timer


class TimerSlot:
    """One restartable timer on an injected clock."""

    __slots__ = ("_clock", "_generation", "_timer")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._timer: Timer | None = None
        self._generation = 0

    @property
    def pending(self) -> bool:
        return self._timer is not None

    def start(self, delay: float, fn: Callable[[], None]) -> None:
        """(Re)start: any earlier pending timer is cancelled first."""
        self.cancel()
        generation = self._generation
        self._timer = self._clock.call_later(delay, lambda: self._fire(generation, fn))

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._generation += 1

    def _fire(self, generation: int, fn: Callable[[], None]) -> None:
        if generation != self._generation or self._timer is None:
            return
        self._timer = None
        fn()
