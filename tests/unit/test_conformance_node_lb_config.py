"""Conformance: grpc-node's LB policy config parsing cases, replayed on pyxds.

Sources: grpc-node ``packages/grpc-js/test/test-confg-parsing.ts`` (pick_first,
round_robin, outlier_detection) and ``packages/grpc-js-xds/test/
test-confg-parsing.ts`` (cds, xds_cluster_impl, priority, weighted_target,
xds_cluster_manager, ring_hash).  grpc-node registers these policies under
names without C-core's ``_experimental`` suffix and reads some fields under
its own spellings (``cluster`` and ``child_policy`` for xds_cluster_impl,
snake_case ring sizes, durations as ``{"seconds", "nanos"}`` objects).  Where
node and C-core differ, C-core (grpcio 1.85) decides (PREAMBLE rule 4): each
case is written here with C-core's names and spellings, and the node
spellings C-core refuses or ignores are cases of their own.  The same
configs are run through grpcio 1.85 by
``tests/e2e/test_differential_node_lb_config.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pyxds.lb import registry
from pyxds.lb.errors import LBConfigError
from pyxds.lb.outlier_detection import (
    FailurePercentageEjection,
    OutlierDetectionConfig,
    SuccessRateEjection,
)
from pyxds.lb.pick_first import PickFirstConfig
from pyxds.lb.registry import PolicySelection
from pyxds.lb.ring_hash import RingHashConfig
from pyxds.lb.round_robin import RoundRobinConfig

RR = [{"round_robin": {}}]
RR_SELECTION = PolicySelection("round_robin", RoundRobinConfig())


def parse(name: str, config: Any) -> Any:
    return registry.select([{name: config}])[1]


def rejected(name: str, config: Any) -> str:
    with pytest.raises(LBConfigError) as err:
        registry.select([{name: config}])
    return str(err.value)


# -- grpc-js test-confg-parsing.ts --------------------------------------------


def test_pick_first_no_fields_set_defaults_shuffle_off():
    """grpc-js test-confg-parsing.ts pick_first "no fields set"."""
    assert parse("pick_first", {}) == PickFirstConfig(shuffle_address_list=False)


def test_pick_first_shuffle_address_list_set():
    """grpc-js test-confg-parsing.ts pick_first "shuffleAddressList set"."""
    assert parse("pick_first", {"shuffleAddressList": True}) == PickFirstConfig(True)


def test_round_robin_no_fields_set():
    """grpc-js test-confg-parsing.ts round_robin "no fields set"."""
    assert parse("round_robin", {}) == RoundRobinConfig()


def _outlier_defaults() -> OutlierDetectionConfig:
    return parse("outlier_detection_experimental", {"childPolicy": RR})


def test_outlier_detection_only_required_fields_takes_a50_defaults():
    """grpc-js test-confg-parsing.ts outlier_detection "only required fields
    set": interval 10 s, base ejection 30 s, max ejection 300 s, 10 %, no
    ejection algorithm (A50 "Configuration")."""
    config = _outlier_defaults()
    assert config.child_policy == RR_SELECTION
    assert (config.interval, config.base_ejection_time, config.max_ejection_time) == (
        10.0,
        30.0,
        300.0,
    )
    assert config.max_ejection_percent == 10
    assert config.success_rate_ejection is None
    assert config.failure_percentage_ejection is None


def test_outlier_detection_all_optional_fields_null_are_the_defaults():
    """grpc-js test-confg-parsing.ts outlier_detection "all optional fields
    undefined": JSON has no undefined; its nearest form, null, is read by
    grpcio 1.85 as a field not there, so the config is the defaults."""
    config = parse(
        "outlier_detection_experimental",
        {
            "interval": None,
            "baseEjectionTime": None,
            "maxEjectionTime": None,
            "maxEjectionPercent": None,
            "successRateEjection": None,
            "failurePercentageEjection": None,
            "childPolicy": RR,
        },
    )
    assert config == _outlier_defaults()


def test_outlier_detection_empty_ejection_configs_take_their_defaults():
    """grpc-js test-confg-parsing.ts outlier_detection "empty ejection
    configs": success rate 1900/100/5/100, failure percentage 85/100/5/50."""
    config = parse(
        "outlier_detection_experimental",
        {"successRateEjection": {}, "failurePercentageEjection": {}, "childPolicy": RR},
    )
    assert config.success_rate_ejection == SuccessRateEjection(
        stdev_factor=1900, enforcement_percentage=100, minimum_hosts=5, request_volume=100
    )
    assert config.failure_percentage_ejection == FailurePercentageEjection(
        threshold=85, enforcement_percentage=100, minimum_hosts=5, request_volume=50
    )


def test_outlier_detection_all_fields_populated():
    """grpc-js test-confg-parsing.ts outlier_detection "all fields populated",
    with durations in the JSON form C-core reads ("20s")."""
    config = parse(
        "outlier_detection_experimental",
        {
            "interval": "20s",
            "baseEjectionTime": "40s",
            "maxEjectionTime": "400s",
            "maxEjectionPercent": 20,
            "successRateEjection": {
                "stdevFactor": 1800,
                "enforcementPercentage": 90,
                "minimumHosts": 4,
                "requestVolume": 200,
            },
            "failurePercentageEjection": {
                "threshold": 95,
                "enforcementPercentage": 90,
                "minimumHosts": 4,
                "requestVolume": 60,
            },
            "childPolicy": RR,
        },
    )
    assert (config.interval, config.base_ejection_time, config.max_ejection_time) == (
        20.0,
        40.0,
        400.0,
    )
    assert config.max_ejection_percent == 20
    assert config.success_rate_ejection == SuccessRateEjection(1800, 90, 4, 200)
    assert config.failure_percentage_ejection == FailurePercentageEjection(95, 90, 4, 60)


def test_outlier_detection_duration_objects_are_refused_as_c_core_does():
    """grpc-js writes durations as {"seconds", "nanos"}; grpcio 1.85 refuses
    that form ("interval: is not a string"), and C-core decides."""
    message = rejected(
        "outlier_detection_experimental",
        {"interval": {"seconds": 20, "nanos": 0}, "childPolicy": RR},
    )
    assert "interval" in message


# -- grpc-js-xds test-confg-parsing.ts ----------------------------------------


def test_cds_populated_cluster_field():
    """grpc-js-xds test-confg-parsing.ts cds "populated cluster field"."""
    assert parse("cds_experimental", {"cluster": "abc"}).cluster == "abc"


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({}, "cluster: required field missing"),  # node "empty"
        ({"cluster": 123}, "cluster: expected string"),  # node "non-string cluster"
        ({"cluster": None}, "cluster: required field missing"),  # grpcio: "field not present"
    ],
)
def test_cds_missing_or_non_string_cluster_is_rejected(config, words):
    """grpc-js-xds test-confg-parsing.ts cds "empty" and "non-string cluster"."""
    assert words in rejected("cds_experimental", config)


def test_xds_cluster_impl_required_fields():
    """grpc-js-xds test-confg-parsing.ts xds_cluster_impl "required fields",
    under C-core's field names (clusterName, childPolicy)."""
    config = parse("xds_cluster_impl_experimental", {"clusterName": "abc", "childPolicy": RR})
    assert (config.cluster_name, config.child_policy) == ("abc", RR_SELECTION)


@pytest.mark.parametrize("cluster", ["abc", 123])
def test_xds_cluster_impl_node_spellings_are_missing_fields(cluster):
    """grpc-js-xds xds_cluster_impl "required fields" / "non-string cluster"
    as node spells them: grpcio 1.85 finds neither clusterName nor
    childPolicy and refuses both configs."""
    message = rejected("xds_cluster_impl_experimental", {"cluster": cluster, "child_policy": RR})
    assert "required field missing" in message


def test_priority_empty_fields():
    """grpc-js-xds test-confg-parsing.ts priority "empty fields"."""
    config = parse("priority_experimental", {"children": {}, "priorities": []})
    assert (dict(config.children), config.priorities) == ({}, ())


def test_priority_populated_fields():
    """grpc-js-xds test-confg-parsing.ts priority "populated fields"."""
    config = parse(
        "priority_experimental",
        {
            "children": {
                "child0": {"config": RR, "ignore_reresolution_requests": True},
                "child1": {"config": RR, "ignore_reresolution_requests": False},
            },
            "priorities": ["child0", "child1"],
        },
    )
    assert config.priorities == ("child0", "child1")
    assert config.children["child0"].ignore_reresolution_requests is True
    assert config.children["child1"].ignore_reresolution_requests is False
    assert config.children["child0"].config == RR_SELECTION


def test_weighted_target_empty_targets_field():
    """grpc-js-xds test-confg-parsing.ts weighted_target "empty targets field"."""
    assert dict(parse("weighted_target_experimental", {"targets": {}}).targets) == {}


def test_weighted_target_populated_targets_field():
    """grpc-js-xds test-confg-parsing.ts weighted_target "populated targets
    field" (childPolicy, C-core's spelling)."""
    config = parse(
        "weighted_target_experimental",
        {
            "targets": {
                "target0": {"weight": 1, "childPolicy": RR},
                "target1": {"weight": 2, "childPolicy": RR},
            }
        },
    )
    assert {name: t.weight for name, t in config.targets.items()} == {"target0": 1, "target1": 2}


def test_weighted_target_node_child_policy_spelling_is_refused():
    """grpc-js-xds weighted_target uses child_policy; grpcio 1.85 refuses it
    (targets["target0"].childPolicy: field not present)."""
    message = rejected(
        "weighted_target_experimental", {"targets": {"target0": {"weight": 1, "child_policy": RR}}}
    )
    assert 'targets["target0"].childPolicy: required field missing' in message


def test_xds_cluster_manager_empty_and_populated_children():
    """grpc-js-xds test-confg-parsing.ts xds_cluster_manager "empty children
    field" and "populated children field"."""
    assert parse("xds_cluster_manager_experimental", {"children": {}}).children == ()
    config = parse(
        "xds_cluster_manager_experimental", {"children": {"child0": {"childPolicy": RR}}}
    )
    assert config.children == (("child0", RR_SELECTION),)


def test_ring_hash_empty_config_defaults():
    """grpc-js-xds test-confg-parsing.ts ring_hash "empty config": 1024/4096."""
    assert parse("ring_hash_experimental", {}) == RingHashConfig(1024, 4096)


def test_ring_hash_populated_config():
    """grpc-js-xds test-confg-parsing.ts ring_hash "populated config"."""
    config = parse("ring_hash_experimental", {"minRingSize": 2048, "maxRingSize": 8192})
    assert config == RingHashConfig(2048, 8192)


@pytest.mark.parametrize("field", ["minRingSize", "maxRingSize"])
def test_ring_hash_ring_size_too_large(field):
    """grpc-js-xds test-confg-parsing.ts ring_hash "min_ring_size too large"
    and "max_ring_size too large" (8388609 > 8388608)."""
    assert field in rejected("ring_hash_experimental", {field: 8_388_609})


@pytest.mark.parametrize("field", ["min_ring_size", "max_ring_size"])
def test_ring_hash_snake_case_ring_sizes_are_ignored_like_c_core(field):
    """node's snake_case spellings are unknown fields to grpcio 1.85, which
    ignores them (the node "too large" cases are accepted there)."""
    assert parse("ring_hash_experimental", {field: 8_388_609}) == RingHashConfig()


# -- how grpcio 1.85 reads JSON values (found replaying the cases above) ------


@pytest.mark.parametrize("value", [None, 5, [], "x"])
def test_a_policy_config_that_is_not_an_object_is_refused(value):
    """grpcio 1.85: ``{"pick_first": null}`` and friends are refused ("child
    entry should be of type object"); null is not an empty object."""
    assert "expected object" in rejected("pick_first", value)


def test_an_unknown_policy_entry_must_still_hold_an_object():
    """grpcio 1.85 refuses ``[{"nope": null}, {"round_robin": {}}]``: the
    entry is checked before its name is looked up."""
    with pytest.raises(LBConfigError, match="nope: expected object, got null"):
        registry.select([{"nope": None}, {"round_robin": {}}])
    # Entries after the chosen one are not read.
    assert registry.select([{"round_robin": {}}, {"pick_first": None}])[1] == RoundRobinConfig()


@pytest.mark.parametrize(
    ("name", "config", "expected"),
    [
        ("pick_first", {"shuffleAddressList": None}, PickFirstConfig()),
        ("ring_hash_experimental", {"minRingSize": None}, RingHashConfig()),
    ],
)
def test_a_field_set_to_null_takes_its_default(name, config, expected):
    """grpcio 1.85 reads ``"field": null`` as a field not there."""
    assert parse(name, config) == expected


def test_a_null_field_deep_in_a_child_config_is_not_there_either():
    config = parse(
        "priority_experimental",
        {
            "children": {"a": {"config": [{"pick_first": {"shuffleAddressList": None}}]}},
            "priorities": ["a"],
        },
    )
    assert config.children["a"].config == PolicySelection("pick_first", PickFirstConfig())


@pytest.mark.parametrize(("text", "number"), [("3", 3), (" 3", 3), ("+3", 3), ("3 ", 3)])
def test_an_integer_field_reads_a_decimal_string(text, number):
    """grpcio 1.85 accepts an integer field written as a string (C-core
    parses a number's text and a string's alike)."""
    weights = parse(
        "weighted_target_experimental", {"targets": {"t": {"weight": text, "childPolicy": RR}}}
    )
    assert weights.targets["t"].weight == number
    outlier = parse(
        "outlier_detection_experimental", {"maxEjectionPercent": text, "childPolicy": RR}
    )
    assert outlier.max_ejection_percent == number
    assert parse("ring_hash_experimental", {"minRingSize": text}).min_ring_size == number


@pytest.mark.parametrize("text", ["3.0", "0x3", "-3", "", "three", "٣"])
def test_an_integer_field_refuses_other_strings(text):
    """What grpcio 1.85 refuses ("failed to parse non-negative number")."""
    assert "weight" in rejected(
        "weighted_target_experimental", {"targets": {"t": {"weight": text, "childPolicy": RR}}}
    )


@pytest.mark.parametrize(("text", "number"), [("1.5", 1.5), (" 2", 2.0), ("1e1", 10.0)])
def test_a_number_field_reads_a_number_string(text, number):
    """grpcio 1.85 accepts WRR's errorUtilizationPenalty written as a string."""
    config = parse("weighted_round_robin", {"errorUtilizationPenalty": text})
    assert config.error_utilization_penalty == number


# -- grpc-js test-outlier-detection.ts / test-weighted-round-robin.ts ---------


@pytest.mark.parametrize("field", ["interval", "baseEjectionTime", "maxEjectionTime"])
@pytest.mark.parametrize("value", ["-1s", "1000000000000s", "-0.000000001s"])
def test_outlier_detection_duration_out_of_range_is_refused(field, value):
    """grpc-js test-outlier-detection.ts "Should reject a negative/large
    <duration>" and "... negative <duration>.nanos", in C-core's string form.
    grpcio 1.85 takes "-0.000000001s" (its seconds part is 0); pyxds refuses
    every negative duration (docs/differences-from-c-core.md)."""
    assert field in rejected("outlier_detection_experimental", {field: value, "childPolicy": RR})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"maxEjectionPercent": -1}, "maxEjectionPercent"),
        ({"successRateEjection": {"enforcementPercentage": -1}}, "enforcementPercentage"),
        ({"failurePercentageEjection": {"threshold": -1}}, "threshold"),
        ({"failurePercentageEjection": {"enforcementPercentage": -1}}, "enforcementPercentage"),
        ({"failurePercentageEjection": {"enforcementPercentage": 101}}, "enforcementPercentage"),
    ],
)
def test_outlier_detection_negative_or_over_100_percentages_are_refused(body, field):
    """grpc-js test-outlier-detection.ts "Should reject a negative value" /
    "Should reject a value above 100" for each percentage (the 101 cases not
    already in test_outlier_detection.py)."""
    assert field in rejected("outlier_detection_experimental", {**body, "childPolicy": RR})


def test_outlier_detection_takes_a_pick_first_child_as_c_core_does():
    """grpc-js test-outlier-detection.ts "Should reject a pick_first
    child_policy": node refuses it, grpcio 1.85 takes it (C-core decides)."""
    config = parse("outlier_detection_experimental", {"childPolicy": [{"pick_first": {}}]})
    assert config.child_policy == PolicySelection("pick_first", PickFirstConfig())


@pytest.mark.parametrize(
    "field",
    ["blackoutPeriod", "oobReportingPeriod", "weightExpirationPeriod", "weightUpdatePeriod"],
)
def test_wrr_duration_objects_are_refused_as_c_core_does(field):
    """grpc-js test-weighted-round-robin.ts "Should handle <period> as an
    object": node takes {"seconds", "nanos"}; grpcio 1.85 refuses it ("is not
    a string").  The string forms, the defaults, the penalty and the 0.1 s
    floor are test_weighted_round_robin.py's test_defaults_follow_a58,
    test_every_field_parses_and_equal_configs_compare_equal,
    test_weight_update_period_below_100ms_is_raised_to_100ms and
    test_bad_values_are_rejected_naming_the_field."""
    assert field in rejected("weighted_round_robin", {field: {"seconds": 1, "nanos": 0}})


def test_whole_numbers_from_a_typed_struct_reach_integer_fields():
    """A52 TypedStruct: a Struct holds every number as a double; C-core
    writes a whole one without a fraction, so ``weight: 3`` is the integer
    3 there, while a JSON service config's ``3.0`` is refused (above)."""
    from test_conformance_cds_resource import lb, with_policy
    from xds.type.v3 import typed_struct_pb2

    typed = typed_struct_pb2.TypedStruct(
        type_url="type.googleapis.com/weighted_target_experimental"
    )
    typed.value.update({"targets": {"t": {"weight": 3, "childPolicy": [{"round_robin": {}}]}}})
    (entry,) = lb(with_policy(typed))
    weight = entry["weighted_target_experimental"]["targets"]["t"]["weight"]  # type: ignore[index]
    assert weight == 3 and isinstance(weight, int)
    assert registry.select([entry])[1].targets["t"].weight == 3


@pytest.mark.parametrize("number", [3.0, 1e2])
def test_an_integer_field_refuses_a_number_with_a_fraction_or_exponent(number):
    """grpcio 1.85 refuses ``"weight": 3.0`` and ``1e2`` ("failed to parse
    non-negative number")."""
    assert "weight" in rejected(
        "weighted_target_experimental", {"targets": {"t": {"weight": number, "childPolicy": RR}}}
    )
