"""Work for one event loop, posted from other threads, one wake-up per batch.

Rules
-----

* :meth:`LoopInbox.run` runs a callable on the inbox's event loop: at once
  when called on that loop's thread while it runs, else it is queued.
* Queued callables run on the loop in the order they were queued, each once,
  all of one batch in one loop callback.  A callable that raises is logged
  and the rest of its batch still runs (as separate loop callbacks would).
* One ``call_soon_threadsafe`` per batch, not per callable: the first
  callable queued into an empty inbox schedules the batch; the others join
  it until the loop takes it.  ``call_soon_threadsafe`` writes to the loop's
  self-pipe and wakes the loop, whose thread then competes for the GIL with
  the poster.  An xDS update that adds N endpoints to a ``pyxds.aio``
  channel runs on an xDS watcher thread and makes N ``grpc.aio`` channels
  that must be made on the loop (issue 18: 2N such writes at N=1000, the
  watcher thread and the loop handing the GIL to each other per endpoint).
* Posted to a closed loop, a callable is dropped (it could never run: a
  ``grpc.aio`` channel cannot be made or closed on a closed loop), as a
  ``call_soon_threadsafe`` to it would be.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable

_log = logging.getLogger(__name__)


class LoopInbox:
    """Callables for ``loop`` from any thread (see the module docstring)."""

    __slots__ = ("loop", "_lock", "_queue", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._scheduled = False

    def run(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop: now when on it, else queued."""
        if asyncio._get_running_loop() is self.loop:
            fn()
            return
        with self._lock:
            self._queue.append(fn)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.drain)
                return
        except RuntimeError:  # closed meanwhile
            pass
        with self._lock:
            self._queue.clear()
            self._scheduled = False

    def drain(self) -> None:
        """Run what is queued (the loop's callback; also callable on the
        loop by whoever needs the queued work done now)."""
        with self._lock:
            batch, self._queue = self._queue, collections.deque()
            self._scheduled = False
        for fn in batch:
            try:
                fn()
            except Exception:
                _log.exception("pyxds: callback raised on the event loop")
