"""Conformance: ring_hash_experimental against the scenarios of the other
implementations' suites (C-core test/core/load_balancing/ring_hash_test.cc
and test/cpp/end2end/xds/xds_ring_hash_end2end_test.cc, grpc-go
balancer/ringhash/{ringhash,picker,ringhash_e2e}_test.go, grpc-java
xds/src/test/java/io/grpc/xds/RingHashLoadBalancerTest.java), gRFC A42 with
A61's changes (pick_first children, sticky TRANSIENT_FAILURE, "connect the
next IDLE endpoint") and A76.

Each test names the test it was taken from.  The scenarios are driven
through pyxds's sans-IO fakes: the end-to-end ones of grpc-go / C-core
become unit tests here (an unreachable backend is a subchannel reporting
TRANSIENT_FAILURE), their real-network twins being
tests/e2e/test_differential_ring_hash*.py.  Where grpc-java differs from
C-core (duplicate addresses rejected, weights above uint32 rejected) pyxds
follows C-core and those cases are not repeated here (see
/work/reports/conformrh.md).
"""

from __future__ import annotations

import random

import grpc
import pytest
import xxhash

from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    LBConfigError,
    PickComplete,
    PickFail,
    PickQueue,
    ResolverUpdate,
    Status,
)
from pyxds.lb.api import REQUEST_HASH_KEY, PickArgs
from pyxds.lb.ring_hash import RingHash, RingHashConfig, RingHashFactory
from pyxds.testing import FakeHelper, FakeSubchannel

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

A, B, C, D = "127.0.0.1:441", "127.0.0.1:442", "127.0.0.1:443", "127.0.0.1:444"
#: one ring entry per endpoint for three endpoints (scale 3)
ONE_ENTRY_EACH = RingHashConfig(3, 3)


def endpoints(*groups: str | tuple[str, ...], weights: dict[str, int] | None = None):
    out = []
    for group in groups:
        addresses = (group,) if isinstance(group, str) else group
        attributes = (
            {"weight": weights[addresses[0]]} if weights and addresses[0] in weights else {}
        )
        out.append(Endpoint(addresses, attributes))
    return out


def start(
    *groups: str | tuple[str, ...],
    config: RingHashConfig | None = None,
    helper: FakeHelper | None = None,
):
    helper = helper or FakeHelper()
    policy = RingHash(helper)
    update = ResolverUpdate(endpoints(*groups), config or RingHashConfig())
    assert policy.update(update) is None
    return policy, helper


def header_config(monkeypatch, **fields: object) -> RingHashConfig:
    """A76 ``requestHashHeader: x-key`` (the env var gate set for the test)."""
    monkeypatch.setenv("GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY", "true")
    return RingHashFactory().parse_config({**fields, "requestHashHeader": "x-key"})


def key_hash(address: str) -> int:
    """The hash of ``address``'s first ring entry (C-core's
    MakeHashAttribute: XXH64 of "<address>_0"): a request with it lands
    exactly on that entry."""
    return xxhash.xxh64_intdigest(f"{address}_0".encode(), 0)


def pick_for(helper: FakeHelper, request_hash: int):
    return helper.pick(**{REQUEST_HASH_KEY: request_hash})


def sc(helper: FakeHelper, address: str) -> FakeSubchannel:
    return helper.subchannel(address)


def serialize(helper: FakeHelper) -> None:
    """Run what picks scheduled on the serializer (C-core's
    WaitForWorkSerializerToFlush)."""
    helper.clock.advance(0)


def connect_by_pick(helper: FakeHelper, address: str) -> FakeSubchannel:
    assert isinstance(pick_for(helper, key_hash(address)), PickQueue)
    serialize(helper)
    subchannel = sc(helper, address)
    assert subchannel.connect_calls >= 1
    return subchannel


def go(helper: FakeHelper, address: str, *states: ConnectivityState, text: str = "") -> None:
    for state in states:
        sc(helper, address).set_state(state, text or None if state is TF else None)


def comes_up(helper: FakeHelper, address: str, key: int) -> None:
    """``address`` connects: CONNECTING (a pick with ``key`` queues), then
    READY (the pick completes on it)."""
    go(helper, address, CONNECTING)
    assert helper.state is CONNECTING
    assert isinstance(pick_for(helper, key), PickQueue)
    go(helper, address, READY)
    assert helper.state is READY
    assert completes_to(pick_for(helper, key)) == address


def completes_to(result) -> str:
    assert isinstance(result, PickComplete), result
    return result.subchannel.address


def asked_to_connect(helper: FakeHelper) -> dict[str, int]:
    return {s.address: s.connect_calls for s in helper.subchannels if not s.shut_down}


# -- C-core ring_hash_test.cc ---------------------------------------------------------


def test_a_duplicated_address_is_one_endpoint_with_one_subchannel():
    """C-core RingHashTest.SameAddressListedMultipleTimes."""
    policy, helper = start(A, B, A)
    assert helper.state is IDLE
    connect_by_pick(helper, A)
    assert [s.address for s in helper.subchannels] == [A]
    comes_up(helper, A, key_hash(A))
    assert len(policy.endpoints) == 2


def test_endpoint_with_two_addresses_is_placed_by_its_first_and_falls_back_to_its_second():
    """C-core RingHashTest.MultipleAddressesPerEndpoint; grpc-go
    TestRingHash_FallBackWithinEndpoint."""
    e1, e2 = (A, B), (C, D)
    _policy, helper = start(e1, e2)
    assert isinstance(pick_for(helper, key_hash(A)), PickQueue)
    serialize(helper)
    assert sc(helper, A).connect_calls == 1
    assert B not in asked_to_connect(helper) or asked_to_connect(helper)[B] == 0
    comes_up(helper, A, key_hash(A))
    # The connection drops: IDLE, re-resolution, and no reconnection until a pick.
    before = helper.reresolution_requests
    calls = sc(helper, A).connect_calls
    go(helper, A, IDLE)
    assert helper.state is IDLE
    assert helper.reresolution_requests == before + 1
    assert sc(helper, A).connect_calls == calls
    assert isinstance(pick_for(helper, key_hash(A)), PickQueue)
    serialize(helper)
    assert sc(helper, A).connect_calls == calls + 1
    go(helper, A, CONNECTING)
    assert helper.state is CONNECTING
    # The first address fails: the endpoint's pick_first tries its second.
    go(helper, A, TF, text="ugh")
    assert sc(helper, B).connect_calls >= 1
    comes_up(helper, B, key_hash(A))
    assert C not in asked_to_connect(helper)  # the other endpoint never connected


# -- grpc-go ringhash_test.go -------------------------------------------------------------


def test_a_failed_endpoint_hands_its_keys_along_the_ring_and_gets_them_back():
    """grpc-go TestThreeSubConnsAffinity: each failure connects one more
    endpoint without a pick; once all failed, the first to come back takes
    the key, and the key returns to its own endpoint when that one does."""
    policy, helper = start(A, B, C, config=ONE_ENTRY_EACH)
    ring = policy.ring
    order = [policy.endpoints[i].endpoint.addresses[0] for i in ring.endpoints]
    home = order[1]
    key = ring.hashes[0] + 1  # lands on the second entry
    assert isinstance(pick_for(helper, key), PickQueue)
    serialize(helper)
    assert list(asked_to_connect(helper)) == [home]
    failed = [home]
    for _ in range(2):
        go(helper, failed[-1], CONNECTING, TF)
        fresh = [a for a in asked_to_connect(helper) if a not in failed]
        assert len(fresh) == 1  # exactly one more endpoint, without a pick
        failed.append(fresh[0])
    go(helper, failed[-1], CONNECTING, TF)
    assert helper.state is TF
    assert isinstance(pick_for(helper, key), PickFail)
    # Walking on from the key's entry: order[1] -> order[2] -> order[0].
    for address in (order[0], order[2], order[1]):
        go(helper, address, IDLE, CONNECTING, READY)
        assert helper.state is READY
        for _ in range(5):
            assert completes_to(pick_for(helper, key)) == address


def test_weight_change_rebuilds_the_ring_and_the_same_list_keeps_it():
    """grpc-go TestAddrWeightChange."""
    policy, helper = start(A, B, C, config=RingHashConfig(3, 100))
    ring = policy.ring
    policy.update(ResolverUpdate(endpoints(A, B, C), RingHashConfig(3, 100)))
    assert policy.ring is ring
    policy.update(ResolverUpdate(endpoints(A, B), RingHashConfig(3, 100)))
    two = policy.ring
    assert two is not ring and set(two.endpoints) == {0, 1}
    reports = len(helper.states)
    policy.update(ResolverUpdate(endpoints(A, B, weights={B: 2}), RingHashConfig(3, 100)))
    assert policy.ring is not two
    assert len(helper.states) == reports + 1  # a new picker over the new ring
    assert helper.last.picker is not None
    shares = [policy.ring.endpoints.count(i) for i in range(2)]
    assert shares[1] == 2 * shares[0]


def test_failures_connect_one_idle_endpoint_at_a_time_and_none_while_one_connects():
    """grpc-go TestAutoConnectEndpointOnTransientFailure (four endpoints)."""
    _policy, helper = start(A, B, C, D)
    pick_for(helper, 0)
    serialize(helper)
    first = list(asked_to_connect(helper))
    assert len(first) == 1
    go(helper, first[0], CONNECTING, TF)
    assert helper.state is CONNECTING  # one failure among several: CONNECTING
    second = [a for a in asked_to_connect(helper) if a not in first]
    assert len(second) == 1
    go(helper, second[0], CONNECTING, TF)
    assert helper.state is TF
    third = [a for a in asked_to_connect(helper) if a not in first + second]
    assert len(third) == 1
    go(helper, third[0], CONNECTING)
    # The first endpoint recovers, then loses its connection (READY -> IDLE).
    go(helper, first[0], IDLE, CONNECTING, READY)
    assert helper.state is READY
    go(helper, first[0], IDLE)
    assert helper.state is CONNECTING  # one TF, one CONNECTING, one IDLE
    calls = sc(helper, first[0]).connect_calls
    pick_for(helper, key_hash(first[0]))
    serialize(helper)
    assert sc(helper, first[0]).connect_calls == calls + 1
    go(helper, first[0], CONNECTING)
    # Another failure while one endpoint connects: nobody new is asked.
    before = asked_to_connect(helper)
    go(helper, third[0], TF)
    assert asked_to_connect(helper) == before


# -- grpc-go picker_test.go ----------------------------------------------------------------


def test_an_empty_header_value_is_hashed_not_replaced_by_a_random_hash(monkeypatch):
    """grpc-go TestPickerRequestHashKey "header empty": a present but empty
    header is hashed (XXH64 of ""), so it always reaches the same endpoint."""
    policy, helper = start(A, B, C, config=header_config(monkeypatch))
    for endpoint in policy.endpoints:
        endpoint.request_connection()
        go(helper, endpoint.endpoint.addresses[0], CONNECTING, READY)
    ring = policy.ring
    want = policy.endpoints[ring.endpoints[ring.start(xxhash.xxh64_intdigest(b"", 0))]]
    for _ in range(10):
        result = helper.last.picker.pick(PickArgs("/s/m", (("x-key", ""),), {}))
        assert completes_to(result) == want.endpoint.addresses[0]


class _ZeroRandom(random.Random):
    """A random source whose 64-bit draws are all 0 (grpc-go's randUint64
    stub): the walk starts at the ring's first entry."""

    def getrandbits(self, k: int) -> int:
        return 0


def test_random_pick_wakes_the_idle_endpoint_it_passes_and_takes_the_ready_one(monkeypatch):
    """grpc-go TestPickerRandomHash "picked is Idle, another is Ready.
    Connect and pick Ready" (A76: a request without the header)."""
    config = header_config(monkeypatch, minRingSize=2, maxRingSize=2)
    helper = FakeHelper()
    helper.random = _ZeroRandom()
    policy, helper = start(A, B, config=config, helper=helper)
    first, second = (policy.endpoints[i] for i in policy.ring.endpoints)
    second.request_connection()
    go(helper, second.endpoint.addresses[0], CONNECTING, READY)
    result = helper.last.picker.pick(PickArgs("/s/m", (), {}))
    assert completes_to(result) == second.endpoint.addresses[0]
    serialize(helper)
    assert sc(helper, first.endpoint.addresses[0]).connect_calls == 1


# -- grpc-java RingHashLoadBalancerTest --------------------------------------------------


def test_two_endpoints_walk_through_connecting_ready_failure_and_idle():
    """grpc-java aggregateSubchannelStates_connectingReadyIdleFailure: with
    one endpoint failed and the other back to IDLE the policy reports
    CONNECTING and asks the IDLE one to connect, without a pick."""
    policy, helper = start(A, B)
    for endpoint in policy.endpoints:
        endpoint.request_connection()
    go(helper, A, CONNECTING)
    assert helper.state is CONNECTING
    go(helper, B, CONNECTING)
    assert helper.state is CONNECTING
    go(helper, B, READY)
    assert helper.state is READY
    calls = asked_to_connect(helper)
    go(helper, A, TF)
    assert helper.state is READY
    assert asked_to_connect(helper) == calls  # READY elsewhere: nothing to recover
    go(helper, B, IDLE)
    assert helper.state is CONNECTING
    assert sc(helper, B).connect_calls == calls[B] + 1


def test_failures_one_by_one_report_connecting_then_transient_failure_and_stay_sticky():
    """grpc-java aggregateSubchannelStates_allSubchannelsInTransientFailure:
    1 of 4 failed: CONNECTING; 2: TRANSIENT_FAILURE; a failed endpoint
    reconnecting stays TRANSIENT_FAILURE (pick_first is sticky) until READY."""
    policy, helper = start(A, B, C, D)
    for endpoint in policy.endpoints:
        endpoint.request_connection()
    for address in (A, B, C, D):
        go(helper, address, CONNECTING)
    go(helper, A, TF)
    assert helper.state is CONNECTING
    go(helper, B, TF)
    assert helper.state is TF
    go(helper, C, TF)
    go(helper, D, TF)
    assert helper.state is TF
    reports = len(helper.states)
    go(helper, C, IDLE, CONNECTING)
    assert len(helper.states) == reports  # hidden by pick_first
    go(helper, C, READY)
    assert helper.state is READY


def test_a_shut_down_policy_ignores_its_subchannels_reports():
    """grpc-java ignoreShutdownSubchannelStateChange."""
    policy, helper = start(A, B, C)
    for endpoint in policy.endpoints:
        endpoint.request_connection()
    subchannels = list(helper.subchannels)
    watchers = [fn for s in subchannels for fn in s._watchers]
    assert len(watchers) == 3
    policy.shutdown()
    assert all(s.shut_down for s in subchannels)
    reports = len(helper.states)
    for fn in watchers:  # reports racing the shutdown (C-core's SHUTDOWN)
        fn(READY, Status(grpc.StatusCode.OK))
    assert len(helper.states) == reports
    serialize(helper)
    assert len(helper.states) == reports


def test_a_key_stays_on_its_endpoint_when_others_are_removed_or_added():
    """grpc-java deterministicPickWithHostsPartiallyRemoved and
    deterministicPickWithNewHostsAdded: the request hash is exactly an entry
    of B's; the same subchannel serves it after both updates."""
    addresses = ["127.0.0.1:450", "127.0.0.1:451", "127.0.0.1:452", "127.0.0.1:453"]
    policy, helper = start(*addresses, config=RingHashConfig(10, 100))
    for endpoint in policy.endpoints:
        endpoint.request_connection()
        go(helper, endpoint.endpoint.addresses[0], CONNECTING, READY)
    key = key_hash(addresses[1])
    served = pick_for(helper, key)
    assert completes_to(served) == addresses[1]
    policy.update(ResolverUpdate(endpoints(*addresses[:2]), RingHashConfig(10, 100)))
    assert helper.state is READY
    assert pick_for(helper, key).subchannel is served.subchannel
    more = [*addresses, "127.0.0.1:454", "127.0.0.1:455"]
    policy.update(ResolverUpdate(endpoints(*more), RingHashConfig(10, 100)))
    assert helper.state is READY
    assert pick_for(helper, key).subchannel is served.subchannel


def test_all_failed_pick_fails_with_the_hashed_endpoints_error_even_while_it_reconnects():
    """grpc-java skipFailingHosts_firstTwoHostsFailed_pickNextFirstReady and
    allSubchannelsInTransientFailure: the failure names the endpoint the key
    hashed to (not the last to fail), a failing pick asks for no connection,
    and once that endpoint is READY every key walks to it."""
    policy, helper = start(A, B, C, config=ONE_ENTRY_EACH)
    for endpoint in policy.endpoints:
        endpoint.request_connection()
    go(helper, B, CONNECTING, TF, text="unreachable")
    go(helper, C, CONNECTING, TF, text="permission denied")
    assert helper.state is TF
    go(helper, A, CONNECTING, TF, text="permission denied again")
    calls = asked_to_connect(helper)
    result = pick_for(helper, key_hash(B))
    assert isinstance(result, PickFail)
    assert result.status == Status(
        UNAVAILABLE, "ring hash cannot find a connected endpoint; first failure: unreachable"
    )
    serialize(helper)
    assert asked_to_connect(helper) == calls  # pick_first retries by itself
    go(helper, B, IDLE, CONNECTING)
    assert isinstance(pick_for(helper, key_hash(B)), PickFail)  # still sticky TF
    go(helper, B, READY)
    assert helper.state is READY
    for address in (A, B, C):
        assert completes_to(pick_for(helper, key_hash(address))) == B


def test_removing_an_endpoint_shuts_its_subchannel_down_after_the_new_picker():
    """grpc-java removingAddressShutdownSubchannel."""
    policy, helper = start(A, B, C, config=ONE_ENTRY_EACH)
    for endpoint in policy.endpoints:
        endpoint.request_connection()
        go(helper, endpoint.endpoint.addresses[0], CONNECTING)
    gone = sc(helper, C)
    policy.update(ResolverUpdate(endpoints(A, B), ONE_ENTRY_EACH))
    assert gone.shut_down
    assert helper.state is CONNECTING
    assert {policy.endpoints[i].endpoint.addresses[0] for i in policy.ring.endpoints} == {A, B}


def test_backoff_over_on_a_failed_endpoint_changes_nothing_visible():
    """grpc-java stickyTransientFailure: the failed endpoint's subchannel
    going IDLE (backoff over) reaches no state report, and a key on it walks
    to the next ring entry: queued there if that endpoint is connecting (the
    recovery rule asked B, the first IDLE one, to connect), else that
    endpoint is asked to connect; nobody else is."""
    policy, helper = start(A, B, C, config=ONE_ENTRY_EACH)
    connect_by_pick(helper, A)
    go(helper, A, CONNECTING, TF)
    assert helper.state is CONNECTING
    assert [a for a in asked_to_connect(helper) if a != A] == [B]
    reports = len(helper.states)
    go(helper, A, IDLE)
    assert len(helper.states) == reports
    ring = policy.ring
    owners = [policy.endpoints[i].endpoint.addresses[0] for i in ring.endpoints]
    after_a = owners[(owners.index(A) + 1) % len(owners)]
    assert isinstance(pick_for(helper, key_hash(A)), PickQueue)
    serialize(helper)
    others = {a for a in asked_to_connect(helper) if a != A}
    assert others == {B, after_a}


def test_failure_beside_a_ready_endpoint_asks_no_idle_endpoint_to_connect():
    """grpc-java tfWithReadyChild_doesNotTriggerIdleChildConnection."""
    policy, helper = start(A, B, C)
    policy.endpoints[1].request_connection()
    policy.endpoints[0].request_connection()
    go(helper, B, CONNECTING, READY)
    go(helper, A, CONNECTING, TF)
    assert helper.state is READY
    assert C not in asked_to_connect(helper)


# -- grpc-go ringhash_e2e_test.go / C-core xds_ring_hash_end2end_test.cc -------------------


def test_endpoints_after_an_empty_list_are_reported_idle_and_connect_on_a_pick():
    """grpc-go TestRingHash_ReattemptWhenGoingFromTransientFailureToIdle
    (the C-core bug: the IDLE picker after TRANSIENT_FAILURE was squelched)."""
    helper = FakeHelper()
    policy = RingHash(helper)
    assert policy.update(ResolverUpdate([], RingHashConfig())) is not None
    assert helper.state is TF
    policy.update(ResolverUpdate(endpoints(A), RingHashConfig()))
    assert helper.state is IDLE
    connect_by_pick(helper, A)
    go(helper, A, CONNECTING, READY)
    assert helper.state is READY


def two_failed_one_ready(policy: RingHash, helper: FakeHelper) -> None:
    """Endpoints A, B, C, D as [TF, TF, READY, IDLE] (grpc-go's recovery tests)."""
    by_address = {e.endpoint.addresses[0]: e for e in policy.endpoints}
    by_address[C].request_connection()
    go(helper, C, CONNECTING, READY)
    for address in (A, B):
        by_address[address].request_connection()
        go(helper, address, CONNECTING, TF)
    assert helper.state is READY
    assert D not in asked_to_connect(helper)


def test_losing_the_only_ready_endpoint_connects_an_idle_one_without_picks():
    """grpc-go TestRingHash_RecoverWhenEndpointEntersIdle: [TF, TF, READY,
    IDLE]; the READY one goes IDLE: the policy reports TRANSIENT_FAILURE and
    asks one IDLE endpoint to connect by itself, the first in C-core's
    endpoint-map order (C, port 443, before D)."""
    policy, helper = start(A, B, C, D)
    two_failed_one_ready(policy, helper)
    calls = sc(helper, C).connect_calls
    go(helper, C, IDLE)
    assert helper.state is TF
    assert sc(helper, C).connect_calls == calls + 1
    assert D not in asked_to_connect(helper)  # one at a time
    go(helper, C, CONNECTING, READY)
    assert helper.state is READY


def test_removing_the_only_ready_endpoint_connects_an_idle_one_without_picks():
    """grpc-go TestRingHash_RecoverWhenResolverRemovesEndpoint."""
    policy, helper = start(A, B, C, D)
    two_failed_one_ready(policy, helper)
    policy.update(ResolverUpdate(endpoints(A, B, D), RingHashConfig()))
    assert helper.state is TF
    assert asked_to_connect(helper)[D] == 1
    go(helper, D, CONNECTING, READY)
    assert helper.state is READY


def test_one_pick_then_connections_follow_one_endpoint_at_a_time_until_ready():
    """C-core RingHashTest.ContinuesConnectingWithoutPicksOneSubchannelAtATime
    (grpc-go TestRingHash_ContinuesConnectingWithoutPicks): three
    unreachable endpoints and a good one; one pick (then abandoned) is
    enough for the channel to reach READY, never two attempts at once."""
    bad = ["127.0.0.1:460", "127.0.0.1:461", "127.0.0.1:462"]
    good = "127.0.0.1:463"
    _policy, helper = start(*bad, good)
    assert isinstance(pick_for(helper, key_hash(bad[0])), PickQueue)
    serialize(helper)
    attempts: list[str] = []
    for _ in range(4):  # bounded: each round fails one endpoint or ends
        connecting = [
            s.address
            for s in helper.subchannels
            if s.connect_calls and s.state is IDLE and s.address not in attempts
        ]
        assert len(connecting) == 1, connecting  # one attempt at a time
        address = connecting[0]
        attempts.append(address)
        if address == good:
            go(helper, address, CONNECTING, READY)
            break
        go(helper, address, CONNECTING, TF)
    assert helper.state is READY
    assert attempts[0] == bad[0] and attempts[-1] == good


def test_reordering_an_endpoints_addresses_moves_it_on_the_ring_and_keeps_its_connection():
    """grpc-go TestRingHash_ReorderAddressessWithinEndpoint: the ring is
    built from each endpoint's first address; the endpoint (its address set)
    keeps its child and connection when the order changes."""
    policy, helper = start((A, B), C)
    connect_by_pick(helper, A)
    go(helper, A, CONNECTING, READY)
    assert completes_to(pick_for(helper, key_hash(A))) == A
    policy.update(ResolverUpdate(endpoints((B, A), C), RingHashConfig()))
    assert not sc(helper, A).shut_down
    ring = policy.ring
    index = [e.endpoint.addresses[0] for e in policy.endpoints].index(B)
    assert ring.endpoints[ring.start(key_hash(B))] == index
    assert helper.state is READY
    assert completes_to(pick_for(helper, key_hash(B))) == A


# -- grpc-go config_test.go ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "fields", "entries"),
    [
        (4096, {"minRingSize": 1, "maxRingSize": 6000}, 1),  # "max greater than global limit"
        (4096, {"minRingSize": 5000, "maxRingSize": 6000}, 4096),  # both above the limit
        (8000, {"minRingSize": 5000, "maxRingSize": 6000}, 5000),  # under a raised limit
        (8000, {"minRingSize": 10000, "maxRingSize": 10000}, 8000),  # above a raised limit
    ],
)
def test_ring_sizes_are_clamped_by_the_channels_ring_size_cap(cap, fields, entries):
    """grpc-go TestParseConfig (the global limit is C-core's
    grpc.lb.ring_hash.ring_size_cap): one endpoint gets min(minRingSize,
    cap) entries."""
    factory = RingHashFactory(ring_size_cap=cap)
    helper = FakeHelper()
    policy = factory.build(helper)
    policy.update(ResolverUpdate(endpoints(A), factory.parse_config(fields)))
    assert len(policy.ring) == entries


@pytest.mark.parametrize(
    "fields",
    [
        {"minRingSize": 10, "maxRingSize": 2},
        {"minRingSize": 6000, "maxRingSize": 5000},
        {"minRingSize": 8388610, "maxRingSize": 10},
        {"minRingSize": 10, "maxRingSize": 8388610},
    ],
)
def test_ring_size_config_errors_are_rejected(fields):
    """grpc-go TestParseConfig: min above max, or either above 8M."""
    with pytest.raises(LBConfigError):
        RingHashFactory().parse_config(fields)
