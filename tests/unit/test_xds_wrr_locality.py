"""xds_wrr_locality_experimental (A52): a weighted_target over the EDS
localities, weights from the endpoints' ``locality_weight``."""

from __future__ import annotations

import collections

import grpc
import pytest
from test_cds_support import READY, TF, build, connect_all, loc, picked_addresses

from pyxds.lb import Endpoint, LBConfigError, PickFail, ResolverUpdate, Status, registry

WRR = [{"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}]
A, B = loc("a"), loc("b")


def endpoint(address, locality, weight, path=True):
    attributes = {"locality": locality, "locality_weight": weight}
    if path:
        attributes["hierarchical_path"] = (str(locality),)
    return Endpoint((address,), attributes)


def weighted_target_config(policy):
    return policy._cache_value.config


def test_builds_one_weighted_target_per_locality_with_its_weight():
    helper, policy, config = build(WRR)
    endpoints = [
        endpoint("10.0.0.1:80", A, 1),
        endpoint("10.0.0.2:80", A, 1),
        endpoint("10.0.0.3:80", B, 4),
    ]
    assert policy.update(ResolverUpdate(endpoints, config)) is None
    targets = weighted_target_config(policy).targets
    assert {name: t.weight for name, t in targets.items()} == {str(A): 1, str(B): 4}
    assert all(t.child_policy.name == "round_robin" for t in targets.values())
    connect_all(helper)
    assert helper.state is READY
    picks = collections.Counter(picked_addresses(helper, 2000))
    assert abs(picks["10.0.0.3:80"] / 2000 - 0.8) < 0.04


def test_first_weight_seen_for_a_locality_wins():
    _, policy, config = build(WRR)
    endpoints = [endpoint("10.0.0.1:80", A, 2), endpoint("10.0.0.2:80", A, 7)]
    policy.update(ResolverUpdate(endpoints, config))
    assert weighted_target_config(policy).targets[str(A)].weight == 2


def test_locality_attribute_names_the_target_without_a_path():
    _, policy, config = build(WRR)
    policy.update(ResolverUpdate([endpoint("10.0.0.1:80", B, 3, path=False)], config))
    assert set(weighted_target_config(policy).targets) == {str(B)}


def test_no_endpoints_fails_with_the_resolution_note():
    helper, policy, config = build(WRR)
    policy.update(ResolverUpdate([endpoint("10.0.0.1:80", A, 1)], config))
    note = "EDS resource c1: all endpoints unhealthy"
    policy.update(ResolverUpdate([], config, resolution_note=note))
    assert helper.state is TF
    assert helper.last.status == Status(grpc.StatusCode.UNAVAILABLE, note)
    assert isinstance(helper.pick(), PickFail)
    assert helper.live_subchannels() == []


def test_same_localities_twice_reuse_the_parsed_child_config():
    helper, policy, config = build(WRR)
    endpoints = [endpoint("10.0.0.1:80", A, 1)]
    policy.update(ResolverUpdate(endpoints, config))
    first = policy._cache_value
    policy.update(ResolverUpdate(list(endpoints), config))
    assert policy._cache_value is first
    assert len(helper.subchannels) == 1


def test_weight_change_builds_a_new_config_but_keeps_subchannels():
    helper, policy, config = build(WRR)
    policy.update(ResolverUpdate([endpoint("10.0.0.1:80", A, 1)], config))
    connect_all(helper)
    policy.update(ResolverUpdate([endpoint("10.0.0.1:80", A, 5)], config))
    assert weighted_target_config(policy).targets[str(A)].weight == 5
    assert len(helper.subchannels) == 1 and not helper.subchannels[0].shut_down


def test_config_errors_name_the_field():
    with pytest.raises(LBConfigError) as err:
        registry.select([{"xds_wrr_locality_experimental": {}}])
    assert str(err.value) == "xds_wrr_locality_experimental.childPolicy: required field missing"
    with pytest.raises(LBConfigError) as err:
        registry.select([{"xds_wrr_locality_experimental": {"childPolicy": [{"nope": {}}]}}])
    assert "xds_wrr_locality_experimental.childPolicy" in str(err.value)
    assert "no supported load balancing policy" in str(err.value)


def test_configs_compare_by_value():
    _, a = registry.select(WRR)
    _, b = registry.select(
        [{"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}]
    )
    assert a == b
