"""Conformance: the picker and state rules weighted_round_robin (A58) and
least_request_experimental (A48) share with round_robin.

A58 "Subchannel connectivity management" and A48 "Aggregated Connectivity
State" both say: as round_robin.  So every round_robin scenario of
tests/unit/test_conformance_round_robin.py (taken from C-core
round_robin_test.cc, grpc-java RoundRobinLoadBalancerTest, grpc-go's
roundrobin tests and A61) runs here again with the policy under test in
round_robin's place (its default config), except the ones that assert
round_robin's exact rotation for least_request, whose picks are random by
design (A48 "Picker Behavior").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import test_conformance_round_robin as rr

from pyxds.lb.least_request import LeastRequest
from pyxds.lb.round_robin import RoundRobin
from pyxds.lb.weighted_round_robin import WeightedRoundRobin

#: round_robin scenarios that assert its exact, even rotation
ROTATION = {
    "test_basic_startup_connects_every_endpoint_and_rotates_evenly",
    "test_dual_stack_endpoint_gets_one_share_of_the_load",
    "test_multiple_addresses_per_endpoint_use_one_connection_each",
}


def _scenarios() -> list[tuple[str, Callable[[], None]]]:
    return [
        (name, fn)
        for name, fn in inspect.getmembers(rr, inspect.isfunction)
        if name.startswith("test_") and not inspect.signature(fn).parameters
    ]


def _cases() -> list:
    return [
        pytest.param(policy, fn, id=f"{policy.__name__}-{name}")
        for policy in (WeightedRoundRobin, LeastRequest)
        for name, fn in _scenarios()
        if not (policy is LeastRequest and name in ROTATION)
    ]


def test_the_round_robin_scenarios_are_all_found():
    assert len(_scenarios()) >= 25
    assert {name for name, _ in _scenarios()} >= ROTATION


@pytest.mark.parametrize(("policy", "scenario"), _cases())
def test_round_robin_state_rules_hold_for(policy: type[RoundRobin], scenario, monkeypatch):
    monkeypatch.setattr(rr, "RoundRobin", policy)
    scenario()
