"""Injected time: ``Clock`` and ``Timer`` (ARCHITECTURE.md "Time and
randomness are injected").

Policies never read the wall clock or start threads for timers; they call
``helper.clock.call_later(delay, fn)``.  :class:`RealClock` runs due
callbacks on one timer thread (a heap of deadlines) and hands each to a
``dispatch`` function (normally the channel's work serializer), so timer
callbacks obey the same one-at-a-time rule as every other LB event.
:class:`pyxds.testing.FakeClock` implements the same API for tests.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable


class Timer(ABC):
    """A scheduled callback.  ``cancel()`` is idempotent; a cancelled timer
    never runs its callback."""

    @abstractmethod
    def cancel(self) -> None: ...

    @property
    @abstractmethod
    def cancelled(self) -> bool: ...


class Clock(ABC):
    """Monotonic time in seconds plus one-shot timers."""

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` after ``delay`` seconds; ``call_later(0, fn)`` defers."""


class _HeapTimer(Timer):
    __slots__ = ("deadline", "seq", "fn", "_cancelled")

    def __init__(self, deadline: float, seq: int, fn: Callable[[], None]) -> None:
        self.deadline = deadline
        self.seq = seq
        self.fn = fn
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def __lt__(self, other: _HeapTimer) -> bool:
        return (self.deadline, self.seq) < (other.deadline, other.seq)


class RealClock(Clock):
    """``time.monotonic`` plus one daemon timer thread over a heap of deadlines.

    ``dispatch`` receives each due callback; the default runs it on the timer
    thread.  Channels pass their serializer's ``run`` so callbacks execute on
    the serializer.
    """

    def __init__(self, dispatch: Callable[[Callable[[], None]], None] | None = None) -> None:
        self._dispatch = dispatch or (lambda fn: fn())
        self._heap: list[_HeapTimer] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    #: ``time.monotonic`` itself: no Python frame per call (pickers read the
    #: clock on the RPC path)
    now = staticmethod(time.monotonic)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = _HeapTimer(time.monotonic() + max(0.0, delay), next(self._seq), fn)
        with self._cond:
            if self._closed:
                timer.cancel()
                return timer
            heapq.heappush(self._heap, timer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pyxds-timer", daemon=True)
                self._thread.start()
            self._cond.notify()
        return timer

    def close(self) -> None:
        """Cancel every pending timer and stop the thread."""
        with self._cond:
            self._closed = True
            for timer in self._heap:
                timer.cancel()
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    while self._heap and self._heap[0].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0].deadline - time.monotonic()
                    if wait <= 0:
                        timer = heapq.heappop(self._heap)
                        break
                    self._cond.wait(wait)
            if not timer.cancelled:
                self._dispatch(self._guarded(timer))

    @staticmethod
    def _guarded(timer: _HeapTimer) -> Callable[[], None]:
        def run() -> None:
            if not timer.cancelled:
                timer.fn()

        return run
