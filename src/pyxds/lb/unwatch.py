"""The watchers of a subchannel, and the handle ``Subchannel.watch_state``
returns (:mod:`pyxds.lb.api`).

A subchannel (the channel's shared core, or a policy's wrapper of one)
nearly always has exactly one watcher: the entry of the policy above it.
:class:`Watched` keeps that watcher in a slot of the subchannel; only a
second one makes a tuple (replaced, never changed in place).  A
10,000-endpoint cluster has several such subchannels per endpoint, and a
list each was an object Python's cyclic garbage collector walks in every
full collection (issue 18).

Rules:

* a report reaches the watchers registered when it started, in the order
  registered; a watcher added or removed by a watcher takes effect from the
  next report (what copying a list before each report gave, without the
  copy);
* unwatching removes the watcher once (its first registration, as
  ``list.remove``), and does nothing when it is gone already (the
  subchannel was shut down, or the handle was called before).  The handle
  is one small slotted object, not a closure (a function, its cells and
  their tuple).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Watched", "slot_add", "slot_items", "slot_remove"]

_Watcher = Callable[[Any, Any], object]


# A *slot* holds a few things in the order added without a list: None, one
# thing, or a tuple of two or more (replaced, never changed in place), for
# what nearly always holds exactly one per endpoint (a subchannel's watcher,
# an OOB stream's subscriber, an endpoint's outlier_detection wrapper).  The
# things themselves are never tuples.


def slot_add(slot: Any, item: Any) -> Any:
    """``slot`` with ``item`` added last."""
    if slot is None:
        return item
    if isinstance(slot, tuple):
        return (*slot, item)
    return (slot, item)


def slot_remove(slot: Any, item: Any) -> Any:
    """``slot`` without the first ``item`` in it (``==``, as ``list.remove``);
    ``slot`` itself when ``item`` is not in it."""
    if isinstance(slot, tuple):
        if item not in slot:
            return slot
        at = slot.index(item)
        rest = slot[:at] + slot[at + 1 :]
        return rest[0] if len(rest) == 1 else rest
    if slot is not None and slot == item:
        return None
    return slot


def slot_items(slot: Any) -> tuple[Any, ...]:
    """What ``slot`` holds, in the order added."""
    if slot is None:
        return ()
    return slot if isinstance(slot, tuple) else (slot,)


class Watched:
    """Watchers of one subchannel (module docstring): ``_watchers`` is None,
    one watcher, or a tuple of two or more, in the order registered.  A
    subclass sets ``_watchers`` to None before the first watcher."""

    __slots__ = ("_watchers",)
    _watchers: _Watcher | tuple[_Watcher, ...] | None

    def _add_watcher(self, fn: _Watcher) -> Callable[[], None]:
        self._watchers = slot_add(self._watchers, fn)
        return _Unwatch(self, fn)

    def _remove_watcher(self, fn: _Watcher) -> None:
        """Forget ``fn`` once (its first registration), as ``list.remove``."""
        self._watchers = slot_remove(self._watchers, fn)

    def _watching(self) -> tuple[_Watcher, ...]:
        """The watchers registered now, in order (for a caller that guards
        each call itself)."""
        return slot_items(self._watchers)

    def _notify(self, state: Any, status: Any) -> None:
        """Report to every watcher registered now."""
        watchers = self._watchers
        if watchers is None:
            return
        if isinstance(watchers, tuple):
            for fn in watchers:
                fn(state, status)
        else:
            watchers(state, status)


class _Unwatch:
    """The handle :meth:`Watched._add_watcher` returns: removes its watcher
    when called (any number of times)."""

    __slots__ = ("_fn", "_owner")

    def __init__(self, owner: Watched, fn: _Watcher) -> None:
        self._owner = owner
        self._fn = fn

    def __call__(self) -> None:
        self._owner._remove_watcher(self._fn)
