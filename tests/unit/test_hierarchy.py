"""pyxds.lb.hierarchy.split: A56 "Hierarchical Addresses", with the section's
own example as the test."""

from __future__ import annotations

import pytest

from pyxds.lb import Endpoint
from pyxds.lb.hierarchy import PATH_KEY, path_of, split, with_path


def ep(address: str, *path: str, **attributes) -> Endpoint:
    return Endpoint((address,), {PATH_KEY: tuple(path), **attributes})


def addresses_and_paths(endpoints):
    return [(e.addresses[0], path_of(e)) for e in endpoints]


def test_a56_example_priority_then_weighted_target():
    endpoints = [
        ep("10.0.0.1:80", "child0", "localityA"),
        ep("10.0.0.2:80", "child0", "localityB"),
        ep("10.0.0.3:80", "child1", "localityC"),
        ep("10.0.0.4:80", "child1", "localityD"),
    ]
    # priority_experimental splits by the first element
    by_priority = split(endpoints)
    assert list(by_priority) == ["child0", "child1"]
    assert addresses_and_paths(by_priority["child0"]) == [
        ("10.0.0.1:80", ("localityA",)),
        ("10.0.0.2:80", ("localityB",)),
    ]
    assert addresses_and_paths(by_priority["child1"]) == [
        ("10.0.0.3:80", ("localityC",)),
        ("10.0.0.4:80", ("localityD",)),
    ]
    # weighted_target for child0 splits again; the leaves see an empty path
    child0 = split(by_priority["child0"])
    assert {k: addresses_and_paths(v) for k, v in child0.items()} == {
        "localityA": [("10.0.0.1:80", ())],
        "localityB": [("10.0.0.2:80", ())],
    }
    child1 = split(by_priority["child1"])
    assert {k: addresses_and_paths(v) for k, v in child1.items()} == {
        "localityC": [("10.0.0.3:80", ())],
        "localityD": [("10.0.0.4:80", ())],
    }


def test_split_keeps_order_and_other_attributes():
    endpoints = [
        ep("b:1", "x", weight=3),
        ep("a:1", "y"),
        ep("c:1", "x", weight=5),
    ]
    groups = split(endpoints)
    assert [e.addresses for e in groups["x"]] == [("b:1",), ("c:1",)]
    assert [e.attributes["weight"] for e in groups["x"]] == [3, 5]


def test_endpoints_without_a_path_belong_to_no_child():
    endpoints = [Endpoint(("a:1",)), ep("b:1"), ep("c:1", "x")]
    assert list(split(endpoints)) == ["x"]


def test_split_does_not_modify_the_input_and_results_compare_by_value():
    original = ep("a:1", "x", "y")
    split([original])
    assert path_of(original) == ("x", "y")
    assert split([original]) == split([ep("a:1", "x", "y")])


def test_with_path_replaces_the_path():
    assert path_of(with_path(ep("a:1", "x"), ["p", "q"])) == ("p", "q")


def test_multi_address_endpoint_stays_whole():
    endpoint = Endpoint(("[::1]:1", "1.1.1.1:1"), {PATH_KEY: ("x",)})
    assert split([endpoint])["x"][0].addresses == ("[::1]:1", "1.1.1.1:1")


def test_a_path_given_as_a_list_is_split_like_a_tuple_and_stored_as_one():
    endpoints = [
        Endpoint(("10.0.0.1:80",), {PATH_KEY: ["p0", "l0"], "weight": 3}),
        Endpoint(("10.0.0.2:80",), {PATH_KEY: ("p0", "l0")}),
    ]
    groups = split(endpoints)
    assert [path_of(e) for e in groups["p0"]] == [("l0",), ("l0",)]
    assert all(isinstance(e.attributes[PATH_KEY], tuple) for e in groups["p0"])
    assert groups["p0"][0] == Endpoint(("10.0.0.1:80",), {PATH_KEY: ("l0",), "weight": 3})
    # The stripped endpoints are ordinary, frozen values.
    with pytest.raises(TypeError):
        groups["p0"][0].attributes["weight"] = 4  # type: ignore[index]
