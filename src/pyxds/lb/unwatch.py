"""The handle ``Subchannel.watch_state`` returns (:mod:`pyxds.lb.api`).

A subchannel (or a policy's wrapper of one) keeps its watchers in a list;
unwatching removes the watcher from that list, once, and does nothing when
it is gone already (the subchannel was shut down, or the handle was called
before).  The handle is one small slotted object instead of a closure per
watcher (a function, its cells and their tuple): a 10,000-endpoint cluster
has three such handles per endpoint, each one an object Python's cyclic
garbage collector walks in every full collection (issue 18).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Unwatch"]

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
