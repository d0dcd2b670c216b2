"""least_request_experimental (gRFC A48): config (choiceCount default 2,
clamped to 10, < 2 rejected), the picker's power-of-choice rule with seeded
randomness, outstanding-request counters (per attempt, never leaking, kept
across updates), round_robin's endpoint management (A61 pick_first
children), and the xDS conversions (legacy enum and extension)."""

from __future__ import annotations

import collections
import random
import threading

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2

from pyxds.lb import LBConfigError, PickComplete, ResolverUpdate, Status, least_request, registry
from pyxds.lb.api import ConnectivityState, Endpoint
from pyxds.lb.least_request import (
    FIRST_BLOCK,
    MAX_BLOCK,
    LeastRequestConfig,
    LeastRequestPicker,
    Outstanding,
)
from pyxds.lb.sampling import uniform_indices
from pyxds.testing import FakeHelper
from pyxds.xds.resources import CLUSTER

READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
OK = Status(grpc.StatusCode.OK)
CANCELLED = Status(grpc.StatusCode.CANCELLED, "cancelled")


def parse(body):
    return registry.select([{"least_request_experimental": body}])[1]


def addresses(n: int) -> list[str]:
    return [f"10.0.0.{i}:80" for i in range(1, n + 1)]


def setup(n: int = 3, choice_count: int = 2, seed: int = 0):
    helper = FakeHelper(seed=seed)
    factory, config = registry.select(
        [{"least_request_experimental": {"choiceCount": choice_count}}]
    )
    policy = factory.build(helper)
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(n)], config))
    for subchannel in helper.subchannels:
        subchannel.set_state(READY)
    assert helper.state is READY
    return helper, policy, config


# ---------------------------------------------------------------- config


def test_choice_count_defaults_to_two():
    assert parse({}) == LeastRequestConfig(2)


def test_choice_count_in_a_string_is_read_like_every_integer_field():
    """ "3" is 3, as grpcio 1.85 reads its integer fields (C-core has no
    least_request; pyxds's config fields all read numbers one way)."""
    assert parse({"choiceCount": "3"}) == LeastRequestConfig(3)


def test_choice_count_above_ten_is_clamped_to_ten():
    assert parse({"choiceCount": 11}) == LeastRequestConfig(10)
    assert parse({"choiceCount": 4294967295}) == LeastRequestConfig(10)


@pytest.mark.parametrize("count", [0, 1])
def test_choice_count_below_two_is_rejected_naming_the_field(count):
    with pytest.raises(LBConfigError, match="choiceCount"):
        parse({"choiceCount": count})


@pytest.mark.parametrize("value", [-1, "2.5", "two", 2.5, True])
def test_malformed_choice_count_is_rejected(value):
    with pytest.raises(LBConfigError, match="choiceCount"):
        parse({"choiceCount": value})


def test_same_config_twice_is_equal_and_a_no_op():
    assert parse({"choiceCount": 3}) == parse({"choiceCount": 3})
    helper, policy, _config = setup()
    reports = len(helper.states)
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(3)], parse({})))
    assert len(helper.states) == reports


# ---------------------------------------------------------------- picker


def test_a_new_choice_count_with_the_very_same_endpoint_objects_is_published_at_once():
    # cds hands an unchanged locality's very endpoint objects on, which
    # round_robin's bookkeeping skips: a new choiceCount must still apply
    helper = FakeHelper()
    factory, config = registry.select([{"least_request_experimental": {"choiceCount": 2}}])
    policy = factory.build(helper)
    endpoints = [Endpoint((a,)) for a in addresses(3)]
    policy.update(ResolverUpdate(endpoints, config))
    for subchannel in helper.subchannels:
        subchannel.set_state(READY)
    published = len(helper.states)
    policy.update(ResolverUpdate(endpoints, parse({"choiceCount": 3})))
    assert len(helper.states) == published + 1
    picker = helper.last.picker
    assert isinstance(picker, LeastRequestPicker)
    assert picker._choice_count == 3


def test_picks_the_endpoint_with_fewer_outstanding_requests():
    """Two endpoints, choiceCount 10: once one holds calls, new picks go to
    the other unless all ten samples hit the busy one (p = 1/1024)."""
    helper, _policy, _ = setup(n=2, choice_count=10)
    held = [helper.pick() for _ in range(1)]
    busy = held[0].subchannel.address
    picks = collections.Counter()
    for _ in range(200):
        result = helper.pick()
        picks[result.subchannel.address] += 1
        result.on_call_done(OK)
    assert picks[busy] <= 2


def test_outstanding_calls_balance_out():
    """Calls held open spread evenly: the counts never differ by more than a few."""
    helper, _policy, _ = setup(n=4, choice_count=2, seed=3)
    for _ in range(400):
        helper.pick()
    counters = helper.last.picker.counters
    assert sum(counters) == 400
    assert max(counters) - min(counters) <= 10


def replay_samples(rng: random.Random, n: int, choice_count: int):
    """The picker's samples, replayed from a copy of its random state: blocks
    of FIRST_BLOCK raw draws, doubling up to MAX_BLOCK, each cut into
    choice_count-tuples (a block's incomplete tail is dropped)."""
    block = FIRST_BLOCK
    while True:
        indices = iter(uniform_indices(rng, n, block))
        yield from zip(*[indices] * choice_count, strict=False)
        block = min(block * 2, MAX_BLOCK)


@pytest.mark.parametrize("choice_count", [2, 3])
def test_ties_keep_the_first_sample_with_seeded_randomness(choice_count):
    """A48 pseudo-code: a later sample wins only with strictly fewer calls,
    so with all counts equal the pick is the first sample: the picks follow
    helper.random exactly, across block refills (150 picks > one block)."""
    helper, _policy, _ = setup(n=5, choice_count=choice_count, seed=11)
    picker = helper.last.picker
    replay = random.Random()
    replay.setstate(helper.random.getstate())
    samples = replay_samples(replay, 5, choice_count)
    results = picker.results
    for _ in range(150):
        expected = results[next(samples)[0]]
        result = picker.pick(None)
        assert result is expected
        result.on_call_done(OK)


def test_on_call_done_decrements_once_whatever_the_status():
    helper, _policy, _ = setup(n=2)
    results = [helper.pick() for _ in range(6)]
    assert sum(helper.last.picker.counters) == 6
    for result, status in zip(results, [OK, CANCELLED, OK, CANCELLED, OK, OK], strict=True):
        result.on_call_done(status)
    assert helper.last.picker.counters == [0, 0]
    results[0].on_call_done(OK)  # a stray extra call never goes below zero
    assert helper.last.picker.counters == [0, 0]


def test_each_retry_attempt_counts_separately():
    """The channel picks once per attempt and calls on_call_done per attempt."""
    helper, _policy, _ = setup(n=2)
    first = helper.pick()
    first.on_call_done(Status(grpc.StatusCode.UNAVAILABLE, "attempt 1 failed"))
    second = helper.pick()
    assert sum(helper.last.picker.counters) == 1
    second.on_call_done(OK)
    assert sum(helper.last.picker.counters) == 0


def test_counters_survive_updates_that_keep_the_endpoint():
    helper, policy, config = setup(n=2)
    held = helper.pick()
    address = held.subchannel.address
    policy.update(ResolverUpdate([Endpoint((a,)) for a in [*addresses(2), "10.0.0.9:80"]], config))
    helper.subchannel("10.0.0.9:80").set_state(READY)
    picker = helper.last.picker
    assert isinstance(picker, LeastRequestPicker)
    counts = dict(zip([r.subchannel.address for r in picker.results], picker.counters, strict=True))
    assert counts[address] == 1
    held.on_call_done(OK)
    assert helper.last.picker.counters == [0, 0, 0]


def test_choice_count_change_republishes_the_picker():
    helper, policy, _ = setup(n=2, choice_count=2)
    reports = len(helper.states)
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(2)], parse({"choiceCount": 5})))
    assert len(helper.states) == reports + 1
    assert "choice_count=5" in repr(helper.last.picker)


def test_only_ready_endpoints_are_picked():
    helper, _policy, _ = setup(n=3)
    helper.subchannel(addresses(3)[0]).set_state(TF)
    picked = {helper.pick().subchannel.address for _ in range(100)}
    assert picked == set(addresses(3)[1:])


def test_aggregation_is_round_robins():
    helper = FakeHelper()
    factory, config = registry.select([{"least_request_experimental": {}}])
    policy = factory.build(helper)
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(2)], config))
    assert helper.state is ConnectivityState.CONNECTING
    for subchannel in helper.subchannels:
        subchannel.set_state(TF)
    assert helper.state is TF
    assert "connections to all backends failing" in helper.last.status.details
    helper.subchannels[0].set_state(READY)
    assert helper.state is READY


def test_dual_stack_endpoint_is_one_choice():
    """A61: one pick_first child per endpoint, one counter per endpoint."""
    helper = FakeHelper()
    factory, config = registry.select([{"least_request_experimental": {}}])
    policy = factory.build(helper)
    policy.update(
        ResolverUpdate([Endpoint(("[::1]:80", "127.0.0.1:80")), Endpoint(("10.0.0.1:80",))], config)
    )
    for subchannel in helper.subchannels:
        subchannel.set_state(READY)
    assert len(helper.last.picker.counters) == 2


def test_picks_are_complete_and_carry_the_channels_subchannel():
    helper, _policy, _ = setup(n=2)
    result = helper.pick()
    assert isinstance(result, PickComplete)
    assert result.subchannel in helper.subchannels


def test_the_first_config_sets_the_choice_count():
    """grpc-go#7969 review: the count comes from the config of the first
    update, not from a built-in default."""
    helper, _policy, _ = setup(n=2, choice_count=7)
    assert "choice_count=7" in repr(helper.last.picker)


def test_a_removed_endpoint_comes_back_with_a_fresh_counter():
    """A48: a counter shares its endpoint's lifecycle.  A call held on an
    endpoint that is removed and then listed again ends on the old counter:
    the new one starts (and stays) at zero."""
    helper, policy, config = setup(n=3)
    held = helper.pick()
    gone = held.subchannel.address
    kept = [a for a in addresses(3) if a != gone]
    policy.update(ResolverUpdate([Endpoint((a,)) for a in kept], config))
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(3)], config))
    helper.subchannel(gone).set_state(READY)
    picker = helper.last.picker
    assert len(picker.counters) == 3
    assert picker.counters == [0, 0, 0]
    held.on_call_done(OK)
    assert helper.last.picker.counters == [0, 0, 0]


# ---------------------------------------------------------------- sampling (A48 "Picker Behavior")


def direct_picker(n: int, choice_count: int = 2, seed: int = 5):
    """A picker over n constant results (subchannel i is the string "s<i>")
    and fresh counters, outside a policy: counts are set with take()."""
    spill: list = []
    counters = [Outstanding(spill) for _ in range(n)]
    constants = [PickComplete(f"s{i}") for i in range(n)]
    picker = LeastRequestPicker(constants, counters, choice_count, random.Random(seed))
    return picker, counters, spill


def picked_shares(picker, picks: int) -> collections.Counter:
    """Subchannel of each of ``picks`` picks, each call ended at once (the
    counts stay as they were set)."""
    seen: collections.Counter = collections.Counter()
    for _ in range(picks):
        result = picker.pick(None)
        seen[result.subchannel] += 1
        result.on_call_done(OK)
    return seen


def within(observed: int, picks: int, p: float, sigmas: float = 5.0) -> bool:
    sd = (picks * p * (1 - p)) ** 0.5
    return abs(observed - picks * p) <= sigmas * sd


def test_samples_are_drawn_with_replacement():
    """Two endpoints, one holding a call: the busy one is picked only when
    both samples land on it, which happens 1/4 of the time with replacement
    (never without).  20000 picks span many block refills."""
    picker, counters, _spill = direct_picker(2)
    counters[0].take()
    shares = picked_shares(picker, 20000)
    assert within(shares["s0"], 20000, 0.25), shares
    assert picker.counters == [1, 0]


def test_power_of_two_choices_follow_a48_probabilities():
    """Counts (2, 1, 0): the idle endpoint loses only if neither sample is it,
    the busiest wins only if both samples are it: P = 1/9, 3/9, 5/9."""
    picker, counters, _spill = direct_picker(3)
    for index, count in enumerate((2, 1, 0)):
        for _ in range(count):
            counters[index].take()
    picks = 27000
    shares = picked_shares(picker, picks)
    for index, p in enumerate((1 / 9, 3 / 9, 5 / 9)):
        assert within(shares[f"s{index}"], picks, p), shares


def test_all_counts_equal_picks_every_endpoint_uniformly():
    """Ties go to the first sample, which is uniform over the READY
    endpoints: 100 endpoints, 50000 picks, a chi-square far below 6 sigma."""
    picker, _counters, _spill = direct_picker(100, seed=9)
    picks = 50000
    shares = picked_shares(picker, picks)
    expected = picks / 100
    chi2 = sum((shares[f"s{i}"] - expected) ** 2 / expected for i in range(100))
    assert len(shares) == 100
    assert chi2 < 99 + 6 * (2 * 99) ** 0.5, chi2


@pytest.mark.parametrize(("n", "choice_count"), [(1, 10), (3, 10), (2, 5)])
def test_choice_count_above_the_endpoint_count_is_fine(n, choice_count):
    """choiceCount may exceed the READY endpoints: samples repeat (with
    replacement), nothing loops or fails, and the least loaded still wins."""
    helper, _policy, _ = setup(n=n, choice_count=choice_count)
    held = [helper.pick() for _ in range(3 * n)]
    counters = helper.last.picker.counters
    assert sum(counters) == 3 * n
    assert max(counters) - min(counters) <= 1
    for result in held:
        result.on_call_done(OK)
    assert helper.last.picker.counters == [0] * n


# ---------------------------------------------------------------- counters beyond TOKENS


@pytest.fixture
def two_tokens(monkeypatch):
    """Counters made from here on take the C-level path for 2 calls only."""
    monkeypatch.setattr(least_request, "TOKENS", 2)


def test_calls_beyond_the_tokens_are_counted_exactly(two_tokens):
    """Counts 3 (two token calls + one overflow call) and 2: while the
    overflow call is in flight every pick compares exact counts, so the
    busier endpoint wins only when both samples are it (1/4)."""
    picker, counters, spill = direct_picker(2)
    for _ in range(3):
        counters[0].take()
    counters[1].take()
    counters[1].take()
    assert picker.counters == [3, 2] and len(spill) == 1
    shares = picked_shares(picker, 8000)
    assert within(shares["s0"], 8000, 0.25), shares
    assert picker.counters == [3, 2] and len(spill) == 1


def test_token_and_overflow_calls_end_in_any_order_without_leaking(two_tokens):
    """One endpoint, five calls: two take tokens, three overflow.  Ending
    them in any order (and a stray extra end of each kind) leaves the count
    at zero and the policy's overflow list empty."""
    picker, _counters, spill = direct_picker(1)
    results = [picker.pick(None) for _ in range(5)]
    assert picker.counters == [5] and len(spill) == 3
    assert len({id(r.on_call_done) for r in results}) == 2  # token end, overflow end
    for index in (3, 0, 4, 1, 2):
        results[index].on_call_done(CANCELLED)
    assert picker.counters == [0] and spill == []
    results[0].on_call_done(OK)
    results[4].on_call_done(OK)
    assert picker.counters == [0] and spill == []


def test_calls_take_tokens_again_once_the_overflow_ended(two_tokens):
    """Six calls on two endpoints with 2 tokens each: two overflow.  Once
    every call ended the policy has no overflow left, and new calls take
    tokens again (the precomputed token results), with exact counts."""
    picker, _counters, spill = direct_picker(2)
    held = [picker.pick(None) for _ in range(6)]
    assert sum(picker.counters) == 6
    assert len(spill) == sum(max(0, count - 2) for count in picker.counters) >= 2
    for result in held:
        result.on_call_done(OK)
    assert picker.counters == [0, 0] and spill == []
    again = [picker.pick(None) for _ in range(2)]
    assert all(any(r is token for token in picker.results) for r in again)
    assert sum(picker.counters) == 2 and spill == []
    for result in again:
        result.on_call_done(OK)
    assert picker.counters == [0, 0]


@pytest.mark.parametrize("tokens", [2, least_request.TOKENS])
def test_concurrent_picks_and_ends_leave_every_counter_at_zero(monkeypatch, tokens):
    """grpc-go#6587/#6602: the counters are updated from many RPC threads at
    once.  Eight threads each hold up to 6 calls, picking and ending calls
    in a loop; after they finish every count and the overflow list are
    back at zero (with 2 tokens the overflow path races too)."""
    monkeypatch.setattr(least_request, "TOKENS", tokens)
    helper, _policy, _ = setup(n=3, choice_count=2, seed=4)
    picker = helper.last.picker
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held = []
        try:
            for _ in range(3000):
                if len(held) < 6 and rng.random() < 0.55:
                    held.append(picker.pick(None))
                elif held:
                    held.pop(rng.randrange(len(held))).on_call_done(OK)
            for result in held:
                result.on_call_done(OK)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert picker.counters == [0, 0, 0]
    assert policy_spill(helper) == []


def policy_spill(helper):
    counters = helper.last.picker._counters
    return counters[0].spill


def test_the_counter_stays_with_the_endpoint_when_its_connection_moves():
    """A61 (grpc-rust#2651 review): counts belong to the endpoint, not to a
    subchannel.  A call held on the endpoint's first address still counts
    after the endpoint reconnects on its second address, and its end brings
    the count back to zero."""
    helper = FakeHelper()
    factory, config = registry.select([{"least_request_experimental": {}}])
    policy = factory.build(helper)
    policy.update(
        ResolverUpdate(
            [Endpoint(("10.0.0.1:80", "10.0.0.2:80")), Endpoint(("10.0.0.3:80",))], config
        )
    )
    helper.subchannel("10.0.0.1:80").set_state(READY)
    helper.subchannel("10.0.0.3:80").set_state(READY)
    held = [helper.pick() for _ in range(4)]
    on_first = [r for r in held if r.subchannel.address == "10.0.0.1:80"]
    assert on_first, "expected a call on the dual-address endpoint"
    for result in held:
        if result not in on_first:
            result.on_call_done(OK)
    helper.subchannel("10.0.0.1:80").set_state(ConnectivityState.IDLE)
    helper.clock.advance(0)
    helper.subchannel("10.0.0.1:80").set_state(TF)
    helper.subchannel("10.0.0.2:80").set_state(READY)
    picker = helper.last.picker
    counts = dict(zip([r.subchannel.address for r in picker.results], picker.counters, strict=True))
    assert counts == {"10.0.0.2:80": len(on_first), "10.0.0.3:80": 0}
    for result in on_first:
        result.on_call_done(OK)
    assert helper.last.picker.counters == [0, 0]


# ---------------------------------------------------------------- xDS conversion


def _cluster() -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.ads.SetInParent()
    return c


def test_extension_converts_with_choice_count():
    c = _cluster()
    policy = c.load_balancing_policy.policies.add()
    policy.typed_extension_config.name = "lr"
    policy.typed_extension_config.typed_config.Pack(
        least_request_pb2.LeastRequest(choice_count={"value": 7})
    )
    result = CLUSTER.decode(c.SerializeToString())
    assert result.error is None, result.error
    assert result.resource.lb_policy_json() == [{"least_request_experimental": {"choiceCount": 7}}]


def test_extension_with_choice_count_one_is_nacked():
    c = _cluster()
    policy = c.load_balancing_policy.policies.add()
    policy.typed_extension_config.name = "lr"
    policy.typed_extension_config.typed_config.Pack(
        least_request_pb2.LeastRequest(choice_count={"value": 1})
    )
    result = CLUSTER.decode(c.SerializeToString())
    assert result.resource is None and "choice_count" in result.error


def test_legacy_enum_without_config_defaults_to_two():
    c = _cluster()
    c.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    result = CLUSTER.decode(c.SerializeToString())
    assert result.error is None, result.error
    child = result.resource.lb_policy_json()[0]["xds_wrr_locality_experimental"]["childPolicy"]
    assert child == [{"least_request_experimental": {"choiceCount": 2}}]


def test_a_non_constant_child_picker_is_asked_and_its_pick_counted():
    """An endpoint whose READY picker is not pick_first's constant one: the
    picker asks it and chains the counter decrement before its done."""
    from pyxds.lb.api import PickArgs, Picker

    done: list[Status] = []

    class Child(Picker):
        def pick(self, args):
            return PickComplete(object(), done.append)

    picker = LeastRequestPicker([None], [Outstanding([])], 2, random.Random(0), [Child()])
    result = picker.pick(PickArgs("/s/m"))
    assert picker.counters == [1]
    result.on_call_done(OK)
    assert picker.counters == [0] and done == [OK]
