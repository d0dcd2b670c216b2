"""The TLS relays' event loops: a fixed, small number of threads, each an
``epoll`` loop (``poll`` where there is no epoll) over non-blocking sockets (gRFC A29 relay; see
:mod:`pyxds.security.relay`).

Rules:

* At most :data:`LOOP_THREADS` threads for the whole process, started on
  first use, whatever the number of relays and connections (a connection is
  given to the loop with the fewest connections; it stays there).
* A handler runs on its loop's thread only, one at a time, so a connection's
  ``ssl.SSLSocket`` is never touched by two threads at once (OpenSSL's rule
  for one ``SSL`` object).  Other threads hand work over with
  :meth:`RelayLoop.call_soon`.
* Sockets are level-triggered; the I/O itself (``recv_into``, ``SSL_read``,
  ``SSL_write``, ``send``) runs in C with the GIL released, and a handler
  does a bounded amount of work per wake-up, so one busy connection cannot
  starve the others.
* Timers (handshake deadlines) are a heap checked once per wake-up.
* Read buffers are per loop (one connection's handler runs at a time), so
  memory per idle connection does not include them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import threading
from collections import deque
from collections.abc import Callable

_log = logging.getLogger(__name__)

LOOP_THREADS = max(1, min(2, os.cpu_count() or 1))
"""Relay threads in the process (bounded: independent of the endpoints)."""

BUFFER_SIZE = 256 * 1024
"""Bytes read per step in each direction (16 TLS records)."""

_EPOLL = hasattr(select, "epoll")  # Linux; elsewhere poll(2), same event bits
IN = select.POLLIN
OUT = select.POLLOUT
ERR = select.POLLERR | select.POLLHUP
RDHUP = getattr(select, "EPOLLRDHUP" if _EPOLL else "POLLRDHUP", 0)  # peer closed


class _Poll:
    """``select.poll`` with epoll's interface (seconds, -1 = forever)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self.register = self._poll.register
        self.modify = self._poll.modify
        self.unregister = self._poll.unregister

    def poll(self, timeout: float = -1) -> list[tuple[int, int]]:
        return self._poll.poll(None if timeout < 0 else timeout * 1000)


Handler = Callable[[int], None]


class Timer:
    """A pending :meth:`RelayLoop.call_at`; :meth:`cancel` before it fires."""

    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class RelayLoop:
    """One epoll thread (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._epoll: select.epoll | _Poll = select.epoll() if _EPOLL else _Poll()
        self._handlers: dict[int, Handler] = {}
        self._calls: deque[Callable[[], None]] = deque()
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._woken = False
        self._stopped = False
        self._epoll.register(self._wake_r, IN)
        #: the pool's load measure: connections given to this loop and not
        #: ended (changed under the pool's lock: :func:`least_loaded`,
        #: :meth:`connection_ended`)
        self.connections = 0
        self.up_view = memoryview(bytearray(BUFFER_SIZE))
        self.down_view = memoryview(bytearray(BUFFER_SIZE))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------
    def connection_ended(self) -> None:
        """A connection :func:`least_loaded` counted here has ended."""
        with _pool_lock:
            self.connections -= 1

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread.  One byte wakes the loop while
        ``_woken`` is clear; the loop clears it only after emptying the pipe
        and before running the calls, so a call added before it is cleared
        runs in that round and one added after writes its own byte."""
        self._calls.append(fn)
        if not self._woken:
            self._woken = True
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    # -- loop thread -----------------------------------------------------
    def register(self, fd: int, events: int, handler: Handler) -> None:
        self._handlers[fd] = handler
        self._epoll.register(fd, events)

    def modify(self, fd: int, events: int) -> None:
        self._epoll.modify(fd, events)

    def unregister(self, fd: int) -> None:
        if self._handlers.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(when, fn)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def stop(self) -> None:
        """End the thread (for tests; the pool's loops live as long as the
        process).  Sockets still registered are left to their owners."""
        self._stopped = True
        self.call_soon(lambda: None)
        self._thread.join(5)
        # closed here, not by the thread: it may end (woken by another
        # call or event that saw ``_stopped``) before the byte above is
        # written, which then went to a closed descriptor (EBADF)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        import time

        monotonic = time.monotonic
        poll = self._epoll.poll
        handlers = self._handlers
        calls = self._calls
        timers = self._timers
        wake_r = self._wake_r
        while not self._stopped:
            timeout = -1.0
            if timers:
                timeout = max(0.0, timers[0][0] - monotonic())
            try:
                events = poll(timeout)
            except InterruptedError:
                continue
            for fd, mask in events:
                if fd == wake_r:
                    # Empty the pipe, *then* let the next call_soon write
                    # again: the other way round, a call_soon between the
                    # two wrote a byte this read swallowed, and left the
                    # flag set with the pipe empty: every later call_soon
                    # skipped its write, and the loop slept with calls
                    # queued until a socket or timer of its own woke it.
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._woken = False
                    continue
                handler = handlers.get(fd)
                if handler is not None:
                    try:
                        handler(mask)
                    except Exception:
                        _log.exception("pyxds TLS relay: handler failed")
            while calls:
                try:
                    calls.popleft()()
                except Exception:
                    _log.exception("pyxds TLS relay: call failed")
            if timers:
                now = monotonic()
                while timers and timers[0][0] <= now:
                    timer = heapq.heappop(timers)[2]
                    if not timer.cancelled:
                        try:
                            timer.fn()
                        except Exception:
                            _log.exception("pyxds TLS relay: timer failed")
        close = getattr(self._epoll, "close", None)
        if close is not None:
            close()


_pool_lock = threading.Lock()
_pool: list[RelayLoop] = []


def least_loaded(count: bool = True) -> RelayLoop:
    """The loop with the fewest connections (starting loops up to
    :data:`LOOP_THREADS`).  ``count``: a new connection goes there, and it
    is counted now, under the pool's lock (a burst of accepts spreads over
    the loops: counted only once its start had run on its loop, every
    accept of a burst saw the same counts and went to the same loop);
    :meth:`RelayLoop.connection_ended` takes it back.  A listener is not a
    connection (``count=False``)."""
    with _pool_lock:
        if len(_pool) < LOOP_THREADS and all(loop.connections for loop in _pool):
            _pool.append(RelayLoop(f"pyxds-tls-relay-{len(_pool)}"))
        chosen = min(_pool, key=lambda loop: loop.connections)
        if count:
            chosen.connections += 1
        return chosen


def loops() -> list[RelayLoop]:
    """The loops started so far (for tests counting threads)."""
    with _pool_lock:
        return list(_pool)
