"""least_request_experimental (gRFC A48): config (choiceCount default 2,
clamped to 10, < 2 rejected), the picker's power-of-choice rule with seeded
randomness, outstanding-request counters (per attempt, never leaking, kept
across updates), round_robin's endpoint management (A61 pick_first
children), and the xDS conversions (legacy enum and extension)."""

from __future__ import annotations

import collections

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2

from pyxds.lb import LBConfigError, PickComplete, ResolverUpdate, Status, registry
from pyxds.lb.api import ConnectivityState, Endpoint
from pyxds.lb.least_request import LeastRequestConfig, LeastRequestPicker
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


def test_choice_count_above_ten_is_clamped_to_ten():
    assert parse({"choiceCount": 11}) == LeastRequestConfig(10)
    assert parse({"choiceCount": 4294967295}) == LeastRequestConfig(10)


@pytest.mark.parametrize("count", [0, 1])
def test_choice_count_below_two_is_rejected_naming_the_field(count):
    with pytest.raises(LBConfigError, match="choiceCount"):
        parse({"choiceCount": count})


@pytest.mark.parametrize("value", [-1, "2", 2.5, True])
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


def test_ties_keep_the_first_sample_with_seeded_randomness():
    """A48 pseudo-code: a later sample wins only with strictly fewer calls,
    so with all counts equal the pick is the first sample: the picks follow
    helper.random exactly."""
    import random

    helper, _policy, _ = setup(n=5, choice_count=3, seed=11)
    picker = helper.last.picker
    replay = random.Random()
    replay.setstate(helper.random.getstate())
    results = picker.results
    for _ in range(20):
        expected = results[int(replay.random() * 5)]
        replay.random()
        replay.random()
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
    import random

    from pyxds.lb.api import PickArgs, Picker

    done: list[Status] = []

    class Child(Picker):
        def pick(self, args):
            return PickComplete(object(), done.append)

    counter: collections.deque = collections.deque()
    picker = LeastRequestPicker([None], [counter], 2, random.Random(0), [Child()])
    result = picker.pick(PickArgs("/s/m"))
    assert picker.counters == [1]
    result.on_call_done(OK)
    assert picker.counters == [0] and done == [OK]
