"""``dataclass`` for pyxds's value classes, defined without compiling a
method per class (issue 18, start-up).

Python 3.11's ``dataclasses.dataclass`` compiles every generated method
with its own ``exec``: a frozen class gets six (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``), ~0.5 ms a class
on a shared machine, and a process's first ``xds:`` RPC defines ~80
dataclasses.  Here no method is compiled per class.

Rules:

* Taken here: ``dataclass`` with no parameter or only ``frozen``,
  ``slots``, ``eq``, ``order`` and ``init``, on a class that defines none of
  ``__eq__``, ``__repr__``, ``__setattr__``, ``__delattr__`` (nor, with
  ``order``, a comparison), has no dataclass base, no ``InitVar`` and no
  keyword-only field.  The fields are collected here as the standard
  decorator collects them (``_collect``: the same ``Field`` objects, its
  ``ClassVar`` rule, defaults put on the class or taken off it,
  ``__dataclass_fields__``, ``__dataclass_params__``, ``__match_args__``,
  the class re-created once for slots, as it always is, with the methods
  below already in its namespace, as the standard decorator has them:
  setting each on the class afterwards updated its type slots again), in
  about half
  the time the standard decorator took when it was called here, with
  everything off, only to collect (it matches each annotation against
  ``ClassVar``, ``InitVar`` and ``KW_ONLY`` with a regex apiece): a frozen
  slotted class of 8 fields took 73 us in all, now 59.  A class whose
  fields the standard decorator refuses (a mutable default, a field
  without an annotation, a ``ClassVar`` with a factory, its own
  ``__slots__``, with ``init`` a parameter without a default after one
  with a default) gets the standard decorator, for its own errors (whose
  texts differ between Python versions: 3.13 names the default argument
  too).  The
  ``Field._field_type`` sentinels and the ``__dataclass_params__`` object
  are copied from a class the standard decorator made once per ``slots``
  with nothing to compile (the params' type and arguments differ between
  Python versions; a class's own params object is then made by calling
  that type with the arguments read once per settings).  One pass over the
  fields checks them (``InitVar``, ``KW_ONLY``, keyword-only ``field()``:
  the standard decorator) and one makes them; the lists the methods read
  (names, compared, hashed, shown, parameters: ``_Collected``) are made
  once, and are all the names when every field is a plain parameter, the
  common case (a frozen slotted class was ~510k instructions, ~3,200
  bytecodes run here, now ~415k and ~2,150: issue 18, start-up).  The
  methods are then added here, with the answers of the generated ones:

  - ``__repr__``: ``QualName(a=..., b=...)`` over the ``repr`` fields,
    ``...`` where it recurses into itself;
  - ``__eq__`` (``eq``): ``NotImplemented`` unless ``other.__class__ is
    self.__class__``, else the tuples of the ``compare`` fields compared
    (tuple semantics: identity first, then ``==``); ``order`` adds ``<``,
    ``<=``, ``>``, ``>=`` the same way;
  - ``__hash__`` (``eq``): frozen, ``hash`` of the tuple of the fields with
    ``hash=True``, or ``hash=None`` and ``compare=True``; not frozen,
    ``None``; a class's own ``__hash__`` is kept, as the standard keeps it;
  - these three are the standard decorator's own source, compiled once per
    (operator, number of fields) with placeholder attribute names that each
    class's copy of the code object replaces (``CodeType.replace``): the
    same bytecode, so the same speed per call (shared functions reading
    the fields with ``attrgetter`` were 1.5-2x slower);
  - ``__setattr__`` / ``__delattr__`` (frozen): ``FrozenInstanceError(
    "cannot assign to field 'x'")`` / ``("cannot delete field 'x'")`` when
    the instance's type is the class the decorator was given or the name
    is a field, else ``super()``'s (so, as with the standard one, a slotted
    class answers a name that is no field with ``super()``'s TypeError: the
    class it names is the one slots replaced);
  - ``__init__`` (``init``, unless the class has its own): the standard
    one's parameters, defaults, annotations, globals and body (each field
    stored, through ``object.__setattr__`` when frozen; default factories
    called for ``<factory>`` arguments; ``init=False`` fields set as the
    standard one sets them; ``__post_init__`` last), made from a template
    compiled once per *shape* (which fields are parameters, which call a
    factory, whether ``__post_init__`` runs, frozen or not) and shared by
    every class of that shape: the template's code object gets the class's
    parameter and attribute names (``CodeType.replace``), its field names
    (frozen; each name's cell shared by every ``__init__``, which only reads
    it) and defaults or factories come from closure cells.  Per
    construction it does what the generated one does, minus the
    ``object.__setattr__`` attribute lookup per field when frozen.
  - the templates of every shape pyxds's own classes use ship as source in
    the generated ``pyxds._value_templates`` (scripts/gen_value_templates.py;
    its ``--check`` and tests/unit/test_value_templates.py hold it in sync),
    so they load as cached bytecode (~0.5 ms) instead of ~55 compiles
    (~6 ms) per process; a shipped template is the very code object
    ``_values`` would compile (file name and first line put back), and a
    shape not shipped is compiled once, as before.

  ``__dataclass_params__`` then says what the standard decorator's says,
  a frozen slotted class gets the standard ``__getstate__`` /
  ``__setstate__``, every class the standard ``__replace__`` where the
  standard decorator gives one (Python 3.13+, ``copy.replace``; copied
  from the class it made), and a class without a docstring the standard
  one (its name and signature).  With ``slots``, the class the copy
  replaces keeps what the standard decorator leaves on it (the fields,
  params, match args, docstring and ``field()`` defaults; not the
  methods: ``_put``).

* Anything else (``repr=False``, ``unsafe_hash``, ``kw_only``, ``match_args``
  or ``weakref_slot`` given, a class defining one of the methods above, a
  dataclass base, ``InitVar``, ``KW_ONLY``) is the standard decorator,
  unchanged.
* Type checkers see ``dataclasses.dataclass`` itself.
  ``tests/unit/test_values.py`` compares both decorators on the same class
  bodies, and on every pyxds class the template made.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import functools
import inspect
import re
import sys
import threading
import types
import typing
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

__all__ = ["dataclass"]

#: methods the standard decorator would make; a class defining one of them
#: gets the standard decorator
_OWN = ("__eq__", "__repr__", "__setattr__", "__delattr__")
#: ``order=True``'s methods (a class defining one gets the standard decorator,
#: which refuses it)
_ORDER = (("__lt__", "<"), ("__le__", "<="), ("__gt__", ">"), ("__ge__", ">="))
_OWN_ORDER = _OWN + tuple(name for name, _ in _ORDER)
#: the parameters taken here
_PARAMS = frozenset(("frozen", "slots", "eq", "init", "order"))
#: annotations (strings under ``from __future__ import annotations``) the
#: standard decorator may read as an ``InitVar`` or the ``KW_ONLY`` marker
_NOT_OURS = ("InitVar", "KW_ONLY")
#: the default of a parameter whose field has a ``default_factory`` (its
#: repr, ``<factory>``, shows in signatures)
_FACTORY: Any = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None)
_SET = object.__setattr__


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function giving ``(obj.<name>, ...)``, always a tuple."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        get_one = attrgetter(names[0])
        return lambda obj: (get_one(obj),)
    get: Callable[[Any], tuple[Any, ...]] = attrgetter(*names)
    return get


def _value_methods(
    methods: dict[str, Any],
    cls: type,
    layout: _Collected,
    frozen: bool,
    eq: bool,
    order: bool,
) -> None:
    """Into ``methods``: ``__repr__``; with ``eq``, ``__eq__`` and
    ``__hash__`` (from the fields when frozen, else ``None``; the class's own
    is kept, as the standard decorator keeps it); with ``order``, the four
    comparisons."""
    compared, hashed, shown = layout.compared, layout.hashed, layout.shown
    body = "(" + ", ".join([f"{name}={{!r}}" for name in shown]) + ")"
    values_shown = _values_of(shown)
    running: set[tuple[int, int]] = set()

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

    __repr__.__qualname__ = f"{cls.__qualname__}.__repr__"
    methods["__repr__"] = __repr__
    if eq:
        methods["__eq__"] = _method(cls, "__eq__", "==", compared)
        if "__hash__" not in cls.__dict__:
            # from the fields when frozen; else None, as the standard decorator
            methods["__hash__"] = _method(cls, "__hash__", "hash", hashed) if frozen else None
    if order:
        for name, op in _ORDER:
            methods[name] = _method(cls, name, op, compared)


#: (operator or "hash", number of fields) -> the template method's code
_METHODS: dict[tuple[str, int], types.CodeType] = {}
#: (prefix, n) -> the placeholder names ``<prefix>0`` .. ``<prefix><n-1>``
_PLACEHOLDERS: dict[tuple[str, int], tuple[str, ...]] = {}


def _placeholders(prefix: str, n: int) -> tuple[str, ...]:
    """The templates' placeholder names ``<prefix><i>`` for ``i < n``."""
    names = _PLACEHOLDERS.get((prefix, n))
    if names is None:
        names = _PLACEHOLDERS[prefix, n] = tuple(f"{prefix}{i}" for i in range(n))
    return names


#: the operators' method names
_OPERATORS = {"==": "__eq__", "hash": "__hash__", **{op: name for name, op in _ORDER}}
#: what the templates' code objects say they were compiled from
_FILENAME = "<pyxds._values>"


def _method_source(op: str, n: int, name: str | None = None) -> str:
    """The source of the ``op`` method over ``n`` fields (``self.n<i>``),
    as ``def <name>`` (the operator's method name by default)."""
    name = name or _OPERATORS[op]
    mine = "(" + "".join(f"self.n{i}," for i in range(n)) + ")"
    if op == "hash":
        return f"def {name}(self):\n return hash({mine})\n"
    theirs = mine.replace("self.", "other.")
    return (
        f"def {name}(self, other):\n"
        f" if other.__class__ is self.__class__:\n  return {mine} {op} {theirs}\n"
        " return NotImplemented\n"
    )


def _method_template(op: str, n: int) -> types.CodeType:
    """The code of the ``op`` method over ``n`` fields: shipped as bytecode
    (``pyxds._value_templates``) or compiled once per key."""
    key = (op, n)
    template = _METHODS.get(key)
    if template is None:
        shipped = _shipped().METHODS.get(key)
        if shipped is not None:
            name = _OPERATORS[op]
            template = shipped.__code__.replace(
                co_filename=_FILENAME, co_firstlineno=1, co_name=name, co_qualname=name
            )
        else:
            namespace: dict[str, Any] = {}
            exec(compile(_method_source(op, n), _FILENAME, "exec"), namespace)  # once per key
            template = namespace[_OPERATORS[op]].__code__
        _METHODS[key] = template
    return template


def _shipped() -> types.ModuleType:
    """``pyxds._value_templates``: the templates of the keys pyxds's own
    classes use, generated (``scripts/gen_value_templates.py``) so that they
    load as cached bytecode instead of being compiled in every process;
    imported with the first value class."""
    from pyxds import _value_templates

    return _value_templates


def _method(cls: type, name: str, op: str, names: tuple[str, ...]) -> types.FunctionType:
    """``cls.<name>`` as the standard decorator generates it over ``names``:
    ``hash((self.a, ...))`` for ``op == "hash"``, else ``(self.a, ...) <op>
    (other.a, ...)`` when ``other.__class__ is self.__class__``, else
    ``NotImplemented``; from a template per (op, number of fields) with the
    attribute names replaced."""
    template = _method_template(op, len(names))
    placeholders = dict(zip(_placeholders("n", len(names)), names, strict=False))
    qualname = f"{cls.__qualname__}.{name}"
    words = template.co_names
    code = template.replace(
        co_name=name, co_names=tuple(map(placeholders.get, words, words)), co_qualname=qualname
    )
    module = sys.modules.get(cls.__module__)
    method = types.FunctionType(code, module.__dict__ if module is not None else {}, name)
    method.__qualname__ = qualname
    return method


def _frozen_methods(methods: dict[str, Any], owner: type[Any], names: tuple[str, ...]) -> None:
    """Into ``methods``: the standard frozen ``__setattr__`` /
    ``__delattr__``; ``owner`` is the class the decorator was given (before
    slots re-created it)."""
    frozen_error = dataclasses.FrozenInstanceError

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is owner or name in names:
            raise frozen_error(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is owner or name in names:
            raise frozen_error(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)

    for name, fn in (("__setattr__", __setattr__), ("__delattr__", __delattr__)):
        fn.__qualname__ = f"{owner.__qualname__}.{name}"
        methods[name] = fn


# --- __init__ from a template per shape -------------------------------------

#: a field's part in ``__init__``: a parameter (``p``), a parameter whose
#: ``<factory>`` default calls the factory (``f``), not a parameter but set
#: from its factory (``F``) or from its default (``D``, slotted classes
#: only), or not set at all (``-``)
_PARAM, _PARAM_FACTORY, _FACTORY_ONLY, _DEFAULT_ONLY, _UNSET = "p", "f", "F", "D", "-"

#: (shape, post_init, frozen) -> the template's ``__init__`` code object
_TEMPLATES: dict[tuple[str, bool, bool], types.CodeType] = {}


def _kind(f: dataclasses.Field[Any], slots: bool) -> str:
    factory = f.default_factory is not dataclasses.MISSING
    if f.init:
        return _PARAM_FACTORY if factory else _PARAM
    if factory:
        return _FACTORY_ONLY
    return _DEFAULT_ONLY if slots and f.default is not dataclasses.MISSING else _UNSET


def _template(shape: str, post_init: bool, frozen: bool) -> types.CodeType:
    """The ``__init__`` code for ``shape``, with placeholder names: the
    parameters ``a<i>``, the field names ``n<i>`` (closure cells when
    frozen, stored through ``object.__setattr__`` in ``_set_``; else the
    attribute names of ``self.n<i> = ...``) and defaults or factories
    ``v<i>`` in closure cells.  Shipped as bytecode
    (``pyxds._value_templates``) or compiled once per shape."""
    key = (shape, post_init, frozen)
    code = _TEMPLATES.get(key)
    if code is not None:
        return code
    shipped = _shipped().INITS.get(key)
    if shipped is not None:
        code = _inner(shipped.__code__).replace(
            co_filename=_FILENAME, co_firstlineno=2, co_qualname="_make_.<locals>.__init__"
        )
    else:
        namespace: dict[str, Any] = {}
        exec(compile(_init_source(shape, post_init, frozen), _FILENAME, "exec"), namespace)
        code = _inner(namespace["_make_"].__code__)  # once per shape
    _TEMPLATES[key] = code
    return code


def _inner(outer: types.CodeType) -> types.CodeType:
    """The ``__init__`` defined in a ``_make_``."""
    return next(c for c in outer.co_consts if isinstance(c, types.CodeType))


def _init_source(shape: str, post_init: bool, frozen: bool, name: str = "_make_") -> str:
    """The source of ``def <name>(<cells>)`` returning the ``__init__`` of
    ``shape`` (see ``_template``)."""
    params = [f"a{i}" for i, kind in enumerate(shape) if kind in (_PARAM, _PARAM_FACTORY)]
    lines = []
    for i, kind in enumerate(shape):
        value = {
            _PARAM: f"a{i}",
            _PARAM_FACTORY: f"v{i}() if a{i} is _factory_ else a{i}",
            _FACTORY_ONLY: f"v{i}()",
            _DEFAULT_ONLY: f"v{i}",
        }.get(kind)
        if value is not None:
            lines.append(f"  _set_(self, n{i}, {value})" if frozen else f"  self.n{i} = {value}")
    if post_init:
        lines.append("  self.__post_init__()")
    cells = ["_set_", "_factory_"]
    cells += [f"n{i}" for i, kind in enumerate(shape) if kind != _UNSET and frozen]
    cells += [f"v{i}" for i, kind in enumerate(shape) if kind not in (_PARAM, _UNSET)]
    return (
        f"def {name}({', '.join(cells)}):\n"
        f" def __init__({', '.join(['self', *params])}):\n"
        + "\n".join(lines or ["  pass"])
        + "\n return __init__\n"
    )


#: the cells every ``__init__`` closes over: ``object.__setattr__`` and the
#: ``<factory>`` default
_INIT_CELLS = {"_set_": types.CellType(_SET), "_factory_": types.CellType(_FACTORY)}
#: field name -> a cell holding it (``n<i>`` of a frozen class's
#: ``__init__``), shared by every ``__init__`` naming it, which only reads
#: it (~4 cells a class fewer to make and collect: issue 18, start-up); at
#: most ``_NAME_CELLS_MAX`` names
_NAME_CELLS: dict[str, types.CellType] = {}
_NAME_CELLS_MAX = 2048


def _name_cell(name: str) -> types.CellType:
    """A cell holding the field name ``name`` (shared, see ``_NAME_CELLS``)."""
    cell = _NAME_CELLS.get(name)
    if cell is None:
        cell = types.CellType(name)
        if len(_NAME_CELLS) < _NAME_CELLS_MAX:
            _NAME_CELLS[name] = cell
    return cell


def _make_init(cls: type, layout: _Collected, slots: bool, frozen: bool) -> Any:
    fields, names, params = layout.fields, layout.names, layout.params
    plain = layout.plain
    shape = _PARAM * len(fields) if plain else "".join([_kind(f, slots) for f in fields])
    template = _template(shape, hasattr(cls, "__post_init__"), frozen)
    self_name = "__dataclass_self__" if "self" in names else "self"
    placeholders = _placeholders("n", len(names))
    qualname = f"{cls.__qualname__}.__init__"
    cells = dict(_INIT_CELLS)
    if frozen:  # the field names, cells ``n<i>``
        cells.update(zip(placeholders, map(_name_cell, names), strict=False))
        code_names = template.co_names
    else:  # the field names, attributes ``self.n<i>``
        attributes = dict(zip(placeholders, names, strict=False))
        code_names = tuple(map(attributes.get, template.co_names, template.co_names))
    code = template.replace(
        co_varnames=(self_name, *(names if plain else [f.name for f in params])),
        co_names=code_names,
        co_qualname=qualname,
    )
    if not plain:  # the cells ``v<i>``: defaults or factories of fields not plain parameters
        cells.update(
            zip(
                _placeholders("v", len(fields)),
                [
                    types.CellType(
                        f.default if f.default_factory is _MISSING else f.default_factory
                    )
                    for f in fields
                ],
                strict=False,
            )
        )
    module = sys.modules.get(cls.__module__)
    defaults = [
        _FACTORY if f.default is _MISSING else f.default
        for f in params
        if f.default is not _MISSING or f.default_factory is not _MISSING
    ]
    init = types.FunctionType(
        code,
        module.__dict__ if module is not None else {},
        "__init__",
        tuple(defaults) if defaults else None,
        tuple(map(cells.__getitem__, code.co_freevars)),
    )
    init.__qualname__ = qualname
    annotations = {f.name: f.type for f in params}
    annotations["return"] = None
    init.__annotations__ = annotations
    return init


# --- fields, collected as the standard decorator collects them ---------------

#: the standard decorator's reading of a string annotation: an optional
#: ``module.`` and the name it looks up (``dataclasses._MODULE_IDENTIFIER_RE``)
_LEADING_NAME = re.compile(r"^(?:\s*(\w+)\s*\.)?\s*(\w+)")
#: annotation text -> what ``_LEADING_NAME`` reads in it (a regex match a
#: field was ~6k instructions, and pyxds's classes repeat their annotations:
#: issue 18, start-up); at most ``_LEADING_MAX`` texts
_LEADING: dict[str, tuple[str | None, str] | None] = {}
_LEADING_MAX = 1024
#: ``typing.ClassVar[X]``'s type
_ALIAS = type(typing.ClassVar[int])
_MISSING: Any = dataclasses.MISSING


_MEMBER = types.MemberDescriptorType
_Field = dataclasses.Field
#: ``Field``'s metadata argument that ``field()`` passes by default (the
#: empty mapping)
_NO_METADATA: Any = None


class _Collected:
    """A value class's fields (not its ``ClassVar``s) as its methods read
    them, each list made once (issue 18, start-up): the names, those
    compared, hashed and shown, the ``__init__`` parameters and, with
    ``slots``, the namespace of the slotted copy.  ``plain``: every field a
    parameter without a factory, compared, hashed (``hash=None``) and
    shown, so that every list is ``names``."""

    __slots__ = (
        "fields",
        "names",
        "compared",
        "hashed",
        "shown",
        "params",
        "match_args",
        "plain",
        "namespace",
    )

    def __init__(self, fields: tuple[dataclasses.Field[Any], ...], plain: bool) -> None:
        self.fields = fields
        self.plain = plain
        self.namespace: dict[str, Any] | None = None
        names = self.names = tuple([f.name for f in fields])
        if plain:
            self.compared = self.hashed = self.shown = self.match_args = names
            self.params = fields
            return
        self.compared = tuple([f.name for f in fields if f.compare])
        self.hashed = tuple([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
        self.shown = tuple([f.name for f in fields if f.repr])
        self.params = tuple([f for f in fields if f.init])
        self.match_args = tuple([f.name for f in self.params])


#: per ``slots``: a class the standard decorator made (with nothing to
#: compile), whose ``Field._field_type`` of a field and of a ``ClassVar``
#: and whose ``__dataclass_params__`` (a type whose arguments differ between
#: Python versions) are copied
_MADE: dict[bool, Any] = {}


def _made(slots: bool) -> Any:
    made = _MADE.get(slots)
    if made is None:
        # a docstring: without one the decorator makes one from
        # ``inspect.signature``, which parses object's text signature (~8 M
        # instructions, more than a hundred value classes)
        body = {"__annotations__": {"a": int, "b": typing.ClassVar[int]}, "__doc__": "-"}
        made = _MADE[slots] = dataclasses.dataclass(init=False, repr=False, eq=False, slots=slots)(
            type("_Made", (), body)
        )
    return made


#: (slots, the settings given) -> a maker of a new ``__dataclass_params__``
_SETTINGS: dict[tuple[bool, tuple[bool, ...]], Callable[[], Any]] = {}


def _made_parts(slots: bool, params: dict[str, bool]) -> tuple[Any, Any, Any]:
    """The ``Field._field_type`` of a field and of a ``ClassVar``, and a new
    ``__dataclass_params__`` saying ``params`` (one per class, as the
    standard decorator's)."""
    made = _made(slots)
    fields = made.__dataclass_fields__
    key = (slots, tuple(params.values()))
    make = _SETTINGS.get(key)
    if make is None:
        make = _SETTINGS[key] = _params_maker(made.__dataclass_params__, params)
    return fields["a"]._field_type, fields["b"]._field_type, make()


def _params_maker(made: Any, params: dict[str, bool]) -> Callable[[], Any]:
    """What makes a ``__dataclass_params__`` like ``made``'s with ``params``
    set: its type called with its slots as keyword arguments (its
    ``__init__``'s parameters in Python 3.11-3.13; ~5x fewer steps than
    copying the slots one by one: issue 18, start-up) where that gives the
    same object, else a copy (:func:`_copy_params`)."""
    settings = _copy_params(made)
    for setting, value in params.items():
        setattr(settings, setting, value)
    kind: type = type(settings)
    names = kind.__dict__.get("__slots__")
    if isinstance(names, tuple) and not hasattr(settings, "__dict__"):
        arguments = {name: getattr(settings, name) for name in names}
        try:
            again = kind(**arguments)
        except TypeError:
            again = None
        if again is not None and all(getattr(again, n) == v for n, v in arguments.items()):
            return functools.partial(kind, **arguments)
    return functools.partial(_copy_params, settings)


def _copy_params(params: Any) -> Any:
    """A copy of a ``__dataclass_params__`` object: its slots copied where
    it has only slots (Python 3.11-3.13; ~2.5x faster than ``copy.copy``)."""
    kind = type(params)
    slots = kind.__dict__.get("__slots__")
    if not isinstance(slots, tuple) or hasattr(params, "__dict__"):
        return copy.copy(params)
    new = object.__new__(kind)
    for slot in slots:
        object.__setattr__(new, slot, getattr(params, slot))
    return new


def _named(annotation: str, module: types.ModuleType) -> tuple[Any, Any]:
    """(the object a string annotation's leading name is in ``module``, the
    module its ``module.`` prefix names, None without one), as the standard
    decorator resolves it for ``ClassVar``, ``InitVar`` and ``KW_ONLY``."""
    leading = _LEADING.get(annotation, _MISSING)
    if leading is _MISSING:
        match = _LEADING_NAME.match(annotation)
        leading = None if match is None else (match[1], match[2])
        if len(_LEADING) < _LEADING_MAX:
            _LEADING[annotation] = leading
    if leading is None:
        return None, None
    prefix, name = leading
    if not prefix:
        return module.__dict__.get(name), None
    via = module.__dict__.get(prefix)
    return (vars(via).get(name) if via is typing or via is dataclasses else None), via


def _collect(
    cls: type, slots: bool, params: dict[str, bool], annotations: dict[str, Any]
) -> _Collected | None:
    """The fields of ``cls`` (``annotations``) collected as the standard
    decorator collects them (see the module docstring), and what it puts on
    the class: ``__dataclass_fields__``, ``__dataclass_params__``
    (``params``), the defaults, ``__match_args__``: set on ``cls`` (None
    for the namespace); with ``slots``, on ``cls`` too (:func:`_put`) and in
    the namespace returned, of the class re-created with ``__slots__`` once
    its methods are in too.  None (``cls`` untouched) where the standard
    decorator has to decide: an ``InitVar``, the ``KW_ONLY`` marker, a
    keyword-only field, or one of its errors."""
    module = sys.modules.get(cls.__module__)
    own = cls.__dict__
    if module is None or (slots and "__slots__" in own):
        return None
    inherited: set[str] = set()  # the bases' slots, as the standard decorator reads them
    for base in cls.__mro__[1:-1] if slots else ():
        base_slots = base.__dict__.get("__slots__")
        if isinstance(base_slots, str):
            inherited.add(base_slots)
        elif base_slots is not None:
            if hasattr(base_slots, "__next__"):
                return None  # the standard decorator's TypeError
            inherited.update(base_slots)
    for name, value in own.items():
        if isinstance(value, dataclasses.Field) and (
            value.kw_only is True or name not in annotations
        ):
            return None  # a keyword-only field; or the standard decorator's TypeError
    field_type, classvar_type, settings = _made_parts(slots, params)
    fields: dict[str, dataclasses.Field[Any]] = {}
    real: list[dataclasses.Field[Any]] = []  # not ClassVars
    found: list[tuple[str, Any, dataclasses.Field[Any], bool]] = []  # field() defaults
    seen_default = False  # a parameter with a default before this one
    init = params["init"]
    for name, annotation in annotations.items():
        if isinstance(annotation, str):
            if _NOT_OURS[0] in annotation or _NOT_OURS[1] in annotation:
                return None
            named, via = _named(annotation, module)
        elif (
            annotation is dataclasses.KW_ONLY
            or annotation is dataclasses.InitVar
            or isinstance(annotation, dataclasses.InitVar)
        ):
            return None
        else:
            named, via = annotation, None
        if named is None or (
            named.__class__ is type
            and named is not dataclasses.KW_ONLY
            and named is not dataclasses.InitVar
        ):
            classvar = False  # a name not bound (yet), or a class: no marker
        elif via is not typing and (
            named is dataclasses.KW_ONLY
            or named is dataclasses.InitVar
            or type(named) is dataclasses.InitVar
        ):
            return None
        else:
            classvar = via is not dataclasses and (
                named is typing.ClassVar
                or (type(named) is _ALIAS and getattr(named, "__origin__", None) is typing.ClassVar)
            )
        default = getattr(cls, name, _MISSING)
        given = isinstance(default, dataclasses.Field)
        if given:
            if default.kw_only is not _MISSING or (
                classvar and default.default_factory is not _MISSING
            ):
                return None
            value = default.default
            parameter = default.init and not classvar
            defaulted = value is not _MISSING or default.default_factory is not _MISSING
        else:
            if default.__class__ is _MEMBER:
                default = _MISSING
            value = default
            parameter = not classvar
            defaulted = value is not _MISSING
        if not classvar and value.__class__.__hash__ is None:
            return None  # a mutable default: the standard decorator's ValueError
        if parameter and init:
            if defaulted:
                seen_default = True
            elif seen_default:
                # the standard decorator's TypeError (checked even for a
                # class with its own __init__), whose text differs between
                # Python versions (3.13 names the default argument too)
                return None
        if given:  # set up once every field is checked
            f = default
            found.append((name, annotation, f, classvar))
        else:  # ``field(default=default)``, set up as the decorator sets it up
            f = _Field(default, _MISSING, True, True, None, True, _NO_METADATA, _MISSING)
            f.name, f.type = name, annotation
            if classvar:
                f._field_type = classvar_type  # type: ignore[attr-defined]
            else:
                f._field_type = field_type  # type: ignore[attr-defined]
                f.kw_only = False
        fields[name] = f
        if not classvar:
            real.append(f)
    namespace = dict(own) if slots else None
    plain = True  # every field a parameter without a factory, compared, hashed and shown
    for name, annotation, f, classvar in found:  # the field() defaults
        if f.default is not _MISSING:
            _put(cls, namespace, name, f.default)
        else:
            delattr(cls, name)  # (a Field in a base's namespace: the decorator's error)
            if namespace is not None:
                namespace.pop(name, None)
        f.name, f.type = name, annotation
        if classvar:
            f._field_type = classvar_type  # type: ignore[attr-defined]  # as the decorator does
        else:
            f._field_type = field_type  # type: ignore[attr-defined]  # as above
            f.kw_only = False
            plain = plain and (
                f.init and f.repr and f.compare and f.hash is None and f.default_factory is _MISSING
            )
    layout = _Collected(tuple(real), plain)
    _put(cls, namespace, "__dataclass_params__", settings)
    _put(cls, namespace, "__dataclass_fields__", fields)
    names = layout.names
    if "__match_args__" not in own:
        _put(cls, namespace, "__match_args__", layout.match_args)
    if namespace is not None:
        namespace["__slots__"] = (
            tuple([name for name in names if name not in inherited]) if inherited else names
        )
        for name in names:
            namespace.pop(name, None)
        namespace.pop("__dict__", None)
        namespace.pop("__weakref__", None)
        namespace["__qualname__"] = cls.__qualname__
    layout.namespace = namespace
    return layout


def _put(cls: type, namespace: dict[str, Any] | None, name: str, value: Any) -> None:
    """``cls.<name> = value``, and into the namespace of its slotted copy:
    the standard decorator sets it on the class it was given, then copies
    that (so ``dataclasses.fields`` answers for that class too, which a
    method's ``__class__`` cell still names).  Not the methods: each set on
    a class updates the type's slots (~1.1k instructions a name; the six
    to eight methods were ~20k a class)."""
    setattr(cls, name, value)
    if namespace is not None:
        namespace[name] = value


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=False):
        _SET(self, f.name, value)


#: the standard decorator's own, when it has them (pickling frozen slots)
_GETSTATE = getattr(dataclasses, "_dataclass_getstate", _getstate)
_SETSTATE = getattr(dataclasses, "_dataclass_setstate", _setstate)


def _annotations(cls: type) -> dict[str, Any]:
    """``inspect.get_annotations(cls)``: a copy of the annotations dict a
    class body wrote (Python 3.11-3.13), read without the copy of the whole
    class namespace ``inspect`` makes for ``eval_str`` (~15k instructions a
    class: issue 18, start-up); anything else (no annotations, a lazily
    evaluated ``__annotate__`` of Python 3.14) is ``inspect``'s to answer."""
    namespace = cls.__dict__
    annotations = namespace.get("__annotations__")
    if type(annotations) is dict and "__annotate__" not in namespace:
        return dict(annotations)
    return inspect.get_annotations(cls)


def _ours(cls: type, params: dict[str, Any]) -> dict[str, Any] | None:
    """The class's annotations when it is taken here (see the module
    docstring), else None."""
    if not _PARAMS.issuperset(params):
        return None
    if params.get("order") and not params.get("eq", True):
        return None  # the standard decorator's ValueError
    own = _OWN_ORDER if params.get("order") else _OWN
    namespace = cls.__dict__
    if _FACTORY is None or not namespace.keys().isdisjoint(own):
        return None
    for base in cls.__mro__[1:]:
        if hasattr(base, "__dataclass_fields__"):
            return None
    return _annotations(cls)  # (each annotation and field() checked by _collect)


def _value_class(
    cls: type,
    annotations: dict[str, Any],
    slots: bool,
    init: bool,
    order: bool,
    frozen: bool,
    eq: bool,
) -> type | None:
    """``cls`` made a value class; None where the standard decorator decides.
    With ``slots``, the methods go into the namespace of the slotted copy
    before it is made, as the standard decorator has them in the class it
    copies (each one set on a class afterwards updated the type's slots
    again: issue 18, start-up)."""
    documented = bool(cls.__dict__.get("__doc__"))
    settings = {"init": init, "repr": True, "eq": eq, "order": order, "frozen": frozen}
    collected = _collect(cls, slots, settings, annotations)
    if collected is None:
        return None
    namespace = collected.namespace
    methods: dict[str, Any] = {}
    if init and "__init__" not in cls.__dict__:  # the standard decorator keeps the class's own
        methods["__init__"] = _make_init(cls, collected, slots, frozen)
    _value_methods(methods, cls, collected, frozen, eq, order)
    if frozen:
        _frozen_methods(methods, cls, collected.names)
    if slots and frozen:
        if "__getstate__" not in cls.__dict__:
            methods["__getstate__"] = _GETSTATE
        if "__setstate__" not in cls.__dict__:
            methods["__setstate__"] = _SETSTATE
    replace = _made(slots).__dict__.get("__replace__")  # Python 3.13+
    if replace is not None and "__replace__" not in cls.__dict__:
        methods["__replace__"] = replace  # as the decorator adds it
    if namespace is None:
        out = cls
        for name, method in methods.items():
            setattr(out, name, method)
    else:
        namespace.update(methods)
        out = type(cls)(cls.__name__, cls.__bases__, namespace)
    if "__abstractmethods__" in out.__dict__:  # what update_abstractmethods
        abc.update_abstractmethods(out)  # tests first (via a raised AttributeError)
    if not documented:
        try:
            signature = str(inspect.signature(out)).replace(" -> None", "")
        except (TypeError, ValueError):
            signature = ""
        out.__doc__ = out.__name__ + signature
        if namespace is not None:
            cls.__doc__ = out.__doc__  # as the standard decorator's (see _put)
    return out


def _value_dataclass(cls: Any = None, /, **params: Any) -> Any:
    def wrap(c: type) -> type:
        annotations = _ours(c, params)
        if annotations is not None:
            made = _value_class(
                c,
                annotations,
                bool(params.get("slots", False)),
                bool(params.get("init", True)),
                bool(params.get("order", False)),
                bool(params.get("frozen", False)),
                bool(params.get("eq", True)),
            )
            if made is not None:
                return made
        return dataclasses.dataclass(c, **params)

    return wrap if cls is None else wrap(cls)


if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
else:
    dataclass = _value_dataclass
