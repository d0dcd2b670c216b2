"""pyxds.security.relay_loop: work handed to a relay loop from another thread
(``call_soon``) always runs, however it interleaves with the loop's own
wake-up.  Real threads, every wait bounded; the interleaving is forced, not
hoped for."""

from __future__ import annotations

import os
import threading
from typing import Any

from pyxds.security import relay_loop

WAIT = 5.0


class _RacingRead:
    """``os`` for the relay loop's module, whose ``read`` of the wake-up pipe
    first lets another thread's ``call_soon`` run to its end (the loop thread
    preempted as it handles its wake-up), once."""

    def __init__(self, loop: relay_loop.RelayLoop, racer: Any) -> None:
        self._loop = loop
        self._racer = racer
        self.raced = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def read(self, fd: int, n: int) -> bytes:
        if fd == self._loop._wake_r and not self.raced.is_set():
            other = threading.Thread(target=self._racer, name="test-relay-racer")
            other.start()
            other.join(WAIT)
            self.raced.set()
        return os.read(fd, n)


def test_a_call_soon_racing_the_loops_wake_up_still_runs(monkeypatch):
    """The loop woke for one call; as it handles that wake-up another
    thread's call_soon completes.  Every call handed over later still runs.
    (A lost wake-up left a loop asleep with work queued until one of its
    sockets or timers happened to wake it: a new relay's listener
    registered on that loop accepted nothing, and its subchannel stayed
    CONNECTING for up to a handshake timeout, 20 s; with none, for good.)"""
    loop = relay_loop.RelayLoop("test-relay-wake")
    try:
        idle = threading.Event()
        loop.call_soon(idle.set)
        assert idle.wait(WAIT)  # the loop sleeps in poll(), no timers, no sockets

        ran: list[str] = []
        raced = _RacingRead(loop, lambda: loop.call_soon(lambda: ran.append("racer")))
        monkeypatch.setattr(relay_loop, "os", raced)
        woke = threading.Event()
        loop.call_soon(woke.set)
        assert woke.wait(WAIT)
        assert raced.raced.is_set()
        assert ran == ["racer"]

        later = threading.Event()
        loop.call_soon(later.set)
        assert later.wait(2.0), "the loop sleeps with a call queued: its wake-up was lost"
    finally:
        loop._woken = False  # a lost wake-up must not hold up the loop's stop
        loop.stop()


def test_calls_from_many_threads_all_run_while_the_loop_keeps_waking():
    """Several threads hand over work at once, each waiting for its own
    call before the next: none is left queued."""
    loop = relay_loop.RelayLoop("test-relay-many")
    stuck: list[int] = []

    def hand_over(worker: int) -> None:
        for _ in range(300):
            done = threading.Event()
            loop.call_soon(done.set)
            if not done.wait(WAIT):
                stuck.append(worker)
                return

    try:
        workers = [threading.Thread(target=hand_over, args=(i,)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(4 * WAIT)
        assert not any(w.is_alive() for w in workers)
        assert stuck == []
    finally:
        loop._woken = False
        loop.stop()


def test_a_burst_of_connections_spreads_over_the_loops_before_any_start_has_run(monkeypatch):
    """Each accepted connection is counted on its loop when it is given to
    it, not once its start has run there: a burst of N accepts (the loops
    busy or not yet scheduled) is spread N/2 + N/2 over two loops, as the
    relay's rule says ("given to the loop with the fewest connections"),
    instead of all N on the one that looked least loaded.  Ending them takes
    the counts back."""
    monkeypatch.setattr(relay_loop, "LOOP_THREADS", 2)
    monkeypatch.setattr(relay_loop, "_pool", [])
    burst = 10
    try:
        given = [relay_loop.least_loaded() for _ in range(burst)]
        loops = relay_loop.loops()
        assert len(loops) == 2
        spread = sorted(sum(1 for loop in given if loop is each) for each in loops)
        assert spread == [burst // 2, burst // 2], spread
        assert [loop.connections for loop in loops] == [burst // 2, burst // 2]
        listener_loop = relay_loop.least_loaded(count=False)  # a listener: not counted
        assert sum(loop.connections for loop in loops) == burst
        assert listener_loop in loops
        for loop in given:
            loop.connection_ended()
        assert [loop.connections for loop in loops] == [0, 0]
    finally:
        for loop in relay_loop.loops():
            loop.stop()
