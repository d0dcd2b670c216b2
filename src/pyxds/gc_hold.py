"""No cyclic garbage collection inside a long bulk job (issue 18).

Why
---

An EDS update that grows a cluster from 1,000 to 10,000 endpoints builds
~45 GC-tracked objects per new endpoint (pyxds's LB tree and grpcio's
channel objects, ~400,000 in all) in one serializer callback.  Every one of
them lives on, yet CPython's collector traverses them again and again while
they are made: each young collection sees them, each one surviving two is
promoted, and every time promoted objects reach a quarter of the old
generation a full collection traverses the whole heap.  Measured on the
grow phase of ``bench/scale.py --shape eds``: 5 full collections, 3.1-3.6 s
of the ~10 s window with the GIL held (the longest 1.5-2 s: an RPC waited
that long), where C-core's channel makes no Python objects at all.

So a serializer drain that has done ``BULK`` pieces of work holds the collector off
(:class:`BulkHold`, :func:`hold`) until it ends (:func:`release`), and then
moves what survived straight to the oldest generation (``gc.freeze()`` then
``gc.unfreeze()``: no traversal, and the moved objects are not counted as
promotions, so they bring on no full collection of their own).  The next
full collection, when the program's own promotions bring it on, traverses
them once.  Measured on the same grow phase: no full collection in the
window (was 5-6), and the 10,000 connections up sooner.

Rules
-----

1. Only while the collector is enabled and the program froze nothing
   (``gc.get_freeze_count()`` no more than :func:`interpreter_frozen`): a
   program that disabled it, or froze its objects (a pre-fork server), is
   left exactly as it is.  CPython 3.12 keeps its own immortal objects
   that the collector tracks (its static types' ``__bases__`` and
   ``__mro__`` tuples: 375 on 3.12.1) in the frozen generation: there at
   start-up, and put back by every full collection after an
   ``unfreeze()``.  They are not the program's; counted as frozen, they
   kept every hold off there.  3.11 and 3.13 freeze nothing themselves.
   (On 3.12 a program that froze objects before this module was imported,
   when it first used pyxds's API, has them counted as the interpreter's.)
2. Holds nest and come from any thread: the collector is enabled again
   when the last hold is released, and only if pyxds disabled it.
3. Garbage cycles made meanwhile (by any thread) are not lost: they wait
   for a later collection (at most one full collection away).  Reference
   counting frees everything else as usual.
4. A hold lasts one drain: a bulk job of a few seconds, never an idle wait;
   and at most ``LIMIT`` pieces of it.  A drain that never empties (work
   submitted as fast as it runs, whatever the cause) lets the collector go
   after that and does not hold it again before it ends: a garbage cycle
   made meanwhile is never kept from the collector longer than one bulk job.
5. A drain's work is counted, not timed: each callback is a piece, and so
   is each endpoint a callback connects (:meth:`BulkHold.check`): an
   integer added and compared.  On a loaded machine a drain of a few
   callbacks can take milliseconds of wall time; counting keeps the hold to
   real bulk work (an update connecting hundreds of endpoints, a flood of
   hundreds of connectivity reports) whatever the load.  Short drains (an
   RPC's exit from idle, a backoff ending, a connectivity report) never
   touch the collector.
6. The other bulk job is loading: the first ``xds:`` channel of a process
   loads the xDS stack (~60 modules, the descriptor bundle's ~370 message
   classes, the LB tree's policies), each piece under :func:`held`.
   Nearly everything it makes lives as long as the process, yet the
   collector ran ~20 times while it was made (8.5 M instructions, ~4.5 %
   of a fresh program's first RPC, sync and aio; issue 18, start-up).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
import threading
from collections.abc import Iterator

__all__ = [
    "BULK",
    "LIMIT",
    "BulkHold",
    "held",
    "hold",
    "holding",
    "import_held",
    "interpreter_frozen",
    "release",
]

#: Pieces of work (callbacks, endpoints connected) a serializer drain does
#: before it holds the collector off.
BULK = 256
#: Pieces of work after which a drain lets the collector go for good (rule
#: 4): well above a 10,000-endpoint update's (one piece an endpoint, plus
#: its callbacks).
LIMIT = 65_536

#: objects the interpreter keeps frozen itself, which do not count as the
#: program's (rule 1): on CPython 3.12 what is frozen when this module is
#: imported, elsewhere none
_interpreter_frozen = gc.get_freeze_count() if sys.version_info[:2] == (3, 12) else 0

_lock = threading.Lock()
#: holds now (the collector is disabled by pyxds while there is one)
_holds = 0


def hold() -> bool:
    """One more hold; True when it counts (release it with :func:`release`),
    False when the collector is left alone (rule 1)."""
    global _holds
    with _lock:
        if _holds:
            _holds += 1
            return True
        if not gc.isenabled() or gc.get_freeze_count() > _interpreter_frozen:
            return False
        gc.disable()
        _holds = 1
        return True


def release() -> None:
    """One hold less; the last one promotes the survivors without a
    traversal and enables the collector again (module docstring)."""
    global _holds
    with _lock:
        _holds -= 1
        if _holds:
            return
        if gc.get_freeze_count() <= _interpreter_frozen:  # the program froze nothing meanwhile
            gc.freeze()
            gc.unfreeze()  # the interpreter's own too, until the next full collection
        gc.enable()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The collector held off over a ``with`` block: a one-off bulk job
    (rule 6), released however the block ends."""
    counted = hold()
    try:
        yield
    finally:
        if counted:
            release()


def import_held(*names: str) -> None:
    """Import the modules ``names`` with the collector held (rule 6), if
    any is not loaded yet; once they are, a dictionary look each."""
    if all(name in sys.modules for name in names):
        return
    with held():
        for name in names:
            importlib.import_module(name)


class BulkHold:
    """One serializer's drains: the collector held off once a drain has done
    ``BULK`` pieces of work, until it ends.  Used by one thread at a time
    (the one draining).

    ``pieces`` and ``held`` are read and set by the drain itself
    (:mod:`pyxds.serializer`): a drain of a few callbacks (a connectivity
    report, a backoff ending: several per failed connection attempt, issue
    18) counts them inline and calls :meth:`over` only at ``BULK`` pieces,
    instead of three method calls per drain."""

    __slots__ = ("pieces", "held")

    def __init__(self) -> None:
        #: pieces of work done by the drain running now
        self.pieces = 0
        #: whether this drain holds the collector
        self.held = False

    def check(self) -> None:
        """One more piece of the drain's work done (rules 4 and 5)."""
        self.pieces += 1
        if self.pieces >= BULK:
            self.over()

    def over(self) -> None:
        """The drain has done ``BULK`` pieces or more (rules 4 and 5)."""
        if self.pieces < LIMIT:
            if not self.held:
                self.held = hold()
        elif self.held:
            self.held = False
            release()

    def end(self) -> None:
        """The drain is over: its hold, if any, is released."""
        if self.held:
            self.held = False
            release()


def holding() -> int:
    """Holds now (for tests)."""
    return _holds


def interpreter_frozen() -> int:
    """Frozen objects that are the interpreter's, not the program's (rule
    1; for tests)."""
    return _interpreter_frozen
