"""The channel's work serializer (ARCHITECTURE.md "One serializer per channel").

Every resolver, LB policy, subchannel-state and timer callback of a channel
runs through one :class:`WorkSerializer`: callbacks run one at a time, in
submission order, never concurrently.  ``run(fn)`` from any thread either
runs ``fn`` at once on the calling thread (when the serializer is free) or
queues it for the thread currently draining; a callback that submits more
work has it run after it returns, never re-entrantly.  This is the shape of
C-core's WorkSerializer: no dedicated thread, no lock held while user code
runs.

A drain is bulk work when it runs long (a 10,000-endpoint update, thousands
of connectivity reports in a row): once it has done ``gc_hold.BULK`` pieces
of work (callbacks, and what a callback counts with
:meth:`WorkSerializer.bulk_progress`) it holds the cyclic garbage collector
off until it ends (:mod:`pyxds.gc_hold`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from pyxds.gc_hold import BULK, BulkHold

_log = logging.getLogger(__name__)


class WorkSerializer:
    """Runs callbacks one at a time, in order, on whichever thread submits
    while the serializer is idle."""

    def __init__(self) -> None:
        self._queue: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()
        self._draining = False
        self._drain_thread: int | None = None
        self._bulk = BulkHold()

    def run(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` serialized with every other callback."""
        with self._lock:
            self._queue.append(fn)
            if self._draining:
                return
            self._draining = True
        self._drain()

    def schedule(self, fn: Callable[[], None]) -> None:
        """Queue ``fn``; it runs now if idle, else after the current callback."""
        self.run(fn)

    @property
    def in_serializer(self) -> bool:
        """True when called from a callback currently running here."""
        return self._drain_thread == threading.get_ident()

    def bulk_progress(self) -> None:
        """Inside a callback doing bulk work: one piece done (one of thousands
        of endpoints connected); a drain that has done many holds the
        collector off (:mod:`pyxds.gc_hold`).  Does nothing outside a drain
        of this serializer."""
        if self._drain_thread == threading.get_ident():
            self._bulk.check()

    def _drain(self) -> None:
        self._drain_thread = threading.get_ident()
        bulk = self._bulk
        # BulkHold.check inline (pieces reset here): most drains run one or two
        # callbacks (a connectivity report, a backoff ending), and three
        # method calls each were a tenth of their Python steps (issue 18)
        bulk.pieces = 0
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        self._draining = False
                        self._drain_thread = None
                        if bulk.held:
                            bulk.end()
                        return
                    fn = self._queue.popleft()
                try:
                    fn()
                except Exception:  # a bug in one callback must not wedge the channel
                    _log.exception("pyxds: callback raised in work serializer")
                bulk.pieces += 1
                if bulk.pieces >= BULK:
                    bulk.over()
        except BaseException:
            with self._lock:
                self._draining = False
                self._drain_thread = None
                bulk.end()
            raise
