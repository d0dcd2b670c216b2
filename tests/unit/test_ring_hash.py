"""ring_hash_experimental (A42, A61 pick_first children), checked against
C-core's ring construction, picker walk, aggregation rules and error text."""

from __future__ import annotations

import dataclasses
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
    registry,
)
from pyxds.lb.api import REQUEST_HASH_KEY
from pyxds.lb.pick_first import PickFirst
from pyxds.lb.ring_hash import (
    RingHash,
    RingHashConfig,
    RingHashFactory,
    RingHashPicker,
    aggregate_state,
    build_ring,
)
from pyxds.testing import FakeHelper

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
NAME = "ring_hash_experimental"


def addr(port: int) -> str:
    return f"127.0.0.1:{port}"


def eps(*ports: int, weights: dict[int, int] | None = None) -> list[Endpoint]:
    weights = weights or {}
    return [Endpoint((addr(p),), {"weight": weights[p]} if p in weights else {}) for p in ports]


def make(
    ports=(80, 81, 82), config: RingHashConfig | None = None, seed: int = 0, **kwargs
) -> tuple[RingHash, FakeHelper]:
    helper = FakeHelper(seed=seed)
    policy = RingHash(helper, **kwargs)
    update = ResolverUpdate(eps(*ports), config or RingHashConfig())
    assert policy.update(update) is None
    return policy, helper


def hash_on(policy: RingHash, port: int) -> int:
    """A request hash whose ring entry belongs to the endpoint of ``port``."""
    ring = policy.ring
    index = [e.endpoint.addresses[0] for e in policy.endpoints].index(addr(port))
    return ring.hashes[ring.endpoints.index(index)]


def pick(helper: FakeHelper, request_hash: int | None):
    if request_hash is None:  # an xDS call whose route has no hash policy
        return helper.pick(cluster="cluster:c1")
    return helper.pick(**{REQUEST_HASH_KEY: request_hash})


def connect(policy: RingHash, helper: FakeHelper, port: int) -> None:
    """A pick lands on ``port``'s endpoint, which is IDLE: it connects."""
    assert isinstance(pick(helper, hash_on(policy, port)), PickQueue)
    helper.clock.advance(0)
    assert helper.subchannel(addr(port)).connect_calls >= 1


def ready(policy: RingHash, helper: FakeHelper, port: int) -> None:
    connect(policy, helper, port)
    helper.subchannel(addr(port)).set_state(CONNECTING)
    helper.subchannel(addr(port)).set_state(READY)


def fail(helper: FakeHelper, port: int, text: str | None = None) -> None:
    sc = helper.subchannel(addr(port))
    sc.set_state(CONNECTING)
    sc.set_state(TF, text)


def picked_address(result) -> str:
    assert isinstance(result, PickComplete), result
    return result.subchannel.address


# -- config --------------------------------------------------------------------


def test_config_defaults_are_c_cores():
    factory, config = registry.select([{NAME: {}}])
    assert isinstance(factory, RingHashFactory)
    assert config == RingHashConfig(1024, 4096)
    assert registry.select([{NAME: {"minRingSize": None}}])[1] == RingHashConfig()


def test_config_values_and_equality():
    config = registry.select([{NAME: {"minRingSize": 10, "maxRingSize": 8388608}}])[1]
    assert config == RingHashConfig(10, 8388608)
    assert config == registry.select([{NAME: {"minRingSize": "10", "maxRingSize": "8388608"}}])[1]
    with pytest.raises(LBConfigError, match="minRingSize"):  # 10.0 is no integer to grpcio
        registry.select([{NAME: {"minRingSize": 10.0}}])
    assert hash(config) == hash(RingHashConfig(10, 8388608))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.min_ring_size = 1  # type: ignore[misc]


def test_config_ignores_unknown_fields_and_request_hash_header():
    config = registry.select([{NAME: {"requestHashHeader": "x-user", "other": 1}}])[1]
    assert config == RingHashConfig()


@pytest.mark.parametrize(
    ("json_config", "message"),
    [
        ({"minRingSize": 0}, f"{NAME}.minRingSize: must be in the range [1, 8388608], got 0"),
        (
            {"maxRingSize": 8388609},
            f"{NAME}.maxRingSize: must be in the range [1, 8388608], got 8388609",
        ),
        ({"minRingSize": "big"}, f'{NAME}.minRingSize: expected integer, got "big"'),
        ({"maxRingSize": True}, f"{NAME}.maxRingSize: expected integer, got true"),
        ({"maxRingSize": 1.5}, f"{NAME}.maxRingSize: expected integer, got 1.5"),
        ({"minRingSize": -1}, f"{NAME}.minRingSize: must be in the range [1, 8388608], got -1"),
        (
            {"minRingSize": 20, "maxRingSize": 10},
            f"{NAME}.maxRingSize: cannot be smaller than minRingSize",
        ),
        # C-core's default maxRingSize is 4096, so a larger minimum alone is invalid.
        ({"minRingSize": 5000}, f"{NAME}.maxRingSize: cannot be smaller than minRingSize"),
        ([], f"{NAME}: expected object, got []"),
    ],
)
def test_config_errors_name_the_field(json_config, message):
    with pytest.raises(LBConfigError) as err:
        registry.select([{NAME: json_config}])
    assert str(err.value) == message


# -- ring construction -----------------------------------------------------------


def test_xxh64_known_vectors():
    # The reference XXH64 test vectors (seed 0): the ring uses exactly this hash.
    assert xxhash.xxh64_intdigest(b"", 0) == 0xEF46DB3751D8E999
    assert xxhash.xxh64_intdigest(b"abc", 0) == 0x44BC2CF5AD770999


def test_golden_ring_two_entries_per_endpoint():
    """Keys are f"{first address}_{n}", n counting from 0 per endpoint; the
    ring is sorted by XXH64(key, seed 0)."""
    ring = build_ring([addr(80), addr(81), addr(82)], [1, 1, 1], 6, 6)
    golden = {
        "127.0.0.1:80_0": 5454692015285649509,
        "127.0.0.1:81_0": 7859399908942313493,
        "127.0.0.1:82_0": 8241336090459785962,
        "127.0.0.1:80_1": 13838424394637650569,
        "127.0.0.1:81_1": 16064866803292627174,
        "127.0.0.1:82_1": 12882406409176325258,
    }
    for key, value in golden.items():
        assert xxhash.xxh64_intdigest(key.encode(), 0) == value
    assert ring.hashes == (
        5454692015285649509,
        7859399908942313493,
        8241336090459785962,
        12882406409176325258,
        13838424394637650569,
        16064866803292627174,
    )
    assert ring.endpoints == (0, 1, 2, 2, 0, 1)


def test_ipv6_key_is_bracketed():
    ring = build_ring(["[::1]:80"], [1], 1, 1)
    assert ring.hashes == (xxhash.xxh64_intdigest(b"[::1]:80_0", 0),)


def test_ring_size_is_min_ring_rounded_up_to_whole_shares():
    # scale = ceil(min_norm * min_ring) / min_norm: 3 equal endpoints, min 5 -> 6
    assert len(build_ring(["a:1", "b:1", "c:1"], [1, 1, 1], 5, 100)) == 6
    assert len(build_ring(["a:1", "b:1", "c:1"], [1, 1, 1], 5, 4)) == 4  # max wins


def test_shares_are_proportional_to_weights():
    ring = build_ring(["a:1", "b:1", "c:1"], [1, 2, 3], 1024, 4096)
    # min_norm = 1/6: scale = ceil(1024 / 6) * 6 = 1026
    assert len(ring) == 1026
    assert [ring.endpoints.count(i) for i in range(3)] == [171, 342, 513]
    assert list(ring.hashes) == sorted(ring.hashes)


def test_max_ring_size_scales_heavy_weights_down():
    ring = build_ring(["a:1", "b:1"], [1, 10000], 1024, 4096)
    assert len(ring) == 4096
    counts = [ring.endpoints.count(i) for i in range(2)]
    assert counts[0] >= 0 and sum(counts) == 4096 and counts[1] > 4000


def test_policy_caps_ring_size_at_4096_like_c_core():
    policy, _ = make(config=RingHashConfig(8388608, 8388608))
    assert len(policy.ring) == 4096
    policy, _ = make(config=RingHashConfig(8000, 9000), ring_size_cap=100_000)
    assert len(policy.ring) == 8001  # ceil(8000 / 3) * 3


def test_policy_reads_endpoint_weights():
    helper = FakeHelper()
    policy = RingHash(helper)
    policy.update(ResolverUpdate(eps(80, 81, weights={80: 3, 81: 1}), RingHashConfig(4, 4096)))
    assert [policy.ring.endpoints.count(i) for i in range(2)] == [3, 1]  # scale 4


def test_duplicate_endpoints_are_merged_and_weights_added():
    helper = FakeHelper()
    policy = RingHash(helper)
    endpoints = [
        Endpoint((addr(80),), {"weight": 1}),
        Endpoint((addr(81),), {"weight": 1}),
        Endpoint((addr(80),), {"weight": 2}),
    ]
    policy.update(ResolverUpdate(endpoints, RingHashConfig(4, 4096)))
    assert [e.endpoint.addresses for e in policy.endpoints] == [(addr(80),), (addr(81),)]
    assert policy.endpoints[0].endpoint.attributes["weight"] == 3
    assert [policy.ring.endpoints.count(i) for i in range(2)] == [3, 1]  # scale 4


# -- picks ---------------------------------------------------------------------------


def _ketama_index(hashes, request_hash):
    """C-core's (ketama's) binary search, written out independently."""
    low, high = 0, len(hashes)
    for _ in range(2 * len(hashes).bit_length() + 2):  # a binary search: bounded
        mid = (low + high) // 2
        if mid == len(hashes):
            return 0
        midval = hashes[mid]
        midval1 = 0 if mid == 0 else hashes[mid - 1]
        if midval1 < request_hash <= midval:
            return mid
        if midval < request_hash:
            low = mid + 1
        else:
            high = mid - 1
        if low > high:
            return 0
    raise AssertionError("the binary search did not end")


def test_start_entry_matches_c_core_binary_search():
    ring = build_ring([addr(p) for p in range(80, 90)], [1] * 10, 64, 64)
    rng = random.Random(7)
    probes = [0, 1, 2**64 - 1, *ring.hashes, *(h + 1 for h in ring.hashes)]
    probes += [h - 1 for h in ring.hashes] + [rng.getrandbits(64) for _ in range(2000)]
    for probe in probes:
        assert ring.start(probe) == _ketama_index(ring.hashes, probe), probe


def test_pick_goes_to_first_entry_at_or_after_the_hash_and_wraps():
    policy, helper = make()
    for port in (80, 81, 82):
        ready(policy, helper, port)
    assert helper.state is READY
    ring = policy.ring
    address_of = [e.endpoint.addresses[0] for e in policy.endpoints]
    for k, h in enumerate(ring.hashes):
        assert picked_address(pick(helper, h)) == address_of[ring.endpoints[k]]
        following = ring.endpoints[(k + 1) % len(ring)]
        assert picked_address(pick(helper, h + 1)) == address_of[following]
    assert picked_address(pick(helper, 0)) == address_of[ring.endpoints[0]]
    assert picked_address(pick(helper, 2**64 - 1)) == address_of[ring.endpoints[0]]


def test_precomputed_walk_matches_a_plain_ring_walk():
    """The picker's precomputed skip table gives what C-core's walk gives:
    from the start entry, the first endpoint not in TRANSIENT_FAILURE."""
    from types import SimpleNamespace

    from pyxds.lb import FailPicker, PickArgs

    rng = random.Random(11)
    ring = build_ring([addr(p) for p in range(80, 86)], [1, 2, 1, 3, 1, 1], 40, 40)
    for _ in range(200):
        states = [rng.choice([IDLE, CONNECTING, READY, TF]) for _ in range(6)]
        endpoints = [
            SimpleNamespace(
                state=s,
                status=Status(UNAVAILABLE, f"e{i}"),
                picker=FailPicker(Status(grpc.StatusCode.INTERNAL, f"picked e{i}")),
            )
            for i, s in enumerate(states)
        ]
        scheduled = []
        picker = RingHashPicker.over(ring, endpoints, scheduled.append, rng.getrandbits, "")
        h = rng.getrandbits(64)
        result = picker.pick(PickArgs("/s/m", (), {REQUEST_HASH_KEY: h}))
        start = _ketama_index(ring.hashes, h)
        walk = [ring.endpoints[(start + i) % len(ring)] for i in range(len(ring))]
        usable = [e for e in walk if states[e] is not TF]
        if not usable:
            assert result.status.details.endswith(f"first failure: e{walk[0]}")
        elif states[usable[0]] is READY:
            assert result.status.details == f"picked e{usable[0]}"
        else:
            assert isinstance(result, PickQueue)
            want = [endpoints[usable[0]]] if states[usable[0]] is IDLE else []
            assert scheduled == want


def test_starts_idle_without_subchannels():
    policy, helper = make()
    assert helper.state_sequence() == [IDLE]
    assert helper.subchannels == [] and policy.subchannels == []
    assert isinstance(helper.last.picker, RingHashPicker)


def test_idle_endpoint_pick_connects_exactly_that_endpoint_and_queues():
    policy, helper = make()
    assert isinstance(pick(helper, hash_on(policy, 81)), PickQueue)
    assert helper.subchannels == []  # nothing runs on the pick thread
    helper.clock.advance(0)
    assert [(s.address, s.connect_calls) for s in helper.subchannels] == [(addr(81), 1)]
    assert helper.state is CONNECTING
    assert isinstance(pick(helper, hash_on(policy, 81)), PickQueue)  # CONNECTING: queue
    helper.subchannel(addr(81)).set_state(CONNECTING)
    helper.subchannel(addr(81)).set_state(READY)
    assert helper.state is READY
    assert picked_address(pick(helper, hash_on(policy, 81))) == addr(81)


def test_pick_on_idle_endpoint_queues_even_when_another_is_ready():
    policy, helper = make()
    ready(policy, helper, 80)
    assert isinstance(pick(helper, hash_on(policy, 82)), PickQueue)
    helper.clock.advance(0)
    assert helper.subchannel(addr(82)).connect_calls == 1


def test_failing_endpoints_are_skipped_to_the_next_entry():
    policy, helper = make()
    ready(policy, helper, 80)
    ready(policy, helper, 81)
    connect(policy, helper, 82)
    fail(helper, 82)
    assert helper.state is READY
    ring = policy.ring
    address_of = [e.endpoint.addresses[0] for e in policy.endpoints]
    failing = address_of.index(addr(82))
    for k, h in enumerate(ring.hashes):
        if ring.endpoints[k] != failing:
            continue
        j = k
        while ring.endpoints[j] == failing:
            j = (j + 1) % len(ring)
        assert picked_address(pick(helper, h)) == address_of[ring.endpoints[j]]


def test_walk_stops_at_connecting_and_idle_endpoints():
    policy, helper = make(ports=(80, 81))
    ring = policy.ring
    address_of = [e.endpoint.addresses[0] for e in policy.endpoints]
    connect(policy, helper, 80)
    fail(helper, 80)
    # 80 failed: the pick walks on to the first entry of 81, which is IDLE.
    k = ring.endpoints.index(address_of.index(addr(80)))
    assert isinstance(pick(helper, ring.hashes[k]), PickQueue)
    helper.clock.advance(0)
    assert helper.subchannel(addr(81)).connect_calls == 1


def test_all_failing_fails_with_c_core_words():
    policy, helper = make(ports=(80, 81))
    connect(policy, helper, 80)
    fail(helper, 80, "refused 80")
    fail(helper, 81, "refused 81")  # the recovery rule connected 81 already
    assert helper.state is TF
    assert helper.last.status == Status(
        UNAVAILABLE, "no reachable endpoints; last error: refused 81"
    )
    for port in (80, 81):
        result = pick(helper, hash_on(policy, port))
        assert isinstance(result, PickFail)
        assert result.status == Status(
            UNAVAILABLE,
            f"ring hash cannot find a connected endpoint; first failure: refused {port}",
        )


def test_failure_message_carries_the_resolution_note():
    helper = FakeHelper()
    policy = RingHash(helper)
    policy.update(ResolverUpdate(eps(80), RingHashConfig(), resolution_note="eds: 1 endpoint"))
    connect(policy, helper, 80)
    fail(helper, 80, "refused")
    assert helper.state is TF
    assert pick(helper, 5).status.details == (
        "ring hash cannot find a connected endpoint; first failure: refused (eds: 1 endpoint)"
    )


def test_missing_hash_on_an_xds_call_uses_helper_random():
    policy, helper = make(seed=3)
    for port in (80, 81, 82):
        ready(policy, helper, port)
    ring = policy.ring
    address_of = [e.endpoint.addresses[0] for e in policy.endpoints]
    twin = random.Random()
    twin.setstate(helper.random.getstate())
    got = [picked_address(pick(helper, None)) for _ in range(50)]
    want = [address_of[ring.endpoints[ring.start(twin.getrandbits(64))]] for _ in range(50)]
    assert got == want
    assert len(set(got)) == 3


def test_ready_pick_returns_the_child_result():
    policy, helper = make()
    ready(policy, helper, 81)
    result = pick(helper, hash_on(policy, 81))
    assert isinstance(result, PickComplete)
    assert result.subchannel is helper.subchannel(addr(81))


# -- aggregate state and recovery ----------------------------------------------------


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([READY, TF, TF], READY),
        ([READY, IDLE], READY),
        ([TF, TF, CONNECTING], TF),
        ([TF, TF, IDLE], TF),
        ([CONNECTING, TF], CONNECTING),
        ([CONNECTING, IDLE], CONNECTING),
        ([TF, IDLE], CONNECTING),
        ([TF, IDLE, IDLE], CONNECTING),
        ([IDLE, IDLE], IDLE),
        ([IDLE], IDLE),
        ([TF], TF),
        ([CONNECTING], CONNECTING),
    ],
)
def test_aggregate_state_rules(states, expected):
    assert aggregate_state(states) is expected


def test_one_failure_reports_connecting_and_connects_the_next_idle_endpoint():
    # Endpoints listed out of address order: recovery follows C-core's
    # endpoint-map order (by address), not the list or the ring.
    policy, helper = make(ports=(82, 80, 81))
    connect(policy, helper, 82)
    fail(helper, 82)
    assert helper.state is CONNECTING
    assert [s.address for s in helper.subchannels] == [addr(82), addr(80)]
    assert helper.subchannel(addr(80)).connect_calls == 1
    fail(helper, 80)
    assert helper.state is TF
    assert helper.subchannel(addr(81)).connect_calls == 1  # no pick needed
    helper.subchannel(addr(81)).set_state(CONNECTING)
    helper.subchannel(addr(81)).set_state(READY)
    assert helper.state is READY
    assert picked_address(pick(helper, hash_on(policy, 82))) == addr(81)  # 80, 82 fail


def test_recovery_waits_while_an_endpoint_is_connecting():
    policy, helper = make()
    connect(policy, helper, 80)
    connect(policy, helper, 81)
    fail(helper, 80)
    assert helper.state is CONNECTING
    assert len(helper.subchannels) == 2  # 81 is still connecting: nothing new


def test_all_endpoints_failing_keep_retrying_through_pick_first():
    policy, helper = make(ports=(80, 81))
    connect(policy, helper, 80)
    fail(helper, 80)
    fail(helper, 81)
    assert helper.state is TF
    sc = helper.subchannel(addr(80))
    before = sc.connect_calls
    sc.set_state(IDLE)  # backoff over: the pick_first child retries by itself
    assert sc.connect_calls == before + 1
    sc.set_state(CONNECTING)
    assert helper.state is TF  # pick_first is sticky in TRANSIENT_FAILURE
    sc.set_state(READY)
    assert helper.state is READY


def test_child_failure_requests_reresolution():
    policy, helper = make(ports=(80,))
    connect(policy, helper, 80)
    assert helper.reresolution_requests == 0
    fail(helper, 80)
    assert helper.reresolution_requests == 1


def test_dropped_connection_goes_idle_and_reconnects_only_on_a_pick():
    policy, helper = make(ports=(80,))
    ready(policy, helper, 80)
    sc = helper.subchannel(addr(80))
    calls = sc.connect_calls
    sc.set_state(IDLE)
    assert helper.state is IDLE
    assert sc.connect_calls == calls
    assert isinstance(pick(helper, 1), PickQueue)
    helper.clock.advance(0)
    assert sc.connect_calls == calls + 1


# -- updates ---------------------------------------------------------------------------


def test_same_update_twice_is_a_no_op():
    policy, helper = make()
    ready(policy, helper, 80)
    ring, reports = policy.ring, len(helper.states)
    assert policy.update(ResolverUpdate(eps(80, 81, 82), RingHashConfig())) is None
    assert policy.ring is ring
    assert len(helper.states) == reports


def test_new_update_attributes_alone_reach_no_endpoint_child(monkeypatch):
    # Each EDS update carries a new xds_config attribute; pick_first reads
    # none, so unchanged endpoints' children are not updated at all.
    policy, helper = make()
    ready(policy, helper, 80)
    calls: list[ResolverUpdate] = []
    real_update = PickFirst.update
    monkeypatch.setattr(
        PickFirst, "update", lambda self, update: calls.append(update) or real_update(self, update)
    )
    policy.update(ResolverUpdate(eps(80, 81, 82), RingHashConfig(), {"xds_config": object()}))
    assert calls == []
    policy.update(ResolverUpdate(eps(80, 81, 82), RingHashConfig(), {}, "a new note"))
    assert [u.resolution_note for u in calls] == ["a new note"]


def test_unchanged_endpoints_keep_their_subchannels():
    policy, helper = make()
    ready(policy, helper, 80)
    connect(policy, helper, 81)
    kept = helper.subchannel(addr(80))
    policy.update(ResolverUpdate(eps(80, 83), RingHashConfig()))
    assert not kept.shut_down and helper.subchannel(addr(80)) is kept
    assert helper.subchannel(addr(81), live=False).shut_down
    assert [e.endpoint.addresses[0] for e in policy.endpoints] == [addr(80), addr(83)]
    assert helper.state is READY
    assert picked_address(pick(helper, hash_on(policy, 80))) == addr(80)
    assert isinstance(pick(helper, hash_on(policy, 83)), PickQueue)


def test_new_config_rebuilds_the_ring_and_keeps_children():
    policy, helper = make()
    ready(policy, helper, 80)
    old_ring = policy.ring
    policy.update(ResolverUpdate(eps(80, 81, 82), RingHashConfig(6, 6)))
    assert policy.ring is not old_ring and len(policy.ring) == 6
    assert not helper.subchannel(addr(80)).shut_down
    assert picked_address(pick(helper, hash_on(policy, 80))) == addr(80)


def test_empty_list_is_rejected_and_reresolves():
    policy, helper = make()
    connect(policy, helper, 80)
    status = policy.update(ResolverUpdate([], RingHashConfig()))
    assert status == Status(UNAVAILABLE, "empty address list")
    assert helper.state is TF and helper.last.status == status
    assert helper.reresolution_requests == 1
    assert helper.subchannel(addr(80), live=False).shut_down
    assert isinstance(pick(helper, 1), PickFail)


def test_resolver_error_is_ignored_while_there_are_endpoints():
    policy, helper = make()
    reports = len(helper.states)
    error = Status(UNAVAILABLE, "xds: cluster not found")
    policy.resolver_error(error)
    assert policy.update(ResolverUpdate(error, RingHashConfig())) == error
    assert len(helper.states) == reports


def test_resolver_error_without_endpoints_is_reported():
    helper = FakeHelper()
    policy = RingHash(helper)
    error = Status(UNAVAILABLE, "xds: cluster not found")
    policy.resolver_error(error)
    assert helper.state is TF and helper.last.status == error
    assert pick(helper, 1) == PickFail(error)


def test_exit_idle_connects_nothing_and_reset_backoff_reaches_children():
    policy, helper = make()
    policy.exit_idle()
    assert helper.subchannels == []
    connect(policy, helper, 80)
    policy.reset_backoff()
    assert helper.subchannel(addr(80)).reset_backoff_calls == 1


def test_shutdown_closes_children_and_drops_pending_connections():
    policy, helper = make()
    connect(policy, helper, 80)
    pick(helper, hash_on(policy, 81))  # scheduled, not yet run
    policy.shutdown()
    helper.clock.advance(0)
    assert all(s.shut_down for s in helper.subchannels)
    assert [s.address for s in helper.subchannels] == [addr(80)]


def test_built_from_the_registry_with_the_xds_cluster_config():
    factory, config = registry.select([{NAME: {"minRingSize": 1024, "maxRingSize": 8388608}}])
    helper = FakeHelper()
    policy = factory.build(helper)
    assert policy.update(ResolverUpdate(eps(80, 81), config)) is None
    assert len(policy.ring) == 1024
    assert helper.state is IDLE


def test_ring_hash_cluster_through_the_cds_tree():
    """A RING_HASH cluster: cds -> xds_cluster_impl -> priority -> ring_hash,
    endpoints weighted locality x endpoint weight, lazy connections."""
    from test_cds_support import cds_update, eds_cluster, eds_entry, loc, locality, xds_config

    helper = FakeHelper()
    factory, config = registry.select([{"cds_experimental": {"cluster": "rh"}}])
    policy = factory.build(helper)
    cluster = eds_cluster(
        "rh", lb_policy_config='[{"ring_hash_experimental": {"minRingSize": 4, "maxRingSize": 64}}]'
    )
    entry = eds_entry(
        cluster,
        [
            locality(loc("a"), [addr(80)], weight=1),
            locality(loc("b"), [addr(81)], weight=3),
        ],
    )
    assert policy.update(cds_update(config, xds_config({"rh": entry}))) is None
    assert helper.subchannels == []  # lazy: nothing connects before a pick
    ring = build_ring([addr(80), addr(81)], [1, 3], 4, 64)
    assert [ring.endpoints.count(i) for i in range(2)] == [1, 3]
    target = ring.hashes[ring.endpoints.index(1)]
    assert isinstance(pick(helper, target), PickQueue)
    helper.clock.advance(0)
    assert [s.address for s in helper.subchannels] == [addr(81)]
    helper.subchannel(addr(81)).set_state(CONNECTING)
    helper.subchannel(addr(81)).set_state(READY)
    assert helper.state is READY
    assert picked_address(pick(helper, target)) == addr(81)


def test_each_report_publishes_the_picker_a_full_rebuild_would_and_only_when_something_changed():
    """ring_hash keeps its picker's columns one endpoint at a time (issue 18:
    a report over 1000 endpoints must not redo 1000 endpoints).  Over random
    picks, connectivity changes and updates, every reported picker holds
    what one built from all endpoints at that moment holds, and a picker is
    reported exactly when the aggregate, the ring, the note or some
    endpoint's (state, status, picker) differs from the last report."""
    rng = random.Random(5)
    ports = list(range(80, 88))
    policy, helper = make(ports, seed=3)

    def full_key() -> tuple:
        children = tuple((e.state, e.status, e.picker) for e in policy.endpoints)
        last = helper.last
        return (last.state, last.status, policy.ring, policy._note, children)

    reported = full_key()
    for step in range(600):
        before = len(helper.states)
        op = rng.random()
        if op < 0.1:
            chosen = sorted(rng.sample(range(80, 92), rng.randint(1, 8)))
            note = rng.choice(["", "", "dns down"])
            policy.update(ResolverUpdate(eps(*chosen), RingHashConfig(), resolution_note=note))
        elif op < 0.4:
            pick(helper, rng.getrandbits(64))
            helper.clock.advance(0)
        else:
            live = [s for s in helper.subchannels if s.watched]
            if not live:
                continue
            state = rng.choice([IDLE, CONNECTING, READY, TF, TF])
            rng.choice(live).set_state(state, f"fail {step % 3}" if state is TF else None)
        if len(helper.states) == before:
            assert full_key()[2:] == reported[2:], f"step {step}: a change was not reported"
            continue
        now = full_key()
        assert now != reported, f"step {step}: reported with nothing changed"
        reported = now
        picker = helper.last.picker
        fresh = RingHashPicker.over(
            policy.ring,
            policy.endpoints,
            policy._schedule_connection,
            helper.random.getrandbits,
            policy._note,
        )
        assert picker.states == fresh.states
        assert picker._actions == fresh._actions and picker._fails == fresh._fails
        assert picker._connects == fresh._connects
        assert picker._next_usable == fresh._next_usable
        assert picker._has_connecting == fresh._has_connecting
        assert helper.last.state is aggregate_state(fresh.states)
