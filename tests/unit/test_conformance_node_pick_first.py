"""Conformance: grpc-node's pick_first cases (``packages/grpc-js/test/
test-pick-first.ts``) that the C-core, grpc-go and grpc-java replays in
test_conformance_pick_first.py / test_conformance_pick_first_suites.py /
test_pick_first.py do not already cover.  Where grpc-js expects otherwise
than C-core, the assertion is C-core's (the gRFCs are silent) and the
docstring says what node expects.  Sans-IO: fake subchannels, some of them
already connected or failing when the policy asks for them (C-core's
subchannel pool), as node's MockSubchannel start states.
"""

from __future__ import annotations

from test_conformance_pick_first import (
    IDLE,
    READY,
    TF,
    PooledHelper,
    eps,
    make,
    picked,
    update,
)

from pyxds.lb import PickQueue

A, B, C = "10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3"


def test_transient_failure_to_ready_after_an_update_with_a_ready_subchannel():
    """test-pick-first.ts "Should transition from TRANSIENT_FAILURE to READY
    after an address update with a READY subchannel": [TF, READY]."""
    helper = PooledHelper()
    helper.preset(A, TF)
    helper.preset(B, TF)
    policy, _ = make(A, B, helper=helper)
    assert helper.state_sequence() == [TF]
    helper.preset(C, READY)
    update(policy, eps(C))
    assert helper.state_sequence() == [TF, READY]
    assert picked(helper) == C


def test_update_to_failing_subchannels_while_ready_goes_idle_as_c_core():
    """test-pick-first.ts "Should transition from READY to TRANSIENT_FAILURE
    if the connected subchannel disconnects and the update fails": node keeps
    the old connection until it drops, then reports TRANSIENT_FAILURE.
    C-core drops the connection at the update when no subchannel of the new
    list is READY and reports IDLE (test_conformance_pick_first.py
    test_update_while_ready_without_the_selected_address_goes_idle); a
    failing new list does not change that."""
    helper = PooledHelper()
    helper.preset(A, READY)
    policy, _ = make(A, helper=helper)
    helper.preset(B, TF)
    update(policy, eps(B))
    assert helper.state_sequence() == [READY, IDLE]
    assert helper.subchannel(A, live=False).shut_down
    assert helper.reresolution_requests == 1
    assert isinstance(helper.pick(), PickQueue)


def test_new_lists_already_failing_each_request_reresolution():
    """test-pick-first.ts "Should request reresolution if the new subchannels
    are already in TF": [A] then [B], each already failing, ask for
    re-resolution once each.  Node sends [B] a third time and counts 3;
    pyxds takes an identical list as a no-op (docs/differences-from-c-core.md,
    "pick_first"), so that third update asks for nothing and reports nothing."""
    helper = PooledHelper()
    helper.preset(A, TF)
    policy, _ = make(A, helper=helper)
    assert helper.reresolution_requests == 1
    helper.preset(B, TF)
    update(policy, eps(B))
    assert helper.reresolution_requests == 2
    reports = len(helper.state_sequence())
    update(policy, eps(B))
    assert helper.reresolution_requests == 2
    assert len(helper.state_sequence()) == reports
    assert helper.state is TF
