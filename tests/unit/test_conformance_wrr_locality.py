"""Conformance: xds_wrr_locality_experimental (gRFC A52 "xDS WRR Locality
Load Balancer") against grpc-go
``internal/xds/balancer/wrrlocality/balancer_test.go`` (``TestParseConfig``,
``TestUpdateClientConnState``) and C-core's
``src/core/load_balancing/xds/xds_wrr_locality.cc`` where the suites are
silent (a locality without a weight), beyond tests/unit/test_xds_wrr_locality.py.
"""

from __future__ import annotations

import logging

import pytest
from test_cds_support import READY, build, connect_all, picked_addresses

from pyxds.lb import Endpoint, LBConfigError, ResolverUpdate, registry
from pyxds.xds.resources.types import LocalityName

WRR_LOCALITY = "xds_wrr_locality_experimental"
R1 = LocalityName("region-1", "zone-1", "subzone-1")
R2 = LocalityName("region-2", "zone-2", "subzone-2")


def endpoint(address: str, locality: LocalityName, weight: int | None) -> Endpoint:
    attributes: dict = {"locality": locality, "hierarchical_path": (str(locality),)}
    if weight is not None:
        attributes["locality_weight"] = weight
    return Endpoint((address,), attributes)


def child_config(policy):
    return policy._cache_value.config


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({}, "childPolicy: required field missing"),
        ({"childPolicy": []}, "childPolicy"),
        ({"childPolicy": [{"": {}}]}, "childPolicy"),
        ({"childPolicy": [{"doesNotExistBalancer": {"cluster": "c"}}]}, "childPolicy"),
        # the child policy's own config is checked too
        ({"childPolicy": [{"ring_hash_experimental": {"minRingSize": 0}}]}, "minRingSize"),
        ({"childPolicy": {"round_robin": {}}}, "childPolicy"),
    ],
)
def test_bad_child_policy_configs_are_rejected_naming_the_field(body, error):
    """grpc-go TestParseConfig (each error case)."""
    with pytest.raises(LBConfigError) as err:
        registry.select([{WRR_LOCALITY: body}])
    assert error in str(err.value)


def test_a_round_robin_child_parses():
    """grpc-go TestParseConfig happy-case-round robin-child."""
    _, config = registry.select([{WRR_LOCALITY: {"childPolicy": [{"round_robin": {}}]}}])
    assert config.child_policy.name == "round_robin"


@pytest.mark.parametrize(
    "child",
    [
        {"round_robin": {}},
        {"weighted_round_robin": {"blackoutPeriod": "1s", "enableOobLoadReport": True}},
        {"least_request_experimental": {"choiceCount": 3}},
    ],
)
def test_each_locality_is_a_weighted_target_with_its_weight_and_the_child_policy(child):
    """grpc-go TestUpdateClientConnState (two localities, weights 2 and 1,
    every target running the configured child with its config); A58's
    weighted_round_robin under wrr_locality."""
    helper, policy, config = build([{WRR_LOCALITY: {"childPolicy": [child]}}])
    endpoints = [endpoint("10.0.0.1:80", R1, 2), endpoint("10.0.0.2:80", R2, 1)]
    assert policy.update(ResolverUpdate(endpoints, config)) is None
    targets = child_config(policy).targets
    assert {name: t.weight for name, t in targets.items()} == {str(R1): 2, str(R2): 1}
    (name,) = child
    _, expected = registry.select([child])
    assert all(t.child_policy.name == name for t in targets.values())
    assert all(t.child_policy.config == expected for t in targets.values())
    connect_all(helper)
    assert helper.state is READY
    picks = picked_addresses(helper, 3000)
    assert abs(picks.count("10.0.0.1:80") / 3000 - 2 / 3) < 0.04


def test_a_locality_seen_with_two_weights_uses_the_first_and_warns(caplog):
    """A52: "just use the weight in the first attribute we encounter. A
    warning should be logged about any locality weights being discarded"
    (C-core logs it as an error)."""
    _, policy, config = build([{WRR_LOCALITY: {"childPolicy": [{"round_robin": {}}]}}])
    endpoints = [
        endpoint("10.0.0.1:80", R1, 2),
        endpoint("10.0.0.2:80", R1, 7),
        endpoint("10.0.0.3:80", R2, 1),
    ]
    with caplog.at_level(logging.WARNING, logger="pyxds.lb.xds_wrr_locality"):
        policy.update(ResolverUpdate(endpoints, config))
    assert child_config(policy).targets[str(R1)].weight == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert str(R1) in warnings[0] and "7" in warnings[0] and "2" in warnings[0]


def test_a_locality_without_a_weight_gets_no_target():
    """C-core xds_wrr_locality.cc: an endpoint without a locality weight (or
    weight 0) adds no target (grpc-go and grpc-java fail the update; EDS
    itself drops zero-weight localities, so only a hand-made config gets
    here).  With no weighted locality left, the policy fails."""
    _, policy, config = build([{WRR_LOCALITY: {"childPolicy": [{"round_robin": {}}]}}])
    endpoints = [
        endpoint("10.0.0.1:80", R1, None),
        endpoint("10.0.0.2:80", R2, 1),
        endpoint("10.0.0.3:80", LocalityName("r3", "z3", ""), 0),
    ]
    assert policy.update(ResolverUpdate(endpoints, config)) is None
    assert set(child_config(policy).targets) == {str(R2)}
    helper, policy, config = build([{WRR_LOCALITY: {"childPolicy": [{"round_robin": {}}]}}])
    policy.update(ResolverUpdate([endpoint("10.0.0.1:80", R1, None)], config))
    assert helper.state.name == "TRANSIENT_FAILURE"
