"""``pyxds._values.dataclass`` answers exactly as ``dataclasses.dataclass``
for the frozen value classes it speeds up (issue 18, start-up): equality,
hash, repr, immutability, slots, pickling, ``replace`` and ``fields``, on
the same class bodies built by both decorators."""

from __future__ import annotations

import dataclasses
import math
import pickle
import random

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
    assert ours.__eq__.__code__.co_filename.endswith("_values.py")  # the fast path was taken
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
    ordered = _values.dataclass(frozen=True, order=True)(
        type("Ordered", (), {"__annotations__": {"a": "int"}})
    )
    assert ordered(1) < ordered(2)
    assert not ordered.__eq__.__code__.co_filename.endswith("_values.py")
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
