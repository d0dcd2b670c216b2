"""The handle ``Subchannel.watch_state`` returns (:mod:`pyxds.lb.api`).

A subchannel (or a policy's wrapper of one) keeps its watchers in a list;
unwatching removes the watcher from that list, once, and does nothing when
it is gone already (the subchannel was shut down, or the handle was called
before).  The handle is one small slotted object instead of a closure per
watcher (a function, its cells and their tuple): a 10,000-endpoint cluster
has three such handles per endpoint, each one an object Python's cyclic
garbage collector walks in every full collection (issue 18).

:class:`Watched` is the same bookkeeping for a policy's subchannel wrapper,
which nearly always has exactly one watcher (its child's entry): the
watcher sits in a slot of the wrapper, and only a second one makes a tuple.
No list per wrapper, and a report goes out without copying one: the
watchers a report reaches are those registered when it started (a watcher
added or removed by a watcher takes effect from the next report), as with
the copied list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Unwatch", "Watched"]

_F = TypeVar("_F", bound=Callable[..., object])


class Unwatch(Generic[_F]):
    """Removes ``fn`` from ``watchers`` when called (any number of times)."""

    __slots__ = ("_fn", "_watchers")

    def __init__(self, watchers: list[_F], fn: _F) -> None:
        self._watchers = watchers
        self._fn = fn

    def __call__(self) -> None:
        try:
            self._watchers.remove(self._fn)
        except ValueError:
            pass


_Watcher = Callable[[Any, Any], object]


class Watched:
    """Watchers of a subchannel wrapper (module docstring): ``_watchers`` is
    None, one watcher, or a tuple of two or more, in the order registered.
    A subclass sets ``_watchers`` to None before the first watcher."""

    __slots__ = ("_watchers",)
    _watchers: _Watcher | tuple[_Watcher, ...] | None

    def _add_watcher(self, fn: _Watcher) -> Callable[[], None]:
        watchers = self._watchers
        if watchers is None:
            self._watchers = fn
        elif type(watchers) is tuple:
            self._watchers = (*watchers, fn)
        else:
            self._watchers = (watchers, fn)  # type: ignore[assignment]  # not a tuple here
        return _Unwatcher(self, fn)

    def _remove_watcher(self, fn: _Watcher) -> None:
        """Forget ``fn`` once (its first registration), as ``list.remove``."""
        watchers = self._watchers
        if type(watchers) is tuple:
            if fn in watchers:
                at = watchers.index(fn)
                rest = watchers[:at] + watchers[at + 1 :]
                self._watchers = rest[0] if len(rest) == 1 else rest
        elif watchers is not None and watchers == fn:
            self._watchers = None

    def _notify(self, state: Any, status: Any) -> None:
        """Report to every watcher registered now."""
        watchers = self._watchers
        if watchers is None:
            return
        if type(watchers) is tuple:
            for fn in watchers:
                fn(state, status)
        else:
            watchers(state, status)  # type: ignore[operator]  # one watcher, not a tuple


class _Unwatcher:
    """The handle :meth:`Watched._add_watcher` returns."""

    __slots__ = ("_fn", "_owner")

    def __init__(self, owner: Watched, fn: _Watcher) -> None:
        self._owner = owner
        self._fn = fn

    def __call__(self) -> None:
        self._owner._remove_watcher(self._fn)
