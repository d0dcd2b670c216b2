"""Injected time: ``Clock`` and ``Timer`` (ARCHITECTURE.md "Time and
randomness are injected").

Policies never read the wall clock or start threads for timers; they call
``helper.clock.call_later(delay, fn)``.  :class:`RealClock` runs due
callbacks on the process's one timer thread (a heap of deadlines shared by
every clock: threads do not grow with channels) and hands each to a
``dispatch`` function (normally the channel's work serializer), so timer
callbacks obey the same one-at-a-time rule as every other LB event.
:class:`pyxds.testing.FakeClock` implements the same API for tests.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

_log = logging.getLogger(__name__)
_get_ident = threading.get_ident


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
    __slots__ = ("deadline", "seq", "fn", "owner", "_cancelled")

    def __init__(self, deadline: float, seq: int, fn: Callable[[], None], owner: RealClock) -> None:
        self.deadline = deadline
        self.seq = seq
        self.fn = fn
        self.owner = owner
        self._cancelled = False

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            _TIMERS.garbage += 1  # approximate (no lock): only a hint to compact

    @property
    def cancelled(self) -> bool:
        return self._cancelled


#: What the heap holds: ``(deadline, seq, timer)``.  Tuples compare in C; a
#: Python ``__lt__`` on the timer made every push and pop ~13 Python calls
#: with 10,000 backoff timers pending (issue 18, refusing endpoints).  ``seq``
#: is unique, so two entries never get as far as comparing their timers.
_Entry = tuple[float, int, _HeapTimer]


#: Seconds the timer thread waits with nothing scheduled before it exits (a
#: new timer starts it again).
TIMER_THREAD_LINGER = 1.0


class _TimerThread:
    """The process's one timer thread: a heap of every RealClock's deadlines
    (C-core's timer manager).  It starts with the first timer and exits once
    nothing has been scheduled for :data:`TIMER_THREAD_LINGER`, so the
    threads of a process do not grow with its channels, and are back to
    their count once every channel is closed.

    A cancelled timer stays in the heap until its deadline, or until
    cancelled ones make up half of it (then the heap is compacted): cancel()
    never takes the lock, as RPC deadlines are cancelled on every call."""

    def __init__(self) -> None:
        self.heap: list[_Entry] = []
        #: the deadlines of ``prompt`` clocks (RealClock), served first once due
        self.prompt: list[_Entry] = []
        self.seq = itertools.count()
        #: taken as itself (``with self.lock``), not through ``cond``: a
        #: Condition's ``__enter__``/``__exit__`` are Python frames, two per
        #: timer pushed and two per timer run (issue 18: ~7 timers per failed
        #: connection attempt); ``cond`` shares it for waiting and waking
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.thread: threading.Thread | None = None
        #: the timer thread's ident while it runs (0: not known yet, or no
        #: thread): a timer the thread pushes itself (a callback scheduling
        #: the next, most of them) needs no wake-up, as it looks at the heaps
        #: again when the callback returns
        self.ident = 0
        #: cancelled timers still in the heap (approximate)
        self.garbage = 0

    def push(self, timer: _HeapTimer) -> None:
        with self.lock:
            if self.garbage > 256 and self.garbage * 2 > len(self.heap) + len(self.prompt):
                self._compact()
            # after compacting: it replaces the list
            heap = self.prompt if timer.owner._prompt else self.heap
            heapq.heappush(heap, (timer.deadline, timer.seq, timer))
            if self.thread is None:
                self._start(timer)
            elif heap[0][2] is timer and _get_ident() != self.ident:
                self.cond.notify()  # a new earliest deadline: wake the thread

    def _start(self, timer: _HeapTimer) -> None:
        """Start the thread for ``timer`` (just pushed; lock held).  A start
        that fails (Python 3.12 refuses new threads in atexit hooks; out of
        threads) records no thread, so the next push tries again, and
        takes ``timer`` back (it never runs): the caller gets the error."""
        thread = threading.Thread(target=self._run, name="pyxds-timer", daemon=True)
        self.thread = thread  # before it runs: its first _next may clear it
        try:
            thread.start()
        except Exception as exc:  # RuntimeError("can't start new thread"), MemoryError
            self.thread = None
            timer._cancelled = True
            self.garbage += 1
            raise RuntimeError(f"pyxds: cannot start the timer thread: {exc}") from exc

    def drop(self, owner: RealClock) -> None:
        """Forget every timer of ``owner`` (closed), so nothing it scheduled
        keeps its callbacks (and what they reference) alive."""
        with self.lock:
            for _, _, timer in self.heap + self.prompt:
                if timer.owner is owner:
                    timer._cancelled = True
            self._compact()
            self.cond.notify()

    def _compact(self) -> None:
        self.heap = [e for e in self.heap if not e[2]._cancelled]
        heapq.heapify(self.heap)
        self.prompt = [e for e in self.prompt if not e[2]._cancelled]
        heapq.heapify(self.prompt)
        self.garbage = 0

    def _next(self) -> _HeapTimer | None:
        """The next due timer (waiting for it); None: the thread exits.  A
        due timer of a ``prompt`` clock comes before every other due timer
        (see :class:`RealClock`); each heap keeps deadline order."""
        with self.lock:
            while True:
                heap, prompt = self.heap, self.prompt
                while heap and heap[0][2]._cancelled:
                    heapq.heappop(heap)
                    if self.garbage:
                        self.garbage -= 1
                while prompt and prompt[0][2]._cancelled:
                    heapq.heappop(prompt)
                    if self.garbage:
                        self.garbage -= 1
                if not heap and not prompt:
                    self.cond.wait(TIMER_THREAD_LINGER)
                    if not self.heap and not self.prompt:
                        self.thread = None
                        self.ident = 0
                        return None
                    continue
                now = time.monotonic()
                if prompt and prompt[0][0] <= now:
                    return heapq.heappop(prompt)[2]
                if heap and heap[0][0] <= now:
                    return heapq.heappop(heap)[2]
                if not prompt:
                    first = heap[0][0]
                elif not heap:
                    first = prompt[0][0]
                else:
                    first = min(heap[0][0], prompt[0][0])
                self.cond.wait(first - now)

    def _run(self) -> None:
        self.ident = _get_ident()
        while True:
            timer = self._next()
            if timer is None:
                return
            if not timer._cancelled:
                owner = timer.owner
                try:
                    if owner._dispatch is None:
                        timer.fn()  # here and now: no wrapper to re-check it later
                    else:
                        owner._dispatch(owner._guarded(timer))
                except Exception:  # one clock's callback must not stop every clock
                    _log.exception("pyxds: timer callback raised")


_TIMERS = _TimerThread()


def on_timer_thread() -> bool:
    """Whether the caller runs on the process's timer thread: every clock's
    callbacks share it (RPC deadlines, and the done-callbacks of the RPCs
    they end), so nothing there may wait for a connection to close."""
    return threading.current_thread() is _TIMERS.thread


class RealClock(Clock):
    """``time.monotonic`` plus timers on the process's one timer thread.

    ``dispatch`` receives each due callback; the default runs it on the timer
    thread.  Channels pass their serializer's ``run`` so callbacks execute on
    the serializer.  Callbacks of every clock share that thread (as C-core's
    timers do): they must not block.

    ``defer``, when given, is offered each zero-delay callback first
    (``call_later(0, fn)``: "not now, on this thread's stack"); when it takes
    it (returns True) it runs it soon on its own terms, and the callback
    still goes through ``dispatch`` and still never runs once cancelled or
    the clock is closed.  The asyncio channel defers to its event loop when
    called on it: a pick on the loop that asks for a connection then makes
    it on the loop, with no hop through the timer thread and back (issue 18:
    ring_hash's lazy connections under ``pyxds.aio``).

    ``prompt``: this clock's due timers run before every other clock's due
    timers (each set still in deadline order).  The process's connectivity
    monitor is one (:func:`pyxds.connectivity.monitor`): its sweeps see the
    end of a failed connection attempt, and its closes let a failed attempt's
    grpcio channel go.  Behind a backlog of other due timers (thousands of
    refusing endpoints whose backoffs end together: each ends in a new
    attempt) both waited as long as the backlog, 1-2 s, so every failed
    attempt's channel and transport lived that long, survived into the
    oldest GC generation and brought on a full collection every ~2 s (issue
    18).  Its timers are few and cheap (the sweeps keep to their share of a
    core), so the others are not starved.
    """

    def __init__(
        self,
        dispatch: Callable[[Callable[[], None]], None] | None = None,
        defer: Callable[[Callable[[], None]], bool] | None = None,
        prompt: bool = False,
    ) -> None:
        #: None: a due callback runs on the timer thread itself, unwrapped
        self._dispatch = dispatch
        #: its due timers run before every other clock's due ones
        self._prompt = prompt
        #: offered each zero-delay callback first: True when it took it (it
        #: runs it soon on the calling thread, e.g. on that thread's running
        #: event loop), False to leave it to the timer thread
        self._defer = defer
        self._closed = False

    #: ``time.monotonic`` itself: no Python frame per call (pickers read the
    #: clock on the RPC path)
    now = staticmethod(time.monotonic)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = _HeapTimer(time.monotonic() + max(0.0, delay), next(_TIMERS.seq), fn, self)
        if self._closed:
            timer._cancelled = True
            return timer
        if delay <= 0 and self._defer is not None and self._defer(self._deferred(timer)):
            return timer
        _TIMERS.push(timer)
        return timer

    def _deferred(self, timer: _HeapTimer) -> Callable[[], None]:
        """A zero-delay ``timer`` run by ``defer``: dispatched as the timer
        thread would, unless cancelled or the clock closed meanwhile."""

        def run() -> None:
            if not timer._cancelled and not self._closed:
                if self._dispatch is None:
                    timer.fn()
                else:
                    self._dispatch(self._guarded(timer))

        return run

    def close(self) -> None:
        """Cancel every pending timer; later ones are born cancelled."""
        self._closed = True
        _TIMERS.drop(self)

    @staticmethod
    def _guarded(timer: _HeapTimer) -> Callable[[], None]:
        def run() -> None:
            if not timer._cancelled:
                timer.fn()

        return run
