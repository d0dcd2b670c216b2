"""Channels a program never closes: how they end without holding up exit.

grpcio's channels let a script end without ``close()``; pyxds channels must
too.  The rules, and why:

1. **Interpreter exit closes every live channel from an ``atexit`` hook.**
   atexit hooks run after the main thread's last line and before the
   interpreter starts finalizing, while pyxds's daemon threads (timers, the
   xDS client's executor, subchannel closers) still run, so a close can
   take the locks those threads hold and hand work to them.  Python 3.12
   starts no new thread there (3.11 and 3.13 do), so what a close hands to
   a thread that has lingered out runs on the closing thread instead: the
   xDS watcher callbacks' flush (``LingeringPool.flush``) and the SHUTDOWN
   a ``subscribe`` callback gets.
2. **``__del__`` never closes anything itself.**  It may run on any thread,
   at any allocation, even inside a callback holding the serializer's or the
   clock's lock; and once the interpreter is finalizing, daemon threads are
   frozen wherever they stood (a lock they held is held forever) and a new
   thread never starts (``Thread.start`` waits for it forever).  So
   ``__del__`` only puts the core on a queue (``SimpleQueue.put`` is safe
   there); the reaper thread closes it.  While finalizing it does nothing:
   rule 1 already closed the channel.
3. **The reaper thread lives while a channel is open** and exits
   ``REAPER_LINGER`` after the last one closed (threads go back to their
   count before the first channel).  It sleeps until there is work: a core
   to close, or a channel that closed or went (:func:`closed`, or the
   core's weak reference dying), after which it looks whether any is still
   open.  It never wakes on a timer while channels are open, so a steady
   program's only pyxds thread wake-ups are its own work's (issue 18: a
   once-a-second wake-up took the GIL from the RPC loop).
4. **Nothing here joins a thread.**  Each close runs the channel's own
   ``close()``, which waits (bounded) only for its xDS client's ADS
   connection to close (``close(wait=0)``).

Channels closed explicitly or by ``with`` are closed once; a closed core is
skipped by both the hook and the reaper.
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
import weakref
from typing import Protocol

__all__ = ["track", "release", "closed", "close_all"]

_log = logging.getLogger(__name__)


class _Closable(Protocol):
    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


_live: weakref.WeakSet[_Closable] = weakref.WeakSet()
#: cores to close, and None: "a channel closed or went, look" (rule 3)
_reap: queue.SimpleQueue[_Closable | None] = queue.SimpleQueue()
#: a weak reference per tracked core whose death wakes the reaper (rule 3)
_refs: set[weakref.ref[_Closable]] = set()
_reaper_lock = threading.Lock()
_reaper: threading.Thread | None = None
_exiting = False


def track(core: _Closable) -> None:
    """Register a new channel core: closed at exit unless closed before."""
    global _reaper
    _live.add(core)
    _refs.add(weakref.ref(core, _gone))
    with _reaper_lock:
        if _reaper is None:
            _reaper = threading.Thread(target=_reap_forever, name="pyxds-reaper", daemon=True)
            _reaper.start()


def closed(core: _Closable) -> None:
    """``core`` closed (from its ``close()``): the reaper looks whether it
    was the last open one (rule 3).  Never blocks."""
    _reap.put(None)


def _gone(ref: weakref.ref[_Closable]) -> None:
    # a tracked core was collected (a weakref callback: any thread, any
    # allocation; SimpleQueue.put is safe there)
    try:
        _refs.discard(ref)
        _reap.put(None)
    except Exception:  # the interpreter is finalizing: its globals may be gone
        pass


def release(core: _Closable) -> None:
    """From ``__del__``: have the reaper close ``core`` (never blocks)."""
    if _exiting or sys.is_finalizing() or core.closed:
        return
    _reap.put(core)


def _close(core: _Closable) -> None:
    if core.closed:
        return
    try:
        core.close()
    except Exception:  # a channel that fails to close must not stop the others
        _log.debug("pyxds: closing an abandoned channel raised", exc_info=True)


#: Seconds the reaper waits after a channel closed or went before it looks
#: for an open one; with none left it exits (the next channel starts it
#: again), so a program that closed every channel has no pyxds thread left.
REAPER_LINGER = 1.0


def _reap_forever() -> None:
    global _reaper
    linger = False
    while True:
        try:
            core = _reap.get(timeout=REAPER_LINGER if linger else None)
        except queue.Empty:
            with _reaper_lock:
                # track() adds before it looks at _reaper (under this lock),
                # and release() only queues an open core: none is missed.
                if _reap.empty() and all(c.closed for c in list(_live)):
                    _reaper = None
                    return
            linger = False  # one is open: sleep until the next close
            continue
        if core is None:  # a channel closed or went: look after the linger
            linger = True
            continue
        if _exiting:
            continue
        _close(core)
        del core


def close_all() -> None:
    """Close every live channel (the atexit hook; callable by tests)."""
    for core in list(_live):
        _close(core)


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True
    close_all()
