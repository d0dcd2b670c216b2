"""``pyxds._values.dataclass`` answers exactly as ``dataclasses.dataclass``
for the frozen value classes it speeds up (issue 18, start-up): equality,
hash, repr, immutability, slots, pickling, ``replace`` and ``fields``, on
the same class bodies built by both decorators."""

from __future__ import annotations

import abc
import copy
import dataclasses
import inspect
import math
import pickle
import random
import types
import typing
from typing import ClassVar, Generic  # noqa: F401  # named by string annotations below

import pytest

from pyxds import _values

NAN = float("nan")


def _bodies():
    """(name, class body namespace maker, kwargs, sample field values)."""

    def plain():
        ns = {"__annotations__": {"a": "int", "b": "str", "c": "tuple"}, "b": "", "c": ()}
        return ns

    def one():
        return {"__annotations__": {"a": "float"}}

    def empty():
        return {"__annotations__": {}}

    def special():
        return {
            "__annotations__": {"a": "int", "hidden": "object", "h": "int", "nh": "int"},
            "hidden": dataclasses.field(default=None, compare=False, hash=False, repr=False),
            "h": dataclasses.field(default=0, compare=False, hash=True),
            "nh": dataclasses.field(default=0, hash=False),
        }

    def factory():
        return {
            "__annotations__": {"a": "int", "items": "list"},
            "items": dataclasses.field(default_factory=list, compare=True),
        }

    return [
        ("Plain", plain, [(1, "x", (1, 2)), (1, "x", (1, 2)), (2, "y", ())]),
        ("One", one, [(1.5,), (NAN,), (0.0,), (-0.0,)]),
        ("Empty", empty, [()]),
        ("Special", special, [(1, "a", 2, 3), (1, "b", 2, 4), (1, "a", 5, 3)]),
        ("Factory", factory, [(1, [1]), (1, [1]), (2, [])]),
    ]


def _build(decorator, name, make_ns, slots):
    cls = type(name, (), make_ns())
    cls.__qualname__ = f"Outer.{name}"
    cls.__module__ = __name__
    return decorator(frozen=True, slots=slots)(cls)


CASES = [
    (name, make_ns, samples, slots)
    for name, make_ns, samples in _bodies()
    for slots in (False, True)
]


@pytest.mark.parametrize(
    ("name", "make_ns", "samples", "slots"), CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES]
)
def test_a_value_class_answers_as_the_standard_dataclass(name, make_ns, samples, slots):
    std = _build(dataclasses.dataclass, name, make_ns, slots)
    ours = _build(_values.dataclass, name, make_ns, slots)
    assert _made_here(ours.__eq__)  # the fast path was taken
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(std)]
    assert ours.__match_args__ == std.__match_args__
    assert hasattr(ours, "__slots__") == hasattr(std, "__slots__") == slots
    nan_shared = NAN
    values = [
        tuple(nan_shared if isinstance(v, float) and math.isnan(v) else v for v in s)
        for s in samples
    ]
    pairs = [(std(*v), ours(*v)) for v in values]
    for s1, o1 in pairs:
        assert repr(o1) == repr(s1)
        assert hash(o1) == hash(s1) if _hashable(s1) else True
        # immutability is the standard decorator's own (same errors, even
        # its TypeError for a slotted class without fields)
        assert _error_of(lambda o: setattr(o, "a", 9), o1) == _error_of(
            lambda o: setattr(o, "a", 9), s1
        )
        assert _error_of(lambda o: delattr(o, "a"), o1) == _error_of(lambda o: delattr(o, "a"), s1)
        for s2, o2 in pairs:
            assert (o1 == o2) == (s1 == s2)
            assert (o1 != o2) == (s1 != s2)
        assert (o1 == 1) == (s1 == 1)
        assert o1.__eq__(object()) is NotImplemented
        if values[0]:
            first = dataclasses.fields(ours)[0].name
            assert repr(dataclasses.replace(o1, **{first: 7})) == repr(
                dataclasses.replace(s1, **{first: 7})
            )
    # another class with the same fields is never equal (``__class__ is``)
    assert pairs[0][1] != pairs[0][0]


def _made_here(method) -> bool:
    """Whether ``method`` is pyxds._values's (shared, or from its templates),
    not one the standard decorator compiled."""
    filename = method.__code__.co_filename
    return filename == "<pyxds._values>" or filename.endswith("_values.py")


def _error_of(action, obj):
    try:
        action(obj)
    except Exception as err:
        return type(err)
    return None


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def test_nan_fields_compare_as_tuples_do():
    One = _build(_values.dataclass, "One", lambda: {"__annotations__": {"a": "float"}}, True)
    nan = float("nan")
    assert One(nan) == One(nan)  # the same object: tuple equality checks identity first
    assert One(nan) != One(float("nan"))


def test_a_value_class_pickles_and_a_recursive_repr_ends():
    Box = _build(_values.dataclass, "Box", lambda: {"__annotations__": {"items": "list"}}, True)
    box = Box([])
    box.items.append(box)
    assert repr(box) == "Outer.Box(items=[...])"
    globals()["Outer"] = type("Outer", (), {"Box": Box})
    try:
        plain = Box([1, (2, 3)])
        assert pickle.loads(pickle.dumps(plain)) == plain
    finally:
        del globals()["Outer"]


def test_other_parameters_and_own_methods_get_the_standard_decorator():
    def body():
        return {"__annotations__": {"a": "int"}, "__eq__": lambda self, other: True}

    own = _values.dataclass(frozen=True)(type("Own", (), body()))
    assert own(1) == own(2)
    assert not _made_here(own.__repr__)
    errors = [
        _message_of(
            lambda c, d=d: d(frozen=True, order=True)(c),
            type("OwnLt", (), {"__annotations__": {"a": "int"}, "__lt__": lambda s, o: True}),
        )
        for d in (dataclasses.dataclass, _values.dataclass)
    ]
    assert errors[0] is not None
    assert errors[0] == errors[1]
    unhashed = _values.dataclass(frozen=True, unsafe_hash=True)(
        type("Unsafe", (), {"__annotations__": {"a": "int"}})
    )
    assert not _made_here(unhashed.__eq__)
    mutable = _values.dataclass(type("Mutable", (), {"__annotations__": {"a": "int"}}))
    m = mutable(1)
    m.a = 2
    assert m == mutable(2)


def test_random_values_hash_and_compare_as_the_standard_dataclass():
    rng = random.Random(18)
    make = lambda: {"__annotations__": {"a": "int", "b": "str", "c": "tuple"}}  # noqa: E731
    std = _build(dataclasses.dataclass, "R", make, True)
    ours = _build(_values.dataclass, "R", make, True)
    for _ in range(300):
        v = (rng.randrange(3), rng.choice("xy"), tuple(rng.randrange(2) for _ in range(2)))
        w = (rng.randrange(3), rng.choice("xy"), tuple(rng.randrange(2) for _ in range(2)))
        assert hash(ours(*v)) == hash(std(*v))
        assert (ours(*v) == ours(*w)) == (std(*v) == std(*w))
        assert repr(ours(*v)) == repr(std(*v))


# --- __init__, __setattr__ / __delattr__ without a compiled method per class


def _init_bodies():
    """Class bodies covering every part a field can have in ``__init__``."""

    def defaults():
        return {
            "__annotations__": {"a": "int", "b": "str", "c": "tuple", "d": "int"},
            "b": "",
            "c": (),
            "d": 4,
        }

    def factories():
        return {
            "__annotations__": {"a": "int", "items": "list", "more": "dict"},
            "items": dataclasses.field(default_factory=list),
            "more": dataclasses.field(default_factory=dict, compare=False),
        }

    def not_init():
        return {
            "__annotations__": {"a": "int", "fixed": "int", "made": "list", "unset": "int"},
            "fixed": dataclasses.field(default=7, init=False),
            "made": dataclasses.field(default_factory=list, init=False),
            "unset": dataclasses.field(init=False, repr=False, compare=False),
        }

    def post_init():
        def __post_init__(self):
            object.__setattr__(self, "seen", self.a * 2)

        return {
            "__annotations__": {"a": "int", "seen": "int"},
            "seen": dataclasses.field(default=0, init=False),
            "__post_init__": __post_init__,
        }

    def named_self():
        return {"__annotations__": {"self": "int", "other": "int"}, "other": 1}

    def undocumented():
        return {
            "__annotations__": {"a": "int", "b": "list"},
            "b": dataclasses.field(default_factory=list),
        }

    def awkward():
        # names of the templates' own parameters, cells and globals
        names = ("other", "hash", "n1", "n0", "a0", "_set_", "v0", "_factory_", "NotImplemented")
        return {
            "__annotations__": dict.fromkeys(names, "int"),
            "v0": 5,
            **dict.fromkeys(names[-2:], 0),
        }

    return [
        (
            "Awkward",
            awkward,
            [((1, 2, 3, 4, 5, 6), {}), ((), dict(other=1, hash=2, n1=3, n0=4, a0=5, _set_=6))],
        ),
        ("Defaults", defaults, [((1,), {}), ((1, "x"), {"d": 9}), ((), {"a": 2, "c": (1,)})]),
        ("Factories", factories, [((1,), {}), ((1, [2]), {}), ((), {"a": 1, "more": {1: 2}})]),
        ("NotInit", not_init, [((1,), {}), ((), {"a": 3})]),
        ("PostInit", post_init, [((1,), {}), ((), {"a": 5})]),
        ("NamedSelf", named_self, [((1,), {}), ((), {"self": 2, "other": 3})]),
        ("Undocumented", undocumented, [((1,), {}), ((1, [1]), {})]),
        ("Empty", lambda: {"__annotations__": {}}, [((), {})]),
    ]


INIT_CASES = [
    (name, make_ns, calls, params)
    for name, make_ns, calls in _init_bodies()
    for params in (
        {"frozen": True},
        {"frozen": True, "slots": True},
        {},
        {"slots": True},
        {"eq": False},
        {"frozen": True, "eq": False, "slots": True},
    )
]


def _state(obj, names):
    """Every field's value, or the error reading it gives (an unset slot)."""
    return [_error_of(lambda o, n=n: getattr(o, n), obj) or getattr(obj, n) for n in names]


def _build_with(decorator, name, make_ns, params):
    cls = type(name, (), make_ns())
    cls.__qualname__ = f"Outer.{name}"
    cls.__module__ = __name__
    return decorator(**params)(cls) if params else decorator(cls)


@pytest.mark.parametrize(
    ("name", "make_ns", "calls", "params"),
    INIT_CASES,
    ids=[f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[3].items())}" for c in INIT_CASES],
)
def test_init_setattr_delattr_answer_as_the_standard_dataclass(name, make_ns, calls, params):
    std = _build_with(dataclasses.dataclass, name, make_ns, params)
    ours = _build_with(_values.dataclass, name, make_ns, params)
    slots = params.get("slots", False)
    assert ours.__init__.__code__.co_filename == "<pyxds._values>"  # the template was used
    assert _made_here(ours.__repr__)
    if params.get("frozen"):
        assert _made_here(ours.__setattr__)
    else:
        assert ours.__setattr__ is std.__setattr__ is object.__setattr__
    assert ("__eq__" in ours.__dict__) == ("__eq__" in std.__dict__)
    assert ours.__hash__ is None if std.__hash__ is None else ours.__hash__ is not None
    assert ours.__hash__ is object.__hash__ if std.__hash__ is object.__hash__ else True
    assert str(inspect.signature(ours)) == str(inspect.signature(std))
    assert str(inspect.signature(ours.__init__)) == str(inspect.signature(std.__init__))
    assert ours.__init__.__annotations__ == std.__init__.__annotations__
    assert ours.__init__.__defaults__ == std.__init__.__defaults__
    assert ours.__init__.__qualname__ == std.__init__.__qualname__
    assert ours.__init__.__module__ == std.__init__.__module__
    assert ours.__init__.__globals__ is std.__init__.__globals__
    for attr in ("__doc__", "__match_args__", "__qualname__", "__module__"):
        assert getattr(ours, attr) == getattr(std, attr), attr
    assert hasattr(ours, "__slots__") == slots
    if slots:
        assert ours.__slots__ == std.__slots__
        assert not hasattr(ours(*calls[0][0], **calls[0][1]), "__dict__")
    for setting in ("init", "repr", "eq", "order", "unsafe_hash", "frozen"):
        assert getattr(ours.__dataclass_params__, setting) == getattr(
            std.__dataclass_params__, setting
        ), setting
    names = [f.name for f in dataclasses.fields(std)]
    assert [f.name for f in dataclasses.fields(ours)] == names
    for args, kwargs in calls:
        s, o = std(*args, **kwargs), ours(*args, **kwargs)
        assert _state(o, names) == _state(s, names)
        assert repr(o) == repr(s)
        assert (o == ours(*args, **kwargs)) == (s == std(*args, **kwargs))
        assert _message_of(hash, o) == _message_of(hash, s) or _hashable(s)
        for copier in (copy.copy, copy.deepcopy):
            copies = [_message_of(copier, x) or _state(copier(x), names) for x in (o, s)]
            assert copies[0] == copies[1]
        if names and dataclasses.fields(std)[0].init:
            first = names[0]
            assert _state(dataclasses.replace(o, **{first: 8}), names) == _state(
                dataclasses.replace(s, **{first: 8}), names
            )
        for target in [*names, "not_a_field"]:
            for action in (
                lambda x, t=target: setattr(x, t, 1),
                lambda x, t=target: delattr(x, t),
            ):
                assert _message_of(action, o) == _message_of(action, s), target
                assert _state(o, names) == _state(s, names)  # the same (or no) change
                assert getattr(o, "__dict__", None) == getattr(s, "__dict__", None)
        # after the changes (pickling: its own test below; a slot left unset or
        # a deleted field fails both decorators' __getstate__ and replace alike)
        for copier in (copy.copy, copy.deepcopy):
            copies = [_message_of(copier, x) or _state(copier(x), names) for x in (o, s)]
            assert copies[0] == copies[1]
        if names and dataclasses.fields(std)[0].init:
            first = names[0]
            replaced = [
                _message_of(lambda x, f=first: dataclasses.replace(x, **{f: 8}), x)
                or _state(dataclasses.replace(x, **{first: 8}), names)
                for x in (o, s)
            ]
            assert replaced[0] == replaced[1]
    # wrong calls fail alike (the message names the class's own __init__)
    for args, kwargs in ((tuple(range(len(names) + 1)), {}), ((), {"nope": 1})):
        for cls in (ours, std):
            assert _error_of(lambda c, a=args, k=kwargs: c(*a, **k), cls) is TypeError


def _message_of(action, obj):
    try:
        action(obj)
    except Exception as err:
        return type(err), str(err)
    return None


def test_pickling_a_value_class_round_trips_as_the_standard_one():
    global Pickled, PickledStd
    make = lambda: {  # noqa: E731
        "__annotations__": {"a": "int", "items": "list"},
        "items": dataclasses.field(default_factory=list),
    }
    for slots in (False, True):
        PickledStd = dataclasses.dataclass(frozen=True, slots=slots)(type("PickledStd", (), make()))
        Pickled = _values.dataclass(frozen=True, slots=slots)(type("Pickled", (), make()))
        for cls in (Pickled, PickledStd):
            cls.__module__ = __name__
            cls.__qualname__ = cls.__name__
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            ours = pickle.loads(pickle.dumps(Pickled(1, [2]), protocol))
            std = pickle.loads(pickle.dumps(PickledStd(1, [2]), protocol))
            assert (ours.a, ours.items) == (std.a, std.items) == (1, [2])
        if slots:
            assert Pickled.__getstate__ is PickledStd.__getstate__
            assert Pickled.__setstate__ is PickledStd.__setstate__


def test_subclasses_of_a_value_class_behave_as_with_the_standard_one():
    def body():
        return {"__annotations__": {"a": "int"}}

    for slots in (False, True):
        results = []
        for decorator in (dataclasses.dataclass, _values.dataclass):
            base = decorator(frozen=True, slots=slots)(type("Base", (), body()))
            plain_sub = type("Sub", (base,), {})
            obj = plain_sub(1)
            extra = _message_of(lambda o: setattr(o, "extra", 2), obj)
            field = _message_of(lambda o: setattr(o, "a", 2), obj)
            # a dataclass subclass sees a frozen base (the standard decorator checks)
            frozen_sub = dataclasses.dataclass(frozen=True)(
                type("FrozenSub", (base,), {"__annotations__": {"b": "int"}})
            )
            mutable_sub = _error_of(
                lambda b: dataclasses.dataclass(type("MutableSub", (b,), {})), base
            )
            results.append(
                (extra, field, getattr(obj, "extra", None), repr(frozen_sub(1, 2)), mutable_sub)
            )
        assert results[0] == results[1]
        assert results[0][-1] is TypeError


def test_methods_an_abstract_base_declares_make_the_value_class_concrete_as_the_standard_one():
    """The standard decorator updates the abstract methods once its methods
    are on the class: a frozen value class whose ABC base declares
    ``__eq__``, ``__repr__`` and ``__hash__`` abstract is concrete (on
    322888d pyxds updated them before adding its methods: the class could
    not be instantiated)."""

    class Shape(abc.ABC):
        @abc.abstractmethod
        def __eq__(self, other: object) -> bool: ...

        @abc.abstractmethod
        def __repr__(self) -> str: ...

        @abc.abstractmethod
        def __hash__(self) -> int: ...

    for slots in (False, True):
        answers = []
        for decorator in (dataclasses.dataclass, _values.dataclass):
            point = decorator(frozen=True, slots=slots)(
                type("Point", (Shape,), {"__annotations__": {"x": "int"}})
            )
            answers.append(
                (sorted(point.__abstractmethods__), repr(point(1)), point(1) == point(1))
            )
        assert answers[0] == answers[1] == ([], "Point(x=1)", True), slots


def test_field_errors_are_the_standard_decorator_s():
    def late_default():
        return {"__annotations__": {"a": "int", "b": "int"}, "a": 1}

    def mutable_default():
        return {"__annotations__": {"a": "list"}, "a": []}

    def field_without_annotation():
        return {"__annotations__": {}, "a": dataclasses.field(default=1)}

    for make in (late_default, mutable_default, field_without_annotation):
        for slots in (False, True):
            errors = [
                _message_of(
                    lambda c, d=d, s=slots: d(frozen=True, slots=s)(c), type("Bad", (), make())
                )
                for d in (dataclasses.dataclass, _values.dataclass)
            ]
            assert errors[0] is not None
            assert errors[0] == errors[1]


def test_initvar_kw_only_own_methods_and_dataclass_bases_get_the_standard_decorator():
    bodies = {
        "initvar": {"__annotations__": {"a": "int", "b": "InitVar[int]"}},
        "initvar_object": {"__annotations__": {"a": "int", "b": dataclasses.InitVar(int)}},
        "kw_only_marker": {"__annotations__": {"a": "int", "_": "KW_ONLY", "b": "int"}},
        "kw_only_field": {
            "__annotations__": {"a": "int", "b": "int"},
            "b": dataclasses.field(kw_only=True),
        },
    }
    for name, body in bodies.items():
        if "InitVar" in str(body["__annotations__"]):
            body["__post_init__"] = lambda self, b: None
        cls = _values.dataclass(frozen=True)(type(name, (), dict(body)))
        assert cls.__setattr__.__code__.co_filename == "<string>", name
        assert cls.__init__.__code__.co_filename == "<string>", name
    base = _values.dataclass(frozen=True)(type("Base", (), {"__annotations__": {"a": "int"}}))
    sub = _values.dataclass(frozen=True)(type("Sub", (base,), {"__annotations__": {"b": "int"}}))
    assert sub.__init__.__code__.co_filename == "<string>"
    assert sub(1, 2).b == 2


def test_every_pyxds_value_class_answers_as_the_standard_decorator_on_its_fields():
    """Each of pyxds's own dataclasses made by the template (every module
    loaded), rebuilt from its fields and settings by the standard decorator:
    the same signature, match args, defaults, ``__eq__`` and hashability."""
    import importlib
    import pkgutil
    import sys

    import pyxds

    for module in pkgutil.walk_packages(pyxds.__path__, "pyxds."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    seen = 0
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("pyxds"):
            continue
        for value in list(vars(module).values()):
            if not (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and "__init__" in value.__dict__
                and getattr(value.__init__, "__code__", None) is not None
                and value.__init__.__code__.co_filename == "<pyxds._values>"
            ):
                continue
            seen += 1
            slots = "__slots__" in value.__dict__
            std_ns = {"__annotations__": {}}
            for f in dataclasses.fields(value):
                std_ns["__annotations__"][f.name] = f.type
                std_ns[f.name] = dataclasses.field(
                    default=f.default,
                    default_factory=f.default_factory,
                    init=f.init,
                    repr=f.repr,
                    hash=f.hash,
                    compare=f.compare,
                    metadata=f.metadata,
                )
            if hasattr(value, "__post_init__"):
                std_ns["__post_init__"] = value.__post_init__
            settings = value.__dataclass_params__
            std = dataclasses.dataclass(
                frozen=settings.frozen, eq=settings.eq, order=settings.order, slots=slots
            )(type(value.__name__, (), std_ns))
            assert ("__eq__" in value.__dict__) == ("__eq__" in std.__dict__), value
            assert (value.__hash__ is None) == (std.__hash__ is None), value
            assert str(inspect.signature(value)) == str(inspect.signature(std)), value
            assert value.__match_args__ == std.__match_args__, value
            assert value.__init__.__defaults__ == std.__init__.__defaults__, value
    assert seen >= 100


def _pair(make, **params):
    std = dataclasses.dataclass(**params)(type("Pair", (), make()))
    ours = _values.dataclass(**params)(type("Pair", (), make()))
    assert _made_here(ours.__eq__)  # the fast path was taken
    for setting in ("init", "repr", "eq", "order", "unsafe_hash", "frozen"):
        assert getattr(ours.__dataclass_params__, setting) == getattr(
            std.__dataclass_params__, setting
        ), setting
    assert ours.__match_args__ == std.__match_args__
    assert ours.__doc__ == std.__doc__
    # the same names on both (Python 3.13's decorator adds __replace__)
    assert sorted(ours.__dict__) == sorted(std.__dict__)
    return std, ours


def test_copy_replace_works_on_a_value_class_as_on_a_standard_one():
    """Python 3.13's ``copy.replace`` calls the ``__replace__`` its standard
    decorator adds to every dataclass (a value class had none there: a
    TypeError); before 3.13 neither class has one."""
    for slots in (False, True):
        std, ours = _pair(
            lambda: {"__annotations__": {"a": "int", "b": "int"}}, frozen=True, slots=slots
        )
        assert (
            hasattr(ours, "__replace__") == hasattr(std, "__replace__") == hasattr(copy, "replace")
        )
        if hasattr(copy, "replace"):
            assert copy.replace(ours(1, 2), a=5) == ours(5, 2)
            assert copy.replace(std(1, 2), a=5) == std(5, 2)


def test_each_value_class_has_its_own_params_object_as_with_the_standard_decorator():
    """``__dataclass_params__`` is made per class (from the settings'
    arguments, not copied from a shared one): the standard type with every
    setting the standard decorator's, and changing one class's leaves the
    next class's alone."""
    for params in ({"frozen": True, "slots": True}, {"order": True}, {"frozen": True}):
        std, first = _pair(lambda: {"__annotations__": {"a": "int"}}, **params)
        _, second = _pair(lambda: {"__annotations__": {"a": "int"}}, **params)
        mine, theirs = first.__dataclass_params__, std.__dataclass_params__
        assert type(mine) is type(theirs)
        assert repr(mine) == repr(theirs)
        assert second.__dataclass_params__ is not mine
        mine.frozen = not mine.frozen
        assert second.__dataclass_params__.frozen == theirs.frozen
        _, third = _pair(lambda: {"__annotations__": {"a": "int"}}, **params)
        assert repr(third.__dataclass_params__) == repr(theirs)


def test_order_compares_as_the_standard_dataclass():
    rng = random.Random(5)

    def make():
        return {
            "__annotations__": {"a": "int", "b": "str", "skip": "int"},
            "b": "",
            "skip": dataclasses.field(default=0, compare=False),
        }

    for slots in (False, True):
        std, ours = _pair(make, frozen=True, order=True, slots=slots)
        for _ in range(200):
            v = (rng.randrange(3), rng.choice("xy"), rng.randrange(2))
            w = (rng.randrange(3), rng.choice("xy"), rng.randrange(2))
            for op in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__"):
                assert getattr(ours(*v), op)(ours(*w)) == getattr(std(*v), op)(std(*w)), op
        assert ours(1).__lt__(std(1)) is NotImplemented
        assert _message_of(lambda o: o < 1, ours(1)) == _message_of(lambda o: o < 1, std(1))
        assert sorted([ours(2), ours(1, "b"), ours(1, "a")]) == [
            ours(1, "a"),
            ours(1, "b"),
            ours(2),
        ]


def test_own_init_and_own_hash_are_kept_as_the_standard_decorator_keeps_them():
    def make():
        def __init__(self, a):
            object.__setattr__(self, "a", a * 10)

        return {
            "__annotations__": {"a": "int"},
            "__init__": __init__,
            "__hash__": lambda self: 42,
        }

    for params in ({"frozen": True}, {"frozen": True, "init": False}, {"frozen": True, "eq": True}):
        std, ours = _pair(make, **params)
        assert ours(1).a == std(1).a == 10
        assert hash(ours(1)) == hash(std(1)) == 42
        assert ours(1) == ours(1)
        assert repr(ours(1)) == repr(std(1))

    def late_default():
        return {
            "__annotations__": {"a": "int", "b": "int"},
            "a": 1,
            "__init__": lambda self, a, b: None,
        }

    errors = [
        _message_of(lambda c, d=d: d(frozen=True)(c), type("Bad", (), late_default()))
        for d in (dataclasses.dataclass, _values.dataclass)
    ]
    assert errors[0] is not None
    assert errors[0] == errors[1]  # checked even with the class's own __init__
    std, ours = _pair(
        lambda: {"__annotations__": {"a": "int", "b": "int"}, "a": 1}, frozen=True, init=False
    )
    assert _message_of(lambda c: c(1, 2), ours) == (TypeError, "Pair() takes no arguments")
    assert _message_of(lambda c: c(1, 2), std) == (TypeError, "Pair() takes no arguments")


_T = typing.TypeVar("_T")


class _Slotted:
    __slots__ = ("extra",)


def _collected(cls: type) -> dict:
    """What a dataclass decorator collected on ``cls``: every field's
    settings and kind, the class-level defaults, slots, match args, params."""
    fields = {}
    for name, f in cls.__dataclass_fields__.items():
        fields[name] = (
            f.name,
            f.type,
            f.default,
            f.default_factory,
            f.init,
            f.repr,
            f.hash,
            f.compare,
            dict(f.metadata),
            f.kw_only,
            f in dataclasses.fields(cls),
            getattr(cls, name, "absent")
            if not isinstance(getattr(cls, name, None), _MEMBER)
            else "slot",
        )
    params = cls.__dataclass_params__
    return {
        "fields": fields,
        "slots": cls.__dict__.get("__slots__"),
        "match_args": cls.__match_args__,
        "params": {s: getattr(params, s) for s in dir(params) if not s.startswith("_")},
        "names": (cls.__name__, cls.__qualname__, [b.__name__ for b in cls.__mro__]),
    }


_MEMBER = type(_Slotted.extra)


def test_fields_are_collected_as_the_standard_decorator_collects_them():
    """ClassVars (named bare or through ``typing.``, as strings or objects)
    stay class attributes, not fields; ``field()`` defaults go onto the
    class or off it; a Generic or slotted base's slots are not repeated."""

    def body():
        return {
            "__annotations__": {
                "a": "int",
                "extra": "int",  # _Slotted's slot: not repeated in __slots__
                "shared": "ClassVar[int]",
                "also_shared": "typing.ClassVar[str]",
                "object_shared": typing.ClassVar[int],
                "b": "str",
                "hidden": "object",
                "items": "list",
                "c": "Generic",  # a name that resolves, but to no marker
            },
            "shared": 3,
            "also_shared": "s",
            "object_shared": 4,
            "b": "x",
            "hidden": dataclasses.field(default=None, compare=False, repr=False),
            "items": dataclasses.field(default_factory=list, metadata={"k": 1}),
            "c": None,
        }

    for bases in ((), (Generic[_T],), (_Slotted,)):
        for slots in (False, True):
            for params in ({"frozen": True}, {"frozen": True, "order": True}, {"eq": False}):
                made = []
                for decorator in (dataclasses.dataclass, _values.dataclass):
                    cls = types.new_class("Body", bases, exec_body=lambda ns: ns.update(body()))
                    cls.__module__ = __name__
                    cls.__qualname__ = "Outer.Body"
                    made.append(decorator(slots=slots, **params)(cls))
                std, ours = made
                assert _made_here(ours.__repr__)  # the fast path was taken
                assert _collected(ours) == _collected(std), (bases, slots, params)
                assert ours.shared == 3 and ours.also_shared == "s" and ours.object_shared == 4


def _left_on(original: type, copy: type) -> dict:
    """What a decorator left on the class its slotted copy replaced: the
    data it collected, the class-level defaults, the docstring, and which
    of these are the very objects the copy has."""
    namespace = original.__dict__
    data = ("__dataclass_fields__", "__dataclass_params__", "__match_args__", "__doc__")
    return {
        "collected": {k: v for k, v in _collected(original).items() if k != "slots"},
        "doc": original.__doc__,
        "defaults": {n: namespace.get(n, "absent") for n in original.__annotations__},
        "shared": sorted(
            n for n in data if n in namespace and copy.__dict__.get(n) is namespace[n]
        ),
    }


def test_the_class_a_slotted_copy_replaces_is_left_as_the_standard_decorator_leaves_it():
    """Python 3.11's decorator decorates the class, then copies it with
    slots: the class it was given (which a method's ``__class__`` cell
    still names) keeps the fields, params, match args, docstring and
    ``field()`` defaults, so ``dataclasses.fields`` answers for it."""

    def body():
        return {
            "__annotations__": {
                "a": "int",
                "b": "str",
                "items": "list",
                "fixed": "int",
                "shared": "ClassVar[int]",
            },
            "b": "x",
            "items": dataclasses.field(default_factory=list),
            "fixed": dataclasses.field(default=3, compare=False),
            "shared": 1,
        }

    for documented in (False, True):
        for params in ({"frozen": True}, {"frozen": True, "order": True}, {}):
            left = []
            for decorator in (dataclasses.dataclass, _values.dataclass):
                cls = types.new_class("Body", (), exec_body=lambda ns: ns.update(body()))
                cls.__module__ = __name__
                if documented:
                    cls.__doc__ = "A body."
                made = decorator(slots=True, **params)(cls)
                assert made is not cls
                left.append(_left_on(cls, made))
                assert [f.name for f in dataclasses.fields(cls)] == ["a", "b", "items", "fixed"]
            assert _made_here(made.__repr__)  # the fast path was taken
            assert left[1] == left[0], (documented, params)
