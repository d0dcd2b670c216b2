"""Conformance: least_request_experimental (gRFC A48) against the scenarios
of grpc-java ``xds/src/test/java/io/grpc/xds/LeastRequestLoadBalancerTest.java``
and grpc-go ``balancer/leastrequest/leastrequest_test.go`` that
tests/unit/test_least_request.py does not already show (the report
/work/reports/conformwrr.md maps each source test to its pyxds test).

The random samples are scripted: :class:`ScriptedRandom` hands out the
bytes the sampler (:func:`pyxds.lb.sampling.uniform_indices`, one byte per
index for up to 256 endpoints) turns into indices, so a test names the
endpoints each pick samples, as grpc-java's mocked ``Random`` does.
"""

from __future__ import annotations

import random

import grpc

from pyxds.lb import ResolverUpdate, Status, registry
from pyxds.lb.api import OK_STATUS, ConnectivityState, Endpoint, PickComplete, PickQueue
from pyxds.lb.least_request import LeastRequest, LeastRequestPicker
from pyxds.testing import FakeHelper

READY = ConnectivityState.READY
IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
TF = ConnectivityState.TRANSIENT_FAILURE

A, B, C = "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"


class ScriptedRandom(random.Random):
    """``getrandbits`` returns the scripted bytes in order (then zeros): with
    n <= 255 endpoints and a script of values below n, each byte is one
    sampled index."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(0)
        self.script = list(script)

    def getrandbits(self, k: int) -> int:
        count = k // 8
        taken, self.script = self.script[:count], self.script[count:]
        return int.from_bytes(bytes(taken + [0] * (count - len(taken))), "little")


def make(
    endpoints: list[str], choice_count: int = 2, rng: random.Random | None = None
) -> tuple[LeastRequest, FakeHelper]:
    helper = FakeHelper(seed=1)
    if rng is not None:
        helper.random = rng
    policy = LeastRequest(helper)
    _, config = registry.select([{"least_request_experimental": {"choiceCount": choice_count}}])
    policy.update(ResolverUpdate([Endpoint((a,)) for a in endpoints], config))
    return policy, helper


def ready_addresses(helper: FakeHelper) -> list[str]:
    picker = helper.last.picker
    assert isinstance(picker, LeastRequestPicker)
    return [r.subchannel.address for r in picker.results]


def test_the_sample_with_fewer_outstanding_calls_wins_and_a_tie_keeps_the_first():
    """grpc-java pickerLeastRequest: samples (0, 2) pick 0 (tie); with a call
    on 0, samples (0, 2) pick 2; samples (1, 1) pick 1; the call ending
    brings 0's count back to 0."""
    rng = ScriptedRandom([0, 2, 0, 2, 1, 1])
    _, helper = make([A, B, C], rng=rng)
    for address in (A, B, C):
        helper.subchannel(address).set_state(READY)
    picker = helper.last.picker
    assert isinstance(picker, LeastRequestPicker)
    first = picker.pick(None)
    assert isinstance(first, PickComplete) and first.subchannel.address == A
    assert picker.counters == [1, 0, 0]
    second = picker.pick(None)
    assert isinstance(second, PickComplete) and second.subchannel.address == C
    third = picker.pick(None)
    assert isinstance(third, PickComplete) and third.subchannel.address == B
    assert picker.counters == [1, 1, 1]
    assert first.on_call_done is not None
    first.on_call_done(OK_STATUS)
    assert picker.counters == [0, 1, 1]


def test_the_picker_grows_and_shrinks_with_each_endpoints_state():
    """grpc-java subchannelStateIsolation: READY endpoints join the picker one
    by one; one going IDLE leaves it and is asked to reconnect; one failing
    leaves it and is not asked."""
    _, helper = make([A, B, C])
    assert helper.state is CONNECTING
    assert isinstance(helper.pick(), PickQueue)
    scs = [helper.subchannel(a) for a in (A, B, C)]
    assert [sc.connect_calls for sc in scs] == [1, 1, 1]
    seen = []
    for sc in scs:
        sc.set_state(READY)
        seen.append(ready_addresses(helper))
    assert seen == [[A], [A, B], [A, B, C]]
    scs[1].set_state(IDLE)
    assert helper.state is READY and ready_addresses(helper) == [A, C]
    assert scs[1].connect_calls == 2
    scs[2].set_state(TF)
    assert helper.state is READY and ready_addresses(helper) == [A]
    assert scs[2].connect_calls == 1


def test_transient_failure_sticks_until_an_endpoint_is_ready():
    """grpc-java stayTransientFailureUntilReady (A48 reuses round_robin's
    aggregation): every endpoint failing is TRANSIENT_FAILURE with the error;
    their CONNECTING afterwards changes nothing; one READY is READY."""
    _, helper = make([A, B, C])
    for address in (A, B, C):
        sc = helper.subchannel(address)
        sc.set_state(TF, Status(grpc.StatusCode.UNKNOWN, "connection broken"))
        sc.set_state(CONNECTING)
    assert helper.state is TF
    assert "connection broken" in helper.last.status.details
    reports = len(helper.states)
    assert helper.reresolution_requests >= 3
    for address in (A, B, C):
        helper.subchannel(address).set_state(CONNECTING)
    assert len(helper.states) == reports  # still TRANSIENT_FAILURE, nothing new
    helper.subchannel(A).set_state(READY)
    assert helper.state is READY and ready_addresses(helper) == [A]


def test_a_broken_connection_asks_for_reresolution_and_reconnects():
    """grpc-java refreshNameResolutionWhenSubchannelConnectionBroken: a
    failure and a READY endpoint going IDLE (GOAWAY) each ask the resolver
    again; IDLE also reconnects and the policy reports CONNECTING."""
    _, helper = make([A])
    sc = helper.subchannel(A)
    sc.set_state(CONNECTING)
    sc.set_state(TF, Status(grpc.StatusCode.UNKNOWN, "connection broken"))
    asked = helper.reresolution_requests
    assert asked >= 1
    sc.set_state(READY)
    assert helper.state is READY
    sc.set_state(IDLE)
    assert helper.reresolution_requests == asked + 1
    assert sc.connect_calls == 2
    assert helper.state is CONNECTING and isinstance(helper.pick(), PickQueue)


def test_a_resolver_error_before_any_address_fails_picks_with_it():
    """grpc-java nameResolutionErrorWithNoChannels; grpc-go
    TestLeastRequestEndpoints_ResolverError (first part)."""
    helper = FakeHelper()
    policy = LeastRequest(helper)
    error = Status(grpc.StatusCode.NOT_FOUND, "nameResolutionError")
    _, config = registry.select([{"least_request_experimental": {}}])
    policy.update(ResolverUpdate(error, config))
    assert helper.state is TF
    result = helper.pick()
    assert getattr(result, "status", None) is not None
    assert "nameResolutionError" in result.status.details  # type: ignore[union-attr]


def test_a_resolver_error_after_addresses_keeps_the_ready_picker():
    """grpc-java nameResolutionErrorWithActiveChannels (choiceCount 8);
    grpc-go TestLeastRequestEndpoints_ResolverError (RPCs keep working)."""
    policy, helper = make([A, B, C], choice_count=8)
    helper.subchannel(A).set_state(READY)
    reports = len(helper.states)
    _, config = registry.select([{"least_request_experimental": {"choiceCount": 8}}])
    policy.update(ResolverUpdate(Status(grpc.StatusCode.NOT_FOUND, "gone"), config))
    assert len(helper.states) == reports and helper.state is READY
    assert len(helper.subchannels) == 3
    for _ in range(2):
        result = helper.pick()
        assert isinstance(result, PickComplete) and result.subchannel.address == A


def test_an_empty_address_list_is_transient_failure_and_rejected():
    """grpc-java emptyAddresses (acceptResolvedAddresses is not OK)."""
    policy, helper = make([A])
    helper.subchannel(A).set_state(READY)
    _, config = registry.select([{"least_request_experimental": {}}])
    status = policy.update(ResolverUpdate([], config))
    assert status is not None and status.code is grpc.StatusCode.UNAVAILABLE
    assert helper.state is TF
    assert helper.subchannel(A, live=False).shut_down
