"""TimerSlot: one restartable timer whose stale callbacks do nothing (grpc#30045)."""

from collections.abc import Callable

from pyxds.clock import Clock, Timer
from pyxds.lb.timer_slot import TimerSlot
from pyxds.testing import FakeClock


class _RacingClock(Clock):
    """Hands callbacks out even after cancel(), as a timer thread that had
    already dequeued a timer when it was cancelled would."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def now(self) -> float:
        return 0.0

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        self.callbacks.append(fn)
        return FakeClock().call_later(delay, fn)


def test_fires_once_after_its_delay():
    clock = FakeClock()
    fired: list[float] = []
    slot = TimerSlot(clock)
    slot.start(10.0, lambda: fired.append(clock.now()))
    clock.advance(9.999)
    assert fired == [] and slot.pending
    clock.advance(0.001)
    assert fired == [10.0] and not slot.pending


def test_restart_replaces_the_pending_timer():
    clock = FakeClock()
    fired: list[str] = []
    slot = TimerSlot(clock)
    slot.start(10.0, lambda: fired.append("first"))
    clock.advance(5)
    slot.start(10.0, lambda: fired.append("second"))
    clock.advance(20)
    assert fired == ["second"]


def test_callback_of_a_cancelled_timer_that_fires_late_does_nothing():
    clock = _RacingClock()
    fired: list[str] = []
    slot = TimerSlot(clock)
    slot.start(1.0, lambda: fired.append("stale"))
    slot.cancel()
    clock.callbacks[0]()
    assert fired == [] and not slot.pending


def test_callback_of_a_replaced_timer_that_fires_late_does_not_end_the_new_one():
    clock = _RacingClock()
    fired: list[str] = []
    slot = TimerSlot(clock)
    slot.start(1.0, lambda: fired.append("old"))
    slot.start(1.0, lambda: fired.append("new"))
    clock.callbacks[0]()
    assert fired == [] and slot.pending
    clock.callbacks[1]()
    assert fired == ["new"] and not slot.pending
