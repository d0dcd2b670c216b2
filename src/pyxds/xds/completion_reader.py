"""Which event loop reads grpc.aio's completions: the application's, not the
xDS stream loop (issue 18 item 2: cost per RPC of ``pyxds.aio``).

Theory of operation
-------------------

grpcio's asyncio stack (1.85) has one completion queue per process.  Its
poller thread writes one byte to a socketpair per completed operation, and
every event loop that made a ``grpc.aio`` channel has a reader on that one
socket (``PollerCompletionQueue.bind_loop``): whichever loop wakes first
drains the queue, completes its own loop's operations and hands every
other loop's to it with ``call_soon_threadsafe``.  The xDS stream loop
(:mod:`pyxds.xds.stream_loop`) is bound too, and idle, so it wins most of
those races: an application RPC's completion then crosses to the stream
loop's thread and back (+32-36k instructions per RPC under callgrind, and
a thread switch).

Rules:

* While an application loop that pyxds bound to grpcio (a ``pyxds.aio``
  subchannel made a ``grpc.aio`` channel on it: :func:`app_loop_bound`) is
  running and has its reader on the socket, the stream loop *yields*: it
  removes its own reader.  The application's loop reads every completion
  and hands the stream loop's (xDS responses and writes: rare) over with
  ``call_soon_threadsafe``, grpcio's own path.
* While yielded, the stream loop looks every :data:`TICK` seconds, the
  interval doubling up to :data:`TICK_MAX` while it finds nothing to read
  or the application loop answers its probe in time (below): an idle
  application, and a busy one that keeps reading, cost two looks a second.
  (A look takes the GIL from the application's thread; with the interval
  back at ``TICK`` after every answered probe, a steady RPC loop paid 3-9
  looks a second: issue 18, the aio x1 rate.)  At each look:
  - no such loop runs any more (``asyncio.run`` returned, the loop stopped
    or closed): it takes its reader back and reads what is pending;
  - one runs, but the socket holds a byte: it posts a probe (a no-op
    callback) to the application loops that read.  One that runs it within
    :data:`STUCK_AFTER` is reading: nothing changes.  If none does, the
    loop is stuck (a long computation, or a blocking call such as a sync
    pyxds RPC made from a coroutine): the stream loop takes its reader back
    at once and reads (grpcio's reader, which also hands the application's
    events over), so the xDS streams run at full speed again after at most
    ``TICK_MAX`` + ``STUCK_AFTER``, for the whole of the stall; it yields
    again once the probe has run (the loop is responsive), looking every
    ``TICK`` after a stall.
* An application loop about to block on the stream loop (``pyxds.aio``'s
  ``close()`` waits for its xDS client's ADS stream to close, and that
  close needs grpc.aio's completions read) says so first
  (:func:`app_loop_blocks`): the stream loop takes its reader back at once
  and keeps it until the loop runs again (the function returned), instead
  of stalling the close for a look and a probe (~``TICK`` +
  ``STUCK_AFTER``: 120 ms of every short asyncio program's end).
* A sync-only process binds no application loop: nothing changes there.
* Only on a grpcio this was checked against (:data:`VERIFIED`), and only
  when the stream loop's reader is what 1.85's is (a selector loop whose
  reader is ``functools.partial(PollerCompletionQueue._handle_events,
  loop)``); otherwise the stream loop keeps its reader (grpcio's own
  behaviour), as with :data:`ENABLED` false.

Everything but :func:`app_loop_bound` runs on the stream loop's thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import select
import threading
import weakref
from collections.abc import Callable

import grpc

__all__ = [
    "ENABLED",
    "STUCK_AFTER",
    "TICK",
    "TICK_MAX",
    "VERIFIED",
    "CompletionReader",
    "app_loop_blocks",
    "app_loop_bound",
]

_log = logging.getLogger(__name__)

#: grpcio versions whose aio completion queue behaves as the module says
VERIFIED = frozenset({"1.85.3"})
#: whether the stream loop yields at all (tests compare both ways)
ENABLED = os.environ.get("PYXDS_STREAM_LOOP_YIELD", "1") != "0"
#: seconds between the yielded stream loop's looks (module rules)
TICK = 0.1
#: the longest interval between two looks (module rules)
TICK_MAX = 0.5
#: seconds an application loop has to run a probe before it counts as stuck
STUCK_AFTER = 0.02

_lock = threading.Lock()
#: application loops pyxds made grpc.aio channels on (weak: a closed loop goes)
_app_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
#: the running stream loop's reader, if any (:func:`attach`)
_current: CompletionReader | None = None


def app_loop_bound(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` (running, the caller's) now has a grpc.aio channel: grpcio
    has bound it to its completion socket (once per grpc.aio channel made,
    never per RPC).  Any thread."""
    with _lock:
        _app_loops.add(loop)
        reader = _current
    if reader is not None and not reader.yielded:
        reader.review_soon()


def app_loop_blocks() -> Callable[[], None]:
    """The calling thread's application loop is about to block on the stream
    loop (module rules): the stream loop reads from now on; call the
    function returned once the loop runs again.  Any thread."""
    with _lock:
        reader = _current
    if reader is None:
        return _nothing
    reader.hold_soon()
    return reader.release_soon


def _nothing() -> None:
    pass


def _poller_reader(loop: asyncio.AbstractEventLoop) -> tuple[int, Callable[[], None]] | None:
    """(fd, callback) of grpcio's completion reader on ``loop`` (a selector
    loop of this thread), or None when it is not the expected one."""
    selector = getattr(loop, "_selector", None)
    if selector is None or not isinstance(loop, asyncio.SelectorEventLoop):
        return None
    for fd, key in selector.get_map().items():
        handle = key.data[0]  # (reader, writer) handles of a selector loop
        callback = getattr(handle, "_callback", None)
        if (
            isinstance(callback, functools.partial)
            and getattr(callback.func, "__qualname__", "") == "PollerCompletionQueue._handle_events"
            and callback.args == (loop,)
            and not callback.keywords
        ):
            return fd, callback
    return None


def _reads(loop: asyncio.AbstractEventLoop, fd: int) -> bool:
    """Whether ``loop`` runs and has a reader on ``fd`` (a selector loop;
    read from another thread: a dict lookup under the GIL)."""
    if not loop.is_running() or loop.is_closed():
        return False
    if not isinstance(loop, asyncio.SelectorEventLoop):
        return False
    try:  # the loop may close meanwhile (its selector's map then goes)
        return fd in loop._selector.get_map()  # type: ignore[attr-defined]  # a selector loop's
    except Exception:
        return False


def _readable(fd: int) -> bool:
    try:
        ready, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(ready)


class CompletionReader:
    """The stream loop's part (module rules): :meth:`attach` after grpcio
    bound the loop, :meth:`detach` before it stops."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, read: Callable[[], None]):
        self._loop = loop
        self._fd = fd
        self._read = read
        self.yielded = False
        self._ticking = False
        self._interval = TICK
        self._closed = False
        #: the outstanding probe of the application loops (module rules):
        #: filled by the first loop that runs it
        self._probe: list[bool] | None = None
        #: application loops blocked on this loop (:func:`app_loop_blocks`)
        self._holds = 0

    @classmethod
    def attach(cls, loop: asyncio.AbstractEventLoop) -> CompletionReader | None:
        """The reader of ``loop`` (the stream loop, on its thread), or None
        when this grpcio or this loop is not one the module handles."""
        global _current
        if not ENABLED or grpc.__version__ not in VERIFIED:
            return None
        try:
            found = _poller_reader(loop)
        except Exception:  # another layout: grpcio's own behaviour
            _log.debug("pyxds: grpc.aio's completion reader not found", exc_info=True)
            found = None
        if found is None:
            return None
        reader = cls(loop, *found)
        with _lock:
            _current = reader
        reader.review()
        return reader

    def detach(self) -> None:
        """The stream loop stops: its reader back (grpcio removes it at its
        shutdown), no more looks."""
        global _current
        with _lock:
            if _current is self:
                _current = None
        self._reclaim()
        self._closed = True

    def review_soon(self) -> None:
        """:meth:`review` on the stream loop (any thread)."""
        try:
            self._loop.call_soon_threadsafe(self.review)
        except RuntimeError:  # the stream loop closed
            pass

    def hold_soon(self) -> None:
        """An application loop blocks on this loop: read (any thread)."""
        self._post(self._hold)

    def release_soon(self) -> None:
        """That loop runs again (any thread)."""
        self._post(self._release)

    def _post(self, fn: Callable[[], None]) -> None:
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the stream loop closed
            pass

    def _hold(self) -> None:
        self._holds += 1
        self._reclaim()

    def _release(self) -> None:
        self._holds -= 1
        if self._holds == 0:
            self.review()

    def _app_reading(self) -> bool:
        with _lock:
            loops = list(_app_loops)
        return any(_reads(loop, self._fd) for loop in loops)

    def review(self) -> None:
        """Yield to a running application loop, or take the reader back."""
        if self._closed:
            return
        if not self._holds and self._app_reading():
            if not self.yielded:
                self._loop.remove_reader(self._fd)
                self.yielded = True
                self._interval = TICK
                _log.debug("pyxds: xDS stream loop yields grpc.aio's completions")
            if not self._ticking:
                self._ticking = True
                self._loop.call_later(self._interval, self._tick)
        else:
            self._reclaim()

    def _tick(self) -> None:
        self._ticking = False
        if not self.yielded or self._closed:
            return
        if self._probe is None and _readable(self._fd) and self._post_probe():
            # Completions wait: is an application loop still reading?
            self._loop.call_later(STUCK_AFTER, self._check_stuck)
            return
        self._interval = min(2 * self._interval, TICK_MAX)
        self.review()

    def _post_probe(self) -> bool:
        """A no-op callback posted to each application loop that reads
        (module rules); False when there is none."""
        probe: list[bool] = []
        with _lock:
            loops = list(_app_loops)
        posted = False
        for loop in loops:
            if _reads(loop, self._fd):
                try:
                    loop.call_soon_threadsafe(probe.append, True)
                    posted = True
                except RuntimeError:  # closed meanwhile
                    pass
        self._probe = probe if posted else None
        return posted

    def _check_stuck(self) -> None:
        """The probe's answer: an application loop ran it (it reads: yield,
        or stay yielded), or none did (stuck: compete again, and look again
        after ``TICK``), or none reads any more (take the reader back)."""
        probe = self._probe
        if self._closed or probe is None:
            self._probe = None
            return
        if probe:
            self._probe = None
            if self.yielded:  # answered in time: as a look that found nothing
                self._interval = min(2 * self._interval, TICK_MAX)
            self.review()  # after a stall: yields again, looking every TICK
            return
        if not self._app_reading():
            self._probe = None
            self._reclaim()
            return
        if self.yielded:
            _log.debug("pyxds: an application loop is stuck; the xDS stream loop reads")
            self._reclaim()
        self._loop.call_later(TICK, self._check_stuck)

    def _reclaim(self) -> None:
        if not self.yielded:
            return
        self.yielded = False
        self._loop.add_reader(self._fd, self._read)
        _log.debug("pyxds: xDS stream loop reads grpc.aio's completions again")
        self._drain()  # what came while no loop of ours read

    def _drain(self) -> None:
        """grpcio's reader, called here: an event of an application loop
        that has closed raises "Event loop is closed" from it (nothing is
        left to deliver it to: dropped quietly, as the stream loop's
        exception handler drops it from grpcio's own calls; the events
        behind it stay queued for the next read)."""
        try:
            self._read()
        except RuntimeError as error:
            if str(error) != "Event loop is closed":
                raise
            _log.debug("pyxds: dropped a grpc.aio event of a closed event loop")


def current() -> CompletionReader | None:
    """The running stream loop's :class:`CompletionReader` (tests)."""
    return _current
