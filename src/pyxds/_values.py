"""``dataclass`` for pyxds's frozen value classes, at half the cost to define
(issue 18, start-up).

Python 3.11's ``dataclasses.dataclass`` compiles every generated method
with its own ``exec``; a frozen class gets six (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``), ~0.5 ms a class
on a shared machine.  A process's first ``xds:`` RPC defines ~65 of them:
a third of its start-up.

Rules:

* ``dataclass(frozen=True[, slots=True])`` with no other parameter, on a
  class that defines none of ``__eq__``, ``__hash__``, ``__repr__`` itself:
  the standard decorator makes ``__init__``, the frozen ``__setattr__`` /
  ``__delattr__``, slots, ``__match_args__`` and the fields as always; the
  three others are shared functions, built once per class from its fields
  (no ``exec``), that answer exactly what the generated ones answer:

  - ``__eq__``: ``NotImplemented`` unless ``other.__class__ is
    self.__class__``, else the tuples of the ``compare`` fields compared
    (tuple semantics: identity first, then ``==``);
  - ``__hash__``: ``hash`` of the tuple of the fields with ``hash=True``,
    or with ``hash=None`` and ``compare=True``;
  - ``__repr__``: ``QualName(a=..., b=...)`` over the ``repr`` fields,
    ``...`` where it recurses into itself.

* Anything else (not frozen, ``order``, ``eq=False``, ``init=False``,
  ``unsafe_hash``, a class defining one of the three) is the standard
  decorator, unchanged.
* Type checkers see ``dataclasses.dataclass`` itself.
  ``tests/unit/test_values.py`` compares both decorators on the same classes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

__all__ = ["dataclass"]

_OWN = ("__eq__", "__hash__", "__repr__")


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function giving ``(obj.<name>, ...)``, always a tuple."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        get_one = attrgetter(names[0])
        return lambda obj: (get_one(obj),)
    get: Callable[[Any], tuple[Any, ...]] = attrgetter(*names)
    return get


def _add_value_methods(cls: type) -> type:
    fields = dataclasses.fields(cls)
    compared = _values_of(tuple(f.name for f in fields if f.compare))
    hashed = _values_of(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
    shown = tuple(f.name for f in fields if f.repr)
    body = "(" + ", ".join(f"{name}={{!r}}" for name in shown) + ")"
    values_shown = _values_of(shown)
    running: set[tuple[int, int]] = set()

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return compared(self) == compared(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hashed(self))

    def __repr__(self: Any) -> str:
        key = (id(self), threading.get_ident())
        if key in running:
            return "..."
        running.add(key)
        try:
            name: str = self.__class__.__qualname__
            return name + body.format(*values_shown(self))
        finally:
            running.discard(key)

    for name, fn in (("__eq__", __eq__), ("__hash__", __hash__), ("__repr__", __repr__)):
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, fn)
    return cls


def _value_dataclass(cls: Any = None, /, **params: Any) -> Any:
    def wrap(c: type) -> type:
        if (
            params.get("frozen") is True
            and set(params) <= {"frozen", "slots"}
            and not any(name in c.__dict__ for name in _OWN)
        ):
            out: type = dataclasses.dataclass(c, eq=False, repr=False, **params)
            return _add_value_methods(out)
        return dataclasses.dataclass(c, **params)

    return wrap if cls is None else wrap(cls)


if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
else:
    dataclass = _value_dataclass
