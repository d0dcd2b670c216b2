"""registry.select: the service-config rule (A28 "the first known (registered)
policy name in the list will be picked"), errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxds.lb import Helper, LBConfigError, PolicyFactory, PolicySelection, registry
from pyxds.lb.errors import expect_bool, expect_object, expect_string, expect_uint32


@dataclass(frozen=True)
class StrictConfig:
    level: int


class StrictFactory(PolicyFactory):
    """Accepts ``{"level": uint32}``; anything else is an error naming the field."""

    def __init__(self, name: str) -> None:
        self.name = name

    def parse_config(self, json_config):
        obj = expect_object(json_config, "")
        return StrictConfig(expect_uint32(obj, "level", ""))

    def build(self, helper: Helper):
        raise NotImplementedError


NAMES = ("test_strict_a", "test_strict_b")


@pytest.fixture(autouse=True)
def strict_policies():
    for name in NAMES:
        registry.register(StrictFactory(name))
    yield
    for name in NAMES:
        registry.unregister(name)


def test_register_and_get():
    factory = registry.get("test_strict_a")
    assert factory is not None and factory.name == "test_strict_a"
    assert registry.get("no_such_policy") is None
    assert "test_strict_a" in registry.names()


def test_unregister_removes_the_name():
    registry.register(StrictFactory("test_temp"))
    registry.unregister("test_temp")
    assert registry.get("test_temp") is None


def test_first_registered_policy_in_the_list_wins():
    factory, config = registry.select(
        [{"unknown_one": {}}, {"test_strict_b": {"level": 2}}, {"test_strict_a": {"level": 1}}]
    )
    assert factory.name == "test_strict_b" and config == StrictConfig(2)


def test_invalid_first_known_policy_makes_the_whole_list_invalid():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"test_strict_a": {"level": "high"}}, {"test_strict_b": {"level": 1}}])
    assert str(err.value) == 'test_strict_a.level: expected integer, got "high"'


def test_no_known_policy_is_an_error_listing_the_names_seen():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"grpclb": {}}, {"foo_lb": {}}])
    assert "grpclb" in str(err.value) and "foo_lb" in str(err.value)
    assert str(err.value) == "no supported load balancing policy in list: grpclb, foo_lb"


def test_empty_list_is_an_error():
    with pytest.raises(LBConfigError, match="no supported load balancing policy"):
        registry.select([])


def test_list_must_be_an_array():
    with pytest.raises(LBConfigError) as err:
        registry.select({"test_strict_a": {}}, path="childPolicy")
    assert err.value.path == "childPolicy"
    assert "expected array" in str(err.value)


def test_each_entry_must_have_exactly_one_key():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"test_strict_a": {"level": 1}, "test_strict_b": {"level": 1}}])
    assert err.value.path == "[0]"
    with pytest.raises(LBConfigError) as err:
        registry.select(["test_strict_a"], path="p")
    assert err.value.path == "p[0]"


def test_nested_path_names_index_and_policy():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"nope": {}}, {"test_strict_a": {}}], path='children["p0"].config')
    assert str(err.value) == 'children["p0"].config[1].test_strict_a.level: required field missing'


def test_errors_nest_through_under():
    error = LBConfigError("shuffleAddressList", 'expected boolean, got "yes"')
    nested = error.under("pick_first").under('priority_experimental.children["p0"].config[0]')
    assert str(nested) == (
        'priority_experimental.children["p0"].config[0].pick_first.shuffleAddressList: '
        'expected boolean, got "yes"'
    )
    assert str(LBConfigError("[2]", "bad").under("list")) == "list[2]: bad"
    assert str(LBConfigError("", "bad").under("x")) == "x: bad"


def test_null_config_is_not_an_object():
    """grpcio 1.85 refuses ``{"name": null}`` ("child entry should be of type
    object"); see test_conformance_node_lb_config.py."""
    with pytest.raises(LBConfigError, match=r"^test_strict_a: expected object, got null$"):
        registry.select([{"test_strict_a": None}])


def test_select_policy_returns_comparable_selection():
    one = registry.select_policy([{"test_strict_a": {"level": 3}}])
    two = registry.select_policy([{"x": {}}, {"test_strict_a": {"level": 3}}])
    assert one == two == PolicySelection("test_strict_a", StrictConfig(3))
    assert hash(one) == hash(two)
    assert one != registry.select_policy([{"test_strict_a": {"level": 4}}])
    assert one.factory is registry.get("test_strict_a")


def test_later_registration_replaces_the_factory():
    replacement = StrictFactory("test_strict_a")
    registry.register(replacement)
    assert registry.get("test_strict_a") is replacement


def test_builtin_leaf_policies_are_registered():
    assert registry.get("pick_first") is not None
    assert registry.get("round_robin") is not None


def test_expect_helpers_name_the_field():
    with pytest.raises(LBConfigError, match=r"^cfg\.flag: expected boolean, got 1$"):
        expect_bool({"flag": 1}, "flag", "cfg")
    assert expect_bool({}, "flag", "cfg", default=True) is True
    with pytest.raises(LBConfigError, match=r"^name: expected string, got null$"):
        expect_string({"name": None}, "name", "")
    with pytest.raises(LBConfigError, match=r"^n: expected integer in \[1, 4294967295\], got 0$"):
        expect_uint32({"n": 0}, "n", "", minimum=1)


def test_custom_policy_example_in_docs_runs():
    """docs/lb-policies.md: the custom-policy example registers, selects and
    passes its own pyxds.testing walkthrough."""
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "lb-policies.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert len(blocks) == 3
    namespace: dict = {}
    try:
        for block in blocks:
            exec(compile(block, str(doc), "exec"), namespace)
    finally:
        registry.unregister("example_random")


# One valid config per built-in policy (TRAPS.md "configs and equality").
_RR = [{"round_robin": {}}]
BUILTIN_SAMPLES = {
    "round_robin": {},
    "pick_first": {"shuffleAddressList": True},
    "cds_experimental": {"cluster": "c1", "isDynamic": True},
    "priority_experimental": {
        "children": {"p0": {"config": _RR}, "p1": {"config": _RR}},
        "priorities": ["p0", "p1"],
    },
    "weighted_target_experimental": {
        "targets": {"a": {"weight": 1, "childPolicy": _RR}, "b": {"weight": 2, "childPolicy": _RR}}
    },
    "xds_cluster_impl_experimental": {"clusterName": "c1", "childPolicy": _RR},
    "xds_override_host_experimental": {"clusterName": "c1", "childPolicy": _RR},
    "xds_cluster_manager_experimental": {"children": {"cluster:c1": {"childPolicy": _RR}}},
    "xds_routing_experimental": {
        "route": [{"prefix": "/", "action": "c1"}],
        "action": {"c1": {"childPolicy": [{"cds_experimental": {"cluster": "c1"}}]}},
    },
    "xds_wrr_locality_experimental": {"childPolicy": _RR},
    "ring_hash_experimental": {"minRingSize": 16, "maxRingSize": 1024},
    "weighted_round_robin": {
        "enableOobLoadReport": True,
        "blackoutPeriod": "1s",
        "metricNamesForComputingUtilization": ["named_metrics.q"],
    },
    "least_request_experimental": {"choiceCount": 3},
    "rls_experimental": {
        "routeLookupConfig": {
            "grpcKeybuilders": [
                {
                    "names": [{"service": "s"}],
                    "headers": [{"key": "k", "names": ["h"]}],
                    "constantKeys": {"c": "v"},
                }
            ],
            "lookupService": "localhost:1",
            "cacheSizeBytes": "1000",
            "defaultTarget": "c1",
        },
        "childPolicy": [{"cds_experimental": {"isDynamic": True}}],
        "childPolicyConfigTargetFieldName": "cluster",
    },
    "outlier_detection_experimental": {
        "interval": "1.5s",
        "maxEjectionPercent": 50,
        "successRateEjection": {"stdevFactor": 1000},
        "failurePercentageEjection": {"threshold": 50},
        "childPolicy": _RR,
    },
}


def test_every_builtin_policy_parses_the_same_json_twice_into_equal_frozen_values():
    """TRAPS grpc-java#12213/#12216: a config class without structural
    equality makes every update look new and restarts children.  A policy
    added to pyxds without a sample here fails this test."""
    import copy
    import dataclasses

    builtin = {
        name
        for name in registry.names()
        if type(registry.get(name)).__module__.startswith("pyxds.")
    }
    assert builtin == set(BUILTIN_SAMPLES)
    for name, sample in BUILTIN_SAMPLES.items():
        first = registry.select([{name: sample}])[1]
        second = registry.select([{name: copy.deepcopy(sample)}])[1]
        assert first is not second, name
        assert first == second and hash(first) == hash(second), name
        assert dataclasses.is_dataclass(first), name
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.changed = True


_JSON_LEAVES = st.one_of(
    st.sampled_from([float("inf"), float("-inf"), float("nan"), -1, 0, 2**32, 2**64, 1.5, "1"]),
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
_JSON = st.recursive(
    _JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every position in a JSON sample, the root included."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _replaced(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: _replaced(node[head], rest, value)}
    return [*node[:head], _replaced(node[head], rest, value), *node[head + 1 :]]


_EDGES = st.sampled_from(
    [float("inf"), float("-inf"), float("nan"), -1, 0, 2**32, 2**64, 1.5, "1", "", [], {}, None]
)


@pytest.mark.parametrize("name", sorted(BUILTIN_SAMPLES))
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_malformed_builtin_config_is_an_lb_config_error_never_a_crash(name, data):
    """Bad input: whatever JSON sits anywhere in a built-in policy's config,
    parsing either succeeds or raises LBConfigError naming the policy's
    field, never anything else (a crash would take the channel down)."""
    sample = BUILTIN_SAMPLES[name]
    path = data.draw(st.sampled_from(_paths(sample)))
    config = _replaced(sample, path, data.draw(st.one_of(_EDGES, _JSON)))
    try:
        registry.select([{name: config}])
    except LBConfigError as err:
        assert str(err).startswith(name), str(err)
