"""FakeClock (pyxds.testing) and RealClock (pyxds.clock)."""

from __future__ import annotations

import threading
import time

import pytest

from pyxds import clock as clock_module
from pyxds.clock import RealClock
from pyxds.testing import FakeClock


def test_nothing_runs_until_advance():
    clock = FakeClock()
    ran = []
    clock.call_later(0, lambda: ran.append(1))
    assert ran == []
    assert clock.advance(0) == 1
    assert ran == [1]


def test_due_timers_fire_in_deadline_order_ties_in_scheduling_order():
    clock = FakeClock()
    ran = []
    clock.call_later(0.3, lambda: ran.append("c"))
    clock.call_later(0.1, lambda: ran.append("a1"))
    clock.call_later(0.1, lambda: ran.append("a2"))
    clock.call_later(0.2, lambda: ran.append("b"))
    clock.advance(1)
    assert ran == ["a1", "a2", "b", "c"]


def test_now_inside_a_callback_is_its_deadline():
    clock = FakeClock(start=10)
    seen = []
    clock.call_later(0.25, lambda: seen.append(clock.now()))
    clock.advance(1)
    assert seen == [10.25] and clock.now() == 11


def test_timers_scheduled_by_fired_callbacks_within_the_window_fire():
    clock = FakeClock()
    ran = []

    def first():
        ran.append(("first", clock.now()))
        clock.call_later(0.25, lambda: ran.append(("second", clock.now())))
        clock.call_later(0.5, lambda: ran.append(("late", clock.now())))

    clock.call_later(0.5, first)
    clock.advance(0.8)
    assert ran == [("first", 0.5), ("second", 0.75)]
    clock.advance(0.2)
    assert ran[-1] == ("late", 1.0)


def test_zero_delay_timer_scheduled_by_a_callback_fires_in_the_same_advance():
    clock = FakeClock()
    ran = []
    clock.call_later(0.1, lambda: clock.call_later(0, lambda: ran.append(clock.now())))
    clock.advance(0.1)
    assert ran == [pytest.approx(0.1)]


def test_boundary_is_inclusive_and_exact():
    clock = FakeClock()
    ran = []
    clock.call_later(0.25, lambda: ran.append(1))
    clock.advance(0.249)
    assert ran == []
    clock.advance(0.001)
    assert ran == [1]


def test_cancelled_timer_never_runs_and_pending_excludes_it():
    clock = FakeClock()
    ran = []
    keep = clock.call_later(1, lambda: ran.append("keep"))
    drop = clock.call_later(0.5, lambda: ran.append("drop"))
    drop.cancel()
    drop.cancel()  # idempotent
    assert drop.cancelled and clock.pending == [keep]
    assert clock.next_deadline() == 1
    clock.advance(2)
    assert ran == ["keep"] and clock.pending == [] and clock.next_deadline() is None


def test_fake_clock_cannot_go_backwards():
    with pytest.raises(ValueError):
        FakeClock().advance(-1)


def test_negative_delay_means_now():
    clock = FakeClock()
    ran = []
    clock.call_later(-5, lambda: ran.append(1))
    clock.run_pending()
    assert ran == [1]


# -- RealClock (one timer thread; bounded waits, no sleeps) -------------------


def test_real_clock_runs_callbacks_in_deadline_order_via_dispatch():
    dispatched = []
    gate = threading.Event()  # the first dispatch waits here: no race with cancel()

    def dispatch(fn):
        gate.wait(5)
        dispatched.append(fn)
        fn()

    clock = RealClock(dispatch=dispatch)
    done = threading.Event()
    order = []
    # "late" is due 0.3 s after its registration, "early" at its own: the
    # order holds while the two registrations are less than 0.3 s apart
    # (0.05 s was not, once, on a machine at load 17)
    clock.call_later(0.3, lambda: (order.append("late"), done.set()))
    clock.call_later(0.0, lambda: order.append("early"))
    cancelled = clock.call_later(0.01, lambda: order.append("cancelled"))
    cancelled.cancel()
    gate.set()
    assert done.wait(5)
    assert order == ["early", "late"]
    assert len(dispatched) == 2
    clock.close()


def test_real_clock_close_cancels_pending_and_later_timers():
    clock = RealClock()
    ran = threading.Event()
    timer = clock.call_later(30, ran.set)
    clock.close()
    assert timer.cancelled
    assert clock.call_later(0, ran.set).cancelled
    assert not ran.wait(0.05)


def test_real_clock_now_is_monotonic():
    clock = RealClock()
    a = clock.now()
    assert clock.now() >= a


def test_a_timer_scheduled_when_cancelled_ones_are_compacted_away_still_fires(monkeypatch):
    """Cancelled timers stay in the heap until they make up half of it; the
    call_later that finds them so compacts the heap and must push its own
    timer onto the compacted heap, not the list it replaced: a timer lost
    there never fires (issue 18: a subchannel's grpcio channel whose close
    was that timer stayed open after the pyxds channel's close(), keeping
    C-core and its threads up)."""
    monkeypatch.setattr(clock_module, "_TIMERS", clock_module._TimerThread())
    clock = RealClock()
    # a live timer first (a backoff): the cancelled ones wait behind it
    clock.call_later(1800, lambda: None)
    deadlines = [clock.call_later(3600, lambda: None) for _ in range(300)]
    for timer in deadlines:  # RPC deadlines, cancelled when their RPCs end
        timer.cancel()
    ran = threading.Event()
    clock.call_later(0.0, ran.set)  # this push compacts the heap
    assert ran.wait(5)
    clock.close()


def test_a_timer_thread_that_fails_to_start_is_not_recorded_and_the_next_timer_starts_one(
    monkeypatch,
):
    """A timer thread whose start fails (Python 3.12 refuses new threads in
    atexit hooks; a process out of threads) must not stay recorded as the
    timer thread: else every later push takes it for running and no timer
    of the process ever runs again.  The failed push raises, naming the
    cause, and its timer never runs."""
    monkeypatch.setattr(clock_module, "_TIMERS", clock_module._TimerThread())
    start = threading.Thread.start

    def refused(thread: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refused)
    clock = RealClock()
    lost = threading.Event()
    with pytest.raises(RuntimeError, match="cannot start the timer thread: can't create"):
        clock.call_later(0.0, lost.set)
    assert clock_module._TIMERS.thread is None
    monkeypatch.setattr(threading.Thread, "start", start)
    ran = threading.Event()
    clock.call_later(0.0, ran.set)
    assert ran.wait(5)
    assert not lost.is_set()
    clock.close()


def test_an_earlier_timer_from_another_thread_wakes_the_timer_thread_and_its_own_need_no_wake(
    monkeypatch,
):
    """The timer thread waits for its earliest deadline.  A timer with an
    earlier one pushed from another thread must wake it (else it runs only
    when the later one is due); one the timer thread pushes itself, from a
    callback, needs no wake-up (it looks at the heaps again when the callback
    returns: a Condition.notify per timer was two Python frames, issue 18),
    and still runs on time."""
    monkeypatch.setattr(clock_module, "_TIMERS", clock_module._TimerThread())
    clock = RealClock()
    clock.call_later(3600, lambda: None)  # the thread now waits an hour
    time.sleep(0.05)
    chained = threading.Event()

    def first() -> None:  # on the timer thread: schedules the next itself
        clock.call_later(0.01, chained.set)

    started = time.monotonic()
    clock.call_later(0.01, first)  # from this thread: must wake the timer thread
    assert chained.wait(5)
    assert time.monotonic() - started < 2.0
    assert clock_module._TIMERS.ident == clock_module._TIMERS.thread.ident
    clock.close()


def test_real_clock_offers_zero_delay_callbacks_to_defer_and_still_dispatches_them():
    offered: list = []
    dispatched: list = []
    ran: list = []

    def dispatch(fn):
        dispatched.append(fn)
        fn()

    clock = RealClock(dispatch=dispatch, defer=lambda fn: offered.append(fn) or True)
    clock.call_later(0, lambda: ran.append("now"))
    clock.call_later(-1, lambda: ran.append("past"))
    assert len(offered) == 2 and ran == [] and dispatched == []  # taken: not run yet
    for fn in offered:
        fn()  # what the taker does (e.g. on its event loop)
    assert ran == ["now", "past"] and len(dispatched) == 2


def test_a_deferred_timer_cancelled_or_of_a_closed_clock_never_runs():
    offered: list = []
    ran: list = []
    clock = RealClock(defer=lambda fn: offered.append(fn) or True)
    clock.call_later(0, lambda: ran.append("cancelled")).cancel()
    clock.call_later(0, lambda: ran.append("closed"))
    clock.close()
    clock.call_later(0, lambda: ran.append("after close"))
    for fn in offered:
        fn()
    assert ran == [] and len(offered) == 2  # born cancelled after close: not offered


def test_defer_is_not_offered_timers_with_a_delay_and_a_refusal_leaves_it_to_the_timer_thread():
    offered: list = []
    done = threading.Event()
    on: list = []
    clock = RealClock(defer=lambda fn: offered.append(fn) or False)
    clock.call_later(0.001, lambda: None).cancel()
    assert offered == []
    clock.call_later(0, lambda: (on.append(threading.current_thread().name), done.set()))
    assert len(offered) == 1
    assert done.wait(5)
    assert on == ["pyxds-timer"]
    clock.close()


def _blocked_timer_thread(monkeypatch):
    """A fresh timer thread held busy by a first callback until the
    returned event is set (a backlog of due timers builds up behind it)."""
    monkeypatch.setattr(clock_module, "_TIMERS", clock_module._TimerThread())
    started, release = threading.Event(), threading.Event()

    def block():
        started.set()
        assert release.wait(5)

    RealClock().call_later(0, block)
    assert started.wait(5)
    return release


def test_a_prompt_clocks_due_timer_runs_before_other_clocks_due_ones(monkeypatch):
    """Issue 18: the connectivity monitor's sweeps and closes must not wait
    behind a backlog of due timers of other clocks (thousands of backoffs
    ending at once); each set still runs in deadline order."""
    release = _blocked_timer_thread(monkeypatch)
    ran: list[str] = []
    done = threading.Event()
    normal, prompt = RealClock(), RealClock(prompt=True)
    normal.call_later(0, lambda: ran.append("backoff 1"))
    normal.call_later(0, lambda: ran.append("backoff 2"))
    prompt.call_later(0, lambda: ran.append("sweep"))
    prompt.call_later(0, lambda: ran.append("close"))
    normal.call_later(0, done.set)
    release.set()
    assert done.wait(5)
    assert ran == ["sweep", "close", "backoff 1", "backoff 2"]


def test_a_prompt_timer_not_yet_due_holds_up_no_due_timer(monkeypatch):
    monkeypatch.setattr(clock_module, "_TIMERS", clock_module._TimerThread())
    ran: list[str] = []
    done = threading.Event()
    RealClock(prompt=True).call_later(0.2, lambda: (ran.append("prompt, later"), done.set()))
    RealClock().call_later(0, lambda: ran.append("due now"))
    assert done.wait(5)
    assert ran == ["due now", "prompt, later"]


def test_a_prompt_clocks_timers_never_run_once_cancelled_or_the_clock_closed(monkeypatch):
    release = _blocked_timer_thread(monkeypatch)
    ran: list[str] = []
    done = threading.Event()
    prompt = RealClock(prompt=True)
    prompt.call_later(0, lambda: ran.append("cancelled")).cancel()
    prompt.call_later(0, lambda: ran.append("closed"))
    prompt.close()
    RealClock().call_later(0, done.set)
    release.set()
    assert done.wait(5)
    assert ran == []
    assert clock_module._TIMERS.prompt == []


def test_a_prompt_timer_scheduled_when_cancelled_ones_are_compacted_away_still_fires(monkeypatch):
    """As the compaction test above, for a prompt clock's own heap (the
    connectivity monitor cancels and re-makes its sweep timer often)."""
    monkeypatch.setattr(clock_module, "_TIMERS", clock_module._TimerThread())
    prompt = RealClock(prompt=True)
    RealClock().call_later(1800, lambda: None)
    for timer in [prompt.call_later(3600, lambda: None) for _ in range(300)]:
        timer.cancel()
    ran = threading.Event()
    prompt.call_later(0.0, ran.set)  # this push compacts both heaps
    assert ran.wait(5)
    assert len(clock_module._TIMERS.prompt) == 0
    prompt.close()
